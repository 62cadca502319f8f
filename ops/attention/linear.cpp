// linear: the elu(x) + 1 feature-map attention of Katharopoulos et al. 2020
// ("Transformers are RNNs"), one autograd op with a fused forward and backward.
//
//   phi(x) = elu(x) + 1;   phi(k)[j] = 0 where the key is padding
//   o_i = phi(q_i) S / (phi(q_i) . z + eps),   S = sum_j phi(k_j) v_j^T [d, dv],
//                                               z = sum_j phi(k_j)        [d]
// with the sums over every key (non-causal, M may differ from N) or over
// j <= i (causal). The causal form is a prefix scan over chunks of kChunk
// positions: inside a chunk a small masked [c, c] product, across chunks the
// running state (S, z). The backward recomputes the feature maps (non-causal,
// it reads S, z and o saved by the forward); its causal
// form is a forward scan (for dq, which needs the prefix states) and a reverse
// scan carrying the gradient states (R, r) = sum over later queries. Nothing
// of size N x M or N x d x dv is ever held.
//
// On a GPU the feature maps phi(q), phi(k) [B*H, len, d] are computed in the
// accumulation type by a fused kernel (linear_features_cuda.h) and the
// attention on them is the linear-family core (linear_core_cuda.h: fused
// reductions non-causal, a chunkwise scan causal); the backward recomputes the
// feature maps, runs the core's backward and maps dphi back through phi'.

#include <algorithm>
#include <atomic>
#include <cmath>
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

constexpr int64_t kChunk = 64;

// phi(x) = elu(x) + 1 of `rows` rows of x [rows, d], zeroed on rows whose
// keep byte is 0 (keep may be null: every row is kept). exp(min(x, 0)) runs
// over the whole block in glibc's vector math (core/vmath.h), then x > 0 picks x + 1.
template <typename T>
void feature_map(const T* x, int64_t rows, int64_t d, const uint8_t* keep, T* out) {
  const int64_t n = rows * d;
  for (int64_t i = 0; i < n; ++i) out[i] = std::min(x[i], T(0));
  vmath::exp(out, out, n);
  for (int64_t r = 0; r < rows; ++r) {
    const T on = (keep == nullptr || keep[r]) ? T(1) : T(0);
    for (int64_t f = 0; f < d; ++f) {
      const T v = x[r * d + f];
      out[r * d + f] = on * (v > 0 ? v + T(1) : out[r * d + f]);
    }
  }
}

// g [rows, d] *= phi'(x), read off phi = feature_map(x) itself: phi'(x) =
// exp(x) = phi(x) for x <= 0 and 1 for x > 0, and 0 on rows not kept (where
// phi is 0), so the backward recomputes no exp.
template <typename T>
void feature_map_backward(const T* x, const T* phi, int64_t rows, int64_t d, T* g) {
  const int64_t n = rows * d;
  for (int64_t i = 0; i < n; ++i) g[i] *= x[i] > 0 ? (phi[i] > 0 ? T(1) : T(0)) : phi[i];
}

// z += the column sums of a [rows, d].
template <typename T>
void add_colsum(const T* a, int64_t rows, int64_t d, T* z) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t f = 0; f < d; ++f) z[f] += a[r * d + f];
}

// Zeroes the strict upper triangle (j > i) of a [c, c] block: causal inside a chunk.
template <typename T>
void keep_lower(T* a, int64_t c) {
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = i + 1; j < c; ++j) a[i * c + j] = 0;
}

struct Sizes {
  int64_t N, M, d, dv;
  double eps;
};

// Per-thread scratch of one chunk: features, products and the states.
template <typename T>
struct Scratch {
  std::vector<T> qp, kp, a, g, num, gn, gd, den, S, z, R, r;
  explicit Scratch(const Sizes& s)
      : qp(kChunk * s.d),
        kp(kChunk * s.d),
        a(kChunk * kChunk),
        g(kChunk * kChunk),
        num(kChunk * s.dv),
        gn(kChunk * s.dv),
        gd(kChunk),
        den(kChunk),
        S(s.d * s.dv),
        z(s.d),
        R(s.d * s.dv),
        r(s.d) {}
};

