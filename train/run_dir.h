// A run's directory (trainer.h lists what it holds): which directory a new run
// takes, whether it may go there, what a failed start leaves behind, and the
// run's log, which goes into it only once the run has passed every check.
#pragma once

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "train/recipe.h"

namespace forge::dist {
class Group;
}  // namespace forge::dist

namespace forge::train {

// runs/<name>-<N>, N one past the highest number of the runs of that name
// there (1 for the first). Rank 0 looks; every process gets its answer.
std::string next_run_dir(const Recipe& recipe, dist::Group& group);

// A new run may go into a directory that does not exist, is empty, or holds
// what a start killed before it wrote its log leaves (recipe.yaml, temporary
// files); never over a run's history (metrics, events, log), checkpoints or not.
void check_new_run_dir(const std::string& run_dir);

// Removes what killed atomic writes of the run's entries left in run_dir
// (recipe.yaml.tmp-PID, ...).
void remove_leftover_temps(const std::string& run_dir);

// Removes the run directory a failed start created, unless the start got far
// enough to disarm it.
class CreatedDirGuard {
 public:
  // Armed when `dir` does not exist yet.
  explicit CreatedDirGuard(std::string dir);
  ~CreatedDirGuard();
  CreatedDirGuard(const CreatedDirGuard&) = delete;
  CreatedDirGuard& operator=(const CreatedDirGuard&) = delete;
  void disarm() { armed_ = false; }

 private:
  std::string dir_;
  bool armed_;
};

// The run's log: on the console at once; into train.log only once the run has
// passed every check (commit()), so a refused start or resume leaves no trace
// in the run directory. What was said before the commit goes into the file first.
class RunLog {
 public:
  explicit RunLog(bool console);

  // Appends what was said so far to run_dir/train.log, and the rest as it is said.
  void commit(const std::string& run_dir);

  spdlog::logger* operator->() const { return logger_.get(); }
  spdlog::logger& operator*() const { return *logger_; }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> pending_;
  std::shared_ptr<spdlog::logger> logger_;
};

}  // namespace forge::train
