// Performer FAVOR+ attention (Choromanski et al. 2020), as in the
// performer-pytorch seed: random-feature maps phi(q) [N, m], phi(k) [M, m] and
// linear attention over them, one autograd op with a fused forward and a fused
// backward per (b, h); plus the Gaussian orthogonal random matrix W [m, d].
//
// Both passes share one form. The key features are kept as g_j [m] with
//   phi(k_j) = alpha g_j + beta            (per feature; masked keys: 0)
// softmax kernel: g_j = exp(k'_j - diag(k_j) - M_j), alpha = r, beta = r eps,
// with M_j the stop-grad key stabiliser (global: one max; prefix: the max of
// k' over keys j' <= j); relu / no_projection: g_j = phi(k_j), alpha = 1,
// beta = 0, M_j = 0. Then, with S [m, dv] and z [m]:
//   S = alpha sum_j g_j v_j^T + beta 1 (sum_j v_j)^T,  z = alpha sum_j g_j + beta n
//   o_i = phi(q_i) S / (phi(q_i) . z)
// where causal sums run over j <= i (z also gets + 1e-6) as a prefix scan in
// chunks whose state is rescaled by exp(M_{i-1} - M_i) when the stabiliser
// grows. The stabilisers take the max over real (unmasked) keys only. Causal
// no_projection uses phi(k) = exp(k), as the reference does: its softmax over
// the whole sequence would let later keys change earlier outputs.
// Nothing of size N x M is ever allocated: only [N, m] features and [m, dv]
// states per (b, h).
//
// The feature maps, with the constants, dims and per-thread scratch they share
// with the passes here, are favor_features.h's; W
// (gaussian_orthogonal_random_matrix) is favor_features.cpp's.

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/attention/attention.h"
#include "ops/attention/cases.h"
#include "ops/attention/common.h"
#include "ops/attention/favor_cuda.h"
#include "ops/attention/favor_features.h"
#include "ops/blas.h"

namespace forge::ops::attention {

using namespace favor_detail;

namespace {

// The rescale factor exp(M_a - M_b) of a state kept relative to M_a when the
// stabiliser moves to M_b >= M_a; 0 while no real key has been seen.
template <typename T>
T rescale(T from, T to) {
  if (from == to) return T(1);
  return from == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(from - to);
}

// Non-causal S and z: S = alpha g^T v + beta 1 vs^T, z = alpha sum_j g_j + beta n.
template <typename T>
void totals(const FavorDims& f, const T* v, const uint8_t* mask, T alpha, T beta, Scratch<T>& w) {
  const int64_t M = f.s.M, dv = f.s.dv, F = f.F;
  gemm(true, false, F, dv, M, alpha, w.g, v, T(0), w.S);
  std::fill(w.vs, w.vs + dv, T(0));
  std::fill(w.z, w.z + F, T(0));
  T n = 0;
  for (int64_t j = 0; j < M; ++j) {
    if (mask && !mask[j]) continue;
    n += 1;
    for (int64_t c = 0; c < dv; ++c) w.vs[c] += v[j * dv + c];
    for (int64_t e = 0; e < F; ++e) w.z[e] += w.g[j * F + e];
  }
  for (int64_t e = 0; e < F; ++e) {
    w.z[e] = alpha * w.z[e] + beta * n;
    for (int64_t c = 0; c < dv; ++c) w.S[e * dv + c] += beta * w.vs[c];
  }
}

// P [L, L]: P_ij = (phi(q_i) . g_j) exp(M_j - M_i) for j <= i, else 0.
template <typename T>
void intra_chunk_weights(const T* Qc, const T* Gc, const T* Mc, int64_t L, int64_t F, T* P) {
  gemm(false, true, L, L, F, T(1), Qc, Gc, T(0), P);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < L; ++j)
      P[i * L + j] = j <= i ? P[i * L + j] * rescale(Mc[j], Mc[i]) : T(0);
}

// D [L, L]: D_ij = (dnum_i . v_j + dden_i) exp(M_j - M_i) for j <= i, else 0.
template <typename T>
void intra_chunk_grad_weights(const T* dNc, const T* ddc, const T* Vc, const T* Mc, int64_t L,
                              int64_t dv, T* D) {
  gemm(false, true, L, L, dv, T(1), dNc, Vc, T(0), D);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < L; ++j)
      D[i * L + j] = j <= i ? (D[i * L + j] + ddc[i]) * rescale(Mc[j], Mc[i]) : T(0);
}

// Moves the causal state (S~, z~) from M_p to the chunk's last M and adds the
// chunk's keys: S~ += sum_j exp(M_j - M_last) g_j v_j^T. Returns M_last.
template <typename T>
T advance_state(const T* Gc, const T* Vc, const T* Mc, int64_t L, int64_t F, int64_t dv, T mprev,
                Scratch<T>& w) {
  const T mlast = Mc[L - 1];
  const T s = rescale(mprev, mlast);
  for (int64_t t = 0; t < F * dv; ++t) w.S[t] *= s;
  for (int64_t e = 0; e < F; ++e) w.z[e] *= s;
  for (int64_t j = 0; j < L; ++j) {
    const T fj = rescale(Mc[j], mlast);
    for (int64_t c = 0; c < dv; ++c) w.tmp[j * dv + c] = fj * Vc[j * dv + c];
    for (int64_t e = 0; e < F; ++e) w.z[e] += fj * Gc[j * F + e];
  }
  gemm(true, false, F, dv, L, T(1), Gc, w.tmp, T(1), w.S);
  return mlast;
}

