// FAVOR+'s CPU feature maps (internal), for favor.cpp's forward and backward
// passes: the reference's constants, the op's dims and per-thread scratch,
// phi(q), the key features g with their stabilisers and (alpha, beta), and
// the backward through a projected map. The math is in favor.cpp's header
// comment; W, the projection the maps multiply by, is made by
// gaussian_orthogonal_random_matrix (favor_features.cpp). Not for use outside
// ops/attention/favor*.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/vmath.h"
#include "ops/attention/attention.h"
#include "ops/attention/common.h"
#include "ops/attention/favor_cuda.h"
#include "ops/blas.h"

namespace forge::ops::attention::favor_detail {

constexpr double kSoftmaxEps = cuda::kFavorSoftmaxEps;  // the softmax kernel's kernel_epsilon
constexpr double kReluEps = cuda::kFavorReluEps;        // the generalized kernel's kernel_epsilon
constexpr double kCausalEps = cuda::kFavorCausalEps;    // on every entry of the causal normaliser
// Positions per chunk of the causal scan: the [L, L] intra-chunk blocks and the
// [F, dv] state updates are GEMMs.
constexpr int64_t kChunk = 64;

struct FavorDims {
  Dims4 s;
  int64_t F = 0;  // feature count: m, or d for no_projection
  FavorOptions opt;
};

// Rows per block of the non-causal projected kernels (favor.cpp's blocked_*_bh).
constexpr int64_t kRows = 128;

// Non-causal softmax and relu kernels run in blocks of kRows queries or keys,
// so that their features stay in cache ([kRows, F] buffers instead of [N, F]);
// no_projection's key softmax over all j and the causal scan keep whole-length
// features.
inline bool blocked(const FavorDims& f) {
  return !f.opt.causal && f.opt.kernel != FavorKernel::no_projection;
}

// Per-thread buffers for one (b, h); allocated once per parallel chunk through
// the tensor allocator so that the peak-memory counter sees them.
template <typename T>
struct Scratch {
  Tensor buf;
  T* qf;   // [N, F]  phi(q)
  T* qx;   // [N, F]  q' (its own buffer for the relu kernel, whose backward needs the
           //          pre-activation; else it is qf, the exp written in place)
  T* g;    // [M, F]  g_j
  T* kx;   // [M, F]  k' (as qx: its own buffer for relu, else g)
  T* mk;   // [M]     M_j
  T* S;    // [F, dv]
  T* z;    // [F]
  T* vs;   // [dv]
  T* dqf;  // [N, F]
  T* dg;   // [M, F]
  T* dn;   // [N, dv] d(numerator)
  T* dd;   // [N]     d(denominator)
  T* P;    // [kChunk, kChunk] causal intra-chunk weights
  T* D;    // [kChunk, kChunk] their backward counterpart
  T* tmp;  // [kChunk, max(F, dv)]
  T* ST;   // [dv, F]  blocked: S^T or dS^T
  // Blocked (non-causal projected kernels): N and M rows become kRows.
  explicit Scratch(const FavorDims& f, bool backward) {
    const Dims4& s = f.s;
    const int64_t F = f.F;
    const bool relu = f.opt.kernel == FavorKernel::relu;
    const bool b = blocked(f);
    const int64_t N = b ? std::min(kRows, s.N) : s.N, M = b ? std::min(kRows, s.M) : s.M;
    const int64_t sizes[] = {N * F,
                             relu ? N * F : 0,
                             M * F,
                             relu ? M * F : 0,
                             b ? 0 : M,
                             F * s.dv,
                             F,
                             s.dv,
                             backward ? N * F : 0,
                             backward ? M * F : 0,
                             backward ? N * s.dv : 0,
                             backward ? N : 0,
                             b ? 0 : kChunk * kChunk,
                             b ? 0 : kChunk * kChunk,
                             b ? 0 : kChunk * std::max(F, s.dv),
                             b && backward ? F * s.dv : 0};
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    buf = Tensor::empty({total}, dtype_of<T>());
    T* p = buf.data<T>();
    T** slots[] = {&qf, &qx, &g, &kx, &mk, &S, &z, &vs, &dqf, &dg, &dn, &dd, &P, &D, &tmp, &ST};
    for (int i = 0; i < 16; ++i) {
      *slots[i] = p;
      p += sizes[i];
    }
    if (!relu) {  // the softmax kernel's exp runs in place over k' and q'
      qx = qf;
      kx = g;
    }
  }
};

// phi(q) of N rows: q [N, d], W [m, d] -> qf [N, F] (and q' in qx; qx may be qf).
template <typename T>
void query_features(const FavorDims& f, int64_t N, const T* q, const T* W, T* qx, T* qf) {
  const int64_t d = f.s.d, F = f.F;
  const T c = static_cast<T>(std::pow(static_cast<double>(d), -0.25));
  if (f.opt.kernel == FavorKernel::no_projection) {
    for (int64_t i = 0; i < N; ++i) {  // softmax over the d features of each row
      softmax_row(q + i * d, qf + i * F, d);
    }
    return;
  }
  gemm(false, true, N, F, d, c, q, W, T(0), qx);  // q' = (c q) W^T
  if (f.opt.kernel == FavorKernel::relu) {
    for (int64_t t = 0; t < N * F; ++t) qf[t] = std::max(qx[t], T(0)) + static_cast<T>(kReluEps);
    return;
  }
  const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(F)));
  for (int64_t i = 0; i < N; ++i) {
    const T* x = q + i * d;
    const T* xp = qx + i * F;
    T* y = qf + i * F;
    const T sq = dot(x, x, d);
    const T shift = sq * c * c / 2 + max_of(xp, F);  // diag(q_i) + stop-grad row max
    for (int64_t e = 0; e < F; ++e) y[e] = xp[e] - shift;
    vmath::exp(y, y, F);  // glibc's vector math (core/vmath.h)
    for (int64_t e = 0; e < F; ++e) y[e] = r * (y[e] + static_cast<T>(kSoftmaxEps));
  }
}

