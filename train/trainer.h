// The training loop of a recipe: data, model, optimizer and schedule from
// the recipe; periodic evaluation; metrics to the console (spdlog, with a
// progress bar and ETA), to train.log and to metrics.jsonl; checkpoints; a
// plot of the curves at the end.
//
// Run directory:
//   recipe.yaml        the resolved recipe (what --resume reads)
//   metrics.jsonl      one record per log interval ("train") and evaluation ("eval")
//   curves.svg         loss and accuracy curves (written at the end)
//   train.log          the console output
//   checkpoints/       step-NNNNNNNN/{model,optimizer}.safetensors + state.json; latest; best
//   attention_maps/    with output.attention_maps
//
// Lifecycle: every check a recipe can fail (schema, cross-key rules, data
// present and readable, model buildable, schedule within the steps) and, on
// resume, the whole checkpoint (checksums, state.json against its directory
// and the recipe) runs before the run directory is written to. A start that
// fails removes the directory it created; a resume that fails changes
// nothing. A directory whose run stopped before its first checkpoint (a
// failed start, a kill) is not a run yet: a new start may take it over, and
// --resume starts it from the beginning.
//
// Resuming reproduces the uninterrupted run exactly: the state saves the
// optimizer step, the loader position, the model's random generator, the
// Performer redraw counters (model buffers) and the partial metric window, and
// a step's batches, dropout masks and updates depend on nothing else. Timing
// fields (samples/s, step time) are the only metrics that differ.
//
// Where things are: train() (trainer.cpp) is the loop; each of its steps
// (setup, step, evaluate, checkpoint, finish) is a method of Run (run.h);
// evaluation and its metrics are in evaluation.h, the run directory's rules
// and log in run_dir.h, a batch's loss and hits in batch_math.h, the GPU
// kernels' and threads' settings in process_settings.h.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "train/checkpoint.h"
#include "train/evaluation.h"  // EvalResult, evaluate_checkpoint (the eval command)
#include "train/recipe.h"

namespace forge::train {

struct TrainOptions {
  std::string run_dir;  // empty: output.dir, or the next free runs/<name>-<N>
  bool resume = false;  // continue the run in run_dir from its latest checkpoint
  // A new run in run_dir (which must not hold one) continuing from this
  // checkpoint (any form resolve_checkpoint accepts, of a run): the checkpoint
  // and the metrics up to it are copied; its run is left as it was.
  std::string resume_from;
  bool check_nan = false;
  bool console = true;  // log to the console (tests turn it off)
  // Polled before each optimizer step with the number of steps done; true
  // writes a checkpoint and stops (SIGINT / SIGTERM, tests). Polled before each
  // evaluation batch too: true there abandons the evaluation and stops without
  // a checkpoint (the resume redoes the steps since the last one).
  std::function<bool(int64_t step)> stop_requested;
};

struct TrainResult {
  enum class Status { finished, interrupted } status = Status::finished;
  int64_t steps = 0;
  double eval_loss = 0, eval_accuracy = 0;  // of the last evaluation
  std::optional<double> ema_eval_accuracy;  // its EMA weights' (ema.decay > 0)
  std::string run_dir;
  std::string last_checkpoint;
};

// Trains; throws forge::Error on bad input (naming what and where) and on a
// non-finite loss (after which the last good checkpoint is still whole:
// nothing is written).
TrainResult train(Recipe recipe, const TrainOptions& options);

// The run directory a recipe trains into when none is given, for messages:
// output.dir, or "runs/<name>-N" (train() picks N).
std::string default_run_dir(const Recipe& recipe);

// The recipe after every check a start makes before it writes anything (the
// device, the data, the model, the optimizer, the schedule), with the sizes the
// data and the model decide filled in (resolve_sizes): what --dump-config
// prints. Adjustments a run would make (a warmup cut to the run) go to `notes`.
Recipe resolve_recipe(Recipe recipe, std::vector<std::string>* notes);

}  // namespace forge::train
