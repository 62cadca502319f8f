// Recurrent decoding for the causal linear mechanisms: MultiHeadAttention::step
// consumes one token and keeps O(F dv) state per head, so generating a token
// costs the same at position 10 and at position 10^5. Each update below is the
// causal formula of ATTENTION.md restricted to the newest query, with the sums
// over j <= i kept as running state:
//   linear:    S += phi(k) v^T, z += phi(k);  o = phi(q) S / (phi(q) . z + eps)
//   efficient: the same with k' = exp(k), q' = softmax_d(q) d^-1/2 and the
//              denominator max(q' . z, 1e-3); with buckets of s > 1 a key joins
//              (S, z) only when its bucket is complete (the blind spot).
//   favor:     relu / no_projection as linear (normaliser + 1e-6 sum(phi(q)));
//              the softmax kernel keeps S, z relative to the running key maximum
//              M (prefix stabiliser) and rescales them by exp(M_old - M_new).
// Tests compare every step with the full causal op (tests/nn/test_attention_module.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/attention.h"
#include "ops/ops.h"

namespace forge::nn {

namespace att = ops::attention;

namespace {

// Feature maps of one row x [d] into y [F].
template <typename T>
void elu1(const T* x, int64_t d, T* y) {
  for (int64_t e = 0; e < d; ++e) y[e] = x[e] > 0 ? x[e] + 1 : std::exp(x[e]);
}
template <typename T>
void softmax_row(const T* x, int64_t d, T scale, T* y) {
  const T mx = *std::max_element(x, x + d);
  T sum = 0;
  for (int64_t e = 0; e < d; ++e) sum += (y[e] = std::exp(x[e] - mx));
  for (int64_t e = 0; e < d; ++e) y[e] *= scale / sum;
}
// y [F] = (c x) W^T with W [F, d].
template <typename T>
void project_row(const T* x, const T* W, int64_t F, int64_t d, T c, T* y) {
  for (int64_t f = 0; f < F; ++f) {
    T s = 0;
    for (int64_t e = 0; e < d; ++e) s += x[e] * W[f * d + e];
    y[f] = c * s;
  }
}

// S [F, dv] += g v^T; z [F] += g.
template <typename T>
void accumulate(const T* g, const T* v, int64_t F, int64_t dv, T* S, T* z) {
  for (int64_t f = 0; f < F; ++f) {
    for (int64_t c = 0; c < dv; ++c) S[f * dv + c] += g[f] * v[c];
    z[f] += g[f];
  }
}

// o [dv] = y S (unnormalised); returns y . z.
template <typename T>
T read(const T* y, const T* S, const T* z, int64_t F, int64_t dv, T* o) {
  std::fill(o, o + dv, T(0));
  T yz = 0;
  for (int64_t f = 0; f < F; ++f) {
    for (int64_t c = 0; c < dv; ++c) o[c] += y[f] * S[f * dv + c];
    yz += y[f] * z[f];
  }
  return yz;
}

}  // namespace

bool MultiHeadAttention::supports_recurrent() const {
  if (cross || !config.causal || config.n_local_heads > 0) return false;
  switch (config.kind) {
    case Mechanism::linear:
    case Mechanism::efficient:
      return true;
    case Mechanism::favor:
      // The global stabiliser takes a max over every key, later ones included.
      return config.favor_kernel != att::FavorKernel::softmax ||
             config.favor_stabilizer == att::FavorStabilizer::prefix;
    default:
      return false;
  }
}

Tensor MultiHeadAttention::step(const Tensor& x, AttentionState& st) {
  FORGE_CHECK(supports_recurrent(),
              "MultiHeadAttention::step: recurrent decoding needs causal self-attention with "
              "linear, efficient or favor (prefix stabiliser) on every head; this layer is {}{}{}",
              config.causal ? "causal " : "non-causal ", mechanism_name(config.kind),
              config.n_local_heads > 0 ? " with local heads" : "");
  FORGE_CHECK(x.dim() == 3 && x.size(1) == 1 && x.size(2) == config.dim,
              "MultiHeadAttention::step: expected one token (B, 1, {}), got {}", config.dim,
              shape_str(x.shape()));
  NoGradGuard no_grad;
  const int64_t B = x.size(0), H = config.heads, d = config.resolved_head_dim(), dv = d;
  const bool favor = config.kind == Mechanism::favor;
  const bool softmax_kernel = favor && config.favor_kernel == att::FavorKernel::softmax;
  const bool projected = favor && config.favor_kernel != att::FavorKernel::no_projection;
  const int64_t F = projected ? projection_matrix.size(0) : d;
  const DType dt = x.dtype();
  if (!st.S.defined()) {
    st.S = Tensor::zeros({B, H, F, dv}, dt);
    st.z = Tensor::zeros({B, H, F}, dt);
    st.S_bucket = Tensor::zeros({B, H, F, dv}, dt);
    st.z_bucket = Tensor::zeros({B, H, F}, dt);
    st.k_max = Tensor::full({B, H}, -std::numeric_limits<double>::infinity(), dt);
    st.v_sum = Tensor::zeros({B, H, dv}, dt);
    st.count = Tensor::zeros({B, H}, dt);
  }
  FORGE_CHECK(st.S.size(0) == B, "MultiHeadAttention::step: the state holds batch {}, x has {}",
              st.S.size(0), B);
  Projected p = project(x, Tensor(), Tensor(), Tensor(), st.pos, 0, H);  // (B, H, 1, d)
  Tensor o = Tensor::empty({B, H, 1, dv}, dt);
  const int64_t s = config.bucket_size, pos = st.pos;
  FORGE_DISPATCH_FLOAT(dt, "MultiHeadAttention::step", [&] {
    using T = scalar_t;
    const T* W = projected ? projection_matrix.data<T>() : nullptr;
    const T c = static_cast<T>(std::pow(static_cast<double>(d), -0.25));
    const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(F)));
    std::vector<T> fq(static_cast<size_t>(F)), fk(static_cast<size_t>(F));
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const T* q = p.q.data<T>() + bh * d;
      const T* k = p.k.data<T>() + bh * d;
      const T* v = p.v.data<T>() + bh * dv;
      T* S = st.S.data<T>() + bh * F * dv;
      T* z = st.z.data<T>() + bh * F;
      T* out = o.data<T>() + bh * dv;
      if (config.kind == Mechanism::linear) {
        elu1(q, d, fq.data());
        elu1(k, d, fk.data());
        accumulate(fk.data(), v, F, dv, S, z);
        const T den = read(fq.data(), S, z, F, dv, out) + static_cast<T>(config.linear_eps);
        for (int64_t e = 0; e < dv; ++e) out[e] /= den;
      } else if (config.kind == Mechanism::efficient) {
        softmax_row(q, d, static_cast<T>(1.0 / std::sqrt(static_cast<double>(d))), fq.data());
        for (int64_t e = 0; e < d; ++e) fk[e] = std::exp(k[e]);
        T* Sb = st.S_bucket.data<T>() + bh * F * dv;
        T* zb = st.z_bucket.data<T>() + bh * F;
        if (s == 1) {
          accumulate(fk.data(), v, F, dv, S, z);
        } else if (pos % s == 0) {  // a bucket just completed: it becomes visible
          for (int64_t t = 0; t < F * dv; ++t) S[t] += std::exchange(Sb[t], T(0));
          for (int64_t f = 0; f < F; ++f) z[f] += std::exchange(zb[f], T(0));
        }
        const T den = std::max(read(fq.data(), S, z, F, dv, out), static_cast<T>(1e-3));
        for (int64_t e = 0; e < dv; ++e) out[e] /= den;
        if (s > 1) accumulate(fk.data(), v, F, dv, Sb, zb);
      } else if (!softmax_kernel) {  // favor relu / no_projection
        if (projected) {
          project_row(q, W, F, d, c, fq.data());
          project_row(k, W, F, d, c, fk.data());
          for (int64_t f = 0; f < F; ++f) {
            fq[f] = std::max(fq[f], T(0)) + static_cast<T>(1e-3);
            fk[f] = std::max(fk[f], T(0)) + static_cast<T>(1e-3);
          }
        } else {
          softmax_row(q, d, T(1), fq.data());
          for (int64_t e = 0; e < d; ++e) fk[e] = std::exp(k[e]);
        }
        accumulate(fk.data(), v, F, dv, S, z);
        const T ysum = std::accumulate(fq.begin(), fq.end(), T(0));
        const T den = read(fq.data(), S, z, F, dv, out) + static_cast<T>(1e-6) * ysum;
        for (int64_t e = 0; e < dv; ++e) out[e] /= den;
      } else {  // favor softmax kernel, prefix stabiliser
        const T eps = static_cast<T>(1e-4);
        T qq = 0, kk = 0;
        for (int64_t e = 0; e < d; ++e) {
          qq += q[e] * q[e];
          kk += k[e] * k[e];
        }
        project_row(q, W, F, d, c, fq.data());
        const T qshift = qq * c * c / 2 + *std::max_element(fq.begin(), fq.end());
        for (int64_t f = 0; f < F; ++f) fq[f] = r * (std::exp(fq[f] - qshift) + eps);
        project_row(k, W, F, d, c, fk.data());
        T& M = st.k_max.data<T>()[bh];
        const T M_new = std::max(M, *std::max_element(fk.begin(), fk.end()));
        const T scale = std::exp(M - M_new);  // 0 before the first key (M = -inf)
        for (int64_t t = 0; t < F * dv; ++t) S[t] *= scale;
        for (int64_t f = 0; f < F; ++f) z[f] *= scale;
        M = M_new;
        for (int64_t f = 0; f < F; ++f) fk[f] = std::exp(fk[f] - kk * c * c / 2 - M);
        accumulate(fk.data(), v, F, dv, S, z);
        T* vs = st.v_sum.data<T>() + bh * dv;
        T& n = st.count.data<T>()[bh];
        for (int64_t e = 0; e < dv; ++e) vs[e] += v[e];
        n += 1;
        // S_total = r S + r eps 1 v_sum^T, z_total = r z + r eps n (+ 1e-6 causal).
        const T ysum = std::accumulate(fq.begin(), fq.end(), T(0));
        const T yz = read(fq.data(), S, z, F, dv, out);
        const T den = r * yz + (r * eps * n + static_cast<T>(1e-6)) * ysum;
        for (int64_t e = 0; e < dv; ++e) out[e] = (r * out[e] + r * eps * ysum * vs[e]) / den;
      }
    }
  });
  st.pos += 1;
  return merge(o);
}

}  // namespace forge::nn
