// Checkpoint directories: the format (what write_checkpoint writes through
// the atomic commit of checkpoint_commit.h, and the validating read) and
// resolve_checkpoint, the one rule every command finds checkpoints by. A run's
// retention is CheckpointManager (checkpoint_manager.cpp).
#include "train/checkpoint.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "core/file_io.h"
#include "core/safetensors.h"
#include "core/version.h"
#include "train/checkpoint_commit.h"

namespace forge::train {

namespace fs = std::filesystem;
using namespace checkpoint_detail;

namespace {

void check_format(const safetensors::File& f, const std::string& path) {
  const auto it = f.metadata.find("format");
  FORGE_CHECK(it != f.metadata.end(),
              "{}: __metadata__ has no \"format\" (expected \"{}\"): not an attnforge checkpoint "
              "file",
              path, kCheckpointFormat);
  constexpr std::string_view prefix = "attnforge-checkpoint-";
  const std::string& tag = it->second;
  int version = 0;
  if (tag.starts_with(prefix)) {
    const std::string_view digits = std::string_view(tag).substr(prefix.size());
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), version);
    if (ec != std::errc() || end != digits.data() + digits.size()) version = 0;
  }
  FORGE_CHECK(version >= 1,
              "{}: format tag is \"{}\", expected \"{}\": not an attnforge checkpoint", path,
              escaped(tag), kCheckpointFormat);
  FORGE_CHECK(version <= kCheckpointFormatVersion,
              "{}: checkpoint format {} was written by a newer attnforge; this one ({}) reads "
              "formats 1 to {}: upgrade attnforge to read it",
              path, version, forge::version(), kCheckpointFormatVersion);
}

struct ChecksumPresence {
  std::string path;
  bool checksummed;
  bool counts;  // a file without tensors carries no checksums either way
};

// A checkpoint has checksums on every file, or, written before attnforge had
// them, on none: anything else is files mixed from different writes, or a
// header damaged where the checksums were.
void check_checksums_everywhere(const std::string& dir,
                                const std::vector<ChecksumPresence>& files) {
  std::vector<std::string> with, without;
  for (const ChecksumPresence& f : files) {
    if (f.counts) (f.checksummed ? with : without).push_back(f.path);
  }
  FORGE_CHECK(with.empty() || without.empty(),
              "checkpoint {}: {} carry checksums but {} carry none: a checkpoint has them on every "
              "file or (written by an older attnforge) on none, so its files come from different "
              "writes or are damaged; restore the checkpoint from a copy or use another one",
              dir, fmt::join(with, ", "), fmt::join(without, ", "));
}

// "step-00001234" -> 1234; nullopt for anything else.

}  // namespace

void set_checkpoint_rename_exchange(bool enabled) {
  g_rename_exchange.store(enabled);
}

void write_checkpoint(const std::string& dir, const Checkpoint& ckpt) {
  write_checkpoint_impl(dir, ckpt.model, ckpt.optimizer, ckpt.recipe_yaml, ckpt.card, ckpt.state);
}

std::pair<std::map<std::string, Tensor>, std::map<std::string, Tensor>> split_ema(
    const std::map<std::string, Tensor>& optimizer_tensors) {
  std::map<std::string, Tensor> rest, ema;
  for (const auto& [name, t] : optimizer_tensors) {
    if (name.starts_with(kEmaPrefix))
      ema.emplace(name.substr(kEmaPrefix.size()), t);
    else
      rest.emplace(name, t);
  }
  return {std::move(rest), std::move(ema)};
}

std::map<std::string, Tensor> checkpoint_weights(const Checkpoint& c, bool ema,
                                                 const std::string& where) {
  if (!ema) return c.model;
  std::map<std::string, Tensor> out = split_ema(c.optimizer).second;
  FORGE_CHECK(!out.empty(),
              "{}: the checkpoint holds no moving average of the weights (its run had ema.decay "
              "0); leave out --ema to use its weights",
              where);
  return out;
}

