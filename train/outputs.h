// The one rule of every command that writes files (eval, predict, export,
// attention-maps, train's run directory): a command never writes into a
// checkpoint (a run's checkpoints/ directory or a directory holding a
// checkpoint's model.safetensors), and never over an existing file or
// directory unless the user said so (--overwrite). A refusal names the path,
// what is there, and the ways forward. Callers check every output before the
// work that produces it, so a refusal costs nothing.
#pragma once

#include <optional>
#include <string>

namespace forge::train {

// The checkpoint area that `path` (a file or directory, existing or not) lies
// in or is: the run's checkpoints/ directory or the checkpoint directory, or
// none.
std::optional<std::string> checkpoint_area_of(const std::string& path);

// `what` names the output in messages, e.g. "eval --out". A file: refused
// inside a checkpoint area always, and where anything exists unless
// `overwrite` (then only a regular file may be replaced).
void check_output_file(const std::string& path, const std::string& what, bool overwrite);

// A directory the command fills: refused inside (or as) a checkpoint area
// always; an existing one unless `overwrite`, and then only a directory (its
// files of the same names are replaced, others are left).
void check_output_dir(const std::string& path, const std::string& what, bool overwrite);

}  // namespace forge::train