// g and M_j for one (b, h): k [M, d] -> g [M, F], mk [M]; returns (alpha, beta).
template <typename T>
std::pair<T, T> key_features(const FavorDims& f, const T* k, const T* W, const uint8_t* mask,
                             Scratch<T>& w) {
  const int64_t M = f.s.M, d = f.s.d, F = f.F;
  const bool causal = f.opt.causal;
  std::fill(w.mk, w.mk + M, T(0));
  if (f.opt.kernel == FavorKernel::no_projection) {
    // Causal: phi(k) = exp(k) as the reference does (a softmax over the whole
    // sequence would let later keys change earlier outputs); else softmax over j.
    if (causal) {
      vmath::exp(k, w.g, M * F);
      for (int64_t j = 0; j < M; ++j)
        if (mask && !mask[j]) std::fill(w.g + j * F, w.g + (j + 1) * F, T(0));
      return {T(1), T(0)};
    }
    for (int64_t e = 0; e < F; ++e) {
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < M; ++j)
        if (!mask || mask[j]) mx = std::max(mx, k[j * F + e]);
      T sum = 0;
      for (int64_t j = 0; j < M; ++j)
        if (!mask || mask[j]) sum += (w.g[j * F + e] = std::exp(k[j * F + e] - mx));
      for (int64_t j = 0; j < M; ++j)
        w.g[j * F + e] = (!mask || mask[j]) ? w.g[j * F + e] / sum : T(0);
    }
    return {T(1), T(0)};
  }
  const T c = static_cast<T>(std::pow(static_cast<double>(d), -0.25));
  gemm(false, true, M, F, d, c, k, W, T(0), w.kx);  // k' = (c k) W^T
  if (f.opt.kernel == FavorKernel::relu) {
    for (int64_t j = 0; j < M; ++j) {  // row by row: no division per element
      T* y = w.g + j * F;
      const T* xp = w.kx + j * F;
      if (mask && !mask[j])
        std::fill(y, y + F, T(0));
      else
        for (int64_t e = 0; e < F; ++e) y[e] = std::max(xp[e], T(0)) + static_cast<T>(kReluEps);
    }
    return {T(1), T(0)};
  }
  // Softmax kernel. The stabiliser is over real keys only; prefix: running max.
  const bool prefix = causal && f.opt.stabilizer == FavorStabilizer::prefix;
  const T ninf = -std::numeric_limits<T>::infinity();
  T run = ninf;
  for (int64_t j = 0; j < M; ++j) {
    if (!mask || mask[j]) run = std::max(run, *std::max_element(w.kx + j * F, w.kx + (j + 1) * F));
    w.mk[j] = run;
  }
  if (!prefix) std::fill(w.mk, w.mk + M, run == ninf ? T(0) : run);
  for (int64_t j = 0; j < M; ++j) {
    T* y = w.g + j * F;
    if (mask && !mask[j]) {
      std::fill(y, y + F, T(0));
      continue;
    }
    const T* x = k + j * d;
    const T* xp = w.kx + j * F;
    const T sq = dot(x, x, d);
    const T shift = sq * c * c / 2 + w.mk[j];
    for (int64_t e = 0; e < F; ++e) y[e] = xp[e] - shift;
    vmath::exp(y, y, F);
  }
  const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(F)));
  return {r, r * static_cast<T>(kSoftmaxEps)};
}

