// Checkpoint directories: the atomic write (temp directory, fsyncs, one
// rename), the validating read, and the run's CheckpointManager.
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

namespace forge::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFiles[] = {"model.safetensors", "optimizer.safetensors", "state.json"};

// The optimizer.safetensors __metadata__ key of state.json's XXH3-64; the
// tensors' own checksums are the safetensors layer's.
constexpr const char* kStateChecksumKey = "state_json_xxh3_64";
// What the small files may hold, read with these caps so a damaged or hostile
// one cannot take the memory: a state is a few KB, a pointer one name.
constexpr size_t kMaxStateBytes = size_t{16} << 20;
constexpr size_t kMaxPointerBytes = 4096;

// The suffixes of what a write leaves beside its target until it finishes:
// the directory being built, an old directory renamed aside, one being deleted.
constexpr std::string_view kTmpMark = ".tmp-", kOldMark = ".old-", kDelMark = ".del-";

std::string pid_suffix() {
  return std::to_string(::getpid());
}

// ---- fault injection ----

// A crash simulated by the test hook: unlike a real error, nothing is cleaned up.
class InjectedFault : public Error {
 public:
  using Error::Error;
};

// What the armed hook does at its step: throw an InjectedFault (in-process
// tests), or SIGKILL the process (crash tests from outside, scripts/soak.sh).
enum class FaultAction { raise_error, kill };

// One countdown for both hooks: arming either replaces what was armed.
std::atomic<int64_t> g_fault_countdown{0};
std::atomic<FaultAction> g_fault_action{FaultAction::raise_error};
std::atomic<bool> g_rename_exchange{true};
std::once_flag g_fault_env_once;

// The step number in environment variable `name`, 0 when unset.
int64_t step_from_env(const char* name) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return 0;
  int64_t n = 0;
  const char* end = s + std::strlen(s);
  const auto [p, ec] = std::from_chars(s, end, n);
  FORGE_CHECK(ec == std::errc() && p == end,
              "{}: expected the integer number of the checkpoint write step to fail at, found "
              "\"{}\"",
              name, s);
  return n;
}

void arm_fault_from_env() {
  std::call_once(g_fault_env_once, [] {
    const int64_t fault = step_from_env("FORGE_CHECKPOINT_FAULT");
    const int64_t kill = step_from_env("FORGE_CHECKPOINT_KILL");
    FORGE_CHECK(fault <= 0 || kill <= 0,
                "FORGE_CHECKPOINT_FAULT={} and FORGE_CHECKPOINT_KILL={} are both set: the hook "
                "fires once, at one step; unset one of them",
                fault, kill);
    if (kill > 0) {
      g_fault_action.store(FaultAction::kill);
      g_fault_countdown.store(kill);
    } else {
      g_fault_action.store(FaultAction::raise_error);
      g_fault_countdown.store(fault);
    }
  });
}

// True when the armed fault fires at this step (once).
bool fault_due() {
  arm_fault_from_env();
  int64_t c = g_fault_countdown.load();
  while (c > 0 && !g_fault_countdown.compare_exchange_weak(c, c - 1)) {
  }
  return c == 1;
}

[[noreturn]] void crash(std::string_view what) {
  // No flush, no cleanup: buffered output and half-written files stay as a kill leaves them.
  if (g_fault_action.load() == FaultAction::kill) ::raise(SIGKILL);
  throw InjectedFault(fmt::format("checkpoint fault injection: simulated crash at \"{}\"", what));
}

void step(std::string_view what) {
  if (fault_due()) crash(what);
}

// ---- files ----

// Writes `bytes` to `path` (created or truncated) and fsyncs it. A fault here
// leaves the first half of the bytes, as a kill during the write would.
void write_durable(const std::string& path, std::string_view bytes, bool faultable) {
  if (faultable && fault_due()) {
    io::Fd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    FORGE_CHECK(out.fd >= 0, "{}: cannot create: {}", path, io::errno_message());
    io::write_all(out.fd, bytes.data(), bytes.size() / 2, path);
    crash("write " + fs::path(path).filename().string());
  }
  io::write_file_durable(path, bytes);
}

void write_atomic(const fs::path& path, std::string_view bytes, bool faultable) {
  const std::string tmp = path.string() + std::string(kTmpMark) + pid_suffix();
  try {
    write_durable(tmp, bytes, faultable);
    if (faultable) step("rename " + path.filename().string());
    FORGE_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename {} to {}: {}", tmp,
                path.string(), io::errno_message());
  } catch (const InjectedFault&) {
    throw;
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (faultable) step("fsync the directory of " + path.filename().string());
  io::fsync_directory(path.parent_path());
}