// S = sum_j phi(k_j) v_j^T, z = sum_j phi(k_j) over every key of one batch-head.
// k [M, d], v [M, dv].
template <typename T>
void key_states(const T* k, const T* v, const uint8_t* keep, const Sizes& s, Scratch<T>& w) {
  std::fill(w.S.begin(), w.S.end(), T(0));
  std::fill(w.z.begin(), w.z.end(), T(0));
  for (int64_t j0 = 0; j0 < s.M; j0 += kChunk) {
    const int64_t c = std::min(kChunk, s.M - j0);
    feature_map(k + j0 * s.d, c, s.d, keep ? keep + j0 : nullptr, w.kp.data());
    gemm(true, false, s.d, s.dv, c, T(1), w.kp.data(), s.d, v + j0 * s.dv, s.dv, T(1), w.S.data(),
         s.dv);
    add_colsum(w.kp.data(), c, s.d, w.z.data());
  }
}

// The key states of one batch-head saved by the non-causal forward: S [d, dv], z [d].
int64_t state_size(const Sizes& s) {
  return s.d * s.dv + s.d;
}

// One chunk [i0, i0 + c) of the causal scan, with (w.S, w.z) the states of
// the chunks before it: phi(q), phi(k) of the chunk into w.qp, w.kp,
// A = tril(phi(q) phi(k)^T) [c, c] (j <= i inside the chunk) into w.a,
// num = phi(q) S + A v into num [c, dv] and den = phi(q) . z + rowsum(A) + eps
// into w.den. The forward and the backward's rebuild both run it.
template <typename T>
void causal_chunk(const T* q, const T* k, const T* v, const uint8_t* keep, int64_t i0, int64_t c,
                  const Sizes& s, Scratch<T>& w, T* num) {
  const T* vc = v + i0 * s.dv;
  feature_map(q + i0 * s.d, c, s.d, nullptr, w.qp.data());
  feature_map(k + i0 * s.d, c, s.d, keep ? keep + i0 : nullptr, w.kp.data());
  gemm(false, true, c, c, s.d, T(1), w.qp.data(), s.d, w.kp.data(), s.d, T(0), w.a.data(), c);
  keep_lower(w.a.data(), c);
  gemm(false, false, c, s.dv, s.d, T(1), w.qp.data(), s.d, w.S.data(), s.dv, T(0), num, s.dv);
  gemm(false, false, c, s.dv, c, T(1), w.a.data(), c, vc, s.dv, T(1), num, s.dv);
  for (int64_t i = 0; i < c; ++i) {
    T den = dot(w.qp.data() + i * s.d, w.z.data(), s.d) + static_cast<T>(s.eps);
    for (int64_t j = 0; j <= i; ++j) den += w.a[i * c + j];
    w.den[i] = den;
  }
}

// After causal_chunk: the chunk's keys join the states, S += phi(k)^T v, z += colsum phi(k).
template <typename T>
void add_chunk_to_states(const T* v, int64_t i0, int64_t c, const Sizes& s, Scratch<T>& w) {
  gemm(true, false, s.d, s.dv, c, T(1), w.kp.data(), s.d, v + i0 * s.dv, s.dv, T(1), w.S.data(),
       s.dv);
  add_colsum(w.kp.data(), c, s.d, w.z.data());
}

