// taylor_linear: first-order Taylor attention (Li et al. 2020), one autograd op
// with a fused CPU forward and backward (f32, f64), non-causal, cross lengths.
//
//   q'_i = q_i / ||q_i||,  k'_j = k_j / ||k_j||,  n = number of real keys
//   o_i  = (sum_j v_j + q'_i C) / (n + q'_i . z),  C = sum_j k'_j v_j^T [d, dv],
//          z = sum_j k'_j + eps (eps on every entry, as the reference does)
//
// Each batch-head keeps only the key states (s [dv], C [d, dv], z [d]) and walks
// the queries and keys in blocks of kChunk rows, with GEMMs for every
// [rows, d] x [d, dv] product, so nothing of size N x M (nor N x d) exists; the
// backward saves the inputs and each head's key states (state_size values).
//
// On a GPU this is the linear-family core (linear_core_cuda.h) on the features
// q~ = [1, q'], k~ = [1, k'] (0 on padding) [B*H, len, d + 1] from a fused
// kernel (linear_features_cuda.h), with the normaliser state starting at
// z0 = [0, eps, ..., eps]: S = sum_j k~_j v_j^T stacks sum_j v_j on C and
// z0 + sum_j k~_j = [n, z], so o_i = q~_i S / (q~_i . (z0 + sum_j k~_j)).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/attention/attention.h"
#include "ops/attention/cases.h"
#include "ops/attention/common.h"
#include "ops/attention/feature_attention.h"
#include "ops/blas.h"
#include "ops/layout/layout.h"

namespace forge::ops::attention {

namespace {

constexpr double kEps = 1e-6;
// Rows per block of queries or keys.
constexpr int64_t kChunk = 64;

// xn [rows, d] = the rows of x [rows, d] over their norms, inv [rows] = 1 / norms;
// rows with keep[r] == 0 (keep may be null) become 0 with inv = 0.
template <typename T>
void normalize_rows(const T* x, int64_t rows, int64_t d, const uint8_t* keep, T* xn, T* inv) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    T* yr = xn + r * d;
    if (keep && !keep[r]) {
      std::fill(yr, yr + d, T(0));
      inv[r] = 0;
      continue;
    }
    const T a = T(1) / std::sqrt(dot(xr, xr, d));
    inv[r] = a;
    for (int64_t c = 0; c < d; ++c) yr[c] = xr[c] * a;
  }
}

// Per-thread scratch: the key states of one batch-head, s = sum_j v_j [dv],
// C = sum_j k'_j v_j^T [d, dv], z = sum_j k'_j + eps [d], n = the number of
// real keys; their gradients ds, dC, dz; CT [dv, d] for C^T or dC^T; one block
// of rows: xn [kChunk, d],
// inv [kChunk], num [kChunk, dv].
template <typename T>
struct Scratch {
  std::vector<T> s, C, CT, z, ds, dC, dz, xn, inv, num;
  T n = 0;
  Scratch(int64_t d, int64_t dv)
      : s(dv),
        C(d * dv),
        CT(d * dv),
        z(d),
        ds(dv),
        dC(d * dv),
        dz(d),
        xn(kChunk * d),
        inv(kChunk),
        num(kChunk * dv) {}
};

// The key states of one head saved for the backward: s [dv], C [d, dv], z [d], n.
int64_t state_size(const Dims4& s) {
  return s.dv + s.d * s.dv + s.d + 1;
}

template <typename T>
void save_states(const Scratch<T>& w, T* state) {
  T* p = std::copy(w.s.begin(), w.s.end(), state);
  p = std::copy(w.C.begin(), w.C.end(), p);
  p = std::copy(w.z.begin(), w.z.end(), p);
  *p = w.n;
}

template <typename T>
void load_states(const T* state, const Dims4& s, Scratch<T>& w) {
  const T* p = state;
  std::copy(p, p + s.dv, w.s.begin());
  p += s.dv;
  std::copy(p, p + s.d * s.dv, w.C.begin());
  p += s.d * s.dv;
  std::copy(p, p + s.d, w.z.begin());
  w.n = p[s.d];
}

