// Incremental decoding for causal self-attention: MultiHeadAttention::step
// consumes tokens into an AttentionState, so a new token never re-runs the
// prefix. Each group of heads (the local heads, the global ones) keeps the
// state of its mechanism, and each update is the causal formula of
// ATTENTION.md for the newest query i with what it needs of j <= i kept:
//   softmax, local: a KVCache; the query attends to the cached keys it sees
//              (local: windows i / w - look_backward .. i / w, so the cache
//              holds (look_backward + 1) w keys), S = scale q k^T (local:
//              d^-1/2), softmax, P v. O(i) per token (local: O(w)).
//   linear:    S += phi(k) v^T, z += phi(k);  o = phi(q) S / (phi(q) . z + eps)
//   efficient: the same with k' = exp(k), q' = softmax_d(q) d^-1/2 and the
//              denominator max(q' . z, 1e-3); with buckets of s > 1 a key joins
//              (S, z) only when its bucket is complete (the blind spot).
//   favor:     relu / no_projection as linear (normaliser + 1e-6 sum(phi(q)));
//              the softmax kernel keeps S, z relative to the running key maximum
//              M (prefix stabiliser) and rescales them by exp(M_old - M_new).
// The linear mechanisms cost O(1) per token. A prompt (n > 1 tokens) gets its
// outputs from the forward's own op and only fills the state.
// Tests: tests/nn/test_attention_module.cpp, tests/nn/test_generation.cpp.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/threading.h"
#include "nn/attention.h"
#include "ops/blas.h"
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
T read_sums(const T* y, const T* S, const T* z, int64_t F, int64_t dv, T* o) {
  std::fill(o, o + dv, T(0));
  T yz = 0;
  for (int64_t f = 0; f < F; ++f) {
    for (int64_t c = 0; c < dv; ++c) o[c] += y[f] * S[f * dv + c];
    yz += y[f] * z[f];
  }
  return yz;
}

// Writes k, v (B, h, n, d) of positions pos.. into the cache: with band > 0
// its last `band` positions (key j in row j % band); with band = 0 all of
// them, doubling the capacity when it is full.
template <typename T>
void cache_append(KVCache& c, const Tensor& k, const Tensor& v, int64_t pos, int64_t band) {
  const int64_t BH = k.size(0) * k.size(1), n = k.size(2), d = k.size(3), dv = v.size(3);
  const int64_t C = c.k.defined() ? c.k.size(2) : 0;
  FORGE_CHECK(C == 0 || c.k.size(0) == k.size(0),
              "MultiHeadAttention::step: the state holds batch {}, x has {}", c.k.size(0),
              k.size(0));
  const int64_t need = band > 0 ? band : pos + n;
  if (C < need) {
    const int64_t grown =
        band > 0 ? band
                 : std::max<int64_t>(16, static_cast<int64_t>(std::bit_ceil(uint64_t(need))));
    // Rows are written before any query reads them.
    KVCache g{Tensor::empty({k.size(0), k.size(1), grown, d}, k.dtype()),
              Tensor::empty({k.size(0), k.size(1), grown, dv}, v.dtype())};
    // Only softmax grows a filled cache, and it never wraps: rows [0, C) stay.
    for (int64_t bh = 0; C > 0 && bh < BH; ++bh) {
      std::copy_n(c.k.data<T>() + bh * C * d, C * d, g.k.data<T>() + bh * grown * d);
      std::copy_n(c.v.data<T>() + bh * C * dv, C * dv, g.v.data<T>() + bh * grown * dv);
    }
    c = std::move(g);
  }
  const int64_t cap = c.k.size(2);
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t j = std::max(pos, pos + n - cap); j < pos + n; ++j) {
      std::copy_n(k.data<T>() + (bh * n + j - pos) * d, d,
                  c.k.data<T>() + (bh * cap + j % cap) * d);
      std::copy_n(v.data<T>() + (bh * n + j - pos) * dv, dv,
                  c.v.data<T>() + (bh * cap + j % cap) * dv);
    }
}