// Forward: o [N, dv] and the normaliser den [N] for one (b, h).
template <typename T>
void favor_forward_bh(const FavorDims& f, const T* q, const T* k, const T* v, const T* W,
                      const uint8_t* mask, T* o, T* den, Scratch<T>& w) {
  const int64_t N = f.s.N, dv = f.s.dv, F = f.F;
  query_features(f, f.s.N, q, W, w.qx, w.qf);
  const auto [alpha, beta] = key_features(f, k, W, mask, w);
  if (!f.opt.causal) {
    totals(f, v, mask, alpha, beta, w);
    gemm(false, false, N, dv, F, T(1), w.qf, w.S, T(0), o);  // numerator phi(q) S
    for (int64_t i = 0; i < N; ++i) {
      const T* y = w.qf + i * F;
      T dn = 0;
      for (int64_t e = 0; e < F; ++e) dn += y[e] * w.z[e];
      if (dn == T(0)) dn = T(1);  // every key masked: S = 0 and z = 0, the row is 0
      den[i] = dn;
      for (int64_t c = 0; c < dv; ++c) o[i * dv + c] /= dn;
    }
    return;
  }
  // Causal: a prefix scan over chunks of kChunk positions. The state entering a
  // chunk, relative to the stabiliser M_p of the position before it, is
  // S~ = sum_{j<p} exp(M_j - M_p) g_j v_j^T [F, dv] and z~ likewise [F], plus
  // vs = sum_{j<p} v_j and the count n of real keys. Inside the chunk, with
  // e_ij = exp(M_j - M_i) (<= 1) for j <= i, P_ij = (phi(q_i) . g_j) e_ij [L, L]:
  //   num_i = alpha (P v + s_i phi(q_i) S~)_i + beta sum(phi(q_i)) vs_i,  s_i = exp(M_p - M_i)
  //   den_i = alpha (sum_j P_ij + s_i phi(q_i) . z~) + (beta n_i + 1e-6) sum(phi(q_i))
  std::fill(w.S, w.S + F * dv, T(0));
  std::fill(w.z, w.z + F, T(0));
  std::fill(w.vs, w.vs + dv, T(0));
  T n = 0, mprev = -std::numeric_limits<T>::infinity();
  for (int64_t i0 = 0; i0 < N; i0 += kChunk) {
    const int64_t L = std::min(kChunk, N - i0);
    const T *Qc = w.qf + i0 * F, *Gc = w.g + i0 * F, *Vc = v + i0 * dv, *Mc = w.mk + i0;
    T* Oc = o + i0 * dv;
    intra_chunk_weights(Qc, Gc, Mc, L, F, w.P);
    gemm(false, false, L, dv, F, T(1), Qc, w.S, T(0), Oc);
    for (int64_t i = 0; i < L; ++i) {
      const T s = alpha * rescale(mprev, Mc[i]);
      for (int64_t c = 0; c < dv; ++c) Oc[i * dv + c] *= s;
    }
    gemm(false, false, L, dv, L, alpha, w.P, Vc, T(1), Oc);
    for (int64_t i = 0; i < L; ++i) {
      if (!mask || mask[i0 + i]) {
        for (int64_t c = 0; c < dv; ++c) w.vs[c] += Vc[i * dv + c];
        n += 1;
      }
      const T* y = Qc + i * F;
      T ysum = 0, yz = 0, prow = 0;
      for (int64_t e = 0; e < F; ++e) {
        ysum += y[e];
        yz += y[e] * w.z[e];
      }
      for (int64_t j = 0; j <= i; ++j) prow += w.P[i * L + j];
      const T dn = alpha * (prow + rescale(mprev, Mc[i]) * yz) +
                   (beta * n + static_cast<T>(kCausalEps)) * ysum;
      den[i0 + i] = dn;
      for (int64_t c = 0; c < dv; ++c)
        Oc[i * dv + c] = (Oc[i * dv + c] + beta * ysum * w.vs[c]) / dn;
    }
    mprev = advance_state(Gc, Vc, Mc, L, F, dv, mprev, w);
  }
}

// ---- Non-causal softmax and relu kernels, in blocks of kRows rows ----
// The state of one (b, h), saved by the forward for the backward
// [F dv + F + 1]: S [F, dv], z [F] and the key stabiliser M (0 for relu).
int64_t blocked_state_size(const FavorDims& f) {
  return f.F * f.s.dv + f.F + 1;
}

