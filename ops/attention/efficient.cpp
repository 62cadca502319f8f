// efficient: Efficient Attention (Shen et al. 2018) as in the Linear Attention
// Transformer seed, one autograd op with a fused forward and backward.
//
//   q' = softmax over the d features of each query row, times c = d^-1/2
// Non-causal (M may differ from N):
//   k' = softmax over the keys j of each feature column (padding keys excluded;
//        a column with every key padded is 0),   o = q' (k'^T v)
// Causal, blind-spot buckets of s = bucket_size positions (N % s == 0):
//   k' = exp(k), zero on padding keys;  for a query in bucket u,
//   C = sum_j k'_j v_j^T [d, dv] and z = sum_j k'_j [d] over the keys of the
//   buckets before u (s == 1: over j <= i), o_i = (q'_i C) / max(q'_i . z, 1e-3)
// The causal form is a scan over buckets with the running state (C, z); its
// backward is a forward scan (dq needs the prefix states) and a reverse scan
// carrying the gradients of the states. The inputs are saved, and non-causal
// each head's C and key-softmax statistics ([d, dv] + 2 d); the feature maps
// are recomputed. Nothing of size N x M is ever held.
//
// On a GPU q' and k' [B*H, len, d] are computed in the accumulation type by
// fused kernels (linear_features_cuda.h: a softmax per row, per column, or
// exp) and the attention on them is the linear-family core
// (linear_core_cuda.h): non-causal un-normalised, causal with eps = 0 and the
// 1e-3 floor; the backward recomputes q', k', runs the core's backward and
// maps dq', dk' back through the feature maps.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "core/vmath.h"
#include "ops/attention/attention.h"
#include "ops/attention/cases.h"
#include "ops/attention/common.h"
#include "ops/attention/feature_attention.h"
#include "ops/blas.h"

namespace forge::ops::attention {

namespace {

// Rows per block (non-causal; causal, about as many).
constexpr int64_t kChunk = 64;
// The reference's floor on the causal denominator.
constexpr double kMinDenominator = 1e-3;

// p = softmax over the d features of each of `rows` rows of x [rows, d]
// (unscaled: the d^-1/2 goes into the GEMMs' alpha).
template <typename T>
void softmax_rows(const T* x, int64_t rows, int64_t d, T* p) {
  for (int64_t r = 0; r < rows; ++r) softmax_row(x + r * d, p + r * d, d);
}

// In the forward q' = c p with p = softmax_d(q); dq holds dq' on entry and
// leaves with dq = p * (c dq' - p . (c dq')).
template <typename T>
void softmax_rows_backward(const T* p, int64_t rows, int64_t d, T c, T* dq) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* pr = p + r * d;
    T* gr = dq + r * d;
    const T pg = dot(pr, gr, d);
    for (int64_t f = 0; f < d; ++f) gr[f] = c * pr[f] * (gr[f] - pg);
  }
}

struct Sizes {
  int64_t N, M, d, dv;
  int64_t s;       // rows per block: kChunk non-causal; causal, a multiple of the bucket size
  int64_t bucket;  // causal bucket size
  bool causal;
  bool intra;  // causal: a block sees part of itself (buckets of 1, or several per block)
};

// Per-thread scratch of one block: features, the state and its gradient.
template <typename T>
struct Scratch {
  std::vector<T> p, kp, num, gn, gx, den, a, g, C, z, R, r;
  explicit Scratch(const Sizes& s)
      : p(s.s * s.d),
        kp(s.s * s.d),
        num(s.s * s.dv),
        gn(s.s * s.dv),
        gx(s.s),
        den(s.s),
        a(s.intra ? s.s * s.s : 0),
        g(s.intra ? s.s * s.s : 0),
        C(s.d * s.dv),
        z(s.d),
        R(s.d * s.dv),
        r(s.d) {}
};

// ---- non-causal ----

// The saved state of one head [d * dv + 2 d]: C = k'^T v [d, dv], then
// colmax [d] and colinv [d] (below). The backward reads C and rebuilds k' from
// the statistics (one exp per entry of k) instead of recomputing C's GEMM.
inline int64_t state_size(const Sizes& s) {
  return s.d * s.dv + 2 * s.d;
}

