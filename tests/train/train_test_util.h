// Helpers shared by the tests that run the trainer (they link forge_train):
// run directories, quiet options and the losses a run logged.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "train/metrics_file.h"
#include "train/trainer.h"

namespace forge::testing {

// A run directory named after `name` and the process under the system's temp
// folder, removed if it exists (not created; left after the test to look at).
inline std::string fresh_dir(const std::string& name) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() /
                                  ("attnforge_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

// Options for a run in `dir` that logs nothing to the console.
inline train::TrainOptions quiet(const std::string& dir) {
  train::TrainOptions o;
  o.run_dir = dir;
  o.console = false;
  return o;
}

// quiet(dir) for a run that stops once step `step` is done (stop_requested
// answers true at that step).
inline train::TrainOptions stopping_at(const std::string& dir, int64_t step) {
  train::TrainOptions o = quiet(dir);
  o.stop_requested = [step](int64_t s) { return s == step; };
  return o;
}

// quiet(dir) that resumes the run in `dir` from its latest checkpoint.
inline train::TrainOptions resuming(const std::string& dir) {
  train::TrainOptions o = quiet(dir);
  o.resume = true;
  return o;
}

// The loss of every "train" record of the run in `dir` (its metrics.jsonl),
// in file order.
inline std::vector<double> train_losses(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "metrics.jsonl").string();
  std::vector<double> out;
  for (const auto& rec : train::read_metrics(path))
    if (rec.at("split").as_string() == "train") out.push_back(rec.at("loss").as_double());
  return out;
}

}  // namespace forge::testing