// Forward for one (b, h): keys first, S = alpha sum_j g_j v_j^T + beta 1 vs^T and
// z = alpha sum_j g_j + beta n block by block; the softmax kernel's M is the
// running max of the real keys' kx, and S, z move to a larger M by exp(M_old -
// M_new) (the result is the one of the global max). Then o_i = phi(q_i) S /
// (phi(q_i) . z) block by block (a row whose keys are all masked is 0).
template <typename T>
void blocked_forward_bh(const FavorDims& f, const T* q, const T* k, const T* v, const T* W,
                        const uint8_t* mask, T* o, T* den, T* state, Scratch<T>& w) {
  const int64_t N = f.s.N, M = f.s.M, d = f.s.d, dv = f.s.dv, F = f.F;
  const bool softmax = f.opt.kernel == FavorKernel::softmax;
  const T c = static_cast<T>(std::pow(static_cast<double>(d), -0.25));
  const T ninf = -std::numeric_limits<T>::infinity();
  T* S = state;
  T* z = state + F * dv;
  std::fill(S, S + F * dv + F, T(0));
  std::fill(w.vs, w.vs + dv, T(0));
  T n = 0, run = softmax ? ninf : T(0);
  for (int64_t j0 = 0; j0 < M; j0 += kRows) {
    const int64_t R = std::min(kRows, M - j0);
    const uint8_t* keep = mask ? mask + j0 : nullptr;
    gemm(false, true, R, F, d, c, k + j0 * d, W, T(0), w.kx);  // k' = (c k) W^T
    if (softmax) {
      T block_max = ninf;
      for (int64_t j = 0; j < R; ++j)
        if (!keep || keep[j]) block_max = std::max(block_max, max_of(w.kx + j * F, F));
      if (block_max > run) {
        const T scale = rescale(run, block_max);
        for (int64_t t = 0; t < F * dv + F; ++t) S[t] *= scale;
        run = block_max;
      }
    }
    key_block_features(f, R, k + j0 * d, keep, run, w.kx, w.g);
    gemm(true, false, F, dv, R, T(1), w.g, v + j0 * dv, T(1), S);
    for (int64_t j = 0; j < R; ++j) {
      for (int64_t e = 0; e < F; ++e) z[e] += w.g[j * F + e];
      if (keep && !keep[j]) continue;
      n += 1;
      for (int64_t e = 0; e < dv; ++e) w.vs[e] += v[(j0 + j) * dv + e];
    }
  }
  const auto [alpha, beta] = key_coefficients<T>(f);
  for (int64_t e = 0; e < F; ++e) {
    z[e] = alpha * z[e] + beta * n;
    for (int64_t t = 0; t < dv; ++t) S[e * dv + t] = alpha * S[e * dv + t] + beta * w.vs[t];
  }
  state[F * dv + F] = run == ninf ? T(0) : run;
  for (int64_t i0 = 0; i0 < N; i0 += kRows) {
    const int64_t R = std::min(kRows, N - i0);
    query_features(f, R, q + i0 * d, W, w.qx, w.qf);
    T* ob = o + i0 * dv;
    gemm(false, false, R, dv, F, T(1), w.qf, S, T(0), ob);  // numerator phi(q) S
    for (int64_t i = 0; i < R; ++i) {
      T dn = dot(w.qf + i * F, z, F);
      if (dn == T(0)) dn = T(1);  // every key masked: S = 0 and z = 0, the row is 0
      den[i0 + i] = dn;
      for (int64_t t = 0; t < dv; ++t) ob[i * dv + t] /= dn;
    }
  }
}