bool exists_no_follow(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

// Whether `name` is BASE + mark + pid; sets `base` and `mark`.
bool split_leftover(const std::string& name, std::string& base, std::string_view& mark) {
  for (const std::string_view m : {kTmpMark, kOldMark, kDelMark}) {
    const size_t pos = name.rfind(m);
    if (pos == std::string::npos || pos == 0) continue;
    const std::string_view pid = std::string_view(name).substr(pos + m.size());
    if (pid.empty() ||
        !std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    base = name.substr(0, pos);
    mark = m;
    return true;
  }
  return false;
}

// Removes what interrupted writes left in `parent` (those of target `only`,
// or of every target when `only` is empty). An old directory renamed aside
// whose target is missing was interrupted between its two renames: it is the
// last whole checkpoint, so it is renamed back.
void clean_leftovers(const fs::path& parent, const std::string& only) {
  std::error_code ec;
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(parent, ec)) found.push_back(e.path());
  std::sort(found.begin(), found.end());
  for (const fs::path& p : found) {
    std::string base;
    std::string_view mark;
    if (!split_leftover(p.filename().string(), base, mark)) continue;
    if (!only.empty() && base != only) continue;
    if (mark == kOldMark && !exists_no_follow(parent / base)) {
      FORGE_CHECK(
          ::rename(p.c_str(), (parent / base).c_str()) == 0,
          "cannot restore {} (a checkpoint renamed aside by an interrupted write) to {}: {}",
          p.string(), (parent / base).string(), io::errno_message());
      continue;
    }
    fs::remove_all(p, ec);
  }
}

// Moves the finished `tmp` to `dir`, replacing an existing `dir` only now.
void commit(const fs::path& tmp, const fs::path& dir) {
  if (!exists_no_follow(dir)) {
    step("rename the temp directory into place");
    FORGE_CHECK(::rename(tmp.c_str(), dir.c_str()) == 0, "cannot rename {} to {}: {}", tmp.string(),
                dir.string(), io::errno_message());
    return;
  }
  std::error_code ec;
  FORGE_CHECK(fs::is_directory(fs::symlink_status(dir, ec)),
              "{}: exists and is not a directory; a checkpoint is a directory", dir.string());
  if (g_rename_exchange.load()) {
    step("exchange the temp directory with the old checkpoint");
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
      step("remove the old checkpoint");
      fs::remove_all(tmp, ec);
      return;
    }
    FORGE_CHECK(errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP,
                "cannot exchange {} with {}: {}", tmp.string(), dir.string(), io::errno_message());
  }
  const fs::path aside = dir.string() + std::string(kOldMark) + pid_suffix();
  step("rename the old checkpoint aside");
  FORGE_CHECK(::rename(dir.c_str(), aside.c_str()) == 0, "cannot rename {} aside to {}: {}",
              dir.string(), aside.string(), io::errno_message());
  step("rename the temp directory into place");
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    const std::string why = io::errno_message();
    ::rename(aside.c_str(), dir.c_str());
    FORGE_FAIL("cannot rename {} to {}: {}", tmp.string(), dir.string(), why);
  }
  step("remove the old checkpoint");
  fs::remove_all(aside, ec);
}

void write_tensors(const fs::path& path, const std::map<std::string, Tensor>& tensors,
                   const std::map<std::string, std::string>& metadata) {
  if (fault_due()) {
    const std::string bytes = safetensors::serialize(tensors, metadata);
    write_durable(path.string(), std::string_view(bytes).substr(0, bytes.size() / 2), false);
    crash("write " + path.filename().string());
  }
  safetensors::save(path.string(), tensors, metadata);
}

