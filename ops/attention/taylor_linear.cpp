// taylor_linear: first-order Taylor attention (Li et al. 2020), one autograd op
// with a fused CPU forward and backward (f32, f64), non-causal, cross lengths.
//
//   q'_i = q_i / ||q_i||,  k'_j = k_j / ||k_j||,  n = number of real keys
//   o_i  = (sum_j v_j + q'_i C) / (n + q'_i . z),  C = sum_j k'_j v_j^T [d, dv],
//          z = sum_j k'_j + eps (eps on every entry, as the reference does)
//
// Each batch-head keeps only the key states (s [dv], C [d, dv], z [d]) and walks
// the queries row by row, so nothing of size N x M exists; the backward saves
// the inputs alone and recomputes the states.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/attention/attention.h"
#include "ops/attention/common.h"
#include "ops/attention/registry.h"

namespace forge::ops::attention {

namespace {

constexpr double kEps = 1e-6;

template <typename T>
T row_norm(const T* x, int64_t d) {
  T ss = 0;
  for (int64_t c = 0; c < d; ++c) ss += x[c] * x[c];
  return std::sqrt(ss);
}

// The key states of one batch-head: s = sum_j v_j [dv], C = sum_j k'_j v_j^T
// [d, dv], z = sum_j k'_j + eps [d], n = the number of real keys.
template <typename T>
struct KeyStates {
  std::vector<T> s, C, z;
  T n = 0;
};

// k [M, d], v [M, dv] of one batch-head; mask [M] or null.
template <typename T>
void key_states(const T* k, const T* v, const uint8_t* mask, const Dims4& s, KeyStates<T>& st) {
  const int64_t M = s.M, d = s.d, dv = s.dv;
  st.s.assign(static_cast<size_t>(dv), T(0));
  st.C.assign(static_cast<size_t>(d * dv), T(0));
  st.z.assign(static_cast<size_t>(d), T(0));
  st.n = 0;
  std::vector<T> kn(static_cast<size_t>(d));
  for (int64_t j = 0; j < M; ++j) {
    if (mask && !mask[j]) continue;
    const T* kj = k + j * d;
    const T* vj = v + j * dv;
    const T inv = T(1) / row_norm(kj, d);
    for (int64_t c = 0; c < d; ++c) kn[static_cast<size_t>(c)] = kj[c] * inv;
    for (int64_t e = 0; e < dv; ++e) st.s[static_cast<size_t>(e)] += vj[e];
    for (int64_t c = 0; c < d; ++c) {
      const T a = kn[static_cast<size_t>(c)];
      T* Cc = st.C.data() + c * dv;
      for (int64_t e = 0; e < dv; ++e) Cc[e] += a * vj[e];
      st.z[static_cast<size_t>(c)] += a;
    }
    st.n += 1;
  }
  for (int64_t c = 0; c < d; ++c) st.z[static_cast<size_t>(c)] += T(kEps);
}

// One query row: qn = q_i / ||q_i|| [d], num = s + qn C [dv], returns den = n + qn . z.
template <typename T>
T query_row(const T* qi, const KeyStates<T>& st, int64_t d, int64_t dv, T* qn, T* num,
            T& inv_norm) {
  inv_norm = T(1) / row_norm(qi, d);
  T den = st.n;
  for (int64_t e = 0; e < dv; ++e) num[e] = st.s[static_cast<size_t>(e)];
  for (int64_t c = 0; c < d; ++c) {
    const T a = qi[c] * inv_norm;
    qn[c] = a;
    den += a * st.z[static_cast<size_t>(c)];
    const T* Cc = st.C.data() + c * dv;
    for (int64_t e = 0; e < dv; ++e) num[e] += a * Cc[e];
  }
  return den;
}

template <typename T>
void forward_kernel(const T* q, const T* k, const T* v, const uint8_t* mask, T* o, const Dims4& s) {
  const int64_t N = s.N, M = s.M, d = s.d, dv = s.dv;
  parallel_for(s.B * s.H, (N + M) * d * dv, [&](int64_t begin, int64_t end) {
    KeyStates<T> st;
    std::vector<T> qn(static_cast<size_t>(d)), num(static_cast<size_t>(dv));
    for (int64_t bh = begin; bh < end; ++bh) {
      const uint8_t* mb = mask ? mask + (bh / s.H) * M : nullptr;
      key_states(k + bh * M * d, v + bh * M * dv, mb, s, st);
      for (int64_t i = 0; i < N; ++i) {
        T inv_norm;
        const T den = query_row(q + (bh * N + i) * d, st, d, dv, qn.data(), num.data(), inv_norm);
        const T inv_den = T(1) / den;
        T* oi = o + (bh * N + i) * dv;
        for (int64_t e = 0; e < dv; ++e) oi[e] = num[static_cast<size_t>(e)] * inv_den;
      }
    }
  });
}

// g = dL/do [B, H, N, dv]; writes dq, dk, dv (same shapes as q, k, v).
template <typename T>
void backward_kernel(const T* q, const T* k, const T* v, const uint8_t* mask, const T* g, T* dq,
                     T* dk, T* dvv, const Dims4& s) {
  const int64_t N = s.N, M = s.M, d = s.d, dv = s.dv;
  parallel_for(s.B * s.H, (N + M) * d * dv, [&](int64_t begin, int64_t end) {
    KeyStates<T> st;
    std::vector<T> qn(static_cast<size_t>(d)), num(static_cast<size_t>(dv)),
        dnum(static_cast<size_t>(dv)), dqn(static_cast<size_t>(d)), kn(static_cast<size_t>(d)),
        dkn(static_cast<size_t>(d));
    std::vector<T> ds(static_cast<size_t>(dv)), dC(static_cast<size_t>(d * dv)),
        dz(static_cast<size_t>(d));
    for (int64_t bh = begin; bh < end; ++bh) {
      const uint8_t* mb = mask ? mask + (bh / s.H) * M : nullptr;
      const T* kb = k + bh * M * d;
      const T* vb = v + bh * M * dv;
      key_states(kb, vb, mb, s, st);
      std::fill(ds.begin(), ds.end(), T(0));
      std::fill(dC.begin(), dC.end(), T(0));
      std::fill(dz.begin(), dz.end(), T(0));
      // Query side. In the forward o_i = num_i / den_i, so dnum_i = g_i / den_i and
      // dden_i = -(g_i . o_i) / den_i; num_i = s + qn_i C and den_i = n + qn_i . z
      // send them on to s, C, z and qn_i; qn_i = q_i / ||q_i|| projects dqn_i.
      for (int64_t i = 0; i < N; ++i) {
        const T* qi = q + (bh * N + i) * d;
        const T* gi = g + (bh * N + i) * dv;
        T inv_norm;
        const T den = query_row(qi, st, d, dv, qn.data(), num.data(), inv_norm);
        const T inv_den = T(1) / den;
        T go = 0;
        for (int64_t e = 0; e < dv; ++e) {
          dnum[static_cast<size_t>(e)] = gi[e] * inv_den;
          go += gi[e] * num[static_cast<size_t>(e)];
        }
        const T dden = -go * inv_den * inv_den;
        T proj = 0;
        for (int64_t e = 0; e < dv; ++e) ds[static_cast<size_t>(e)] += dnum[static_cast<size_t>(e)];
        for (int64_t c = 0; c < d; ++c) {
          const T a = qn[static_cast<size_t>(c)];
          const T* Cc = st.C.data() + c * dv;
          T* dCc = dC.data() + c * dv;
          T acc = dden * st.z[static_cast<size_t>(c)];
          for (int64_t e = 0; e < dv; ++e) {
            acc += Cc[e] * dnum[static_cast<size_t>(e)];
            dCc[e] += a * dnum[static_cast<size_t>(e)];
          }
          dqn[static_cast<size_t>(c)] = acc;
          dz[static_cast<size_t>(c)] += dden * a;
          proj += a * acc;
        }
        T* dqi = dq + (bh * N + i) * d;
        for (int64_t c = 0; c < d; ++c)
          dqi[c] = (dqn[static_cast<size_t>(c)] - qn[static_cast<size_t>(c)] * proj) * inv_norm;
      }
      // Key side. s = sum_j v_j, C = sum_j k'_j v_j^T and z = sum_j k'_j + eps give
      // dv_j = ds + dC^T k'_j and dk'_j = dC v_j + dz; k'_j = k_j / ||k_j|| projects
      // dk'_j. Masked keys were in no sum: their gradients are 0.
      for (int64_t j = 0; j < M; ++j) {
        T* dkj = dk + (bh * M + j) * d;
        T* dvj = dvv + (bh * M + j) * dv;
        if (mb && !mb[j]) {
          std::fill(dkj, dkj + d, T(0));
          std::fill(dvj, dvj + dv, T(0));
          continue;
        }
        const T* kj = kb + j * d;
        const T* vj = vb + j * dv;
        const T inv = T(1) / row_norm(kj, d);
        for (int64_t e = 0; e < dv; ++e) dvj[e] = ds[static_cast<size_t>(e)];
        T proj = 0;
        for (int64_t c = 0; c < d; ++c) {
          const T a = kj[c] * inv;
          kn[static_cast<size_t>(c)] = a;
          const T* dCc = dC.data() + c * dv;
          T acc = dz[static_cast<size_t>(c)];
          for (int64_t e = 0; e < dv; ++e) {
            acc += dCc[e] * vj[e];
            dvj[e] += a * dCc[e];
          }
          dkn[static_cast<size_t>(c)] = acc;
          proj += a * acc;
        }
        for (int64_t c = 0; c < d; ++c)
          dkj[c] = (dkn[static_cast<size_t>(c)] - kn[static_cast<size_t>(c)] * proj) * inv;
      }
    }
  });
}

}  // namespace

Tensor taylor_linear(const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& key_padding_mask) {
  const Dims4 s = check_qkv("taylor_linear", q, k, v, key_padding_mask, false);
  const Tensor mask = key_padding_mask.defined() ? key_padding_mask.detach() : Tensor();
  Tensor o = Tensor::empty({s.B, s.H, s.N, s.dv}, q.dtype());
  FORGE_DISPATCH_FLOAT(q.dtype(), "attention::taylor_linear", [&] {
    forward_kernel(q.data<scalar_t>(), k.data<scalar_t>(), v.data<scalar_t>(), mask_bytes(mask),
                   o.data<scalar_t>(), s);
  });
  return autograd::record(
      "attention::taylor_linear", {q, k, v}, o,
      [q = q.detach(), k = k.detach(), v = v.detach(), mask,
       s](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        const Tensor g = grads[0];
        Tensor dq = Tensor::empty(q.shape(), q.dtype()), dk = Tensor::empty(k.shape(), k.dtype()),
               dv = Tensor::empty(v.shape(), v.dtype());
        FORGE_DISPATCH_FLOAT(q.dtype(), "attention::taylor_linear backward", [&] {
          backward_kernel(q.data<scalar_t>(), k.data<scalar_t>(), v.data<scalar_t>(),
                          mask_bytes(mask), g.data<scalar_t>(), dq.data<scalar_t>(),
                          dk.data<scalar_t>(), dv.data<scalar_t>(), s);
        });
        return {dq, dk, dv};
      });
}

std::vector<GradcheckCase> taylor_linear_gradcheck_cases() {
  struct Config {
    const char* name;
    int64_t N, M;
    bool mask;
  };
  std::vector<GradcheckCase> cases;
  for (const Config& c : {Config{"self", 6, 6, false}, Config{"mask", 7, 7, true},
                          Config{"cross", 5, 8, false}, Config{"cross+mask", 6, 9, true}}) {
    GradcheckCase gc;
    gc.name = std::string("taylor_linear/") + c.name;
    gc.make_inputs = [c] {
      auto leaf = [](const Shape& shape, uint64_t seed) {
        Generator g(seed);
        Tensor t = Tensor::rand(shape, DType::f64, &g);
        double* p = t.data<double>();
        for (int64_t i = 0; i < t.numel(); ++i) p[i] = 2 * p[i] - 1;
        return t.set_requires_grad(true);
      };
      std::vector<Tensor> in = {leaf({2, 2, c.N, 3}, 11), leaf({2, 2, c.M, 3}, 12),
                                leaf({2, 2, c.M, 4}, 13)};
      if (c.mask) {
        Tensor m = Tensor::ones({2, c.M}, DType::boolean);
        bool* p = m.data<bool>();
        p[c.M - 1] = false;  // batch 0: last key padded; batch 1: last three
        for (int64_t j = c.M - 3; j < c.M; ++j) p[c.M + j] = false;
        in.push_back(m);
      }
      return in;
    };
    gc.fn = [](const std::vector<Tensor>& in) {
      return taylor_linear(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor());
    };
    cases.push_back(std::move(gc));
  }
  return cases;
}

}  // namespace forge::ops::attention
