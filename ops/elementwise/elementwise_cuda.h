// The CUDA launchers of the elementwise ops (defined in elementwise_cuda.cu,
// only in builds with CUDA; elementwise.cpp and unary.cpp call them under
// FORGE_IF_CUDA).
// Pointers are device pointers of contiguous tensors of `dtype` (f32, f64,
// bf16, f16) on CUDA device `device`; masks are one byte per element (bool or
// u8, true when non-zero). Kernels compute in f32 (f64 for f64) and round once.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace forge::cuda {

// Most dims a broadcast may have after merging neighbours.
constexpr int kMaxElementwiseDims = 8;

// How K operands are read while walking an output of `ndim` dims: element
// strides per operand, 0 where it is broadcast. ndim 1 is the flat case (every
// operand full-size with stride 1, or one element with stride 0).
template <int K>
struct Broadcast {
  int ndim = 0;
  int64_t sizes[kMaxElementwiseDims] = {};
  int64_t strides[K][kMaxElementwiseDims] = {};
};

enum class BinaryOp { add, sub, mul, div };

// y = f(x) with up to two parameters: pow (p0 exponent), clamp (p0 lo, p1 hi),
// elu (p0 alpha), add_scalar / mul_scalar (p0 the scalar).
enum class UnaryOp {
  neg,
  exp,
  log,
  sqrt,
  rsqrt,
  pow,
  abs,
  square,
  clamp,
  relu,
  gelu,
  gelu_tanh,
  elu,
  silu,
  sigmoid,
  tanh,
  add_scalar,
  mul_scalar
};

// The derivative of a unary op, dx = g * f'(s), where s is the saved input x
// or, for the *_of_y ones, the saved output y. Parameters: pow (p0 exponent,
// p1 exponent - 1), clamp (p0 lo, p1 hi), elu (p0 alpha).
enum class UnaryGrad {
  exp_of_y,
  log,
  sqrt_of_y,
  rsqrt_of_y,
  pow,
  abs,
  square,
  clamp,
  relu,
  gelu,
  gelu_tanh,
  elu,
  silu,
  sigmoid_of_y,
  tanh_of_y
};

// out = a op b over the broadcast `b2` (operand 0 is a, 1 is b); n = numel(out).
void binary(BinaryOp op, DType dtype, const void* a, const void* b, void* out, int64_t n,
            const Broadcast<2>& b2, int device);

// y[i] = f(x[i]) over n elements.
void unary(UnaryOp op, double p0, double p1, DType dtype, const void* x, void* y, int64_t n,
           int device);

// dx[i] = g[i] * f'(s[i]) over n elements.
void unary_backward(UnaryGrad grad, double p0, double p1, DType dtype, const void* g, const void* s,
                    void* dx, int64_t n, int device);

// out = x broadcast over `b1`; n = numel(out).
void expand(DType dtype, const void* x, void* out, int64_t n, const Broadcast<1>& b1, int device);


// out = cond ? a : b over the broadcast `b3` (operands cond, a, b); n = numel(out).
void where(DType dtype, const uint8_t* cond, const void* a, const void* b, void* out, int64_t n,
           const Broadcast<3>& b3, int device);

// out = mask ? value : x over `b2` (operands x, mask); n = numel(x).
void masked_fill(DType dtype, const void* x, const uint8_t* mask, double value, void* out,
                 int64_t n, const Broadcast<2>& b2, int device);

}  // namespace forge::cuda
