// Running a trained classifier on new inputs (attnforge predict): a checkpoint
// (any form resolve_checkpoint accepts) and input files in, one JSON record
// per example out, in input order:
//   {"input": "shirt.png", "top_k": [{"class": 6, "name": "Shirt", "probability": 0.91}, ...],
//    "logits": [...], "probabilities": [...]}
// Inputs, by what the model takes (its checkpoint's recipe and card say):
//   images (vit; pixel-sequence classifiers)  PNG or JPEG files, one example
//       each ("input" is the path), or IDX files of u8 images [N, H, W] (MNIST's
//       format; "input" is "path#i"); prepared as evaluation prepares its
//       images (eval_image_transform, then the pixel tokens for sequences)
//   token sequences (sequence_classifier)  TSV files, one example a line, in
//       the training data's layout, so its own files predict as they are:
//       ListOps `expression[<TAB>label]` (LRA's "Source<TAB>Target" header
//       skipped), text `[label<TAB>]text`, document pairs
//       `[label<TAB>...]text1<TAB>text2` (the last two columns); "input" is
//       "path:line". Tokenised as the training data was (ListOps tokens; bytes
//       + 1 for text and retrieval)
// Examples go through the model in batches, as evaluation runs them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/json.h"
#include "data/dataset.h"
#include "train/model.h"
#include "train/recipe.h"

namespace forge::train {

// A classifier loaded from a checkpoint for inference (eval mode), with what
// preparing its inputs needs.
struct Classifier {
  std::string checkpoint;  // the checkpoint directory
  Recipe recipe;           // its recipe, with the overrides applied
  DataShape shape;
  Placement place;
  std::vector<std::string> class_names;  // from the card (empty: none)
  std::unique_ptr<TaskModel> task;
};
// `what` starts error messages ("predict", "attention-maps").
// With `ema`, the checkpoint's moving average of the weights (ema.decay).
Classifier load_classifier(const std::string& checkpoint, const std::vector<std::string>& overrides,
                           const std::string& what, bool ema = false);

// Input files made into examples as evaluation prepares its data (see the top
// of this file), each with its name.
struct PreparedInputs {
  std::vector<data::Example> examples;
  std::vector<std::string> names;
};
PreparedInputs prepare_inputs(const Classifier& model, const std::vector<std::string>& paths);

// The batches of `inputs` (collated and placed as evaluation's): calls `run`
// with each batch and the index of its first example.
void for_each_batch(const Classifier& model, const PreparedInputs& inputs, int64_t batch_size,
                    const std::function<void(const data::Batch&, int64_t first)>& run);

struct PredictRequest {
  std::string checkpoint;
  std::vector<std::string> inputs;
  int64_t top_k = 5;                   // classes listed per example (at most the number of classes)
  int64_t batch_size = 0;              // 0: the recipe's evaluation batch size
  std::vector<std::string> overrides;  // --set assignments to the checkpoint's recipe
  bool ema = false;                    // the moving average of the weights (ema.decay)
  int64_t limit = 0;                   // > 0: the first `limit` examples of the inputs, in order
};

struct PredictResult {
  std::string checkpoint;  // the checkpoint directory used
  int64_t examples = 0;
  double seconds = 0;
};

// Calls `emit` once per example, in input order; throws forge::Error naming the
// file (and line or index) of an input it cannot use, before any model runs.
PredictResult predict(const PredictRequest& request,
                      const std::function<void(const json::Value&)>& emit);

}  // namespace forge::train
