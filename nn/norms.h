// Normalisation and residual-scaling layers of the reference transformers
// (performer-pytorch's ScaleNorm, ReZero) and linear-attention-transformer's
// token shift, under the references' parameter names.
#pragma once

#include <vector>

#include "nn/module.h"

namespace forge::nn {

// x (..., D) -> x / max(||x||_2 over D, eps) * g; parameter "g" (1) = 1.
class ScaleNorm : public Module {
 public:
  explicit ScaleNorm(double eps = 1e-5, DType dtype = DType::f32);
  Tensor forward(const Tensor& x);

  double eps;
  Tensor g;
};

// y -> y * g with parameter "g" (1) = 0: a residual branch starts switched off.
// The block applies it to its sublayer's output.
class ReZero : public Module {
 public:
  explicit ReZero(DType dtype = DType::f32);
  Tensor forward(const Tensor& y);

  Tensor g;
};

// PreShiftTokens of linear-attention-transformer, without parameters: the last
// dim of x (B, N, D) is cut into len(shifts) segments of D / len(shifts)
// features (any remainder stays as it is, at the end) and segment s moves
// shifts[s] positions along N (positive: later, out[:, i] = in[:, i - shift]),
// zeros shifted in. A shift of 0 leaves its segment untouched.
class TokenShift : public Module {
 public:
  explicit TokenShift(std::vector<int64_t> shifts);
  // mask (B, N) bool/u8 or undefined: in the segments that move, positions
  // where it is false are zeroed before the shift (padding does not leak in).
  Tensor forward(const Tensor& x, const Tensor& mask = Tensor());

  // (1, 0, -1), or (1, 0) when causal (no look-ahead).
  static std::vector<int64_t> default_shifts(bool causal);

  std::vector<int64_t> shifts;
};

}  // namespace forge::nn