Checkpoint read_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    std::string hint;
    const fs::path d = fs::path(dir).lexically_normal();
    const fs::path parent = d.has_parent_path() ? d.parent_path() : fs::path(".");
    for (const auto& e : fs::directory_iterator(parent, ec)) {
      std::string base;
      std::string_view mark;
      if (split_leftover(e.path().filename().string(), base, mark) && mark == kOldMark &&
          base == d.filename().string()) {
        hint = fmt::format(
            "; an interrupted write left the previous checkpoint at {}, which the next write to "
            "this place restores",
            e.path().string());
      }
    }
    FORGE_FAIL(
        "checkpoint {}: not found or not a directory (expected a directory holding "
        "model.safetensors, optimizer.safetensors and state.json){}",
        dir, hint);
  }
  for (const char* name : kFiles) {
    const fs::path p = fs::path(dir) / name;
    FORGE_CHECK(fs::is_regular_file(p, ec),
                "checkpoint {}: missing {} (a checkpoint holds model.safetensors, "
                "optimizer.safetensors and state.json)",
                dir, p.string());
  }
  Checkpoint c;
  const std::string model_path = (fs::path(dir) / kFiles[0]).string();
  safetensors::File model = safetensors::load(model_path);
  check_format(model, model_path);
  const auto recipe = model.metadata.find("recipe");
  FORGE_CHECK(recipe != model.metadata.end(),
              "{}: __metadata__ has no \"recipe\" (every checkpoint stores its resolved recipe)",
              model_path);
  c.recipe_yaml = recipe->second;
  if (const auto card = model.metadata.find("card"); card != model.metadata.end())
    c.card = json::parse(card->second, model_path + " (__metadata__ card)");

  const std::string optimizer_path = (fs::path(dir) / kFiles[1]).string();
  safetensors::File optimizer = safetensors::load(optimizer_path);
  check_format(optimizer, optimizer_path);

  const std::string state_path = (fs::path(dir) / kFiles[2]).string();
  const std::string state_text = io::read_file(state_path, kMaxStateBytes);
  // Parsed first: a cut or garbled file is better described by where its JSON breaks.
  c.state = json::parse(state_text, state_path);
  FORGE_CHECK(c.state.is_object(), "{}: expected a JSON object, found {}", state_path,
              json::type_name(c.state.type()));
  const auto state_sum = optimizer.metadata.find(kStateChecksumKey);
  check_checksums_everywhere(dir,
                             {{model_path, model.checksummed, !model.tensors.empty()},
                              {optimizer_path, optimizer.checksummed, !optimizer.tensors.empty()},
                              {state_path, state_sum != optimizer.metadata.end(), true}});
  if (state_sum != optimizer.metadata.end()) {
    const std::string got = safetensors::checksum_hex(state_text);
    FORGE_CHECK(got == state_sum->second,
                "{}: checksum mismatch: {} records xxh3_64 {} for it, its {} bytes hash to {}: the "
                "file is corrupt (damaged on disk or in a copy); restore it from a copy or use "
                "another checkpoint",
                state_path, optimizer_path, state_sum->second, state_text.size(), got);
  } else {
    c.warnings.push_back(fmt::format(
        "{}: written without checksums (an older attnforge); its bytes cannot be verified", dir));
  }
  c.model = std::move(model.tensors);
  c.optimizer = std::move(optimizer.tensors);
  return c;
}

namespace {

// For a path that does not exist: the checkpoints of the run it points into
// (the nearest of its three parents that is a run or its checkpoints/ folder),
// as "; RUN/checkpoints holds: step-..., latest, best", or else the runs beside
// it (a misspelt run name: "; runs holds the runs a-1, a-2"); empty when none.
std::string checkpoints_near(const fs::path& missing) {
  fs::path d = missing.parent_path();
  {
    std::error_code ec;
    std::vector<std::string> runs;
    for (const auto& e : fs::directory_iterator(d.empty() ? fs::path(".") : d, ec))
      if (fs::is_directory(e.path() / "checkpoints", ec))
        runs.push_back(e.path().filename().string());
    std::sort(runs.begin(), runs.end());
    if (!runs.empty())
      return fmt::format("; {} holds the run{} {}", d.empty() ? "." : d.string(),
                         runs.size() == 1 ? "" : "s", fmt::join(runs, ", "));
  }
  for (int up = 0; up < 3 && !d.empty(); ++up, d = d.parent_path()) {
    std::error_code ec;
    const fs::path ck = d.filename() == "checkpoints" ? d : d / "checkpoints";
    if (!fs::is_directory(ck, ec)) continue;
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(ck, ec)) {
      const std::string n = e.path().filename().string();
      if (parse_name(n) || n == "latest" || n == "best") names.push_back(n);
    }
    std::sort(names.begin(), names.end());
    return names.empty()
               ? fmt::format("; {} holds no checkpoint", ck.string())
               : fmt::format("; {} holds: {}", ck.string(), fmt::join(names, ", "));
  }
  return "";
}