// One batch-head of the forward. q [N, d], k [M, d], v [M, dv] -> o [N, dv];
// non-causal, S and z into state (state_size).
template <typename T>
void linear_forward_bh(const T* q, const T* k, const T* v, const uint8_t* keep, bool causal,
                       const Sizes& s, Scratch<T>& w, T* state, T* o) {
  const T eps = static_cast<T>(s.eps);
  if (!causal) {
    key_states(k, v, keep, s, w);
    std::copy(w.z.begin(), w.z.end(), std::copy(w.S.begin(), w.S.end(), state));
    for (int64_t i0 = 0; i0 < s.N; i0 += kChunk) {
      const int64_t c = std::min(kChunk, s.N - i0);
      feature_map(q + i0 * s.d, c, s.d, nullptr, w.qp.data());
      T* oc = o + i0 * s.dv;
      gemm(false, false, c, s.dv, s.d, T(1), w.qp.data(), s.d, w.S.data(), s.dv, T(0), oc, s.dv);
      for (int64_t i = 0; i < c; ++i) {
        const T inv = T(1) / (dot(w.qp.data() + i * s.d, w.z.data(), s.d) + eps);
        for (int64_t e = 0; e < s.dv; ++e) oc[i * s.dv + e] *= inv;
      }
    }
    return;
  }
  // Causal scan: (S, z) hold the sums over the chunks before this one.
  std::fill(w.S.begin(), w.S.end(), T(0));
  std::fill(w.z.begin(), w.z.end(), T(0));
  for (int64_t i0 = 0; i0 < s.N; i0 += kChunk) {
    const int64_t c = std::min(kChunk, s.N - i0);
    T* oc = o + i0 * s.dv;
    causal_chunk(q, k, v, keep, i0, c, s, w, oc);
    for (int64_t i = 0; i < c; ++i)
      for (int64_t e = 0; e < s.dv; ++e) oc[i * s.dv + e] /= w.den[i];
    add_chunk_to_states(v, i0, c, s, w);
  }
}

// For the c queries of a chunk whose numerators (num [c, dv]) and denominators
// (den [c]) are in the scratch, with g [c, dv] the output gradient: in the
// forward o = num / den, so gn = g / den is the gradient of num and
// gd = -(g . o) / den that of den.
template <typename T>
void output_backward(const T* g, int64_t c, const Sizes& s, Scratch<T>& w) {
  for (int64_t i = 0; i < c; ++i) {
    const T inv = T(1) / w.den[i];
    // dot in vectors: a sum fused into the loop below would add in order.
    w.gd[i] = -dot(g + i * s.dv, w.num.data() + i * s.dv, s.dv) * inv * inv;
    for (int64_t e = 0; e < s.dv; ++e) w.gn[i * s.dv + e] = g[i * s.dv + e] * inv;
  }
}