// k' [rows, d] of a block of keys: exp(k - colmax) * colinv (unscaled without
// colinv), 0 on padding keys; colinv is 0 for a column with no real key.
template <typename T>
void key_features(const T* k, const uint8_t* keep, int64_t rows, const Sizes& s, const T* colmax,
                  const T* colinv, T* kp) {
  for (int64_t j = 0; j < rows; ++j) {
    T* kj = kp + j * s.d;
    if (keep != nullptr && !keep[j]) {
      std::fill(kj, kj + s.d, T(0));
      continue;
    }
    for (int64_t f = 0; f < s.d; ++f) kj[f] = exp_nonpos(k[j * s.d + f] - colmax[f]);
    if (colinv != nullptr)
      for (int64_t f = 0; f < s.d; ++f) kj[f] *= colinv[f];
  }
}

// The per-column statistics of the key softmax, colmax [d] (max over the real
// keys) and colinv [d] (1 / sum_j exp(k[j, f] - colmax[f]); 0 for a column
// with no real key), and C = k'^T v [d, dv], k' = exp(k - colmax) * colinv
// (padding keys 0, so their v never counts, as v = 0 there in the reference),
// into `state` (state_size). k [M, d], v [M, dv]. One exp per entry of k: a
// block of e = exp(k - colmax) [c, d] goes into C = diag(colinv) (e^T v).
template <typename T>
void key_context(const T* k, const T* v, const uint8_t* keep, const Sizes& s, Scratch<T>& w,
                 T* state) {
  T* C = state;
  T* colmax = state + s.d * s.dv;
  T* colinv = colmax + s.d;
  std::fill(colmax, colmax + s.d, -std::numeric_limits<T>::infinity());
  std::fill(colinv, colinv + s.d, T(0));
  // Four rows a pass: a pass loads and stores colmax once.
  const auto kept = [&](int64_t j) { return keep == nullptr || keep[j] != 0; };
  int64_t j = 0;
  for (; j + 4 <= s.M; j += 4) {
    if (!(kept(j) && kept(j + 1) && kept(j + 2) && kept(j + 3))) {
      for (int64_t r = j; r < j + 4; ++r)
        if (kept(r))
          for (int64_t f = 0; f < s.d; ++f)
            colmax[f] = k[r * s.d + f] > colmax[f] ? k[r * s.d + f] : colmax[f];
      continue;
    }
    const T *a = k + j * s.d, *b = a + s.d, *c = b + s.d, *e = c + s.d;
    for (int64_t f = 0; f < s.d; ++f) {
      const T ab = a[f] > b[f] ? a[f] : b[f];
      const T ce = c[f] > e[f] ? c[f] : e[f];
      const T m = ab > ce ? ab : ce;
      colmax[f] = m > colmax[f] ? m : colmax[f];
    }
  }
  for (; j < s.M; ++j)
    if (kept(j))
      for (int64_t f = 0; f < s.d; ++f)
        colmax[f] = k[j * s.d + f] > colmax[f] ? k[j * s.d + f] : colmax[f];
  std::fill(C, C + s.d * s.dv, T(0));
  for (int64_t j0 = 0; j0 < s.M; j0 += s.s) {
    const int64_t c = std::min(s.s, s.M - j0);
    key_features(k + j0 * s.d, keep ? keep + j0 : nullptr, c, s, colmax,
                 static_cast<const T*>(nullptr), w.kp.data());
    for (int64_t r = 0; r < c; ++r)
      for (int64_t f = 0; f < s.d; ++f) colinv[f] += w.kp[r * s.d + f];
    gemm(true, false, s.d, s.dv, c, T(1), w.kp.data(), s.d, v + j0 * s.dv, s.dv, T(1), C, s.dv);
  }
  for (int64_t f = 0; f < s.d; ++f) {
    colinv[f] = colinv[f] > 0 ? T(1) / colinv[f] : T(0);
    for (int64_t e = 0; e < s.dv; ++e) C[f * s.dv + e] *= colinv[f];
  }
}

template <typename T>
void noncausal_forward_bh(const T* q, const T* k, const T* v, const uint8_t* keep, const Sizes& s,
                          Scratch<T>& w, T* state, T* o) {
  const T c = T(1) / std::sqrt(static_cast<T>(s.d));
  key_context(k, v, keep, s, w, state);
  for (int64_t i0 = 0; i0 < s.N; i0 += s.s) {
    const int64_t rows = std::min(s.s, s.N - i0);
    softmax_rows(q + i0 * s.d, rows, s.d, w.p.data());
    gemm(false, false, rows, s.dv, s.d, c, w.p.data(), s.d, state, s.dv, T(0), o + i0 * s.dv, s.dv);
  }
}

