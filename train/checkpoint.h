// Checkpoints: a directory per checkpoint, written so that a crash at any
// instant leaves either the previous or the new checkpoint whole.
//
//   DIR/model.safetensors      the model state dict; __metadata__ holds
//                              "format": kCheckpointFormat, "recipe": the
//                              resolved recipe YAML and "card": the model card
//                              (train/card.h) as JSON
//   DIR/optimizer.safetensors  the optimizer state dict ("format" as above)
//   DIR/state.json             a JSON object the trainer fills (step, epoch,
//                              RNG states, data position, counters, metrics)
//
// Checksums: both safetensors files carry the XXH3-64 of every tensor (see
// core/safetensors.h), and optimizer.safetensors' __metadata__ holds
// "state_json_xxh3_64": the XXH3-64 of state.json's exact bytes (16 lowercase
// hex digits). model.safetensors holds nothing that depends on wall time: the
// same weights and recipe give the same bytes. The reader checks them all. A checkpoint written
// before them (no checksums on any file) still loads, with a warning.
//
// A write builds DIR.tmp-<pid> beside DIR, fsyncs every file and the directory,
// then swaps it in with one rename (renameat2 RENAME_EXCHANGE where the
// filesystem has it; otherwise the old DIR is renamed aside to DIR.old-<pid>
// first) and fsyncs the parent. Leftovers of an interrupted write are cleaned
// (or an aside DIR restored) by the next write to the same place. One writer
// per directory at a time.
//
// CheckpointManager keeps RUN/checkpoints/step-00001234 directories, the
// `latest` and `best` pointer files (one name and a newline, replaced by
// rename; not symlinks) and prunes old checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/json.h"
#include "core/tensor.h"

namespace forge::train {

// The format this build writes. It reads this one and every older one
// (format 1 has no card); a newer one is refused with a message saying so.
//   1  model / optimizer / state, recipe in the model's __metadata__
//   2  + the model card ("card") in the model's __metadata__ and in state.json
inline constexpr const char* kCheckpointFormat = "attnforge-checkpoint-2";
inline constexpr int kCheckpointFormatVersion = 2;

struct Checkpoint {
  std::map<std::string, Tensor> model;
  std::map<std::string, Tensor> optimizer;
  std::string recipe_yaml;
  json::Value card;   // the model card (null: none, as format 1 wrote)
  json::Value state;  // an object (null is written as {})
  // Set by read_checkpoint for the caller to log: what it could not verify
  // (a checkpoint written without checksums). Not written.
  std::vector<std::string> warnings;
};

// The moving average of the weights (recipe key ema.decay) travels in
// optimizer.safetensors, as the rest of the training state, under
// "ema.<parameter name>".
inline constexpr std::string_view kEmaPrefix = "ema.";

// A checkpoint's optimizer tensors split into the optimizer's own and the
// EMA's (under the model's names, the prefix removed).
std::pair<std::map<std::string, Tensor>, std::map<std::string, Tensor>> split_ema(
    const std::map<std::string, Tensor>& optimizer_tensors);

// The weights of checkpoint `c` for a model: model.safetensors' or, with
// `ema`, the moving average's under the model's names. A checkpoint without
// an EMA is then an error that starts with `where`.
std::map<std::string, Tensor> checkpoint_weights(const Checkpoint& c, bool ema,
                                                 const std::string& where);

// Writes `dir` atomically (see above); its parent directories are created.
void write_checkpoint(const std::string& dir, const Checkpoint& ckpt);

// Reads and validates every file; any problem (missing file, truncated or
// corrupt safetensors, a checksum mismatch, checksums on some files only,
// unparsable state.json, wrong format tag) is a forge::Error naming the file.
// Never modifies anything on disk.
Checkpoint read_checkpoint(const std::string& dir);

class CheckpointManager {
 public:
  using Warn = std::function<void(const std::string&)>;

  // Manages `run_dir`/checkpoints. Keeps the `keep_last` newest checkpoints
  // (>= 1) and the `keep_best` best by `metric_name` (mode "max" or "min";
  // an empty name tracks no metric); the latest and the best one are never
  // deleted. Construction only reads: it finds the latest whole checkpoint
  // (the one `latest` names, or, when that is missing or unreadable, the
  // newest readable one) and the best one, and reports each fallback, and the
  // warnings of the checkpoints it read (Checkpoint::warnings), through
  // `on_warning` (default: spdlog) and warnings(). Checkpoints newer than the
  // latest whole one belong to an abandoned run; the next save() deletes them.
  CheckpointManager(std::string run_dir, int keep_last, int keep_best, std::string metric_name,
                    std::string mode, Warn on_warning = {});