// Backward for one (b, h), from the saved state. Queries: dnum_i = do_i / den_i,
// dden_i = -(do_i . o_i) / den_i; dphi(q) = dnum S^T + dden z^T; dS = phi(q)^T dnum,
// dz = phi(q)^T dden. Keys (real ones): dg_j = alpha (dS v_j + dz),
// dv_j = alpha dS^T g_j + beta colsum(dS). Both through their feature maps.
template <typename T>
void blocked_backward_bh(const FavorDims& f, const T* q, const T* k, const T* v, const T* W,
                         const uint8_t* mask, const T* o, const T* den, const T* state, const T* go,
                         T* gq, T* gk, T* gv, Scratch<T>& w) {
  const int64_t N = f.s.N, M = f.s.M, d = f.s.d, dv = f.s.dv, F = f.F;
  const T c = static_cast<T>(std::pow(static_cast<double>(d), -0.25));
  const T* S = state;
  const T* z = state + F * dv;
  const T Mk = state[F * dv + F];
  const auto [alpha, beta] = key_coefficients<T>(f);
  T* dS = w.S;
  T* dz = w.z;
  std::fill(dS, dS + F * dv, T(0));
  std::fill(dz, dz + F, T(0));
  transpose(S, F, dv, w.ST);
  const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(F)));
  for (int64_t i0 = 0; i0 < N; i0 += kRows) {
    const int64_t R = std::min(kRows, N - i0);
    query_features(f, R, q + i0 * d, W, w.qx, w.qf);
    for (int64_t i = 0; i < R; ++i) {
      const T* gi = go + (i0 + i) * dv;
      const T inv = T(1) / den[i0 + i];
      for (int64_t t = 0; t < dv; ++t) w.dn[i * dv + t] = gi[t] * inv;
      w.dd[i] = -dot(gi, o + (i0 + i) * dv, dv) * inv;
    }
    gemm(false, false, R, F, dv, T(1), w.dn, w.ST, T(0), w.dqf);  // dnum S^T
    for (int64_t i = 0; i < R; ++i)
      for (int64_t e = 0; e < F; ++e) {
        w.dqf[i * F + e] += w.dd[i] * z[e];
        dz[e] += w.dd[i] * w.qf[i * F + e];
      }
    gemm(true, false, F, dv, R, T(1), w.qf, w.dn, T(1), dS);
    // phi(q) = r (exp(...) + eps): its exp part is qf - r eps
    projected_features_backward(f, R, q + i0 * d, w.qx, w.qf, -r * static_cast<T>(kSoftmaxEps), W,
                                w.dqf, gq + i0 * d);
  }
  std::fill(w.vs, w.vs + dv, T(0));
  for (int64_t e = 0; e < F; ++e)
    for (int64_t t = 0; t < dv; ++t) w.vs[t] += dS[e * dv + t];
  transpose(dS, F, dv, w.ST);
  for (int64_t j0 = 0; j0 < M; j0 += kRows) {
    const int64_t R = std::min(kRows, M - j0);
    const uint8_t* keep = mask ? mask + j0 : nullptr;
    gemm(false, true, R, F, d, c, k + j0 * d, W, T(0), w.kx);
    key_block_features(f, R, k + j0 * d, keep, Mk, w.kx, w.g);
    T* gvb = gv + j0 * dv;
    gemm(false, false, R, F, dv, alpha, v + j0 * dv, w.ST, T(0), w.dg);
    gemm(false, false, R, dv, F, alpha, w.g, dS, T(0), gvb);
    for (int64_t j = 0; j < R; ++j) {
      const bool real = !keep || keep[j];
      for (int64_t e = 0; e < F; ++e)
        w.dg[j * F + e] = real ? w.dg[j * F + e] + alpha * dz[e] : T(0);
      for (int64_t t = 0; t < dv; ++t)
        gvb[j * dv + t] = real ? gvb[j * dv + t] + beta * w.vs[t] : T(0);
    }
    // g = exp(k' - diag(k) - M) with M stop-grad: its own derivative in k'.
    projected_features_backward(f, R, k + j0 * d, w.kx, w.g, T(0), W, w.dg, gk + j0 * d);
  }
}