template <typename T>
void noncausal_backward_bh(const T* q, const T* k, const T* v, const uint8_t* keep, const T* g,
                           const T* state, const Sizes& s, Scratch<T>& w, T* dq, T* dk, T* dv) {
  const T c = T(1) / std::sqrt(static_cast<T>(s.d));
  const T* C = state;
  const T* colmax = state + s.d * s.dv;
  const T* colinv = colmax + s.d;
  // In the forward o = q' C, so dq' = g C^T and R = dC = q'^T g (summed over queries).
  transpose(C, s.d, s.dv, w.C.data());  // C^T [dv, d]
  std::fill(w.R.begin(), w.R.end(), T(0));
  for (int64_t i0 = 0; i0 < s.N; i0 += s.s) {
    const int64_t rows = std::min(s.s, s.N - i0);
    softmax_rows(q + i0 * s.d, rows, s.d, w.p.data());
    T* dqc = dq + i0 * s.d;
    gemm(false, false, rows, s.d, s.dv, T(1), g + i0 * s.dv, s.dv, w.C.data(), s.d, T(0), dqc, s.d);
    softmax_rows_backward(w.p.data(), rows, s.d, c, dqc);
    gemm(true, false, s.d, s.dv, rows, c, w.p.data(), s.d, g + i0 * s.dv, s.dv, T(1), w.R.data(),
         s.dv);
  }
  // C = k'^T v: dk' = v dC^T and dv = k' dC. k' was a softmax over j per
  // column f, so dk[j, f] = k'[j, f] (dk'[j, f] - t_f) with
  // t_f = sum_j k'[j, f] dk'[j, f] = sum_e dC[f, e] C[f, e].
  for (int64_t f = 0; f < s.d; ++f) {
    T t = 0;
    for (int64_t e = 0; e < s.dv; ++e) t += w.R[f * s.dv + e] * C[f * s.dv + e];
    w.r[f] = t;
  }
  transpose(w.R.data(), s.d, s.dv, w.C.data());  // dC^T [dv, d]
  for (int64_t j0 = 0; j0 < s.M; j0 += s.s) {
    const int64_t rows = std::min(s.s, s.M - j0);
    key_features(k + j0 * s.d, keep ? keep + j0 : nullptr, rows, s, colmax, colinv, w.kp.data());
    T* dkc = dk + j0 * s.d;
    gemm(false, false, rows, s.d, s.dv, T(1), v + j0 * s.dv, s.dv, w.C.data(), s.d, T(0), dkc, s.d);
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t f = 0; f < s.d; ++f)
        dkc[j * s.d + f] = w.kp[j * s.d + f] * (dkc[j * s.d + f] - w.r[f]);
    gemm(false, false, rows, s.dv, s.d, T(1), w.kp.data(), s.d, w.R.data(), s.dv, T(0),
         dv + j0 * s.dv, s.dv);
  }
}

// ---- causal ----
// Rows go in blocks of s.s (a multiple of the bucket size): the state (C, z)
// holds the keys of the blocks before; inside a block query i sees key j when
// j is in an earlier bucket (bucket size 1: j <= i), a masked [rows, rows]
// product A (skipped when a block is one bucket: it sees nothing of itself).

// Zeroes the entries of a [rows, rows] block where query i does not see key j.
template <typename T>
void keep_visible(T* a, int64_t rows, int64_t bucket) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < rows; ++j)
      if (!(bucket == 1 ? j <= i : j / bucket < i / bucket)) a[i * rows + j] = 0;
}

// p = softmax_d(q) and k' = exp(k) (0 on padding keys) of a block of rows.
template <typename T>
void block_features(const T* q, const T* k, const uint8_t* keep, int64_t rows, const Sizes& s,
                    Scratch<T>& w) {
  softmax_rows(q, rows, s.d, w.p.data());
  vmath::exp(k, w.kp.data(), rows * s.d);  // glibc's vector math (core/vmath.h)
  for (int64_t j = 0; j < rows; ++j)
    if (keep != nullptr && !keep[j])
      std::fill(w.kp.data() + j * s.d, w.kp.data() + (j + 1) * s.d, T(0));
}