// The key states from k [M, d], v [M, dv] of one batch-head; keep [M] or null.
template <typename T>
void key_states(const T* k, const T* v, const uint8_t* keep, const Dims4& s, Scratch<T>& w) {
  const int64_t M = s.M, d = s.d, dv = s.dv;
  std::fill(w.s.begin(), w.s.end(), T(0));
  std::fill(w.C.begin(), w.C.end(), T(0));
  std::fill(w.z.begin(), w.z.end(), T(0));
  w.n = 0;
  for (int64_t j0 = 0; j0 < M; j0 += kChunk) {
    const int64_t rows = std::min(kChunk, M - j0);
    const uint8_t* kb = keep ? keep + j0 : nullptr;
    normalize_rows(k + j0 * d, rows, d, kb, w.xn.data(), w.inv.data());
    // C += k'^T v over the block (padded rows of k' are 0).
    gemm(true, false, d, dv, rows, T(1), w.xn.data(), d, v + j0 * dv, dv, T(1), w.C.data(), dv);
    for (int64_t j = 0; j < rows; ++j) {
      if (kb && !kb[j]) continue;
      const T* vj = v + (j0 + j) * dv;
      const T* kn = w.xn.data() + j * d;
      for (int64_t e = 0; e < dv; ++e) w.s[e] += vj[e];
      for (int64_t c = 0; c < d; ++c) w.z[c] += kn[c];
      w.n += 1;
    }
  }
  for (int64_t c = 0; c < d; ++c) w.z[c] += T(kEps);
}

// One block of queries q [rows, d]: xn = q' [rows, d], inv = 1 / ||q_i||,
// num = s + q' C [rows, dv]. den_i = n + q'_i . z comes from query_den.
template <typename T>
void query_block(const T* q, int64_t rows, const Dims4& s, Scratch<T>& w) {
  const int64_t d = s.d, dv = s.dv;
  normalize_rows(q, rows, d, static_cast<const uint8_t*>(nullptr), w.xn.data(), w.inv.data());
  for (int64_t i = 0; i < rows; ++i) std::copy(w.s.begin(), w.s.end(), w.num.begin() + i * dv);
  gemm(false, false, rows, dv, d, T(1), w.xn.data(), d, w.C.data(), dv, T(1), w.num.data(), dv);
}

template <typename T>
T query_den(const Scratch<T>& w, int64_t i, int64_t d) {
  const T* qn = w.xn.data() + i * d;
  return w.n + dot(qn, w.z.data(), d);
}

template <typename T>
void forward_kernel(const T* q, const T* k, const T* v, const uint8_t* mask, T* o, T* state,
                    const Dims4& s) {
  const int64_t N = s.N, M = s.M, d = s.d, dv = s.dv;
  parallel_for(s.B * s.H, (N + M) * d * dv, [&](int64_t begin, int64_t end) {
    Scratch<T> w(d, dv);
    for (int64_t bh = begin; bh < end; ++bh) {
      const uint8_t* mb = mask ? mask + (bh / s.H) * M : nullptr;
      key_states(k + bh * M * d, v + bh * M * dv, mb, s, w);
      save_states(w, state + bh * state_size(s));
      for (int64_t i0 = 0; i0 < N; i0 += kChunk) {
        const int64_t rows = std::min(kChunk, N - i0);
        query_block(q + (bh * N + i0) * d, rows, s, w);
        for (int64_t i = 0; i < rows; ++i) {
          const T inv_den = T(1) / query_den(w, i, d);
          const T* num = w.num.data() + i * dv;
          T* oi = o + (bh * N + i0 + i) * dv;
          for (int64_t e = 0; e < dv; ++e) oi[e] = num[e] * inv_den;
        }
      }
    }
  });
}

