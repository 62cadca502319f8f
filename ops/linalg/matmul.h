// Matrix products: OpenBLAS on the CPU (f32, f64), cuBLAS on a GPU (f32, f64,
// bf16, f16, summed in f32 / f64). a is (..., n, k) or, with trans_a,
// (..., k, n); b is (..., k, m) or, with trans_b, (..., m, k); the batch dims
// broadcast; the result is (..., n, m). Under autocast (ops/autocast.h) f32 GPU
// operands are multiplied as bf16 / f16 copies and the result is f32.
#pragma once

#include "core/tensor.h"

namespace forge::ops {

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// x (..., in) W^T + b: weight (out, in), bias (out) or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// Whether f32 products on a GPU (matmul, linear, patch_embed) may use TF32
// tensor cores: inputs rounded to 10 mantissa bits, sums still in f32, several
// times faster. Off by default, so that f32 on the GPU matches the CPU to f32
// rounding; process-wide.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace forge::ops
