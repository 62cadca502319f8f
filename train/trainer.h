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
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "train/checkpoint.h"
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

struct EvalResult {
  std::string split;
  int64_t examples = 0;
  // What loss and accuracy average over: examples for classifiers, real target
  // tokens for language models and decoders.
  int64_t predictions = 0;
  double loss = 0, accuracy = 0;
  std::optional<double> bits_per_byte, perplexity;  // next-token tasks (bits: byte tokens)
  // Classifiers (evaluate_checkpoint): top-5 accuracy, and the confusion matrix
  // (rows: the true class, columns: the predicted one) with the classes' names.
  std::optional<double> top5_accuracy;
  // During training with ema.decay > 0: the EMA weights' loss and accuracy.
  std::optional<double> ema_loss, ema_accuracy;
  bool ema_weights = false;  // evaluate_checkpoint: the EMA was evaluated ("weights": "ema")
  std::vector<std::vector<int64_t>> confusion;
  std::vector<std::string> class_names;
  int64_t step = 0;
  int64_t limit = 0;  // evaluate_checkpoint: the data.limit_eval in effect (0: the whole split)
  std::string checkpoint, run_dir;    // what was evaluated (run_dir empty for a loose checkpoint)
  std::vector<std::string> warnings;  // about the checkpoint read (e.g. written without checksums)
  json::Value to_json() const;
};

// Loads a checkpoint (any form resolve_checkpoint accepts; its recipe comes
// from its model.safetensors) and evaluates it on the whole of `split` (empty:
// the recipe's data.eval_split); `overrides` are --set assignments applied to
// that recipe (data.limit_eval=N evaluates a subset).
// With `ema`, the checkpoint's moving average of the weights (ema.decay) is
// evaluated instead of its weights.
EvalResult evaluate_checkpoint(const std::string& path, const std::string& split,
                               const std::vector<std::string>& overrides, bool ema = false);

}  // namespace forge::train