// o, g = dL/do [B, H, N, dv]; writes dq, dk, dv (same shapes as q, k, v).
template <typename T>
void backward_kernel(const T* q, const T* k, const T* v, const uint8_t* mask, const T* state,
                     const T* o, const T* g, T* dq, T* dk, T* dvv, const Dims4& s) {
  const int64_t N = s.N, M = s.M, d = s.d, dv = s.dv;
  parallel_for(s.B * s.H, 2 * (N + M) * d * dv, [&](int64_t begin, int64_t end) {
    Scratch<T> w(d, dv);
    std::vector<T> dden(static_cast<size_t>(kChunk));
    for (int64_t bh = begin; bh < end; ++bh) {
      const uint8_t* mb = mask ? mask + (bh / s.H) * M : nullptr;
      const T* kb = k + bh * M * d;
      const T* vb = v + bh * M * dv;
      load_states(state + bh * state_size(s), s, w);
      transpose(w.C.data(), d, dv, w.CT.data());
      std::fill(w.ds.begin(), w.ds.end(), T(0));
      std::fill(w.dC.begin(), w.dC.end(), T(0));
      std::fill(w.dz.begin(), w.dz.end(), T(0));
      // Query side, a block of rows at a time. In the forward o_i = num_i / den_i,
      // so dnum_i = g_i / den_i and dden_i = -(g_i . num_i) / den_i^2 = -(g_i . o_i) / den_i
      // (the saved output: no GEMM recomputes num);
      // num = s + q' C and den_i = n + q'_i . z send them on:
      //   ds += colsum(dnum), dC += q'^T dnum, dz += sum_i dden_i q'_i,
      //   dq' = dnum C^T + dden z^T [rows, d],
      // and q'_i = q_i / ||q_i|| projects: dq_i = (dq'_i - q'_i (q'_i . dq'_i)) / ||q_i||.
      for (int64_t i0 = 0; i0 < N; i0 += kChunk) {
        const int64_t rows = std::min(kChunk, N - i0);
        normalize_rows(q + (bh * N + i0) * d, rows, d, static_cast<const uint8_t*>(nullptr),
                       w.xn.data(), w.inv.data());
        const T* gb = g + (bh * N + i0) * dv;
        const T* ob = o + (bh * N + i0) * dv;
        for (int64_t i = 0; i < rows; ++i) {  // num holds dnum
          const T inv_den = T(1) / query_den(w, i, d);
          const T* gi = gb + i * dv;
          T* dnum = w.num.data() + i * dv;
          // The reductions go through dot (vectors); a sum fused into the update
          // loops would run in order, one scalar add an element.
          dden[i] = -dot(gi, ob + i * dv, dv) * inv_den;
          for (int64_t e = 0; e < dv; ++e) {
            dnum[e] = gi[e] * inv_den;
            w.ds[e] += dnum[e];
          }
          const T* qn = w.xn.data() + i * d;
          for (int64_t c = 0; c < d; ++c) w.dz[c] += dden[i] * qn[c];
        }
        gemm(true, false, d, dv, rows, T(1), w.xn.data(), d, w.num.data(), dv, T(1), w.dC.data(),
             dv);
        T* dqb = dq + (bh * N + i0) * d;
        gemm(false, false, rows, d, dv, T(1), w.num.data(), dv, w.CT.data(), d, T(0), dqb, d);
        for (int64_t i = 0; i < rows; ++i) {
          const T* qn = w.xn.data() + i * d;
          T* dqi = dqb + i * d;
          for (int64_t c = 0; c < d; ++c) dqi[c] += dden[i] * w.z[c];
          const T proj = dot(qn, dqi, d);
          for (int64_t c = 0; c < d; ++c) dqi[c] = (dqi[c] - qn[c] * proj) * w.inv[i];
        }
      }
      transpose(w.dC.data(), d, dv, w.CT.data());
      // Key side. s = sum_j v_j, C = sum_j k'_j v_j^T and z = sum_j k'_j + eps give
      //   dv_j = ds + dC^T k'_j,  dk'_j = dC v_j + dz  (GEMMs over a block),
      // and k'_j = k_j / ||k_j|| projects dk'_j. Masked keys were in no sum: their
      // gradients are 0.
      for (int64_t j0 = 0; j0 < M; j0 += kChunk) {
        const int64_t rows = std::min(kChunk, M - j0);
        const uint8_t* keep = mb ? mb + j0 : nullptr;
        normalize_rows(kb + j0 * d, rows, d, keep, w.xn.data(), w.inv.data());
        T* dkb = dk + (bh * M + j0) * d;
        T* dvb = dvv + (bh * M + j0) * dv;
        for (int64_t j = 0; j < rows; ++j) std::copy(w.ds.begin(), w.ds.end(), dvb + j * dv);
        gemm(false, false, rows, dv, d, T(1), w.xn.data(), d, w.dC.data(), dv, T(1), dvb, dv);
        gemm(false, false, rows, d, dv, T(1), vb + j0 * dv, dv, w.CT.data(), d, T(0), dkb, d);
        for (int64_t j = 0; j < rows; ++j) {
          T* dkj = dkb + j * d;
          if (keep && !keep[j]) {
            std::fill(dkj, dkj + d, T(0));
            std::fill(dvb + j * dv, dvb + (j + 1) * dv, T(0));
            continue;
          }
          const T* kn = w.xn.data() + j * d;
          for (int64_t c = 0; c < d; ++c) dkj[c] += w.dz[c];
          const T proj = dot(kn, dkj, d);
          for (int64_t c = 0; c < d; ++c) dkj[c] = (dkj[c] - kn[c] * proj) * w.inv[j];
        }
      }
    }
  });
}

