// Shared argument checks and shape bookkeeping of the attention ops, and the
// CPU kernels' row helpers (exp of shifted scores, row softmax, dot, bf16
// operands) (internal).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/tensor.h"

namespace forge::ops::attention {

// exp(x) for x <= 0 (a shifted score, S - row max or S - L: at most rounding
// above 0; -inf for a masked entry gives 0), one call per element, for the CPU
// kernels' innermost loops (softmax, local, Linformer, efficient, FAVOR+). f64 keeps std::exp,
// which gradcheck and the 1e-10 reference comparisons rely on. f32 uses a form the compiler
// vectorises: x = n ln2 + r with n = round(x / ln2) (by the 1.5 * 2^23 shift, which also leaves n
// in the low mantissa bits, so no float-to-int conversion stops the vectoriser), exp(r) by the
// Cephes expf polynomial (relative error below 2e-7), times 2^n built in the exponent bits; below
// -87 it gives 0.
inline double exp_nonpos(double x) {
  return std::exp(x);
}
inline float exp_nonpos(float x) {
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  const float xc = std::max(x, -87.0f);  // 2^n stays a normal float
  const float t = xc * 1.44269504f + kShift;
  const float n = t - kShift;
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift);
  const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float two_n = std::bit_cast<float>((ni + 127) << 23);
  return x < -87.0f ? 0.0f : p * two_n;
}

// sum_i a[i] b[i], in vectors (omp simd: the lanes' partial sums, then theirs).
template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// max_i x[i] (-inf for n = 0; NaN entries are skipped), in vectors. Written
// as a comparison: GCC vectorises std::max only under -ffinite-math-only and
// -fno-signed-zeros, and left the rows' maxima scalar (6% of Efficient
// Attention's time at N = 4096).
template <typename T>
inline T max_of(const T* x, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

// y [cols, rows] = x^T, x [rows, cols]. The CPU kernels transpose a head's
// [d, dv] state once so that their per-block GEMMs take it untransposed:
// OpenBLAS's small kernel for a transposed B operand is 25% slower at 64^3.
template <typename T>
inline void transpose(const T* x, int64_t rows, int64_t cols, T* y) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[c * rows + r] = x[r * cols + c];
}

// y = softmax(x) over one row of n (y may alias x): the max, the exps and the
// sum as separate loops, each in vectors (a sum fused into the exp loop keeps
// the compiler to scalar code). With `lse`, also *lse = log sum exp(x).
template <typename T>
inline void softmax_row(const T* x, T* y, int64_t n, T* lse = nullptr) {
  const T mx = max_of(x, n);
  for (int64_t i = 0; i < n; ++i) y[i] = exp_nonpos(x[i] - mx);
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += y[i];
  const T inv = T(1) / sum;
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  if (lse) *lse = mx + std::log(sum);
}

// bf16 tiles on the CPU (softmax and local attention under bf16 autocast):
// the kernels are templates over In, the type their GEMMs multiply (the
// accumulation type T, or BF16), and T. Below kMinBf16Keys keys per tile a
// oneDNN call costs more than the tile's product saves, so the kernels stay
// in T there.
constexpr int64_t kMinBf16Keys = 128;

// x [n] as a GEMM operand of type In: x itself when In is T, else its values
// rounded to bf16 in `low`.
template <typename In, typename T>
const In* operand(const T* x, int64_t n, std::vector<In>& low) {
  if constexpr (std::is_same_v<In, T>) {
    return x;
  } else {
    low.resize(static_cast<size_t>(n));
    for (int64_t e = 0; e < n; ++e) low[static_cast<size_t>(e)] = BF16{float_to_bf16_bits(x[e])};
    return low.data();
  }
}

// An operand element in the accumulation type.
template <typename T>
T widen(T x) {
  return x;
}
inline float widen(BF16 x) {
  return bf16_bits_to_float(static_cast<uint16_t>(x));
}

// The operands of a CPU kernel whose tiles hold `keys` keys: bf16 copies of
// q, k, v under bf16 autocast (f32 inputs) with keys >= kMinBf16Keys (low is
// true; the kernel runs with In = BF16), else q, k, v themselves, detached.
struct CpuOperands {
  Tensor q, k, v;
  bool low = false;
};
CpuOperands cpu_operands(const Tensor& q, const Tensor& k, const Tensor& v, int64_t keys);

struct Dims4 {
  int64_t B = 0, H = 0, N = 0, M = 0, d = 0, dv = 0;
};

// Checks q [B,H,N,d], k [B,H,M,d], v [B,H,M,dv], the optional mask [B,M]
// (bool/u8), one floating dtype (f32/f64; also bf16/f16 on a GPU) and one
// device -- the CPU unless `cuda_ok` -- and N == M when `self_only`; every
// error names the op, the argument, expected and found.
Dims4 check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& key_padding_mask, bool self_only, bool cuda_ok = false);

// The mask's bytes (1 = real token), or null when there is no mask.
const uint8_t* mask_bytes(const Tensor& key_padding_mask);

// Batch-head bh's slices of a CPU kernel's operands, T their element type:
// q [N, d], k [M, d], v [M, dv] of q [B, H, N, d], k [B, H, M, d],
// v [B, H, M, dv], and keep, the row [M] of the key padding mask [B, M]
// (null: no mask).
template <typename T>
struct Head {
  const T *q, *k, *v;
  const uint8_t* keep;
};
template <typename T>
Head<T> head(const Dims4& s, int64_t bh, const Tensor& q, const Tensor& k, const Tensor& v,
             const Tensor& key_padding_mask) {
  const uint8_t* mask = mask_bytes(key_padding_mask);
  return {q.data<T>() + bh * s.N * s.d, k.data<T>() + bh * s.M * s.d, v.data<T>() + bh * s.M * s.dv,
          mask ? mask + bh / s.H * s.M : nullptr};
}

// The backward's: dq, dk, dv, uninitialised, shaped as q, k, v in `dtype`
// (what the backward returns), and batch-head bh's slices of them and of
// g = dL/do [B, H, N, dv].
inline std::vector<Tensor> empty_grads(const Tensor& q, const Tensor& k, const Tensor& v,
                                       DType dtype) {
  return {Tensor::empty(q.shape(), dtype), Tensor::empty(k.shape(), dtype),
          Tensor::empty(v.shape(), dtype)};
}
template <typename T>
struct HeadGrads {
  const T* g;
  T *dq, *dk, *dv;
};
template <typename T>
HeadGrads<T> head_grads(const Dims4& s, int64_t bh, const Tensor& g,
                        const std::vector<Tensor>& grads) {
  return {g.data<T>() + bh * s.N * s.dv, grads[0].data<T>() + bh * s.N * s.d,
          grads[1].data<T>() + bh * s.M * s.d, grads[2].data<T>() + bh * s.M * s.dv};
}

}  // namespace forge::ops::attention