// o (B, h, 1, dv) of query q (B, h, 1, d) at position i over the cached keys
// j0..i: softmax_j(scale q k_j) v_j. The rows j0 % C .. i % C are at most two
// contiguous runs (the ring wraps once).
template <typename T>
Tensor cache_attend(const KVCache& c, const Tensor& q, int64_t j0, int64_t i, double scale) {
  const int64_t BH = q.size(0) * q.size(1), d = q.size(3), dv = c.v.size(3), C = c.k.size(2);
  const int64_t n = i + 1 - j0;
  Tensor o = Tensor::zeros({q.size(0), q.size(1), 1, dv}, q.dtype());
  parallel_for(BH, n * (d + dv), [&](int64_t begin, int64_t end) {
    std::vector<T> s(static_cast<size_t>(n));
    for (int64_t bh = begin; bh < end; ++bh) {
      const T* K = c.k.data<T>() + bh * C * d;
      const T* V = c.v.data<T>() + bh * C * dv;
      T* out = o.data<T>() + bh * dv;
      const auto runs = [&](auto&& fn) {  // fn(first key, its row, run length)
        for (int64_t j = j0; j <= i;) {
          const int64_t r = j % C, len = std::min(i + 1 - j, C - r);
          fn(j, r, len);
          j += len;
        }
      };
      // s [n] = scale q K^T
      runs([&](int64_t j, int64_t r, int64_t len) {
        ops::gemm(false, true, 1, len, d, static_cast<T>(scale), q.data<T>() + bh * d, d, K + r * d,
                  d, T(0), s.data() + (j - j0), len);
      });
      const T mx = *std::max_element(s.begin(), s.end());
      T sum = 0;
      for (T& e : s) sum += (e = std::exp(e - mx));
      // out [dv] = (s / sum) V
      runs([&](int64_t j, int64_t r, int64_t len) {
        ops::gemm(false, false, 1, dv, len, T(1) / sum, s.data() + (j - j0), len, V + r * dv, dv,
                  T(1), out, dv);
      });
    }
  });
  return o;
}

}  // namespace