// Where `path` says a checkpoint is (see resolve_checkpoint); `verified` is
// set when the run's manager chose it, having read it whole.
CheckpointRef locate_checkpoint(const std::string& path, const std::string& what,
                                bool& verified) {
  std::error_code ec;
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // a trailing '/'
  constexpr const char* kAccepted =
      "give a run directory, RUN/checkpoints/latest, RUN/checkpoints/best or "
      "RUN/checkpoints/step-N";
  FORGE_CHECK(fs::exists(p, ec), "{} {}: no such file or directory ({}){}", what, path, kAccepted,
              checkpoints_near(p));
  // What RUN/checkpoints/latest names, read without reading the checkpoint
  // (the manager reads it whole; whether a given one is the latest needs the name only).
  const auto named_latest = [](const fs::path& run) -> std::optional<int64_t> {
    std::error_code none;
    const fs::path file = run / "checkpoints" / "latest";
    if (!fs::is_regular_file(file, none)) return std::nullopt;
    return parse_name(trim(io::read_file(file.string(), kMaxPointerBytes)));
  };
  // The run's latest checkpoint by its pointer, or an error: never another in its place.
  const auto latest_of = [&](const fs::path& run) {
    const CheckpointManager m(run.string(), 1, 0, "", "max", [](const std::string&) {});
    if (m.latest_problem())
      FORGE_FAIL("{} {}: {}. No other checkpoint is used in its place: {}", what, path,
                 *m.latest_problem(),
                 m.latest() ? fmt::format("the newest intact one is {}; give it explicitly to use "
                                          "it",
                                          *m.latest())
                            : std::string("the run has no intact checkpoint"));
    FORGE_CHECK(m.latest(), "{} {}: the run has no readable checkpoint{}", what, path,
                m.warnings().empty() ? std::string()
                                     : fmt::format(" ({})", fmt::join(m.warnings(), "; ")));
    CheckpointRef ref;
    ref.dir = *m.latest();
    ref.step = m.latest_step();
    ref.run_dir = run.string();
    ref.latest = true;
    verified = true;
    return ref;
  };
  const std::string name = p.filename().string();
  CheckpointRef ref;
  if (!fs::is_directory(p, ec)) {
    FORGE_CHECK((name == "latest" || name == "best") && p.parent_path().filename() == "checkpoints",
                "{} {}: a file, not a checkpoint ({})", what, path, kAccepted);
    const fs::path run = p.parent_path().parent_path();
    if (name == "latest") return latest_of(run);
    // The pointer as written (the manager without a metric ranks nothing).
    const std::string text = trim(io::read_file(p.string(), kMaxPointerBytes));
    ref.step = parse_name(text);
    FORGE_CHECK(ref.step, "{} {}: holds \"{}\", not a checkpoint name like step-00001234", what,
                path, escaped(text));
    ref.dir = (p.parent_path() / text).string();
    FORGE_CHECK(fs::is_directory(ref.dir, ec), "{} {}: names {}, which does not exist", what, path,
                ref.dir);
    ref.run_dir = run.string();
    ref.latest = named_latest(run) == ref.step;
    return ref;
  }
  if (fs::exists(p / kFiles[0], ec)) {
    ref.dir = p.string();
    ref.step = parse_name(name);
    if (ref.step && p.parent_path().filename() == "checkpoints") {
      ref.run_dir = p.parent_path().parent_path().string();
      ref.latest = named_latest(ref.run_dir) == ref.step;
    }
    return ref;
  }
  const fs::path run = name == "checkpoints" ? p.parent_path() : p;
  FORGE_CHECK(fs::is_directory(run / "checkpoints", ec),
              "{} {}: neither a checkpoint (no {}) nor a run directory (no checkpoints/) ({})",
              what, path, kFiles[0], kAccepted);
  return latest_of(run);
}

}  // namespace

CheckpointRef resolve_checkpoint(const std::string& path, const std::string& what) {
  bool verified = false;
  const CheckpointRef ref = locate_checkpoint(path, what, verified);
  if (verified) return ref;
  try {
    read_checkpoint(ref.dir);
  } catch (const Error& e) {
    std::string intact = "the run has no other intact checkpoint";
    if (ref.run_dir.empty()) {
      intact = "it belongs to no run";
    } else {
      const CheckpointManager m(ref.run_dir, 1, 0, "", "max", [](const std::string&) {});
      if (m.latest() && fs::path(*m.latest()) != fs::path(ref.dir))
        intact = fmt::format("the run's newest intact one is {}; give it explicitly to use it",
                             *m.latest());
    }
    FORGE_FAIL("{} {}: the checkpoint {} is damaged: {}. No other checkpoint is used in its "
               "place: {}",
               what, path, ref.dir, message_of(e), intact);
  }
  return ref;
}


}  // namespace forge::train