// num = q' C + A v [rows, dv] and den = x = q' . z + rowsum(A) [rows] of a
// block, with q' = c p and A = visible(q' k'^T) [rows, rows]. v [rows, dv].
template <typename T>
void block_outputs(const T* v, int64_t rows, const Sizes& s, T c, Scratch<T>& w) {
  gemm(false, false, rows, s.dv, s.d, c, w.p.data(), s.d, w.C.data(), s.dv, T(0), w.num.data(),
       s.dv);
  for (int64_t i = 0; i < rows; ++i) {
    T x = 0;
    for (int64_t f = 0; f < s.d; ++f) x += w.p[i * s.d + f] * w.z[f];
    w.den[i] = c * x;
  }
  if (!s.intra) return;
  gemm(false, true, rows, rows, s.d, c, w.p.data(), s.d, w.kp.data(), s.d, T(0), w.a.data(), rows);
  keep_visible(w.a.data(), rows, s.bucket);
  gemm(false, false, rows, s.dv, rows, T(1), w.a.data(), rows, v, s.dv, T(1), w.num.data(), s.dv);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < rows; ++j) w.den[i] += w.a[i * rows + j];
}

// C += k'^T v and z += colsum(k') for a block (k' in the scratch, v [rows, dv]).
template <typename T>
void add_block(const T* v, int64_t rows, const Sizes& s, Scratch<T>& w) {
  gemm(true, false, s.d, s.dv, rows, T(1), w.kp.data(), s.d, v, s.dv, T(1), w.C.data(), s.dv);
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t f = 0; f < s.d; ++f) w.z[f] += w.kp[j * s.d + f];
}

template <typename T>
void causal_forward_bh(const T* q, const T* k, const T* v, const uint8_t* keep, const Sizes& s,
                       Scratch<T>& w, T* o) {
  const T c = T(1) / std::sqrt(static_cast<T>(s.d));
  std::fill(w.C.begin(), w.C.end(), T(0));
  std::fill(w.z.begin(), w.z.end(), T(0));
  for (int64_t i0 = 0; i0 < s.N; i0 += s.s) {
    const int64_t rows = std::min(s.s, s.N - i0);
    block_features(q + i0 * s.d, k + i0 * s.d, keep ? keep + i0 : nullptr, rows, s, w);
    block_outputs(v + i0 * s.dv, rows, s, c, w);
    for (int64_t i = 0; i < rows; ++i) {
      const T inv = T(1) / std::max(w.den[i], static_cast<T>(kMinDenominator));
      for (int64_t e = 0; e < s.dv; ++e) o[(i0 + i) * s.dv + e] = w.num[i * s.dv + e] * inv;
    }
    add_block(v + i0 * s.dv, rows, s, w);
  }
}

// For the rows of a block with num and den = x in the scratch and g
// [rows, dv]: in the forward o = num / max(x, 1e-3), so gn = g / max(x, 1e-3)
// is the gradient of num and gx = -(g . o) / max(x, 1e-3) that of x where
// x > 1e-3 (0 where the floor held). den becomes max(x, 1e-3).
template <typename T>
void block_output_backward(const T* g, int64_t rows, const Sizes& s, Scratch<T>& w) {
  for (int64_t i = 0; i < rows; ++i) {
    const bool floored = !(w.den[i] > static_cast<T>(kMinDenominator));
    const T den = floored ? static_cast<T>(kMinDenominator) : w.den[i];
    const T inv = T(1) / den;
    T go = 0;
    for (int64_t e = 0; e < s.dv; ++e) {
      const T ge = g[i * s.dv + e];
      go += ge * w.num[i * s.dv + e] * inv;
      w.gn[i * s.dv + e] = ge * inv;
    }
    w.gx[i] = floored ? T(0) : -go * inv;
    w.den[i] = den;
  }
}

// G = visible(gn v^T + gx 1^T) [rows, rows]: the gradient of A (num had A v,
// x had rowsum(A)). v [rows, dv].
template <typename T>
void block_score_grad(const T* v, int64_t rows, const Sizes& s, Scratch<T>& w) {
  gemm(false, true, rows, rows, s.dv, T(1), w.gn.data(), s.dv, v, s.dv, T(0), w.g.data(), rows);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < rows; ++j) w.g[i * rows + j] += w.gx[i];
  keep_visible(w.g.data(), rows, s.bucket);
}