// One batch-head of the backward: dq [N, d], dk [M, d], dv [M, dv] from g [N, dv];
// non-causal with the forward's state and output o [N, dv].
template <typename T>
void linear_backward_bh(const T* q, const T* k, const T* v, const uint8_t* keep, const T* g,
                        bool causal, const Sizes& s, Scratch<T>& w, const T* state, const T* o,
                        T* den_all, T* gd_all, T* dq, T* dk, T* dv) {
  const T eps = static_cast<T>(s.eps);
  std::fill(w.R.begin(), w.R.end(), T(0));
  std::fill(w.r.begin(), w.r.end(), T(0));
  if (!causal) {
    // In the forward o = num / den with num = phi(q) S and den = phi(q) . z + eps,
    // so gn = g / den and gd = -(g . o) / den are their gradients (o saved: no
    // GEMM rebuilds num); d phi(q) = gn S^T + gd z^T, and R = sum_i phi(q_i) gn_i^T,
    // r = sum_i gd_i phi(q_i) are the gradients of S and z. The GEMMs take S^T
    // and R^T (in w.S) untransposed.
    const T* S = state;
    const T* z = state + s.d * s.dv;
    transpose(S, s.d, s.dv, w.S.data());
    for (int64_t i0 = 0; i0 < s.N; i0 += kChunk) {
      const int64_t c = std::min(kChunk, s.N - i0);
      feature_map(q + i0 * s.d, c, s.d, nullptr, w.qp.data());
      const T* gc = g + i0 * s.dv;
      for (int64_t i = 0; i < c; ++i) {
        const T inv = T(1) / (dot(w.qp.data() + i * s.d, z, s.d) + eps);
        w.gd[i] = -dot(gc + i * s.dv, o + (i0 + i) * s.dv, s.dv) * inv;
        for (int64_t e = 0; e < s.dv; ++e) w.gn[i * s.dv + e] = gc[i * s.dv + e] * inv;
      }
      T* dqc = dq + i0 * s.d;
      gemm(false, false, c, s.d, s.dv, T(1), w.gn.data(), s.dv, w.S.data(), s.d, T(0), dqc, s.d);
      for (int64_t i = 0; i < c; ++i)
        for (int64_t f = 0; f < s.d; ++f) dqc[i * s.d + f] += w.gd[i] * z[f];
      feature_map_backward(q + i0 * s.d, w.qp.data(), c, s.d, dqc);
      gemm(true, false, s.d, s.dv, c, T(1), w.qp.data(), s.d, w.gn.data(), s.dv, T(1), w.R.data(),
           s.dv);
      for (int64_t i = 0; i < c; ++i)
        for (int64_t f = 0; f < s.d; ++f) w.r[f] += w.gd[i] * w.qp[i * s.d + f];
    }
    // S and z summed phi(k_j) v_j^T and phi(k_j): d phi(k_j) = R v_j + r, dv_j = R^T phi(k_j).
    transpose(w.R.data(), s.d, s.dv, w.S.data());
    for (int64_t j0 = 0; j0 < s.M; j0 += kChunk) {
      const int64_t c = std::min(kChunk, s.M - j0);
      const uint8_t* kc = keep ? keep + j0 : nullptr;
      feature_map(k + j0 * s.d, c, s.d, kc, w.kp.data());
      T* dkc = dk + j0 * s.d;
      gemm(false, false, c, s.d, s.dv, T(1), v + j0 * s.dv, s.dv, w.S.data(), s.d, T(0), dkc, s.d);
      for (int64_t j = 0; j < c; ++j)
        for (int64_t f = 0; f < s.d; ++f) dkc[j * s.d + f] += w.r[f];
      feature_map_backward(k + j0 * s.d, w.kp.data(), c, s.d, dkc);
      gemm(false, false, c, s.dv, s.d, T(1), w.kp.data(), s.d, w.R.data(), s.dv, T(0),
           dv + j0 * s.dv, s.dv);
    }
    return;
  }
  // Causal, pass 1 (forward scan, as the forward): rebuild num and den of each
  // chunk from the prefix state (S, z); the forward had
  //   num = phi(q) S + A v,  den = phi(q) . z + rowsum(A) + eps,  A = tril(phi(q) phi(k)^T),
  // so d phi(q) = gn S^T + gd z^T + G phi(k) with G = tril(gn v^T + gd 1^T) [c, c].
  // den and gd of every row are kept for pass 2.
  std::fill(w.S.begin(), w.S.end(), T(0));
  std::fill(w.z.begin(), w.z.end(), T(0));
  for (int64_t i0 = 0; i0 < s.N; i0 += kChunk) {
    const int64_t c = std::min(kChunk, s.N - i0);
    const T* vc = v + i0 * s.dv;
    causal_chunk(q, k, v, keep, i0, c, s, w, w.num.data());
    output_backward(g + i0 * s.dv, c, s, w);
    for (int64_t i = 0; i < c; ++i) {
      den_all[i0 + i] = w.den[i];
      gd_all[i0 + i] = w.gd[i];
    }
    gemm(false, true, c, c, s.dv, T(1), w.gn.data(), s.dv, vc, s.dv, T(0), w.g.data(), c);
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j <= i; ++j) w.g[i * c + j] += w.gd[i];
    keep_lower(w.g.data(), c);
    T* dqc = dq + i0 * s.d;
    gemm(false, true, c, s.d, s.dv, T(1), w.gn.data(), s.dv, w.S.data(), s.dv, T(0), dqc, s.d);
    gemm(false, false, c, s.d, c, T(1), w.g.data(), c, w.kp.data(), s.d, T(1), dqc, s.d);
    for (int64_t i = 0; i < c; ++i)
      for (int64_t f = 0; f < s.d; ++f) dqc[i * s.d + f] += w.gd[i] * w.z[f];
    feature_map_backward(q + i0 * s.d, w.qp.data(), c, s.d, dqc);
    add_chunk_to_states(v, i0, c, s, w);
  }
  // Pass 2 (reverse scan): (R, r) = the gradients of the states, summed over the
  // queries of later chunks: R = sum phi(q_i) gn_i^T, r = sum gd_i phi(q_i).
  // A key j fed S and z of every query i >= j, so
  //   d phi(k_j) = R v_j + r + (G^T phi(q))_j,   dv_j = R^T phi(k_j) + (A^T gn)_j.
  const int64_t last = (s.N - 1) / kChunk * kChunk;
  for (int64_t i0 = last; i0 >= 0; i0 -= kChunk) {
    const int64_t c = std::min(kChunk, s.N - i0);
    const T* vc = v + i0 * s.dv;
    const T* gc = g + i0 * s.dv;
    const uint8_t* kc = keep ? keep + i0 : nullptr;
    feature_map(q + i0 * s.d, c, s.d, nullptr, w.qp.data());
    feature_map(k + i0 * s.d, c, s.d, kc, w.kp.data());
    for (int64_t i = 0; i < c; ++i) {
      const T inv = T(1) / den_all[i0 + i];
      for (int64_t e = 0; e < s.dv; ++e) w.gn[i * s.dv + e] = gc[i * s.dv + e] * inv;
      w.gd[i] = gd_all[i0 + i];
    }
    gemm(false, true, c, c, s.d, T(1), w.qp.data(), s.d, w.kp.data(), s.d, T(0), w.a.data(), c);
    keep_lower(w.a.data(), c);
    gemm(false, true, c, c, s.dv, T(1), w.gn.data(), s.dv, vc, s.dv, T(0), w.g.data(), c);
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j <= i; ++j) w.g[i * c + j] += w.gd[i];
    keep_lower(w.g.data(), c);
    T* dkc = dk + i0 * s.d;
    gemm(false, true, c, s.d, s.dv, T(1), vc, s.dv, w.R.data(), s.dv, T(0), dkc, s.d);
    gemm(true, false, c, s.d, c, T(1), w.g.data(), c, w.qp.data(), s.d, T(1), dkc, s.d);
    for (int64_t j = 0; j < c; ++j)
      for (int64_t f = 0; f < s.d; ++f) dkc[j * s.d + f] += w.r[f];
    feature_map_backward(k + i0 * s.d, w.kp.data(), c, s.d, dkc);
    T* dvc = dv + i0 * s.dv;
    gemm(false, false, c, s.dv, s.d, T(1), w.kp.data(), s.d, w.R.data(), s.dv, T(0), dvc, s.dv);
    gemm(true, false, c, s.dv, c, T(1), w.a.data(), c, w.gn.data(), s.dv, T(1), dvc, s.dv);
    gemm(true, false, s.d, s.dv, c, T(1), w.qp.data(), s.d, w.gn.data(), s.dv, T(1), w.R.data(),
         s.dv);
    for (int64_t i = 0; i < c; ++i)
      for (int64_t f = 0; f < s.d; ++f) w.r[f] += w.gd[i] * w.qp[i * s.d + f];
  }
}