// Backward for one (b, h). In the forward o_i = num_i / den_i, so
// dnum_i = do_i / den_i and dden_i = -(do_i . o_i) / den_i; then through S, z
// to phi(q), g, v, and through the feature maps to q and k.
template <typename T>
void favor_backward_bh(const FavorDims& f, const T* q, const T* k, const T* v, const T* W,
                       const uint8_t* mask, const T* o, const T* den, const T* go, T* gq, T* gk,
                       T* gv, Scratch<T>& w) {
  const int64_t N = f.s.N, M = f.s.M, d = f.s.d, dv = f.s.dv, F = f.F;
  query_features(f, f.s.N, q, W, w.qx, w.qf);
  const auto [alpha, beta] = key_features(f, k, W, mask, w);
  for (int64_t i = 0; i < N; ++i) {
    T dot = 0;
    for (int64_t c = 0; c < dv; ++c) {
      w.dn[i * dv + c] = go[i * dv + c] / den[i];
      dot += go[i * dv + c] * o[i * dv + c];
    }
    w.dd[i] = -dot / den[i];
  }
  if (!f.opt.causal) {
    totals(f, v, mask, alpha, beta, w);
    // dphi(q) = dnum S^T + dden z^T
    gemm(false, true, N, F, dv, T(1), w.dn, w.S, T(0), w.dqf);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t e = 0; e < F; ++e) w.dqf[i * F + e] += w.dd[i] * w.z[e];
    // dS = phi(q)^T dnum [F, dv] (reusing S), dz = phi(q)^T dden [F] (reusing z)
    gemm(true, false, F, dv, N, T(1), w.qf, w.dn, T(0), w.S);
    gemm(true, false, F, 1, N, T(1), w.qf, w.dd, T(0), w.z);
    // In the forward S = alpha g^T v + beta 1 vs^T and z = alpha sum_j g_j + beta n, so
    // dg_j = alpha (dS v_j + dz) and dv_j = alpha dS^T g_j + beta colsum(dS) for real keys.
    gemm(false, true, M, F, dv, alpha, v, w.S, T(0), w.dg);
    gemm(false, false, M, dv, F, alpha, w.g, w.S, T(0), gv);
    std::fill(w.vs, w.vs + dv, T(0));
    for (int64_t e = 0; e < F; ++e)
      for (int64_t c = 0; c < dv; ++c) w.vs[c] += w.S[e * dv + c];
    for (int64_t j = 0; j < M; ++j) {
      const bool real = !mask || mask[j];
      for (int64_t e = 0; e < F; ++e)
        w.dg[j * F + e] = real ? w.dg[j * F + e] + alpha * w.z[e] : T(0);
      for (int64_t c = 0; c < dv; ++c)
        gv[j * dv + c] = real ? gv[j * dv + c] + beta * w.vs[c] : T(0);
    }
  } else {
    // Causal, chunked as in the forward. First a forward sweep for
    // dphi(q_i) = s_i alpha (S~ dnum_i + dden_i z~) (the state of earlier chunks)
    // + alpha sum_{j<=i} D_ij g_j with D_ij = (dnum_i . v_j + dden_i) e_ij (this chunk)
    // + beta (vs_i . dnum_i) + dden_i (beta n_i + 1e-6)   (the terms equal in every feature).
    std::fill(w.S, w.S + F * dv, T(0));
    std::fill(w.z, w.z + F, T(0));
    std::fill(w.vs, w.vs + dv, T(0));
    T n = 0, mprev = -std::numeric_limits<T>::infinity();
    for (int64_t i0 = 0; i0 < N; i0 += kChunk) {
      const int64_t L = std::min(kChunk, N - i0);
      const T *Gc = w.g + i0 * F, *Vc = v + i0 * dv, *Mc = w.mk + i0, *dNc = w.dn + i0 * dv;
      T* dQc = w.dqf + i0 * F;
      intra_chunk_grad_weights(dNc, w.dd + i0, Vc, Mc, L, dv, w.D);
      gemm(false, false, L, F, L, alpha, w.D, Gc, T(0), dQc);
      gemm(false, true, L, F, dv, T(1), dNc, w.S, T(0), w.tmp);  // dnum_i S~^T
      for (int64_t i = 0; i < L; ++i) {
        if (!mask || mask[i0 + i]) {
          for (int64_t c = 0; c < dv; ++c) w.vs[c] += Vc[i * dv + c];
          n += 1;
        }
        const T ddi = w.dd[i0 + i];
        const T bterm =
            beta * dot(w.vs, dNc + i * dv, dv) + ddi * (beta * n + static_cast<T>(kCausalEps));
        const T s = alpha * rescale(mprev, Mc[i]);
        for (int64_t e = 0; e < F; ++e)
          dQc[i * F + e] += s * (w.tmp[i * F + e] + ddi * w.z[e]) + bterm;
      }
      mprev = advance_state(Gc, Vc, Mc, L, F, dv, mprev, w);
    }
    // Then a reverse sweep. Entering chunk [i0, i1) from the right, the state is
    // R~ = sum_{i>=i1} alpha exp(M_i1 - M_i) phi(q_i) dnum_i^T [F, dv] (in S),
    // ra~ = the same with dden_i [F] (in z) and sv = sum_{i>=i1} beta sum(phi(q_i)) dnum_i
    // (in vs). A real key j of the chunk gets, with t_j = exp(M_j - M_i1):
    //   dg_j = t_j (R~ v_j + ra~) + alpha (D^T phi(q))_j
    //   dv_j = t_j R~^T g_j + alpha (P^T dnum)_j + sv_j
    std::fill(w.S, w.S + F * dv, T(0));
    std::fill(w.z, w.z + F, T(0));
    std::fill(w.vs, w.vs + dv, T(0));
    T mnext = 0;
    for (int64_t i0 = ((N - 1) / kChunk) * kChunk; i0 >= 0; i0 -= kChunk) {
      const int64_t L = std::min(kChunk, N - i0);
      const T *Qc = w.qf + i0 * F, *Gc = w.g + i0 * F, *Vc = v + i0 * dv, *Mc = w.mk + i0,
              *dNc = w.dn + i0 * dv;
      T *dGc = w.dg + i0 * F, *dVc = gv + i0 * dv;
      const bool last = i0 + L == N;  // no state from the right yet
      gemm(false, true, L, F, dv, T(1), Vc, w.S, T(0), dGc);
      gemm(false, false, L, dv, F, T(1), Gc, w.S, T(0), dVc);
      for (int64_t j = 0; j < L; ++j) {
        const T t = last ? T(0) : rescale(Mc[j], mnext);
        for (int64_t e = 0; e < F; ++e) dGc[j * F + e] = t * (dGc[j * F + e] + w.z[e]);
        for (int64_t c = 0; c < dv; ++c) dVc[j * dv + c] *= t;
      }
      intra_chunk_weights(Qc, Gc, Mc, L, F, w.P);
      intra_chunk_grad_weights(dNc, w.dd + i0, Vc, Mc, L, dv, w.D);
      gemm(true, false, L, F, L, alpha, w.D, Qc, T(1), dGc);
      gemm(true, false, L, dv, L, alpha, w.P, dNc, T(1), dVc);
      for (int64_t j = L - 1; j >= 0; --j) {
        const T* y = Qc + j * F;
        T ysum = 0;
        for (int64_t e = 0; e < F; ++e) ysum += y[e];
        for (int64_t c = 0; c < dv; ++c) w.vs[c] += beta * ysum * dNc[j * dv + c];
        const bool real = !mask || mask[i0 + j];
        for (int64_t c = 0; c < dv; ++c) dVc[j * dv + c] = real ? dVc[j * dv + c] + w.vs[c] : T(0);
        if (!real) std::fill(dGc + j * F, dGc + (j + 1) * F, T(0));
      }
      // Move the state to M_i0 and add this chunk's queries: u_i = alpha exp(M_i0 - M_i).
      const T rr = last ? T(0) : rescale(Mc[0], mnext);
      for (int64_t t = 0; t < F * dv; ++t) w.S[t] *= rr;
      for (int64_t e = 0; e < F; ++e) w.z[e] *= rr;
      for (int64_t i = 0; i < L; ++i) {
        const T u = alpha * rescale(Mc[0], Mc[i]);
        for (int64_t c = 0; c < dv; ++c) w.tmp[i * dv + c] = u * dNc[i * dv + c];
        const T ud = u * w.dd[i0 + i];
        for (int64_t e = 0; e < F; ++e) w.z[e] += ud * Qc[i * F + e];
      }
      gemm(true, false, F, dv, L, T(1), Qc, w.tmp, T(1), w.S);
      mnext = Mc[0];
    }
  }

  // Through the query feature map (forward: query_features).
  const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(F)));
  if (f.opt.kernel == FavorKernel::no_projection) {
    for (int64_t i = 0; i < N; ++i) {  // softmax_d backward
      const T* y = w.qf + i * F;
      const T* dy = w.dqf + i * F;
      const T ydy = dot(y, dy, F);
      for (int64_t e = 0; e < F; ++e) gq[i * d + e] = y[e] * (dy[e] - ydy);
    }
  } else {  // phi(q) = r (exp(...) + eps): its exp part is qf - r eps
    projected_features_backward(f, N, q, w.qx, w.qf, -r * static_cast<T>(kSoftmaxEps), W, w.dqf,
                                gq);
  }

  // Through the key feature map (forward: key_features); masked keys have dg = 0.
  if (f.opt.kernel == FavorKernel::no_projection) {
    if (f.opt.causal) {
      for (int64_t t = 0; t < M * F; ++t) gk[t] = w.g[t] * w.dg[t];  // g = exp(k)
    } else {
      for (int64_t e = 0; e < F; ++e) {  // softmax over j backward, per feature column
        T dot = 0;
        for (int64_t j = 0; j < M; ++j) dot += w.g[j * F + e] * w.dg[j * F + e];
        for (int64_t j = 0; j < M; ++j) gk[j * F + e] = w.g[j * F + e] * (w.dg[j * F + e] - dot);
      }
    }
    return;
  }
  // g = exp(k' - diag(k) - M_j) with M_j stop-grad: its own derivative in k'.
  projected_features_backward(f, M, k, w.kx, w.g, T(0), W, w.dg, gk);
}