template <typename T>
void causal_backward_bh(const T* q, const T* k, const T* v, const uint8_t* keep, const T* g,
                        const Sizes& s, Scratch<T>& w, T* den_all, T* gx_all, T* dq, T* dk, T* dv) {
  const T c = T(1) / std::sqrt(static_cast<T>(s.d));
  // Pass 1 (forward scan, as the forward): num = q' C + A v and x = q' . z + rowsum(A)
  // with A = visible(q' k'^T), so dq' = gn C^T + gx z^T + G k'. The floored
  // denominators and gx are kept for pass 2.
  std::fill(w.C.begin(), w.C.end(), T(0));
  std::fill(w.z.begin(), w.z.end(), T(0));
  for (int64_t i0 = 0; i0 < s.N; i0 += s.s) {
    const int64_t rows = std::min(s.s, s.N - i0);
    const T* vb = v + i0 * s.dv;
    block_features(q + i0 * s.d, k + i0 * s.d, keep ? keep + i0 : nullptr, rows, s, w);
    block_outputs(vb, rows, s, c, w);
    block_output_backward(g + i0 * s.dv, rows, s, w);
    T* dqb = dq + i0 * s.d;
    gemm(false, true, rows, s.d, s.dv, T(1), w.gn.data(), s.dv, w.C.data(), s.dv, T(0), dqb, s.d);
    for (int64_t i = 0; i < rows; ++i) {
      den_all[i0 + i] = w.den[i];
      gx_all[i0 + i] = w.gx[i];
      for (int64_t f = 0; f < s.d; ++f) dqb[i * s.d + f] += w.gx[i] * w.z[f];
    }
    if (s.intra) {
      block_score_grad(vb, rows, s, w);
      gemm(false, false, rows, s.d, rows, T(1), w.g.data(), rows, w.kp.data(), s.d, T(1), dqb, s.d);
    }
    softmax_rows_backward(w.p.data(), rows, s.d, c, dqb);
    add_block(vb, rows, s, w);
  }
  // Pass 2 (reverse scan): R = dC = sum q'_i gn_i^T and r = dz = sum gx_i q'_i
  // over the queries of later blocks, which see every key of this block. C and
  // z summed k'_j v_j^T and k'_j, and A = visible(q' k'^T), so
  //   dk'_j = R v_j + r + (G^T q')_j,   dv_j = R^T k'_j + (A^T gn)_j,
  // and k' = exp(k) gives dk = k' dk' (0 on padding keys, where k' = 0).
  std::fill(w.R.begin(), w.R.end(), T(0));
  std::fill(w.r.begin(), w.r.end(), T(0));
  for (int64_t i0 = (s.N - 1) / s.s * s.s; i0 >= 0; i0 -= s.s) {
    const int64_t rows = std::min(s.s, s.N - i0);
    const T* vb = v + i0 * s.dv;
    block_features(q + i0 * s.d, k + i0 * s.d, keep ? keep + i0 : nullptr, rows, s, w);
    for (int64_t i = 0; i < rows; ++i) {
      const T inv = T(1) / den_all[i0 + i];
      for (int64_t e = 0; e < s.dv; ++e) w.gn[i * s.dv + e] = g[(i0 + i) * s.dv + e] * inv;
      w.gx[i] = gx_all[i0 + i];
    }
    T* dkb = dk + i0 * s.d;
    T* dvb = dv + i0 * s.dv;
    gemm(false, true, rows, s.d, s.dv, T(1), vb, s.dv, w.R.data(), s.dv, T(0), dkb, s.d);
    gemm(false, false, rows, s.dv, s.d, T(1), w.kp.data(), s.d, w.R.data(), s.dv, T(0), dvb, s.dv);
    if (s.intra) {
      gemm(false, true, rows, rows, s.d, c, w.p.data(), s.d, w.kp.data(), s.d, T(0), w.a.data(),
           rows);
      keep_visible(w.a.data(), rows, s.bucket);
      block_score_grad(vb, rows, s, w);
      gemm(true, false, rows, s.d, rows, c, w.g.data(), rows, w.p.data(), s.d, T(1), dkb, s.d);
      gemm(true, false, rows, s.dv, rows, T(1), w.a.data(), rows, w.gn.data(), s.dv, T(1), dvb,
           s.dv);
    }
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t f = 0; f < s.d; ++f)
        dkb[j * s.d + f] = w.kp[j * s.d + f] * (dkb[j * s.d + f] + w.r[f]);
    gemm(true, false, s.d, s.dv, rows, c, w.p.data(), s.d, w.gn.data(), s.dv, T(1), w.R.data(),
         s.dv);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t f = 0; f < s.d; ++f) w.r[f] += c * w.gx[i] * w.p[i * s.d + f];
  }
}