void write_checkpoint_impl(const std::string& dir_arg, const std::map<std::string, Tensor>& model,
                           const std::map<std::string, Tensor>& optimizer,
                           const std::string& recipe_yaml, const json::Value& card,
                           const json::Value& state) {
  FORGE_CHECK(state.is_null() || state.is_object(),
              "write_checkpoint {}: the state must be a JSON object, found {}", dir_arg,
              json::type_name(state.type()));
  fs::path dir = fs::path(dir_arg).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  FORGE_CHECK(!dir.empty() && dir.filename() != "." && dir.filename() != "..",
              "write_checkpoint: \"{}\" does not name a directory to write", dir_arg);
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  const std::string name = dir.filename().string();
  std::error_code ec;
  fs::create_directories(parent, ec);
  FORGE_CHECK(!ec, "write_checkpoint: cannot create {}: {}", parent.string(), ec.message());

  // Everything that can fail without touching the disk comes first.
  const std::string state_text =
      json::dump(state.is_null() ? json::Value(json::Object{}) : state, 2) + "\n";
  clean_leftovers(parent, name);

  const fs::path tmp = parent / (name + std::string(kTmpMark) + pid_suffix());
  try {
    step("create the temp directory");
    FORGE_CHECK(::mkdir(tmp.c_str(), 0755) == 0, "cannot create {}: {}", tmp.string(),
                io::errno_message());
    // The state's checksum goes with the optimizer, the other training state:
    // model.safetensors is then a function of the weights and the recipe alone
    // (two runs that train the same weights write the same file), while
    // state.json holds wall times.
    std::map<std::string, std::string> model_meta = {{"format", kCheckpointFormat},
                                                     {"recipe", recipe_yaml}};
    if (!card.is_null()) model_meta["card"] = json::dump(card);
    write_tensors(tmp / kFiles[0], model, model_meta);
    write_tensors(tmp / kFiles[1], optimizer,
                  {{"format", kCheckpointFormat},
                   {kStateChecksumKey, safetensors::checksum_hex(state_text)}});
    write_durable((tmp / kFiles[2]).string(), state_text, true);
    step("fsync the temp directory");
    io::fsync_directory(tmp);
    commit(tmp, dir);
    step("fsync the parent directory");
    io::fsync_directory(parent);
  } catch (const InjectedFault&) {
    throw;
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

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
std::optional<int64_t> parse_name(std::string_view name) {
  constexpr std::string_view prefix = "step-";
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  const std::string_view digits = name.substr(prefix.size());
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  int64_t step = 0;
  const auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || p != digits.data() + digits.size()) return std::nullopt;
  return step;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

}  // namespace

void set_checkpoint_fault(int64_t n) {
  arm_fault_from_env();
  g_fault_action.store(FaultAction::raise_error);
  g_fault_countdown.store(std::max<int64_t>(n, 0));
}

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

// ---- CheckpointManager ----

CheckpointManager::CheckpointManager(std::string run_dir, int keep_last, int keep_best,
                                     std::string metric_name, std::string mode, Warn on_warning)
    : dir_((fs::path(run_dir) / "checkpoints").string()),
      keep_last_(keep_last),
      keep_best_(keep_best),
      metric_name_(std::move(metric_name)),
      maximize_(mode == "max"),
      warn_(std::move(on_warning)) {
  FORGE_CHECK(keep_last >= 1,
              "CheckpointManager: keep_last must be at least 1 (the latest checkpoint is always "
              "kept), found {}",
              keep_last);
  FORGE_CHECK(keep_best >= 0, "CheckpointManager: keep_best must be 0 or more, found {}",
              keep_best);
  FORGE_CHECK(mode == "max" || mode == "min",
              "CheckpointManager: mode must be \"max\" or \"min\", found \"{}\"", mode);

  std::error_code ec;
  std::vector<int64_t> steps;
  if (fs::is_directory(dir_, ec)) {
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      if (!e.is_directory(ec)) continue;
      if (const auto s = parse_name(e.path().filename().string())) steps.push_back(*s);
    }
  }
  std::sort(steps.begin(), steps.end());

  const auto readable = [&](int64_t s, std::string& why) {
    try {
      for (const std::string& w : read_checkpoint(path_of(s)).warnings) warn(w);
      return true;
    } catch (const Error& e) {
      why = message_of(e);
      return false;
    }
  };
  const auto read_pointer = [&](const char* file) -> std::optional<int64_t> {
    const fs::path p = fs::path(dir_) / file;
    if (!exists_no_follow(p)) return std::nullopt;
    try {
      const std::string text = trim(io::read_file(p.string(), kMaxPointerBytes));
      if (const auto s = parse_name(text)) return s;
      warn(fmt::format("{}: holds \"{}\", not a checkpoint name like step-00001234", p.string(),
                       escaped(text)));
    } catch (const Error& e) {
      warn(message_of(e));
    }
    return std::nullopt;
  };

  const fs::path latest_file = fs::path(dir_) / "latest";
  const std::optional<int64_t> named = read_pointer("latest");
  std::string why;
  if (named) {
    if (!std::binary_search(steps.begin(), steps.end(), *named)) {
      latest_problem_ = fmt::format("{} names {}, which does not exist", latest_file.string(),
                                    name_of(*named));
    } else if (readable(*named, why)) {
      latest_ = named;
    } else {
      damaged_latest_ = fmt::format("{} ({})", path_of(*named), why);
      latest_problem_ = fmt::format("{} names {}, which is damaged: {}", latest_file.string(),
                                    name_of(*named), why);
    }
  } else if (!steps.empty()) {
    latest_problem_ = fmt::format("{} is missing or unreadable", latest_file.string());
  }
  if (latest_problem_)
    warn(fmt::format("{}; falling back to the newest readable checkpoint", *latest_problem_));
  if (!latest_) {
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      if (named && *it == *named) continue;
      if (readable(*it, why)) {
        latest_ = *it;
        warn(fmt::format("using {} as the latest checkpoint", path_of(*it)));
        break;
      }
      warn(fmt::format("skipping {}: {}", path_of(*it), why));
    }
  }

  for (int64_t s : steps) {
    if (latest_ && s > *latest_) {
      abandoned_.push_back(s);
      continue;
    }
    Entry e{s, std::nullopt};
    if (!metric_name_.empty()) {
      try {
        const fs::path state = fs::path(path_of(s)) / kFiles[2];
        const json::Value v =
            json::parse(io::read_file(state.string(), kMaxStateBytes), state.string());
        const json::Value* m = v.is_object() ? v.find("checkpoint_metric") : nullptr;
        if (m && m->is_object()) {
          const json::Value* n = m->find("name");
          const json::Value* x = m->find("value");
          if (n && n->is_string() && n->as_string() == metric_name_ && x && x->is_number())
            e.metric = x->as_double();
        }
      } catch (const Error&) {
        // Unreadable: it has no metric and is never the best.
      }
    }
    entries_.push_back(e);
  }
  if (!abandoned_.empty()) {
    warn(
        fmt::format("{} checkpoint(s) newer than {} belong to an interrupted run and will be "
                    "deleted by the next save",
                    abandoned_.size(), path_of(*latest_)));
  }
  // The best one must be readable too.
  while (const auto b = best_index()) {
    if (latest_ && entries_[*b].step == *latest_) break;
    if (readable(entries_[*b].step, why)) break;
    warn(fmt::format("best checkpoint candidate {} cannot be read ({}); ignoring it",
                     path_of(entries_[*b].step), why));
    entries_[*b].metric.reset();
  }
  best_on_disk_ = read_pointer("best");
}

