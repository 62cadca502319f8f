// Matrix products on OpenBLAS (f32 and f64). a is (..., n, k) or, with
// trans_a, (..., k, n); b is (..., k, m) or, with trans_b, (..., m, k); the
// batch dims broadcast; the result is (..., n, m).
#pragma once

#include "core/tensor.h"

namespace forge::ops {

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// x (..., in) W^T + b: weight (out, in), bias (out) or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace forge::ops