// The CUDA branch (favor_cuda.h): the same op, one autograd node, on GPU tensors.
cuda::FavorArgs cuda_args(const FavorDims& f, DType dtype) {
  cuda::FavorArgs a;
  a.B = f.s.B;
  a.H = f.s.H;
  a.N = f.s.N;
  a.M = f.s.M;
  a.d = f.s.d;
  a.dv = f.s.dv;
  a.F = f.F;
  a.dtype = dtype;
  a.map = f.opt.kernel == FavorKernel::softmax ? cuda::FavorMap::softmax
          : f.opt.kernel == FavorKernel::relu  ? cuda::FavorMap::relu
                                               : cuda::FavorMap::no_projection;
  a.causal = f.opt.causal;
  a.prefix = f.opt.causal && f.opt.kernel == FavorKernel::softmax &&
             f.opt.stabilizer == FavorStabilizer::prefix;
  return a;
}

// The device data of an optional tensor (null when undefined).
void* device_ptr(const Tensor& t) {
  return t.defined() ? t.raw_device_data() : nullptr;
}

Tensor favor_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& W,
                  const Tensor& key_padding_mask, const FavorDims& f) {
  const cuda::FavorArgs a = cuda_args(f, q.dtype());
  const Device dev = q.device();
  const DType acc = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const auto* mask = static_cast<const uint8_t*>(device_ptr(key_padding_mask));
  Tensor out = Tensor::empty({a.B, a.H, a.N, a.dv}, q.dtype(), dev);
  // The prefix scan's normalisers [B, H, N] (accumulation type), for its backward.
  Tensor den = a.prefix ? Tensor::empty({a.B, a.H, a.N}, acc, dev) : Tensor();
  // (The launchers sit under FORGE_IF_CUDA so that builds without CUDA need no definition.)
  FORGE_IF_CUDA(q) {
    Tensor ws = Tensor::empty({cuda::favor_workspace_elems(a, false)}, acc, dev);
    cuda::favor_forward(a, q.raw_device_data(), k.raw_device_data(), v.raw_device_data(),
                        device_ptr(W), mask, out.raw_device_data(), device_ptr(den),
                        ws.raw_device_data(), dev.index);
  }
  const Tensor qd = q.detach(), kd = k.detach(), vd = v.detach(), od = out.detach();
  const Tensor Wd = W.defined() ? W.detach() : Tensor();
  return autograd::record(
      "attention::favor", {q, k, v}, out,
      [a, acc, qd, kd, vd, Wd, od, den, key_padding_mask](const std::vector<Tensor>& g) {
        const Tensor& go = g[0];
        const Device dev = qd.device();
        Tensor gq = Tensor::empty(qd.shape(), qd.dtype(), dev),
               gk = Tensor::empty(kd.shape(), kd.dtype(), dev),
               gv = Tensor::empty(vd.shape(), vd.dtype(), dev);
        FORGE_IF_CUDA(go) {
          Tensor ws = Tensor::empty({cuda::favor_workspace_elems(a, true)}, acc, dev);
          cuda::favor_backward(
              a, qd.raw_device_data(), kd.raw_device_data(), vd.raw_device_data(), device_ptr(Wd),
              static_cast<const uint8_t*>(device_ptr(key_padding_mask)), od.raw_device_data(),
              device_ptr(den), go.raw_device_data(), gq.raw_device_data(), gk.raw_device_data(),
              gv.raw_device_data(), ws.raw_device_data(), dev.index);
        }
        return std::vector<Tensor>{gq, gk, gv};
      });
}

}  // namespace

