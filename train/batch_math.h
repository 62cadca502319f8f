// What a batch is scored on, shared by the training step (train/run.cpp) and
// evaluation (train/evaluation.cpp): the batch moved to the run's device and
// dtype, the rows of logits and labels it is scored on, their loss and their
// top-1 hits.
#pragma once

#include <cstdint>

#include "core/upload.h"
#include "data/loader.h"

namespace forge::train {

// Class ids of the largest logit per row of (B, C), and how many equal `labels`.
int64_t count_correct(const Tensor& logits_any_device, const Tensor& labels_any_device);

// The batch in the run's dtype, on the run's device.
data::Batch cast_batch(data::Batch b, DType dtype, Uploader& uploader);

// What a batch is scored on: rows of logits (R, C) and their labels (R). A
// classifier predicts one row per example; a language model or a decoder one
// per real target token (padded positions left out), so losses and accuracies
// are per token.
struct Predictions {
  Tensor logits, labels;
  Tensor labels_mix;  // mixup / cutmix partners (classification only)
  double mix_lambda = 1.0;
  int64_t rows() const { return labels.size(0); }
};

// The rows of the model's output `out` for batch `b` that are scored.
Predictions predictions(const Tensor& out, const data::Batch& b);

// The mean cross-entropy of the rows (mixed with the partners' by mix_lambda),
// with label smoothing `smoothing`.
Tensor batch_loss(const Predictions& p, double smoothing);

}  // namespace forge::train