// Back through a projected feature map, rows x [R, d] -> x' = (c x) W^T [R, F]:
// on entry dxp holds the gradient of the features. relu kernel: phi = relu(x')
// + 1e-3, so d(x') = d(phi) where x' > 0. softmax kernel: phi = s (exp(x' -
// diag(x) - max) + const), whose derivative in x' is `expd` = s exp(...) and
// in diag(x) = c^2 |x|^2 / 2 minus the sum of those (the max is stop-grad).
// Writes gx [R, d] = c d(x') W + d(diag) c^2 x.
template <typename T>
void projected_features_backward(const FavorDims& f, int64_t R, const T* x, const T* xp,
                                 const T* expd, T expd_offset, const T* W, T* dxp, T* gx) {
  const int64_t d = f.s.d, F = f.F;
  const T c = static_cast<T>(std::pow(static_cast<double>(d), -0.25));
  std::vector<T> ddiag(static_cast<size_t>(R), T(0));
  for (int64_t i = 0; i < R; ++i)
    for (int64_t e = 0; e < F; ++e) {
      const int64_t t = i * F + e;
      if (f.opt.kernel == FavorKernel::relu) {
        dxp[t] = xp[t] > 0 ? dxp[t] : T(0);
      } else {
        dxp[t] *= expd[t] + expd_offset;
        ddiag[static_cast<size_t>(i)] -= dxp[t];
      }
    }
  gemm(false, false, R, d, F, c, dxp, W, T(0), gx);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t e = 0; e < d; ++e)
      gx[i * d + e] += ddiag[static_cast<size_t>(i)] * c * c * x[i * d + e];
}

// (alpha, beta) of phi(k) = alpha g + beta: the softmax kernel's g lacks its
// r = F^-1/2 and r eps; relu's g is phi(k) itself.
template <typename T>
std::pair<T, T> key_coefficients(const FavorDims& f) {
  if (f.opt.kernel != FavorKernel::softmax) return {T(1), T(0)};
  const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(f.F)));
  return {r, r * static_cast<T>(kSoftmaxEps)};
}

// g [R, F] of R keys from their projection kx = (c k) W^T [R, F]: relu(kx) +
// eps, or exp(kx - diag(k) - M) for the softmax kernel (g may be kx); 0 on
// padding keys (keep[j] == 0; keep may be null).
template <typename T>
void key_block_features(const FavorDims& f, int64_t R, const T* k, const uint8_t* keep, T M,
                        const T* kx, T* g) {
  const int64_t d = f.s.d, F = f.F;
  const T c = static_cast<T>(std::pow(static_cast<double>(d), -0.25));
  for (int64_t j = 0; j < R; ++j) {
    T* y = g + j * F;
    const T* xp = kx + j * F;
    if (keep && !keep[j]) {
      std::fill(y, y + F, T(0));
    } else if (f.opt.kernel == FavorKernel::relu) {
      for (int64_t e = 0; e < F; ++e) y[e] = std::max(xp[e], T(0)) + static_cast<T>(kReluEps);
    } else {
      const T shift = dot(k + j * d, k + j * d, d) * c * c / 2 + M;
      for (int64_t e = 0; e < F; ++e) y[e] = xp[e] - shift;
      vmath::exp(y, y, F);
    }
  }
}

}  // namespace forge::ops::attention::favor_detail