std::string CheckpointManager::name_of(int64_t step) {
  return fmt::format("step-{:08d}", step);
}

bool CheckpointManager::holds_checkpoint(const std::string& run_dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "checkpoints", ec)) {
    std::string name = e.path().filename().string();
    std::string base;
    std::string_view mark;
    if (split_leftover(name, base, mark)) {
      if (mark != kOldMark) continue;
      name = base;
    }
    if (parse_name(name)) return true;
  }
  return false;
}

std::string CheckpointManager::path_of(int64_t step) const {
  return (fs::path(dir_) / name_of(step)).string();
}

void CheckpointManager::warn(const std::string& message) {
  warnings_.push_back(message);
  if (warn_) {
    warn_(message);
  } else {
    spdlog::warn("{}", message);
  }
}

bool CheckpointManager::better(double a, double b) const {
  return maximize_ ? a > b : a < b;
}

std::optional<size_t> CheckpointManager::best_index() const {
  std::optional<size_t> best;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!entries_[i].metric) continue;
    if (!best || better(*entries_[i].metric, *entries_[*best].metric)) best = i;
  }
  return best;
}

std::optional<std::string> CheckpointManager::latest() const {
  if (!latest_) return std::nullopt;
  return path_of(*latest_);
}

std::optional<std::string> CheckpointManager::best() const {
  const auto b = best_index();
  if (!b) return std::nullopt;
  return path_of(entries_[*b].step);
}

std::vector<std::string> CheckpointManager::list() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(path_of(e.step));
  return out;
}