bool MultiHeadAttention::supports_recurrent() const {
  if (cross || !config.causal) return false;
  if (config.n_local_heads == config.heads) return true;
  switch (config.kind) {
    case Mechanism::softmax:
    case Mechanism::local:
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

bool MultiHeadAttention::recurrent_with_ops() const {
  return supports_recurrent() && config.n_local_heads == 0 &&
         (config.kind == Mechanism::linear || config.kind == Mechanism::efficient ||
          config.kind == Mechanism::favor);
}

Tensor MultiHeadAttention::step(const Tensor& x, AttentionState& st) {
  FORGE_CHECK(supports_recurrent(),
              "MultiHeadAttention::step: decoding needs causal self-attention with softmax, "
              "local, linear, efficient or favor (prefix stabiliser) heads; this layer is {}{}",
              config.causal ? "causal " : "non-causal ",
              cross ? "cross-attention" : mechanism_name(config.kind));
  FORGE_CHECK(x.dim() == 3 && x.size(1) >= 1 && x.size(2) == config.dim,
              "MultiHeadAttention::step: expected tokens (B, n, {}), got {}", config.dim,
              shape_str(x.shape()));
  FORGE_CHECK(x.size(1) == 1 || st.pos == 0,
              "MultiHeadAttention::step: a prompt of {} tokens must come first (the state "
              "already holds {}); feed later tokens one at a time",
              x.size(1), st.pos);
  NoGradGuard no_grad;
  // The head groups of forward: the local heads and the global ones, in head order.
  std::vector<std::pair<int64_t, int64_t>> groups;
  const int64_t H = config.heads, l0 = config.local_begin(), l1 = l0 + config.n_local_heads;
  if (l0 > 0) groups.emplace_back(0, l0);
  if (l1 > l0) groups.emplace_back(l0, l1);
  if (l1 < H) groups.emplace_back(l1, H);
  std::vector<Tensor> outs;
  for (auto [h0, h1] : groups) {
    const Projected p = project(x, Tensor(), Tensor(), Tensor(), st.pos, h0, h1);  // (B, h, n, d)
    absorb(p.k, p.v, st.pos, h0, st);
    outs.push_back(x.size(1) == 1 ? read(p.q, st.pos, h0, st)
                                  : attend(p.q, p.k, p.v, Tensor(), h0, h1));
  }
  st.pos += x.size(1);
  return merge(outs.size() == 1 ? outs[0] : ops::cat(outs, 1));
}

void MultiHeadAttention::absorb(const Tensor& k, const Tensor& v, int64_t pos, int64_t h0,
                                AttentionState& st) {
  const Mechanism kind = is_local(h0) ? Mechanism::local : config.kind;
  const DType dt = k.dtype();
  if (kind == Mechanism::softmax || kind == Mechanism::local) {
    FORGE_CHECK(!st.with_ops && k.device().is_cpu(),
                "MultiHeadAttention::step: softmax and local heads keep their key / value cache "
                "in host memory, so on a GPU this layer ({} heads{}) cannot decode with a state; "
                "decode on the CPU, or recompute (GenerateOptions.use_recurrent_state = false)",
                mechanism_name(config.kind), config.n_local_heads > 0 ? " and local ones" : "");
    const int64_t band =
        kind == Mechanism::local ? (config.local_look_backward + 1) * config.local_window : 0;
    FORGE_DISPATCH_FLOAT(dt, "MultiHeadAttention::step", [&] {
      cache_append<scalar_t>(is_local(h0) ? st.local_kv : st.kv, k, v, pos, band);
    });
    return;
  }
  if (st.with_ops || !k.device().is_cpu()) {
    FORGE_CHECK(recurrent_with_ops(),
                "MultiHeadAttention::step: on a GPU the decoding state is kept for linear, "
                "efficient and favor heads only; this layer has {} heads{}",
                mechanism_name(config.kind), config.n_local_heads > 0 ? " and local ones" : "");
    st.with_ops = true;
    absorb_with_ops(k, v, pos, st);
    return;
  }
  const int64_t B = k.size(0), Hg = k.size(1), n = k.size(2), d = k.size(3), dv = v.size(3);
  const bool softmax_kernel =
      kind == Mechanism::favor && config.favor_kernel == att::FavorKernel::softmax;
  const bool projected =
      kind == Mechanism::favor && config.favor_kernel != att::FavorKernel::no_projection;
  const int64_t F = projected ? projection_matrix.size(0) : d;
  if (!st.S.defined()) {
    st.S = Tensor::zeros({B, Hg, F, dv}, dt);
    st.z = Tensor::zeros({B, Hg, F}, dt);
    st.S_bucket = Tensor::zeros({B, Hg, F, dv}, dt);
    st.z_bucket = Tensor::zeros({B, Hg, F}, dt);
    st.k_max = Tensor::full({B, Hg}, -std::numeric_limits<double>::infinity(), dt);
    st.v_sum = Tensor::zeros({B, Hg, dv}, dt);
    st.count = Tensor::zeros({B, Hg}, dt);
  }
  FORGE_CHECK(st.S.size(0) == B, "MultiHeadAttention::step: the state holds batch {}, x has {}",
              st.S.size(0), B);
  const int64_t s = config.bucket_size;
  FORGE_DISPATCH_FLOAT(dt, "MultiHeadAttention::step", [&] {
    using T = scalar_t;
    const T* W = projected ? projection_matrix.data<T>() : nullptr;
    const T c = static_cast<T>(std::pow(static_cast<double>(d), -0.25));
    parallel_for(B * Hg, n * F * dv, [&](int64_t begin, int64_t end) {
      std::vector<T> fk(static_cast<size_t>(F));
      for (int64_t bh = begin; bh < end; ++bh) {
        T* S = st.S.data<T>() + bh * F * dv;
        T* z = st.z.data<T>() + bh * F;
        for (int64_t t = 0; t < n; ++t) {
          const T* kt = k.data<T>() + (bh * n + t) * d;
          const T* vt = v.data<T>() + (bh * n + t) * dv;
          if (kind == Mechanism::linear) {
            elu1(kt, d, fk.data());
            accumulate(fk.data(), vt, F, dv, S, z);
          } else if (kind == Mechanism::efficient) {
            for (int64_t e = 0; e < d; ++e) fk[e] = std::exp(kt[e]);
            if (s == 1) {
              accumulate(fk.data(), vt, F, dv, S, z);
              continue;
            }
            T* Sb = st.S_bucket.data<T>() + bh * F * dv;
            T* zb = st.z_bucket.data<T>() + bh * F;
            if ((pos + t) % s == 0) {  // the previous bucket is complete: it becomes visible
              for (int64_t e = 0; e < F * dv; ++e) S[e] += std::exchange(Sb[e], T(0));
              for (int64_t f = 0; f < F; ++f) z[f] += std::exchange(zb[f], T(0));
            }
            accumulate(fk.data(), vt, F, dv, Sb, zb);
          } else if (!softmax_kernel) {  // favor relu / no_projection
            if (projected) {
              project_row(kt, W, F, d, c, fk.data());
              for (int64_t f = 0; f < F; ++f) fk[f] = std::max(fk[f], T(0)) + static_cast<T>(1e-3);
            } else {
              for (int64_t e = 0; e < d; ++e) fk[e] = std::exp(kt[e]);
            }
            accumulate(fk.data(), vt, F, dv, S, z);
          } else {  // favor softmax kernel, prefix stabiliser
            T kk = 0;
            for (int64_t e = 0; e < d; ++e) kk += kt[e] * kt[e];
            project_row(kt, W, F, d, c, fk.data());
            T& M = st.k_max.data<T>()[bh];
            const T M_new = std::max(M, *std::max_element(fk.begin(), fk.end()));
            const T scale = std::exp(M - M_new);  // 0 before the first key (M = -inf)
            for (int64_t e = 0; e < F * dv; ++e) S[e] *= scale;
            for (int64_t f = 0; f < F; ++f) z[f] *= scale;
            M = M_new;
            for (int64_t f = 0; f < F; ++f) fk[f] = std::exp(fk[f] - kk * c * c / 2 - M);
            accumulate(fk.data(), vt, F, dv, S, z);
            T* vs = st.v_sum.data<T>() + bh * dv;
            for (int64_t e = 0; e < dv; ++e) vs[e] += vt[e];
            st.count.data<T>()[bh] += 1;
          }
        }
      }
    });
  });
}

Tensor MultiHeadAttention::read(const Tensor& q, int64_t pos, int64_t h0, AttentionState& st) {
  const Mechanism kind = is_local(h0) ? Mechanism::local : config.kind;
  const DType dt = q.dtype();
  const int64_t d = q.size(3);
  const double rsqrt_d = 1.0 / std::sqrt(static_cast<double>(d));
  if (kind == Mechanism::softmax || kind == Mechanism::local) {
    // local: S = d^-1/2 q k^T over the band; softmax: config.scale (0: d^-1/2) over 0..pos.
    const int64_t w = config.local_window;
    const int64_t j0 = kind == Mechanism::local
                           ? std::max<int64_t>(0, (pos / w - config.local_look_backward) * w)
                           : 0;
    const double scale = kind == Mechanism::softmax && config.scale > 0 ? config.scale : rsqrt_d;
    return FORGE_DISPATCH_FLOAT(dt, "MultiHeadAttention::step", [&] {
      return cache_attend<scalar_t>(is_local(h0) ? st.local_kv : st.kv, q, j0, pos, scale);
    });
  }
  if (st.with_ops) return read_with_ops(q, st);
  const int64_t BH = q.size(0) * q.size(1), F = st.S.size(2), dv = st.S.size(3);
  const bool softmax_kernel =
      kind == Mechanism::favor && config.favor_kernel == att::FavorKernel::softmax;
  const bool projected =
      kind == Mechanism::favor && config.favor_kernel != att::FavorKernel::no_projection;
  Tensor o = Tensor::empty({q.size(0), q.size(1), 1, dv}, dt);
  FORGE_DISPATCH_FLOAT(dt, "MultiHeadAttention::step", [&] {
    using T = scalar_t;
    const T* W = projected ? projection_matrix.data<T>() : nullptr;
    const T c = static_cast<T>(std::pow(static_cast<double>(d), -0.25));
    const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(F)));
    std::vector<T> fq(static_cast<size_t>(F));
    for (int64_t bh = 0; bh < BH; ++bh) {
      const T* qt = q.data<T>() + bh * d;
      const T* S = st.S.data<T>() + bh * F * dv;
      const T* z = st.z.data<T>() + bh * F;
      T* out = o.data<T>() + bh * dv;
      T den = 0;
      if (kind == Mechanism::linear) {
        elu1(qt, d, fq.data());
        den = read_sums(fq.data(), S, z, F, dv, out) + static_cast<T>(config.linear_eps);
      } else if (kind == Mechanism::efficient) {
        softmax_row(qt, d, static_cast<T>(rsqrt_d), fq.data());
        den = std::max(read_sums(fq.data(), S, z, F, dv, out), static_cast<T>(1e-3));
      } else if (!softmax_kernel) {  // favor relu / no_projection
        if (projected) {
          project_row(qt, W, F, d, c, fq.data());
          for (int64_t f = 0; f < F; ++f) fq[f] = std::max(fq[f], T(0)) + static_cast<T>(1e-3);
        } else {
          softmax_row(qt, d, T(1), fq.data());
        }
        const T ysum = std::accumulate(fq.begin(), fq.end(), T(0));
        den = read_sums(fq.data(), S, z, F, dv, out) + static_cast<T>(1e-6) * ysum;
      } else {  // favor softmax kernel, prefix stabiliser
        const T eps = static_cast<T>(1e-4);
        T qq = 0;
        for (int64_t e = 0; e < d; ++e) qq += qt[e] * qt[e];
        project_row(qt, W, F, d, c, fq.data());
        const T qshift = qq * c * c / 2 + *std::max_element(fq.begin(), fq.end());
        for (int64_t f = 0; f < F; ++f) fq[f] = r * (std::exp(fq[f] - qshift) + eps);
        // S_total = r S + r eps 1 v_sum^T, z_total = r z + r eps n (+ 1e-6 causal).
        const T* vs = st.v_sum.data<T>() + bh * dv;
        const T n = st.count.data<T>()[bh];
        const T ysum = std::accumulate(fq.begin(), fq.end(), T(0));
        const T yz = read_sums(fq.data(), S, z, F, dv, out);
        for (int64_t e = 0; e < dv; ++e) out[e] = r * out[e] + r * eps * ysum * vs[e];
        den = r * yz + (r * eps * n + static_cast<T>(1e-6)) * ysum;
      }
      for (int64_t e = 0; e < dv; ++e) out[e] /= den;
    }
  });
  return o;
}