// ---- arguments of the GPU path (launched under FORGE_IF_CUDA in taylor_linear()) ----

// The normaliser's start z0 = [0, eps, ..., eps] [d + 1] on q's device, in
// the accumulation type.
Tensor z0_cuda(const Tensor& q) {
  // Filled on the device (no host copy per call): eps everywhere, then a 0 in front.
  return ops::pad(Tensor::full({q.size(3)}, kEps, feature_dtype(q.dtype()), q.device()), {1, 0});
}

cuda::LinearCoreArgs core_args(const Dims4& s, DType dtype, const Tensor& z0) {
  cuda::LinearCoreArgs a = core_sizes(s, s.d + 1, dtype);
  a.z0 = z0.raw_device_data();
  return a;
}

}  // namespace

Tensor taylor_linear(const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& key_padding_mask) {
  const Dims4 s = check_qkv("taylor_linear", q, k, v, key_padding_mask, false, true);
  FORGE_IF_CUDA(q) {
    // [1, x / ||x||] [B*H, len, d + 1], zero on the rows the mask pads.
    const FeatureMap unit = row_feature_map(cuda::unit_features, cuda::unit_features_backward, 1);
    const Tensor z0 = z0_cuda(q);
    return feature_attention_cuda("attention::taylor_linear", q, k, v, key_padding_mask,
                                  core_args(s, q.dtype(), z0), unit, unit, z0);
  }
  const Tensor mask = key_padding_mask.defined() ? key_padding_mask.detach() : Tensor();
  Tensor o = Tensor::empty({s.B, s.H, s.N, s.dv}, q.dtype());
  Tensor state = Tensor::empty({s.B * s.H, state_size(s)}, q.dtype());
  FORGE_DISPATCH_FLOAT(q.dtype(), "attention::taylor_linear", [&] {
    forward_kernel(q.data<scalar_t>(), k.data<scalar_t>(), v.data<scalar_t>(), mask_bytes(mask),
                   o.data<scalar_t>(), state.data<scalar_t>(), s);
  });
  return autograd::record(
      "attention::taylor_linear", {q, k, v}, o,
      [q = q.detach(), k = k.detach(), v = v.detach(), mask, state, o = o.detach(),
       s](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        const Tensor g = grads[0];
        Tensor dq = Tensor::empty(q.shape(), q.dtype()), dk = Tensor::empty(k.shape(), k.dtype()),
               dv = Tensor::empty(v.shape(), v.dtype());
        FORGE_DISPATCH_FLOAT(q.dtype(), "attention::taylor_linear backward", [&] {
          backward_kernel(q.data<scalar_t>(), k.data<scalar_t>(), v.data<scalar_t>(),
                          mask_bytes(mask), state.data<scalar_t>(), o.data<scalar_t>(),
                          g.data<scalar_t>(), dq.data<scalar_t>(), dk.data<scalar_t>(),
                          dv.data<scalar_t>(), s);
        });
        return {dq, dk, dv};
      });
}

std::vector<AttentionCase> taylor_linear_cases() {
  struct Config {
    const char* name;
    int64_t N, M;
    bool mask, bench;
  };
  std::vector<AttentionCase> cases;
  for (const Config& x :
       {Config{"self", 6, 6, false, true}, Config{"mask", 7, 7, true, false},
        Config{"cross", 5, 8, false, false}, Config{"cross+mask", 6, 9, true, false}}) {
    AttentionCase c = qkv_case(std::string("taylor_linear/") + x.name, x.N, x.M, 11,
                               x.mask ? kCasePad : std::vector<int64_t>{});
    c.fn = [](const std::vector<Tensor>& in) {
      return taylor_linear(in[0], in[1], in[2], case_input(in, 3));
    };
    c.bench = x.bench;
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace forge::ops::attention
