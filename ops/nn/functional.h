// The neural-network ops: softmax, log_softmax, layer_norm, dropout and the
// losses; f32 and f64 on the CPU, each a fused forward and backward kernel.
#pragma once

#include "core/rng.h"
#include "core/tensor.h"

namespace forge::ops {

Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

// Normalises over the last `normalized_ndim` dims; weight and bias have that
// trailing shape and may be undefined.
Tensor layer_norm(const Tensor& x, int64_t normalized_ndim, const Tensor& weight,
                  const Tensor& bias, double eps = 1e-5);

// Zeroes each element with probability p and scales the rest by 1/(1-p). The
// mask comes from the Philox generator (the default one when null); identity
// when !training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);

enum class Reduction { mean, sum, none };

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::mean;  // mean over the targets not ignored
};

// logits (N, C) or (..., C); target i64/i32 class ids of logits' leading shape.
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     const CrossEntropyOptions& options = {});

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);

}  // namespace forge::ops