std::string CheckpointManager::save(int64_t step_number, const Checkpoint& ckpt,
                                    std::optional<double> metric) {
  FORGE_CHECK(step_number >= 0, "CheckpointManager::save: step must be non-negative, found {}",
              step_number);
  FORGE_CHECK(!metric || !metric_name_.empty(),
              "CheckpointManager::save: a metric value was given but this manager tracks no "
              "metric (its metric_name is empty)");
  FORGE_CHECK(ckpt.state.is_null() || ckpt.state.is_object(),
              "CheckpointManager::save: the state must be a JSON object, found {}",
              json::type_name(ckpt.state.type()));
  std::error_code ec;
  fs::create_directories(dir_, ec);
  FORGE_CHECK(!ec, "CheckpointManager: cannot create {}: {}", dir_, ec.message());
  clean_leftovers(dir_, "");

  json::Value state = ckpt.state.is_null() ? json::Value(json::Object{}) : ckpt.state;
  const bool finite = metric && std::isfinite(*metric);
  if (metric) {
    json::Object m;
    m.emplace_back("name", json::Value(metric_name_));
    m.emplace_back("value", finite ? json::Value(*metric) : json::Value());
    state["checkpoint_metric"] = json::Value(std::move(m));
  } else {
    // A state carried over from a loaded checkpoint must not lend this one its metric.
    std::erase_if(state.as_object(),
                  [](const auto& kv) { return kv.first == "checkpoint_metric"; });
  }
  const std::string path = path_of(step_number);
  write_checkpoint_impl(path, ckpt.model, ckpt.optimizer, ckpt.recipe_yaml, ckpt.card, state);

  // Whole on disk: record it, then commit it through `latest`.
  std::erase(abandoned_, step_number);
  auto it = std::lower_bound(entries_.begin(), entries_.end(), step_number,
                             [](const Entry& e, int64_t s) { return e.step < s; });
  const Entry entry{step_number, finite ? metric : std::nullopt};
  if (it != entries_.end() && it->step == step_number) {
    *it = entry;
  } else {
    entries_.insert(it, entry);
  }
  write_atomic(fs::path(dir_) / "latest", name_of(step_number) + "\n", true);
  latest_ = step_number;

  const auto b = best_index();
  const std::optional<int64_t> best_step =
      b ? std::optional<int64_t>(entries_[*b].step) : std::nullopt;
  if (best_step != best_on_disk_) {
    const fs::path best_file = fs::path(dir_) / "best";
    if (best_step) {
      write_atomic(best_file, name_of(*best_step) + "\n", true);
    } else {
      step("remove best");
      fs::remove(best_file, ec);
    }
    best_on_disk_ = best_step;
  }
  prune();
  return path;
}

void CheckpointManager::tidy() {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return;
  clean_leftovers(dir_, "");
  prune();
}

void CheckpointManager::prune() {
  std::vector<int64_t> keep;
  if (latest_) keep.push_back(*latest_);
  for (size_t i = entries_.size() > static_cast<size_t>(keep_last_)
                      ? entries_.size() - static_cast<size_t>(keep_last_)
                      : 0;
       i < entries_.size(); ++i) {
    keep.push_back(entries_[i].step);
  }
  std::vector<const Entry*> ranked;
  for (const Entry& e : entries_) {
    if (e.metric) ranked.push_back(&e);
  }
  // Best first; among equals the earlier one, which reached the value first.
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](const Entry* a, const Entry* b) { return better(*a->metric, *b->metric); });
  if (!ranked.empty()) keep.push_back(ranked.front()->step);
  for (size_t i = 0; i < ranked.size() && i < static_cast<size_t>(keep_best_); ++i)
    keep.push_back(ranked[i]->step);

  std::vector<int64_t> victims = abandoned_;
  for (const Entry& e : entries_) {
    if (std::find(keep.begin(), keep.end(), e.step) == keep.end()) victims.push_back(e.step);
  }
  for (int64_t s : victims) {
    // Renamed first, so a crash mid-delete leaves a leftover, never a half checkpoint.
    const std::string path = path_of(s);
    const std::string doomed = path + std::string(kDelMark) + pid_suffix();
    step("rename " + name_of(s) + " for deletion");
    if (::rename(path.c_str(), doomed.c_str()) != 0) {
      warn(fmt::format("cannot delete old checkpoint {}: rename to {} failed: {}", path, doomed,
                       io::errno_message()));
      continue;
    }
    std::erase_if(entries_, [s](const Entry& e) { return e.step == s; });
    std::erase(abandoned_, s);
    step("remove " + name_of(s));
    std::error_code ec;
    fs::remove_all(doomed, ec);
    if (ec) warn(fmt::format("cannot delete old checkpoint {}: {}", doomed, ec.message()));
  }
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
