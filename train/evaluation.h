// Evaluation: a model's loss and accuracy on a split. The trainer evaluates
// with run_eval during a run (train/run.h); the eval command evaluates a
// checkpoint with evaluate_checkpoint, which adds top-5 accuracy and the
// confusion matrix for classifiers.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "data/loader.h"
#include "train/model.h"

namespace forge::dist {
class Group;
}  // namespace forge::dist

namespace forge::train {

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

// Evaluates on every batch of `loader`; nullopt when `stop` asks to stop first
// (an evaluation can take minutes: a stop signal does not wait for it).
// Data parallelism: each process evaluates its slice of every batch (a slice
// may be empty) and the sums and counts are added over the processes, so the
// accuracy is the one process's exactly and the loss up to summation order.
// With `class_counts`, top-5 accuracy and the confusion matrix too.
std::optional<EvalResult> run_eval(TaskModel& model, data::DataLoader& loader,
                                   const Placement& place, double smoothing, dist::Group& group,
                                   const std::function<bool()>& stop = {},
                                   bool class_counts = false);

// Bits per byte and perplexity of a mean loss in nats per token, into a
// metrics record: for next-token tasks (bits per byte when the tokens are bytes).
void add_token_metrics(json::Value& rec, double loss, const DataShape& shape);

// "  bpb 1.234" (bits per byte) or "  ppl 3.21" for a record with those fields.
std::string token_metrics_text(const json::Value& rec);

}  // namespace forge::train
