// The CUDA kernels of ops/nn/functional.cpp (defined in functional_cuda.cu,
// only in builds with CUDA; functional.cpp calls them under FORGE_IF_CUDA).
// Pointers are device pointers of contiguous tensors of `dtype` (f32, f64,
// bf16, f16) unless said otherwise; "acc" buffers hold the accumulation type
// (f32 for f32 / bf16 / f16, f64 for f64). Every launcher runs on the stream of
// CUDA device `device` and returns without waiting for it, except
// cross_entropy_check_targets.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace forge::cuda {

// softmax (log false) or log_softmax (log true) along the middle dim of x seen
// as (outer, C, inner): y = exp(x - m) / s, log y = x - m - log s, with m the
// max over C and s = sum_c exp(x - m).
void softmax_forward(DType dtype, int device, const void* x, void* y, int64_t outer, int64_t C,
                     int64_t inner, bool log);
// From the forward's output y and the gradient g (same view):
// softmax gx = y * (g - sum_c g y); log_softmax gx = g - exp(y) * sum_c g.
void softmax_backward(DType dtype, int device, const void* y, const void* g, void* gx,
                      int64_t outer, int64_t C, int64_t inner, bool log);

// x (rows, N) normalised per row: y = (x - mean) * rstd * w + b, with w and b
// (N) optional (null). mean and rstd (rows) are acc buffers, saved for backward.
void layer_norm_forward(DType dtype, int device, const void* x, const void* w, const void* b,
                        void* y, void* mean, void* rstd, int64_t rows, int64_t N, double eps);
// gx (rows, N), gw and gb (N) from g (rows, N); each output may be null (not
// needed). gw and gb are summed over rows in a fixed order (deterministic).
void layer_norm_backward(DType dtype, int device, const void* x, const void* w, const void* mean,
                         const void* rstd, const void* g, void* gx, void* gw, void* gb,
                         int64_t rows, int64_t N);

// Element i of n keeps iff philox_unit_f32(word first + i of the Philox stream
// at (seed, offset)) >= p, the CPU's rule: mask[i] = keep, y[i] = keep ? x[i] *
// scale : 0, with scale rounded to the accumulation type. `first` is the
// shard's first draw (Generator::reserve_rows).
void dropout_forward(DType dtype, int device, const void* x, void* y, uint8_t* mask, int64_t n,
                     uint64_t seed, uint64_t offset, uint64_t first, double p, double scale);
// gx = g * mask * scale.
void dropout_backward(DType dtype, int device, const void* g, const uint8_t* mask, void* gx,
                      int64_t n, double scale);

struct TargetCheck {
  int64_t count = 0;      // targets other than ignore_index
  int64_t bad_row = -1;   // the first row whose target is out of [0, C), or -1
  int64_t bad_value = 0;  // its target
};
// Checks `rows` class ids (i32 or i64 `target_dtype`) against C classes.
// Waits for the device (the caller reports a bad target).
TargetCheck cross_entropy_check_targets(DType target_dtype, int device, const void* target,
                                        int64_t rows, int64_t C, int64_t ignore_index);
// logits x (rows, C), targets checked already. Per row, with lse its
// logsumexp (saved in the acc buffer `lse`) and eps the label smoothing:
// loss = (1 - eps)(lse - x[t]) + eps (lse - mean_c x[c]), 0 for ignored rows.
// per_row: y (rows) holds the losses; else y (one element) = sum / divisor.
void cross_entropy_forward(DType dtype, DType target_dtype, int device, const void* x,
                           const void* target, void* lse, void* y, int64_t rows, int64_t C,
                           double eps, int64_t ignore_index, bool per_row, double divisor);
// gx (rows, C) = w_r (softmax(x) - eps / C - (1 - eps) [c == t]), with w_r =
// g[r] (per_row) or g[0] / divisor, and 0 for ignored rows.
void cross_entropy_backward(DType dtype, DType target_dtype, int device, const void* x,
                            const void* target, const void* lse, const void* g, void* gx,
                            int64_t rows, int64_t C, double eps, int64_t ignore_index, bool per_row,
                            double divisor);

// per_element: y (n) = (x - t)^2; else y (one element) = sum (x - t)^2 / divisor.
void mse_loss_forward(DType dtype, int device, const void* x, const void* t, void* y, int64_t n,
                      bool per_element, double divisor);
// d = 2 w (x - t) with w = g[i] (per_element) or g[0] / divisor; gx = d and
// gt = -d, either may be null.
void mse_loss_backward(DType dtype, int device, const void* x, const void* t, const void* g,
                       void* gx, void* gt, int64_t n, bool per_element, double divisor);

}  // namespace forge::cuda