// ---- arguments of the GPU path (launched under FORGE_IF_CUDA in efficient()) ----

// o = q' (k'^T v) non-causal; causal, (q'_i C) / max(q'_i . z, 1e-3) over the
// keys of earlier buckets (j <= i for buckets of 1).
cuda::LinearCoreArgs core_args(const Dims4& dims, DType dtype, const EfficientOptions& options) {
  cuda::LinearCoreArgs a = core_sizes(dims, dims.d, dtype);
  a.causal = options.causal;
  a.bucket = options.causal ? options.bucket_size : 1;
  a.normalise = options.causal;
  a.eps = 0;
  if (options.causal) a.den_min = kMinDenominator;
  return a;
}

}  // namespace

Tensor efficient(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                 const EfficientOptions& options) {
  const Dims4 dims = check_qkv("efficient", q, k, v, key_padding_mask, options.causal, true);
  FORGE_CHECK(dims.d >= 1,
              "attention::efficient: q and k need at least one feature (d >= 1), got d = {}",
              dims.d);
  if (options.causal) {
    FORGE_CHECK(options.bucket_size >= 1,
                "attention::efficient: options.bucket_size must be >= 1, got {}",
                options.bucket_size);
    FORGE_CHECK(dims.N % options.bucket_size == 0,
                "attention::efficient: causal needs the length N = {} to be a multiple of "
                "options.bucket_size = {}; pad the sequence (with masked keys) or pick a bucket "
                "size that divides N",
                dims.N, options.bucket_size);
  }
  FORGE_IF_CUDA(q) {
    // The feature maps [B*H, len, d] in the accumulation type: q' = softmax_d(q)
    // d^-1/2; k' = exp(k) zeroed on padding (causal) or the masked softmax over
    // the keys of each column, whose statistics [2, B*H, d] its backward reuses.
    const FeatureMap column_softmax{
        [](const Tensor& x, const Tensor& mask, Tensor& stats) {
          Tensor f = Tensor::empty({x.size(0) * x.size(1), x.size(2), x.size(3)},
                                   feature_dtype(x.dtype()), x.device());
          stats = Tensor::empty({2, x.size(0) * x.size(1), x.size(3)}, f.dtype(), x.device());
          cuda::column_softmax_features(x.dtype(), feature_rows(x, mask), x.raw_device_data(),
                                        f.raw_device_data(), stats.raw_device_data(),
                                        x.device().index);
          return f;
        },
        [](const Tensor& x, const Tensor& mask, const Tensor& f, const Tensor& stats,
           const Tensor& df, const Tensor& dx) {
          cuda::column_softmax_features_backward(
              x.dtype(), feature_rows(x, mask), f.raw_device_data(), df.raw_device_data(),
              dx.raw_device_data(), stats.raw_device_data(), x.device().index);
        }};
    const FeatureMap keys = options.causal
                                ? row_feature_map(cuda::exp_features, cuda::exp_features_backward)
                                : column_softmax;
    return feature_attention_cuda(
        "attention::efficient", q, k, v, key_padding_mask, core_args(dims, q.dtype(), options),
        row_feature_map(cuda::row_softmax_features, cuda::row_softmax_features_backward), keys);
  }
  // Causal blocks: one bucket when buckets are large, else the multiple of the
  // bucket size nearest above kChunk rows.
  const int64_t bucket = options.bucket_size;
  const int64_t block = !options.causal    ? kChunk
                        : bucket >= kChunk ? bucket
                                           : (kChunk + bucket - 1) / bucket * bucket;
  const Sizes s{dims.N, dims.M, dims.d,         dims.dv,
                block,  bucket, options.causal, options.causal && (bucket == 1 || block > bucket)};
  const int64_t BH = dims.B * dims.H;
  const int64_t cost = (s.N + s.M) * s.d * (s.dv + 4);
  Tensor o = Tensor::empty({dims.B, dims.H, s.N, s.dv}, q.dtype());
  // Non-causal: each head's C and key-softmax statistics [BH, state_size] for the backward.
  Tensor state = s.causal ? Tensor() : Tensor::empty({BH, state_size(s)}, q.dtype());
  FORGE_DISPATCH_FLOAT(q.dtype(), "attention::efficient", [&] {
    scalar_t* op = o.data<scalar_t>();
    scalar_t* sp = s.causal ? nullptr : state.data<scalar_t>();
    parallel_for(BH, cost, [&](int64_t b0, int64_t b1) {
      Scratch<scalar_t> w(s);
      for (int64_t bh = b0; bh < b1; ++bh) {
        const auto h = head<scalar_t>(dims, bh, q, k, v, key_padding_mask);
        if (s.causal)
          causal_forward_bh(h.q, h.k, h.v, h.keep, s, w, op + bh * s.N * s.dv);
        else
          noncausal_forward_bh(h.q, h.k, h.v, h.keep, s, w, sp + bh * state_size(s),
                               op + bh * s.N * s.dv);
      }
    });
  });
  return autograd::record(
      "attention::efficient", {q, k, v}, o,
      [qs = q.detach(), ks = k.detach(), vs = v.detach(), ms = key_padding_mask, state, s, dims, BH,
       cost](const std::vector<Tensor>& grads) {
        const Tensor& g = grads[0];
        std::vector<Tensor> out = empty_grads(qs, ks, vs, g.dtype());
        FORGE_DISPATCH_FLOAT(g.dtype(), "attention::efficient backward", [&] {
          // Causal: the floored denominator and gx of every row, [BH, 2, N], from pass 1 for
          // pass 2.
          Tensor rows = s.causal ? Tensor::empty({BH, 2, s.N}, g.dtype()) : Tensor();
          scalar_t* rp = s.causal ? rows.data<scalar_t>() : nullptr;
          parallel_for(BH, 2 * cost, [&](int64_t b0, int64_t b1) {
            Scratch<scalar_t> w(s);
            for (int64_t bh = b0; bh < b1; ++bh) {
              const auto h = head<scalar_t>(dims, bh, qs, ks, vs, ms);
              const auto gh = head_grads<scalar_t>(dims, bh, g, out);
              if (s.causal)
                causal_backward_bh(h.q, h.k, h.v, h.keep, gh.g, s, w, rp + bh * 2 * s.N,
                                   rp + (bh * 2 + 1) * s.N, gh.dq, gh.dk, gh.dv);
              else
                noncausal_backward_bh(h.q, h.k, h.v, h.keep, gh.g,
                                      state.data<scalar_t>() + bh * state_size(s), s, w, gh.dq,
                                      gh.dk, gh.dv);
            }
          });
        });
        return out;
      });
}