  // Writes checkpoints/step-<step, 8 digits> (replacing one of the same step),
  // then updates `latest` (the commit point) and `best` (when `metric`, a
  // value of metric_name, improves strictly on the best so far), then prunes.
  // The metric is recorded in the checkpoint's state.json as
  // "checkpoint_metric": {"name": ..., "value": ...} (removed from a state
  // without a metric; the key is the manager's). Pruning starts only after
  // the commit, so a save that throws before it has deleted nothing, and
  // whenever it throws `latest` names a whole checkpoint. Returns the new
  // checkpoint's directory.
  std::string save(int64_t step, const Checkpoint& ckpt, std::optional<double> metric);

  // Finishes what a process killed after a save's commit left undone: removes
  // the leftovers of interrupted writes and prunes as save() would. A run that
  // resumes calls it once its checks have passed (a finished run never saves again).
  void tidy();

  // Directories (run_dir/checkpoints/NAME), not names.
  std::optional<std::string> latest() const;
  std::optional<int64_t> latest_step() const { return latest_; }
  std::optional<std::string> best() const;
  std::vector<std::string> list() const;  // oldest first

  const std::vector<std::string>& warnings() const { return warnings_; }
  // When `latest` names a checkpoint that exists but cannot be read: its
  // directory and why (the manager fell back to an older one).
  const std::optional<std::string>& damaged_latest() const { return damaged_latest_; }
  // When latest() is not what `latest` names, why: the pointer is missing or
  // unreadable while checkpoints exist, or names one that is missing or
  // damaged (latest() is then the newest readable one, if any).
  const std::optional<std::string>& latest_problem() const { return latest_problem_; }
  const std::string& dir() const { return dir_; }

  static std::string name_of(int64_t step);  // "step-00001234"
  // Whether `run_dir`/checkpoints holds a checkpoint, readable or not, without
  // reading one: a step-N directory, or one an interrupted write renamed aside
  // (restored by the next write). What a write leaves half done is none.
  static bool holds_checkpoint(const std::string& run_dir);

 private:
  struct Entry {
    int64_t step;
    std::optional<double> metric;
  };
  bool better(double a, double b) const;
  std::optional<size_t> best_index() const;
  void warn(const std::string& message);
  std::string path_of(int64_t step) const;
  // Makes the `best` file name the best entry (or removes it when none has a metric).
  void point_best();
  // point_best(), then deletes what keep_last / keep_best no longer keep.
  void prune();

  std::string dir_;
  int keep_last_;
  int keep_best_;
  std::string metric_name_;
  bool maximize_;
  Warn warn_;
  std::vector<std::string> warnings_;
  std::optional<std::string> damaged_latest_;
  std::optional<std::string> latest_problem_;
  std::vector<Entry> entries_;  // by step, ascending
  std::optional<int64_t> latest_;
  std::vector<int64_t> abandoned_;       // newer than the latest whole checkpoint
  std::optional<int64_t> best_on_disk_;  // what the `best` file names
};

// What a user may name for a checkpoint on the command line (eval, predict,
// generate, export, --resume, model.init_from):
//   RUN                          a run directory: its latest checkpoint
//   RUN/checkpoints              the same
//   RUN/checkpoints/latest|best  the checkpoint the pointer file names
//   RUN/checkpoints/step-N       that checkpoint (any directory holding a
//                                model.safetensors is taken as a checkpoint)
struct CheckpointRef {
  std::string dir;              // the checkpoint directory
  std::string run_dir;          // the run it belongs to (empty for a loose checkpoint directory)
  std::optional<int64_t> step;  // from its name step-N (none for a loose directory)
  bool latest = false;          // whether it is the run's latest checkpoint
};
// Resolves `path` and verifies the checkpoint it names (every file read,
// checksums included). Every command resolves checkpoints here, by one rule:
// none is ever used in place of another. A run directory or `latest` whose
// pointer is missing, unreadable or names a missing or damaged checkpoint, and
// a named checkpoint that is damaged, are errors naming the problem and the
// run's newest intact checkpoint, to pass explicitly. Other errors say what
// was found and what would be accepted. `what` starts the message ("eval",
// "--resume").
CheckpointRef resolve_checkpoint(const std::string& path, const std::string& what);

// ---- test hooks (process-wide) ----
// Every step of a checkpoint write (creating the temp directory, writing each
// file, fsyncs, renames, removals, across write_checkpoint and
// CheckpointManager::save) is a "checkpoint" point of core/fault.h: a fault
// armed there (fault::arm, ATTNFORGE_FAULT=checkpoint:N[:kill]) leaves what a
// crash at that step would: a file being written half written, nothing
// cleaned up.

// Off: replace an existing directory by renaming it aside instead of with
// RENAME_EXCHANGE (the path taken on filesystems without it).
void set_checkpoint_rename_exchange(bool enabled);

}  // namespace forge::train