// ---- the linear-family state with tensor ops (AttentionState::with_ops) ----
// The same updates as absorb / read above, as ops on the state's device: the
// whole prompt at once where an update does not depend on the previous one,
// token by token where it does (efficient's buckets, favor's prefix
// stabiliser). tests/nn/test_generation.cpp compares the two on the CPU.

Tensor MultiHeadAttention::features_with_ops(const Tensor& x, bool query) const {
  const double d = static_cast<double>(x.size(3));
  switch (config.kind) {
    case Mechanism::linear:
      return ops::add(ops::elu(x), 1.0);  // elu(x) + 1
    case Mechanism::efficient:
      return query ? ops::mul(ops::softmax(x, -1), 1.0 / std::sqrt(d)) : ops::exp(x);
    default:  // favor, relu or no_projection kernel
      if (config.favor_kernel == att::FavorKernel::no_projection)
        return query ? ops::softmax(x, -1) : ops::exp(x);
      return ops::add(ops::relu(ops::mul(ops::linear(x, projection_matrix), std::pow(d, -0.25))),
                      1e-3);
  }
}

void MultiHeadAttention::absorb_with_ops(const Tensor& k, const Tensor& v, int64_t pos,
                                         AttentionState& st) {
  const int64_t B = k.size(0), Hg = k.size(1), n = k.size(2), d = k.size(3), dv = v.size(3);
  const bool favor = config.kind == Mechanism::favor;
  const bool softmax_kernel = favor && config.favor_kernel == att::FavorKernel::softmax;
  const bool projected = favor && config.favor_kernel != att::FavorKernel::no_projection;
  const int64_t F = projected ? projection_matrix.size(0) : d;
  const DType dt = k.dtype();
  const Device dev = k.device();
  if (!st.S.defined()) {
    st.S = Tensor::zeros({B, Hg, F, dv}, dt, dev);
    st.z = Tensor::zeros({B, Hg, F}, dt, dev);
    st.S_bucket = Tensor::zeros({B, Hg, F, dv}, dt, dev);
    st.z_bucket = Tensor::zeros({B, Hg, F}, dt, dev);
    st.k_max = Tensor::full({B, Hg}, -std::numeric_limits<double>::infinity(), dt, dev);
    st.v_sum = Tensor::zeros({B, Hg, dv}, dt, dev);
    st.count = Tensor::zeros({B, Hg}, dt, dev);
  }
  FORGE_CHECK(st.S.size(0) == B, "MultiHeadAttention::step: the state holds batch {}, x has {}",
              st.S.size(0), B);
  // S += g^T v and z += the column sums of g, for rows g (B, h, r, F), v (B, h, r, dv).
  const auto add_rows = [](Tensor& S, Tensor& z, const Tensor& g, const Tensor& vr) {
    S = ops::add(S, ops::matmul(g, vr, true, false));
    z = ops::add(z, ops::sum(g, {2}));
  };
  const int64_t s = config.bucket_size;
  if (config.kind == Mechanism::efficient && s > 1) {
    for (int64_t t = 0; t < n; ++t) {
      if ((pos + t) % s == 0) {  // the previous bucket is complete: it becomes visible
        st.S = ops::add(st.S, st.S_bucket);
        st.z = ops::add(st.z, st.z_bucket);
        st.S_bucket = Tensor::zeros(st.S.shape(), dt, dev);
        st.z_bucket = Tensor::zeros(st.z.shape(), dt, dev);
      }
      add_rows(st.S_bucket, st.z_bucket, features_with_ops(ops::narrow(k, 2, t, 1), false),
               ops::narrow(v, 2, t, 1));
    }
    return;
  }
  if (!softmax_kernel) {
    add_rows(st.S, st.z, features_with_ops(k, false), v);
    return;
  }
  // favor's softmax kernel, prefix stabiliser: the sums stay relative to the
  // running key maximum M and move by exp(M_old - M_new) when it grows.
  const double c = std::pow(static_cast<double>(d), -0.25);
  for (int64_t t = 0; t < n; ++t) {
    const Tensor kt = ops::narrow(k, 2, t, 1), vt = ops::narrow(v, 2, t, 1);
    const Tensor kp = ops::mul(ops::linear(kt, projection_matrix), c);  // (B, h, 1, F)
    const Tensor m_new =
        ops::max(ops::stack({st.k_max, ops::max(kp, {2, 3})}, -1), {-1});  // (B, h)
    const Tensor scale = ops::exp(ops::sub(st.k_max, m_new));  // 0 before the first key
    st.S = ops::mul(st.S, ops::unsqueeze(ops::unsqueeze(scale, -1), -1));
    st.z = ops::mul(st.z, ops::unsqueeze(scale, -1));
    st.k_max = m_new;
    const Tensor shift = ops::add(ops::mul(ops::sum(ops::square(kt), {3}, true), c * c / 2),
                                  ops::unsqueeze(ops::unsqueeze(m_new, -1), -1));  // (B, h, 1, 1)
    add_rows(st.S, st.z, ops::exp(ops::sub(kp, shift)), vt);
    st.v_sum = ops::add(st.v_sum, ops::sum(vt, {2}));
    st.count = ops::add(st.count, 1.0);
  }
}

