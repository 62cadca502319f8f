// The atomic checkpoint write (see checkpoint_commit.h).
#include "train/checkpoint_commit.h"

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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/fault.h"
#include "core/file_io.h"
#include "core/safetensors.h"
#include "core/version.h"
#include "train/checkpoint.h"

namespace forge::train::checkpoint_detail {

std::string pid_suffix() {
  return std::to_string(::getpid());
}

std::atomic<bool> g_rename_exchange{true};

void step(std::string_view what) {
  fault::point("checkpoint", what);
}

// ---- files ----

// Writes `bytes` to `path` (created or truncated) and fsyncs it. A fault here
// leaves the first half of the bytes, as a kill during the write would.
void write_durable(const std::string& path, std::string_view bytes, bool faultable) {
  if (faultable && fault::due("checkpoint")) {
    io::Fd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    FORGE_CHECK(out.fd >= 0, "{}: cannot create: {}", path, io::errno_message());
    io::write_all(out.fd, bytes.data(), bytes.size() / 2, path);
    fault::fire("write " + fs::path(path).filename().string());
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
  } catch (const fault::InjectedFault&) {
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
  if (fault::due("checkpoint")) {
    const std::string bytes = safetensors::serialize(tensors, metadata);
    write_durable(path.string(), std::string_view(bytes).substr(0, bytes.size() / 2), false);
    fault::fire("write " + path.filename().string());
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
  } catch (const fault::InjectedFault&) {
    throw;
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}


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


}  // namespace forge::train::checkpoint_detail