namespace {

AttentionCase efficient_case(const std::string& name, int64_t N, int64_t M, bool masked,
                             bool causal, int64_t bucket_size, bool bench = false) {
  AttentionCase c =
      qkv_case("efficient/" + name, N, M, 21, masked ? kCasePad : std::vector<int64_t>{});
  c.fn = [=](const std::vector<Tensor>& in) {
    EfficientOptions options;
    options.causal = causal;
    options.bucket_size = bucket_size;
    return efficient(in[0], in[1], in[2], case_input(in, 3), options);
  };
  c.bench = bench;
  if (causal) c.length_multiple = bucket_size;
  return c;
}

}  // namespace

std::vector<AttentionCase> efficient_cases() {
  return {efficient_case("plain", 6, 6, false, false, 64, true),
          efficient_case("mask", 6, 6, true, false, 64),
          efficient_case("cross+mask", 5, 8, true, false, 64),
          efficient_case("causal", 7, 7, false, true, 1),
          efficient_case("causal+mask", 7, 7, true, true, 1),
          efficient_case("causal+buckets", 9, 9, false, true, 3),
          efficient_case("causal+buckets+mask", 9, 9, true, true, 3),
          // linear-attention-transformer's usual bucket (the benchmark's row), two of them.
          [] {
            AttentionCase c = efficient_case("causal+buckets64", 128, 128, false, true, 64, true);
            c.dims.B = c.dims.H = 1;
            return c;
          }()};
}

}  // namespace forge::ops::attention