Tensor favor(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& W,
             const Tensor& key_padding_mask, const FavorOptions& options) {
  FavorDims f;
  f.s = check_qkv("favor", q, k, v, key_padding_mask, options.causal, true);
  f.opt = options;
  if (options.kernel == FavorKernel::no_projection) {
    FORGE_CHECK(!W.defined(),
                "attention::favor: W must be undefined with the no_projection kernel, got {}",
                shape_str(W.shape()));
    f.F = f.s.d;
  } else {
    FORGE_CHECK(W.defined(),
                "attention::favor: W [m, {}] is required by the softmax and relu kernels (make one "
                "with gaussian_orthogonal_random_matrix), got an undefined tensor",
                f.s.d);
    FORGE_CHECK(W.dim() == 2 && W.size(1) == f.s.d && W.size(0) > 0,
                "attention::favor: W must be [m, d] = [m, {}] with m > 0, got {}", f.s.d,
                shape_str(W.shape()));
    FORGE_CHECK(W.device() == q.device(), "attention::favor: W must be on q's device {}, got {}",
                q.device().str(), W.device().str());
    FORGE_CHECK(W.dtype() == q.dtype(),
                "attention::favor: W must be a {} tensor (q's dtype), got {}",
                dtype_name(q.dtype()), dtype_name(W.dtype()));
    FORGE_CHECK(!W.requires_grad(),
                "attention::favor: W is a buffer and gets no gradient; pass it detached");
    f.F = W.size(0);
  }
  FORGE_IF_CUDA(q) return favor_cuda(q, k, v, W, key_padding_mask, f);
  const Dims4& s = f.s;
  Tensor out = Tensor::empty({s.B, s.H, s.N, s.dv}, q.dtype());
  Tensor den = Tensor::empty({s.B, s.H, s.N}, q.dtype());
  // Blocked kernels: each (b, h)'s S, z and key stabiliser for the backward.
  Tensor state =
      blocked(f) ? Tensor::empty({s.B * s.H, blocked_state_size(f)}, q.dtype()) : Tensor();
  const int64_t cost = (s.N + s.M) * f.F * (s.d + s.dv);
  FORGE_DISPATCH_FLOAT(q.dtype(), "attention::favor", [&] {
    const scalar_t* pw = W.defined() ? W.data<scalar_t>() : nullptr;
    parallel_for(s.B * s.H, cost, [&](int64_t b0, int64_t b1) {
      Scratch<scalar_t> w(f, false);
      for (int64_t bh = b0; bh < b1; ++bh) {
        const auto h = head<scalar_t>(s, bh, q, k, v, key_padding_mask);
        scalar_t *ob = out.data<scalar_t>() + bh * s.N * s.dv,
                 *db = den.data<scalar_t>() + bh * s.N;
        if (blocked(f))
          blocked_forward_bh<scalar_t>(f, h.q, h.k, h.v, pw, h.keep, ob, db,
                                       state.data<scalar_t>() + bh * blocked_state_size(f), w);
        else
          favor_forward_bh<scalar_t>(f, h.q, h.k, h.v, pw, h.keep, ob, db, w);
      }
    });
  });
  const Tensor qd = q.detach(), kd = k.detach(), vd = v.detach(), od = out.detach();
  const Tensor Wd = W.defined() ? W.detach() : Tensor();
  return autograd::record(
      "attention::favor", {q, k, v}, out,
      [f, qd, kd, vd, Wd, od, den, state, key_padding_mask](const std::vector<Tensor>& g) {
        const Dims4& s = f.s;
        const Tensor go = g[0];
        std::vector<Tensor> out = empty_grads(qd, kd, vd, qd.dtype());
        const int64_t cost = (s.N + s.M) * f.F * (s.d + s.dv) * 3;
        FORGE_DISPATCH_FLOAT(qd.dtype(), "attention::favor backward", [&] {
          const scalar_t* pw = Wd.defined() ? Wd.data<scalar_t>() : nullptr;
          parallel_for(s.B * s.H, cost, [&](int64_t b0, int64_t b1) {
            Scratch<scalar_t> w(f, true);
            for (int64_t bh = b0; bh < b1; ++bh) {
              const auto h = head<scalar_t>(s, bh, qd, kd, vd, key_padding_mask);
              const auto gh = head_grads<scalar_t>(s, bh, go, out);
              const scalar_t *ob = od.data<scalar_t>() + bh * s.N * s.dv,
                             *db = den.data<scalar_t>() + bh * s.N;
              if (blocked(f))
                blocked_backward_bh<scalar_t>(f, h.q, h.k, h.v, pw, h.keep, ob, db,
                                              state.data<scalar_t>() + bh * blocked_state_size(f),
                                              gh.g, gh.dq, gh.dk, gh.dv, w);
              else
                favor_backward_bh<scalar_t>(f, h.q, h.k, h.v, pw, h.keep, ob, db, gh.g, gh.dq,
                                            gh.dk, gh.dv, w);
            }
          });
        });
        return out;
      });
}