Tensor MultiHeadAttention::read_with_ops(const Tensor& q, AttentionState& st) {
  const double d = static_cast<double>(q.size(3));
  const Tensor z = ops::unsqueeze(st.z, 2);  // (B, h, 1, F)
  const auto dot_z = [&](const Tensor& fq) { return ops::sum(ops::mul(fq, z), {3}, true); };
  const bool softmax_kernel =
      config.kind == Mechanism::favor && config.favor_kernel == att::FavorKernel::softmax;
  if (config.kind == Mechanism::linear || config.kind == Mechanism::efficient ||
      !softmax_kernel) {
    const Tensor fq = features_with_ops(q, true);  // (B, h, 1, F)
    const Tensor num = ops::matmul(fq, st.S);      // (B, h, 1, dv)
    Tensor den;
    if (config.kind == Mechanism::linear)
      den = ops::add(dot_z(fq), config.linear_eps);
    else if (config.kind == Mechanism::efficient)
      den = ops::clamp(dot_z(fq), 1e-3);
    else  // favor relu / no_projection: normaliser + 1e-6 sum(phi(q))
      den = ops::add(dot_z(fq), ops::mul(ops::sum(fq, {3}, true), 1e-6));
    return ops::div(num, den);
  }
  // favor's softmax kernel: phi(q) = r (exp(q' - diag(q) - max q') + eps), and
  // the sums S_total = r S + r eps 1 v_sum^T, z_total = r z + r eps n (+ 1e-6).
  const double c = std::pow(d, -0.25), eps = 1e-4;
  const double r = 1.0 / std::sqrt(static_cast<double>(st.S.size(2)));
  const Tensor qp = ops::mul(ops::linear(q, projection_matrix), c);
  const Tensor shift = ops::add(ops::mul(ops::sum(ops::square(q), {3}, true), c * c / 2),
                                ops::max(qp, {3}, true));
  const Tensor fq = ops::mul(ops::add(ops::exp(ops::sub(qp, shift)), eps), r);
  const Tensor ysum = ops::sum(fq, {3}, true);                                // (B, h, 1, 1)
  const Tensor count = ops::unsqueeze(ops::unsqueeze(st.count, -1), -1);     // (B, h, 1, 1)
  const Tensor num = ops::add(ops::mul(ops::matmul(fq, st.S), r),
                              ops::mul(ops::mul(ops::unsqueeze(st.v_sum, 2), ysum), r * eps));
  const Tensor den = ops::add(ops::mul(dot_z(fq), r),
                              ops::mul(ops::add(ops::mul(count, r * eps), 1e-6), ysum));
  return ops::div(num, den);
}

}  // namespace forge::nn
