// The model of a recipe: a ViT or a SequenceClassifier (one encoder, or a
// dual encoder for document pairs) built from the `model.*` keys, with the
// sizes the data decides (classes, channels, vocabulary, length) filled in.
#pragma once

#include <memory>

#include "core/rng.h"
#include "data/loader.h"
#include "nn/module.h"
#include "train/recipe.h"

namespace forge::train {

// What the data tells the model.
struct DataShape {
  int64_t classes = 0;
  bool images = true;
  int64_t channels = 0, image_size = 0;  // images
  int64_t vocab_size = 0, max_length = 0;  // sequences
  bool pairs = false;                      // examples are document pairs
};

class TaskModel {
 public:
  virtual ~TaskModel() = default;
  virtual nn::Module& module() = 0;
  // logits (B, classes) of a batch (images, tokens + mask, or pairs).
  virtual Tensor forward(const data::Batch& batch) = 0;
  // The attention maps of the first example of `batch` for each layer
  // (layer -> (H, N, M) probabilities; undefined for heads without maps).
  virtual std::vector<Tensor> attention_maps(const data::Batch& batch) = 0;
};

// Builds the model with parameters drawn from `gen` and in `dtype`; errors
// name the recipe key at fault.
std::unique_ptr<TaskModel> build_model(const Recipe& recipe, const DataShape& shape, DType dtype,
                                       Generator* gen);

}  // namespace forge::train
