#include "train/outputs.h"

#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace forge::train {

namespace fs = std::filesystem;

namespace {

// Whether dir is a run's checkpoints/ directory: named so, and holding the
// `latest` pointer or a step-N directory.
bool is_checkpoints_dir(const fs::path& dir) {
  std::error_code ec;
  if (dir.filename() != "checkpoints" || !fs::is_directory(dir, ec)) return false;
  if (fs::exists(dir / "latest", ec) || fs::exists(dir / "best", ec)) return true;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind("step-", 0) == 0) return true;
  return false;
}

// Whether dir holds a checkpoint (model.safetensors beside state.json).
bool is_checkpoint_dir(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "model.safetensors", ec) &&
         fs::exists(dir / "state.json", ec);
}

std::string describe_existing(const fs::path& p) {
  std::error_code ec;
  const auto st = fs::symlink_status(p, ec);
  if (fs::is_symlink(st)) return "a symbolic link";
  if (fs::is_directory(st)) return "a directory";
  if (fs::is_regular_file(st)) {
    const auto size = fs::file_size(p, ec);
    return ec ? std::string("a file") : fmt::format("a file of {} bytes", size);
  }
  return "something that is not a regular file";
}

}  // namespace

std::optional<std::string> checkpoint_area_of(const std::string& path) {
  std::error_code ec;
  // Symbolic links resolved as far as the path exists, so a link into a
  // checkpoint counts as the checkpoint.
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::absolute(path).lexically_normal();
  for (fs::path a = p; !a.empty(); a = a.parent_path()) {
    if (is_checkpoint_dir(a) || is_checkpoints_dir(a)) return a.string();
    if (a == a.root_path()) break;
  }
  return std::nullopt;
}

namespace {

// check_output_file and check_output_dir: `kind` is "file" or "directory".
void check_output(const std::string& path, const std::string& what, bool overwrite,
                  bool directory) {
  const char* kind = directory ? "directory" : "file";
  if (const auto area = checkpoint_area_of(path))
    FORGE_FAIL(
        "{} {}: inside the checkpoint directory {}; no command writes into a checkpoint (it "
        "would damage it). Give a {} outside it",
        what, path, *area, directory ? "directory" : "path");
  std::error_code ec;
  const fs::path p(path);
  if (!fs::exists(fs::symlink_status(p, ec))) return;
  FORGE_CHECK(overwrite, "{} {}: exists ({}); nothing was written. Give a new {}, or add {}", what,
              path, describe_existing(p), directory ? "directory" : "path",
              directory ? "--overwrite to write into it (files of the same names are replaced)"
                        : "--overwrite to replace it");
  const auto st = fs::symlink_status(p, ec);
  FORGE_CHECK(directory ? fs::is_directory(st) : fs::is_regular_file(st),
              "{} {}: exists and is {}, not a {}{}. Give another path", what, path,
              describe_existing(p), kind, directory ? "" : "; --overwrite replaces files only");
}

}  // namespace

void check_output_file(const std::string& path, const std::string& what, bool overwrite) {
  check_output(path, what, overwrite, false);
}

void check_output_dir(const std::string& path, const std::string& what, bool overwrite) {
  check_output(path, what, overwrite, true);
}

}  // namespace forge::train