// ---- arguments of the GPU path (launched under FORGE_IF_CUDA in linear()) ----

cuda::LinearCoreArgs core_args(const Dims4& dims, DType dtype, const LinearOptions& options) {
  cuda::LinearCoreArgs a = core_sizes(dims, dims.d, dtype);
  a.causal = options.causal;
  a.eps = options.eps;
  return a;
}

}  // namespace

namespace {
std::atomic<cuda::LinearEngine> g_linear_engine{cuda::LinearEngine::fma};
}  // namespace

void set_linear_engine(cuda::LinearEngine engine) {
  g_linear_engine.store(engine);
}

cuda::LinearEngine linear_engine() {
  return g_linear_engine.load();
}

Tensor linear(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
              const LinearOptions& options) {
  const Dims4 dims = check_qkv("linear", q, k, v, key_padding_mask, options.causal, true);
  FORGE_CHECK(std::isfinite(options.eps) && options.eps >= 0,
              "attention::linear: options.eps must be a finite number >= 0, got {}", options.eps);
  FORGE_IF_CUDA(q) {
    // phi(x) = elu(x) + 1 [B*H, len, d], zero on the rows the mask pads.
    // The tensor-core core applies it as it stages q and k (FusedMap).
    FeatureMap elu = row_feature_map(cuda::elu_features, cuda::elu_features_backward);
    elu.fused = cuda::FusedMap::elu_plus_one;
    return feature_attention_cuda("attention::linear", q, k, v, key_padding_mask,
                                  core_args(dims, q.dtype(), options), elu, elu);
  }
  const Sizes s{dims.N, dims.M, dims.d, dims.dv, options.eps};
  const int64_t BH = dims.B * dims.H;
  const bool causal = options.causal;
  const int64_t cost = (s.N + s.M) * (s.d * s.dv + (causal ? kChunk * (s.d + s.dv) : 0));
  Tensor o = Tensor::empty({dims.B, dims.H, s.N, s.dv}, q.dtype());
  // Non-causal: each batch-head's S and z [BH, state_size] for the backward.
  Tensor state = causal ? Tensor() : Tensor::empty({BH, state_size(s)}, q.dtype());
  FORGE_DISPATCH_FLOAT(q.dtype(), "attention::linear", [&] {
    scalar_t* op = o.data<scalar_t>();
    scalar_t* sp = causal ? nullptr : state.data<scalar_t>();
    parallel_for(BH, cost, [&](int64_t b0, int64_t b1) {
      Scratch<scalar_t> w(s);
      for (int64_t bh = b0; bh < b1; ++bh) {
        const auto h = head<scalar_t>(dims, bh, q, k, v, key_padding_mask);
        linear_forward_bh(h.q, h.k, h.v, h.keep, causal, s, w,
                          sp ? sp + bh * state_size(s) : nullptr, op + bh * s.N * s.dv);
      }
    });
  });
  return autograd::record(
      "attention::linear", {q, k, v}, o,
      [qs = q.detach(), ks = k.detach(), vs = v.detach(), ms = key_padding_mask, state,
       os = causal ? Tensor() : o.detach(), s, dims, BH, causal,
       cost](const std::vector<Tensor>& grads) {
        const Tensor& g = grads[0];
        std::vector<Tensor> out = empty_grads(qs, ks, vs, g.dtype());
        FORGE_DISPATCH_FLOAT(g.dtype(), "attention::linear backward", [&] {
          // Causal: the denominator and gd of every row, [BH, 2, N], from pass 1 for pass 2.
          Tensor rows = causal ? Tensor::empty({BH, 2, s.N}, g.dtype()) : Tensor();
          scalar_t* rp = causal ? rows.data<scalar_t>() : nullptr;
          const scalar_t* sp = causal ? nullptr : state.data<scalar_t>();
          const scalar_t* op = causal ? nullptr : os.data<scalar_t>();
          parallel_for(BH, 2 * cost, [&](int64_t b0, int64_t b1) {
            Scratch<scalar_t> w(s);
            for (int64_t bh = b0; bh < b1; ++bh) {
              const auto h = head<scalar_t>(dims, bh, qs, ks, vs, ms);
              const auto gh = head_grads<scalar_t>(dims, bh, g, out);
              linear_backward_bh(
                  h.q, h.k, h.v, h.keep, gh.g, causal, s, w, sp ? sp + bh * state_size(s) : nullptr,
                  op ? op + bh * s.N * s.dv : nullptr, causal ? rp + bh * 2 * s.N : nullptr,
                  causal ? rp + (bh * 2 + 1) * s.N : nullptr, gh.dq, gh.dk, gh.dv);
            }
          });
        });
        return out;
      });
}

namespace {

AttentionCase linear_case(const std::string& name, int64_t N, int64_t M, bool masked, bool causal,
                          bool bench = false) {
  AttentionCase c =
      qkv_case("linear/" + name, N, M, 11, masked ? kCasePad : std::vector<int64_t>{});
  c.fn = [=](const std::vector<Tensor>& in) {
    LinearOptions options;
    options.causal = causal;
    return linear(in[0], in[1], in[2], case_input(in, 3), options);
  };
  c.bench = bench;
  return c;
}

}  // namespace

std::vector<AttentionCase> linear_cases() {
  return {linear_case("plain", 6, 6, false, false, true), linear_case("mask", 6, 6, true, false),
          linear_case("cross+mask", 5, 8, true, false),
          linear_case("causal", 7, 7, false, true, true),
          linear_case("causal+mask", 7, 7, true, true)};
}

}  // namespace forge::ops::attention
