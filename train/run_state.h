// The trainer's state.json: everything besides the weights and the optimizer
// that a checkpoint needs to continue a run exactly (see trainer.h), written
// by to_json and read back by parse_run_state.
//
// A checkpoint may come from a damaged disk or a hand edit, so the reader is
// strict: every key is checked for its type and range, against the directory
// it was found in (step-00000200 holds step 200) and against the recipe the
// run continues with (the step is within the run, the data position is the
// one that many steps reach); an unknown key is an error. Every error names
// the file and the key. It reads only: a run directory is touched after the
// whole state has been accepted.
//
//   {"step": 200, "epoch": 3,
//    "loader": {"epoch": 3, "batch": 8},          the next batch to draw
//    "generator": {"seed": 3, "offset": 4096},    the model's (dropout, redraws)
//    "default_generator": {...},
//    "window": {...},                             the metrics since the last train record
//    "schedule": {"kind": "cosine", "step": 200, "lr": 0.0011},   for people; not read back
//    "elapsed_s": 81.5,
//    "world_size": 2,                             processes that trained it (any may resume)
//    "last_eval": {"loss": 0.52, "accuracy": 0.81},
//    "grad_scaler": {"scale": 65536, "growth_tracker": 12},       fp16 runs only
//    "checkpoint_metric": {"name": "eval_accuracy", "value": 0.81}}  the CheckpointManager's
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "core/json.h"
#include "core/rng.h"
#include "data/loader.h"

namespace forge::train {

// The metrics of the steps since the last train record.
struct MetricWindow {
  double loss_sum = 0, grad_norm_sum = 0, seconds = 0;
  int64_t correct = 0, examples = 0, tokens = 0, steps = 0;
  // Rows that loss_sum and correct count: examples (classifiers) or target
  // tokens (next-token models).
  int64_t predictions = 0;
};

struct RunState {
  int64_t step = 0;  // optimizer steps done
  data::LoaderPosition loader;
  GeneratorState generator, default_generator;
  MetricWindow window;
  std::string schedule_kind;
  double lr = 0;
  double elapsed_s = 0;
  int64_t world_size = 1;
  double last_eval_loss = 0, last_eval_accuracy = 0;
  std::optional<std::map<std::string, double>> grad_scaler;  // {"scale", "growth_tracker"}

  json::Value to_json() const;
};

// What the state must agree with.
struct RunStateExpect {
  int64_t step = 0;               // the step its directory's name says
  int64_t total_steps = 0;        // the recipe's
  int64_t batches_per_epoch = 0;  // of the recipe's training loader
  int64_t accumulation = 1;       // batches drawn per step
};

// Validates `state` (read from `file`) completely; throws forge::Error naming
// the file and the key at the first problem.
RunState parse_run_state(const json::Value& state, const std::string& file,
                         const RunStateExpect& expect);

}  // namespace forge::train