std::vector<AttentionCase> favor_cases() {
  struct Spec {
    const char* name;
    FavorKernel kernel;
    bool causal;
    FavorStabilizer stabilizer;
    bool mask;
    int64_t M;
    bool bench;
  };
  using K = FavorKernel;
  using S = FavorStabilizer;
  const Spec specs[] = {
      {"favor/softmax", K::softmax, false, S::prefix, false, 6, true},
      {"favor/softmax+mask", K::softmax, false, S::prefix, true, 6, false},
      {"favor/softmax+cross+mask", K::softmax, false, S::prefix, true, 8, false},
      {"favor/softmax+causal", K::softmax, true, S::prefix, false, 6, true},
      {"favor/softmax+causal+mask", K::softmax, true, S::prefix, true, 6, false},
      {"favor/softmax+causal+global", K::softmax, true, S::global, false, 6, false},
      {"favor/softmax+causal+global+mask", K::softmax, true, S::global, true, 6, false},
      {"favor/relu", K::relu, false, S::prefix, false, 6, true},
      {"favor/relu+cross+mask", K::relu, false, S::prefix, true, 8, false},
      {"favor/relu+causal+mask", K::relu, true, S::prefix, true, 6, false},
      {"favor/no_projection+mask", K::no_projection, false, S::prefix, true, 6, false},
      {"favor/no_projection+cross", K::no_projection, false, S::prefix, false, 8, false},
      {"favor/no_projection+causal+mask", K::no_projection, true, S::prefix, true, 6, false},
  };
  std::vector<AttentionCase> cases;
  for (const Spec& sp : specs) {
    AttentionCase c;
    c.name = sp.name;
    c.dims.M = sp.M;
    c.dims.k = 5;
    // The softmax kernel's maxima are stop-grad (as the reference): central
    // differences on the element holding a maximum also move it, and the output
    // feels that through the eps term, an O(1e-4) difference the analytic
    // gradient rightly leaves out. The naive-composite test checks these
    // gradients to 1e-10.
    if (sp.kernel == FavorKernel::softmax) c.gradcheck.atol = 3e-4;
    c.make_inputs = [sp](const CaseDims& s) {
      // q, k, v, then W (projection kernels: m = k, or performer-pytorch's
      // default int(d ln d)), then the mask (masked cases).
      std::vector<Tensor> in = case_qkv(s, 11);
      if (sp.kernel != FavorKernel::no_projection) {
        const auto m = s.k > 0 ? s.k
                               : std::max<int64_t>(
                                     1, static_cast<int64_t>(static_cast<double>(s.d) *
                                                             std::log(static_cast<double>(s.d))));
        Generator g(14);
        in.push_back(gaussian_orthogonal_random_matrix(m, s.d, 0, DType::f64, &g));
      }
      // Batch 0: the last key padded; batch 1: key 1.
      if (sp.mask)
        in.push_back(case_key_mask(s, [](int64_t b, int64_t j, int64_t M) {
          return b == 0 ? j == M - 1 : b == 1 && j == 1;
        }));
      return in;
    };
    c.fn = [sp](const std::vector<Tensor>& in) {
      const bool proj = sp.kernel != FavorKernel::no_projection;
      const Tensor W = proj ? in[3] : Tensor();
      const Tensor mask = sp.mask ? in[proj ? 4 : 3] : Tensor();
      return favor(in[0], in[1], in[2], W, mask, FavorOptions{sp.kernel, sp.causal, sp.stabilizer});
    };
    c.bench = sp.bench;
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace forge::ops::attention
