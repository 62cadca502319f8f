// Helpers shared by the tests that run the trainer (they link forge_train):
// run directories and quiet options.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

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

}  // namespace forge::testing
