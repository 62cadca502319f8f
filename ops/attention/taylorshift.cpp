// TaylorShift attention (Nauen et al. 2024): the softmax's exp replaced by its
// second-order Taylor polynomial T(A) = a A^2 + b A + c of normalised scores,
// as one autograd op with two interchangeable kernels (ATTENTION.md,
// "taylorshift"):
//   direct,    O(N M d): tiles of A = q^ k^^T, T, P = T / rowsum(T), o = P v;
//   efficient, O((N + M) d^2 dv): a [d^2, dv + 1] state of key outer products.
// Neither ever holds anything N x M; the backward recomputes tiles and states.
//
// Per (b, h): q [N, d], k [M, d], v [M, dv], tau[h] the learnable temperature;
//   q^_i = tau q_i / ||q_i||,  k^_j = k_j / ||k_j||.
// n_b = the number of real keys of batch b (all M without a mask). It is the
// "N" of v~ = [1 | v] / n_b and of output_normalized's sqrt(n_b / d): the key
// count, as the reference uses, so a padded batch gives the same output as the
// unpadded one. A row whose keys are all masked outputs 0.
//
// On a GPU both forms run as fused kernels (taylorshift_cuda.h), in f32, f64,
// bf16 and f16, computing in f32 (f64 for f64) and saving the normaliser in
// that type.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/threading.h"
#include "ops/attention/attention.h"
#include "ops/attention/cases.h"
#include "ops/attention/common.h"
#include "ops/attention/taylorshift_cuda.h"
#include "ops/blas.h"

namespace forge::ops::attention {

namespace {

constexpr int64_t kTileQ = 64;   // query rows per tile (both forms)
constexpr int64_t kTileK = 128;  // key rows per tile (direct form)

// Everything a kernel needs about one call: dims, coefficients, the mask.
struct Problem {
  Dims4 s;
  double a, b, c;
  double sigma;  // d^1/4
  bool normalized;
  const uint8_t* mask;  // [B, M] or null
};

// Real keys of batch b.
int64_t real_keys(const Problem& p, int64_t b) {
  if (!p.mask) return p.s.M;
  int64_t n = 0;
  for (int64_t j = 0; j < p.s.M; ++j) n += p.mask[b * p.s.M + j] != 0;
  return n;
}

bool is_real(const Problem& p, int64_t b, int64_t j) {
  return !p.mask || p.mask[b * p.s.M + j] != 0;
}

// out [rows, d] = scale * x / ||x|| row-wise; inv_norm [rows] = 1 / ||x||.
template <typename T>
void normalize_rows(const T* x, int64_t rows, int64_t d, T scale, T* out, T* inv_norm) {
  for (int64_t r = 0; r < rows; ++r) {
    const T inv = T(1) / std::sqrt(dot(x + r * d, x + r * d, d));
    inv_norm[r] = inv;
    for (int64_t c = 0; c < d; ++c) out[r * d + c] = scale * x[r * d + c] * inv;
  }
}

// The backward of y = scale * x / ||x|| for rows of x: dx = scale (dy - u (u . dy)) / ||x||,
// u = x / ||x||; returns sum over rows of u . dy, the gradient of `scale`.
template <typename T>
T normalize_rows_backward(const T* x, const T* inv_norm, const T* dy, int64_t rows, int64_t d,
                          T scale, T* dx) {
  T dscale = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T inv = inv_norm[r];
    const T udy = inv * dot(x + r * d, dy + r * d, d);
    dscale += udy;
    for (int64_t c = 0; c < d; ++c)
      dx[r * d + c] = scale * inv * (dy[r * d + c] - x[r * d + c] * inv * udy);
  }
  return dscale;
}

// F [rows, d^2]: F[r, p d + s] = x[r, p] x[r, s], the features x ⊠ x.
template <typename T>
void outer_features(const T* x, int64_t rows, int64_t d, T* F) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < d; ++p) {
      const T xp = x[r * d + p];
      T* f = F + r * d * d + p * d;
      for (int64_t s = 0; s < d; ++s) f[s] = xp * x[r * d + s];
    }
}

// The backward of outer_features: dx[r] += (G + G^T) x[r] with G = dF[r] as [d, d].
template <typename T>
void outer_features_backward(const T* x, const T* dF, int64_t rows, int64_t d, T* dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* G = dF + r * d * d;
    const T* xr = x + r * d;
    for (int64_t p = 0; p < d; ++p) {
      T acc = 0;
      for (int64_t s = 0; s < d; ++s) acc += (G[p * d + s] + G[s * d + p]) * xr[s];
      dx[r * d + p] += acc;
    }
  }
}

// Runs body(bh, scratch) for every batch-head, the scratch (`per` elements)
// private to each of the parallel chunks and allocated once per chunk.
template <typename T, typename F>
void for_each_head(int64_t BH, int64_t per, int64_t cost, F&& body) {
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(num_threads(), BH));
  Tensor scratch = Tensor::empty({chunks, per}, dtype_of<T>());
  T* base = scratch.data<T>();
  parallel_for(chunks, cost * BH / chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t bh = BH * c / chunks; bh < BH * (c + 1) / chunks; ++bh) body(bh, base + c * per);
  });
}

// ---------------------------------------------------------------- direct form

// o [B, H, N, dv] = P v scaled; l [B, H, N] = rowsum(T) (0 for a row with no real key).
template <typename T>
void direct_forward(const Problem& p, const T* q, const T* k, const T* v, const T* tau, T* o,
                    T* l) {
  const auto [B, H, N, M, d, dv] = p.s;
  const T a = T(p.a), b = T(p.b), c = T(p.c);
  // scratch: kh [M, d], inverse key norms [M], qh [tq, d], inverse query norms [tq], S [tq, tk],
  // acc [tq, dv]
  const int64_t per = M * d + M + kTileQ * d + kTileQ + kTileQ * kTileK + kTileQ * dv;
  for_each_head<T>(B * H, per, N * M * (d + dv + 4), [&](int64_t bh, T* w) {
    T *kh = w, *kinv = kh + M * d, *qh = kinv + M, *qinv = qh + kTileQ * d, *S = qinv + kTileQ,
      *acc = S + kTileQ * kTileK;
    const int64_t bi = bh / H, h = bh % H;
    const T* qb = q + bh * N * d;
    const T* kb = k + bh * M * d;
    const T* vb = v + bh * M * dv;
    const T scale = p.normalized ? T(std::sqrt(double(real_keys(p, bi)) / double(d))) : T(1);
    normalize_rows<T>(kb, M, d, T(1), kh, kinv);
    for (int64_t i0 = 0; i0 < N; i0 += kTileQ) {
      const int64_t tq = std::min(kTileQ, N - i0);
      normalize_rows<T>(qb + i0 * d, tq, d, tau[h], qh, qinv);
      T* li = l + bh * N + i0;
      for (int64_t r = 0; r < tq; ++r) li[r] = 0;
      for (int64_t x = 0; x < tq * dv; ++x) acc[x] = 0;
      for (int64_t j0 = 0; j0 < M; j0 += kTileK) {
        const int64_t tk = std::min(kTileK, M - j0);
        // S [tq, tk] = A = q^ k^^T, then T(A), zero at masked keys; accumulate rowsum and T v.
        gemm(false, true, tq, tk, d, T(1), qh, d, kh + j0 * d, d, T(0), S, tk);
        for (int64_t r = 0; r < tq; ++r) {
          T rs = 0;
          for (int64_t j = 0; j < tk; ++j) {
            const T A = S[r * tk + j];
            const T t = is_real(p, bi, j0 + j) ? (a * A + b) * A + c : T(0);
            S[r * tk + j] = t;
            rs += t;
          }
          li[r] += rs;
        }
        gemm(false, false, tq, dv, tk, T(1), S, tk, vb + j0 * dv, dv, T(1), acc, dv);
      }
      T* orow = o + (bh * N + i0) * dv;
      for (int64_t r = 0; r < tq; ++r) {
        const T f = li[r] != T(0) ? scale / li[r] : T(0);
        for (int64_t x = 0; x < dv; ++x) orow[r * dv + x] = acc[r * dv + x] * f;
      }
    }
  });
}

// Retraces direct_forward. With dO = scale * do and D_i = do_i . o_i (= dO_i . (P v)_i):
//   dv = P^T dO;  dP = dO v^T;  dT = (dP - D) / l;  dA = dT (2 a A + b) at real keys;
//   dq^ = dA k^;  dk^ = dA^T q^;  then through the row normalisations (and tau).
// dtau_bh [B * H] gets each batch-head's share of dtau.
template <typename T>
void direct_backward(const Problem& p, const T* q, const T* k, const T* v, const T* tau, const T* o,
                     const T* l, const T* go, T* dq, T* dk, T* dv_out, T* dtau_bh) {
  const auto [B, H, N, M, d, dv] = p.s;
  const T a = T(p.a), b = T(p.b), c = T(p.c);
  // scratch: kh, dkh [M, d], kinv [M], qh, dqh [tq, d], qinv, Dr [tq], S, dP [tq, tk], dO [tq, dv]
  const int64_t per =
      2 * M * d + M + 2 * kTileQ * d + 2 * kTileQ + 2 * kTileQ * kTileK + kTileQ * dv;
  for_each_head<T>(B * H, per, N * M * (3 * d + 2 * dv + 8), [&](int64_t bh, T* w) {
    T *kh = w, *dkh = kh + M * d, *kinv = dkh + M * d, *qh = kinv + M, *dqh = qh + kTileQ * d,
      *qinv = dqh + kTileQ * d, *Dr = qinv + kTileQ, *S = Dr + kTileQ, *dP = S + kTileQ * kTileK,
      *dO = dP + kTileQ * kTileK;
    const int64_t bi = bh / H, h = bh % H;
    const T* qb = q + bh * N * d;
    const T* kb = k + bh * M * d;
    const T* vb = v + bh * M * dv;
    T* dvb = dv_out + bh * M * dv;
    const T scale = p.normalized ? T(std::sqrt(double(real_keys(p, bi)) / double(d))) : T(1);
    normalize_rows<T>(kb, M, d, T(1), kh, kinv);
    for (int64_t x = 0; x < M * d; ++x) dkh[x] = 0;
    for (int64_t x = 0; x < M * dv; ++x) dvb[x] = 0;
    T dtau = 0;
    for (int64_t i0 = 0; i0 < N; i0 += kTileQ) {
      const int64_t tq = std::min(kTileQ, N - i0);
      normalize_rows<T>(qb + i0 * d, tq, d, tau[h], qh, qinv);
      const T* li = l + bh * N + i0;
      const T* orow = o + (bh * N + i0) * dv;
      const T* grow = go + (bh * N + i0) * dv;
      for (int64_t r = 0; r < tq; ++r) {
        T D = 0;
        for (int64_t x = 0; x < dv; ++x) D += grow[r * dv + x] * orow[r * dv + x];
        Dr[r] = D;
        for (int64_t x = 0; x < dv; ++x) dO[r * dv + x] = scale * grow[r * dv + x];
      }
      for (int64_t x = 0; x < tq * d; ++x) dqh[x] = 0;
      for (int64_t j0 = 0; j0 < M; j0 += kTileK) {
        const int64_t tk = std::min(kTileK, M - j0);
        // In the forward S = A and T(A) / l = P; now S becomes P and dP becomes dA.
        gemm(false, true, tq, tk, d, T(1), qh, d, kh + j0 * d, d, T(0), S, tk);
        gemm(false, true, tq, tk, dv, T(1), dO, dv, vb + j0 * dv, dv, T(0), dP, tk);
        for (int64_t r = 0; r < tq; ++r) {
          const T inv_l = li[r] != T(0) ? T(1) / li[r] : T(0);
          for (int64_t j = 0; j < tk; ++j) {
            const T A = S[r * tk + j];
            const bool real = is_real(p, bi, j0 + j);
            S[r * tk + j] = real ? ((a * A + b) * A + c) * inv_l : T(0);
            dP[r * tk + j] = real ? (dP[r * tk + j] - Dr[r]) * inv_l * (T(2) * a * A + b) : T(0);
          }
        }
        gemm(true, false, tk, dv, tq, T(1), S, tk, dO, dv, T(1), dvb + j0 * dv, dv);
        gemm(false, false, tq, d, tk, T(1), dP, tk, kh + j0 * d, d, T(1), dqh, d);
        gemm(true, false, tk, d, tq, T(1), dP, tk, qh, d, T(1), dkh + j0 * d, d);
      }
      dtau +=
          normalize_rows_backward<T>(qb + i0 * d, qinv, dqh, tq, d, tau[h], dq + (bh * N + i0) * d);
    }
    normalize_rows_backward<T>(kb, kinv, dkh, M, d, T(1), dk + bh * M * d);
    dtau_bh[bh] = dtau;
  });
}

// ------------------------------------------------------------- efficient form

// The key state of one batch-head, with k~ = sigma k^ and v~ = [1 | v] / n_b (0 at masked keys):
//   S2 [d^2, dv + 1] = sum_j (k~_j ⊠ k~_j) v~_j^T;  S1 [d, dv + 1] = sum_j k~_j v~_j^T;
//   S0 [dv + 1] = sum_j v~_j.
// kt [tq, d], kinv [tq], F [tq, d^2], vt [tq, dv + 1] are scratch.
template <typename T>
void key_state(const Problem& p, int64_t bi, const T* kb, const T* vb, T inv_n, T* S2, T* S1, T* S0,
               T* kt, T* kinv, T* F, T* vt) {
  const int64_t M = p.s.M, d = p.s.d, dv = p.s.dv, dv1 = dv + 1, d2 = d * d;
  for (int64_t x = 0; x < d2 * dv1; ++x) S2[x] = 0;
  for (int64_t x = 0; x < d * dv1; ++x) S1[x] = 0;
  for (int64_t x = 0; x < dv1; ++x) S0[x] = 0;
  for (int64_t j0 = 0; j0 < M; j0 += kTileQ) {
    const int64_t tk = std::min(kTileQ, M - j0);
    normalize_rows<T>(kb + j0 * d, tk, d, T(p.sigma), kt, kinv);
    outer_features<T>(kt, tk, d, F);
    for (int64_t j = 0; j < tk; ++j) {
      const T f = is_real(p, bi, j0 + j) ? inv_n : T(0);
      vt[j * dv1] = f;
      for (int64_t x = 0; x < dv; ++x) vt[j * dv1 + 1 + x] = f * vb[(j0 + j) * dv + x];
      for (int64_t x = 0; x < dv1; ++x) S0[x] += vt[j * dv1 + x];
    }
    gemm(true, false, d2, dv1, tk, T(1), F, d2, vt, dv1, T(1), S2, dv1);
    gemm(true, false, d, dv1, tk, T(1), kt, d, vt, dv1, T(1), S1, dv1);
  }
}

// o [B, H, N, dv] = Y[:, 1:] / Y[:, 0] scaled; y0 [B, H, N] = Y[:, 0] (0 when no key is real), with
//   Y = a (q~ ⊠ q~) S2 + sigma^2 b q~ S1 + sigma^4 c S0,  q~ = sigma q^.
template <typename T>
void efficient_forward(const Problem& p, const T* q, const T* k, const T* v, const T* tau, T* o,
                       T* y0) {
  const auto [B, H, N, M, d, dv] = p.s;
  const int64_t dv1 = dv + 1, d2 = d * d;
  const T sig = T(p.sigma), sig2 = sig * sig;
  const T a = T(p.a), b2 = T(p.b) * sig2, c4 = T(p.c) * sig2 * sig2;
  // scratch: S2, S1, S0, xt [tq, d], xinv [tq], F [tq, d^2], Y [tq, dv + 1]
  const int64_t per = d2 * dv1 + d * dv1 + dv1 + kTileQ * d + kTileQ + kTileQ * d2 + kTileQ * dv1;
  for_each_head<T>(B * H, per, (N + M) * d2 * dv1 * 2, [&](int64_t bh, T* w) {
    T *S2 = w, *S1 = S2 + d2 * dv1, *S0 = S1 + d * dv1, *xt = S0 + dv1, *xinv = xt + kTileQ * d,
      *F = xinv + kTileQ, *Y = F + kTileQ * d2;
    const int64_t bi = bh / H, h = bh % H;
    const int64_t n = real_keys(p, bi);
    const T scale = p.normalized ? T(std::sqrt(double(n) / double(d))) : T(1);
    key_state<T>(p, bi, k + bh * M * d, v + bh * M * dv, T(1) / T(std::max<int64_t>(n, 1)), S2, S1,
                 S0, xt, xinv, F, Y);
    const T* qb = q + bh * N * d;
    for (int64_t i0 = 0; i0 < N; i0 += kTileQ) {
      const int64_t tq = std::min(kTileQ, N - i0);
      normalize_rows<T>(qb + i0 * d, tq, d, sig * tau[h], xt, xinv);
      outer_features<T>(xt, tq, d, F);
      gemm(false, false, tq, dv1, d2, a, F, d2, S2, dv1, T(0), Y, dv1);
      gemm(false, false, tq, dv1, d, b2, xt, d, S1, dv1, T(1), Y, dv1);
      T* orow = o + (bh * N + i0) * dv;
      for (int64_t r = 0; r < tq; ++r) {
        for (int64_t x = 0; x < dv1; ++x) Y[r * dv1 + x] += c4 * S0[x];
        const T y = n > 0 ? Y[r * dv1] : T(0);
        y0[bh * N + i0 + r] = y;
        const T f = y != T(0) ? scale / y : T(0);
        for (int64_t x = 0; x < dv; ++x) orow[r * dv + x] = Y[r * dv1 + 1 + x] * f;
      }
    }
  });
}

// Retraces efficient_forward. With dO = scale * do and D_i = do_i . o_i, o = Y[:, 1:] / Y[:, 0]
// gives
//   dY_i = [-D_i, dO_i] / y0_i.
// Y = a Fq S2 + sigma^2 b q~ S1 + sigma^4 c S0 gives
//   dS2 = a Fq^T dY, dS1 = sigma^2 b q~^T dY, dS0 = sigma^4 c sum_i dY_i,
//   dFq = a dY S2^T, dq~ = sigma^2 b dY S1^T + (features' backward of dFq);
// and the key state (S2 = Fk^T v~, S1 = k~^T v~, S0 = sum v~) gives
//   dFk = v~ dS2^T, dk~ = v~ dS1^T + (features' backward), dv~ = Fk dS2 + k~ dS1 + dS0, dv = dv~[:,
//   1:] / n_b.
template <typename T>
void efficient_backward(const Problem& p, const T* q, const T* k, const T* v, const T* tau,
                        const T* o, const T* y0, const T* go, T* dq, T* dk, T* dv_out, T* dtau_bh) {
  const auto [B, H, N, M, d, dv] = p.s;
  const int64_t dv1 = dv + 1, d2 = d * d;
  const T sig = T(p.sigma), sig2 = sig * sig;
  const T a = T(p.a), b2 = T(p.b) * sig2, c4 = T(p.c) * sig2 * sig2;
  // scratch: S2, dS2 [d^2, dv + 1], S1, dS1 [d, dv + 1], S0, dS0 [dv + 1], xt, dxt [tq, d], xinv
  // [tq], F, dF [tq, d^2], Y, dY [tq, dv + 1]
  const int64_t per =
      2 * (d2 * dv1 + d * dv1 + dv1 + kTileQ * d + kTileQ * d2 + kTileQ * dv1) + kTileQ;
  for_each_head<T>(B * H, per, (N + M) * d2 * dv1 * 6, [&](int64_t bh, T* w) {
    T *S2 = w, *dS2 = S2 + d2 * dv1, *S1 = dS2 + d2 * dv1, *dS1 = S1 + d * dv1, *S0 = dS1 + d * dv1,
      *dS0 = S0 + dv1, *xt = dS0 + dv1, *dxt = xt + kTileQ * d, *xinv = dxt + kTileQ * d,
      *F = xinv + kTileQ, *dF = F + kTileQ * d2, *Y = dF + kTileQ * d2, *dY = Y + kTileQ * dv1;
    const int64_t bi = bh / H, h = bh % H;
    const int64_t n = real_keys(p, bi);
    const T inv_n = T(1) / T(std::max<int64_t>(n, 1));
    const T scale = p.normalized ? T(std::sqrt(double(n) / double(d))) : T(1);
    const T* qb = q + bh * N * d;
    const T* kb = k + bh * M * d;
    const T* vb = v + bh * M * dv;
    key_state<T>(p, bi, kb, vb, inv_n, S2, S1, S0, xt, xinv, F, Y);
    for (int64_t x = 0; x < d2 * dv1; ++x) dS2[x] = 0;
    for (int64_t x = 0; x < d * dv1; ++x) dS1[x] = 0;
    for (int64_t x = 0; x < dv1; ++x) dS0[x] = 0;
    T dtau = 0;
    for (int64_t i0 = 0; i0 < N; i0 += kTileQ) {
      const int64_t tq = std::min(kTileQ, N - i0);
      normalize_rows<T>(qb + i0 * d, tq, d, sig * tau[h], xt, xinv);
      outer_features<T>(xt, tq, d, F);
      const T* orow = o + (bh * N + i0) * dv;
      const T* grow = go + (bh * N + i0) * dv;
      for (int64_t r = 0; r < tq; ++r) {
        const T y = y0[bh * N + i0 + r];
        const T f = y != T(0) ? T(1) / y : T(0);
        T D = 0;
        for (int64_t x = 0; x < dv; ++x) D += grow[r * dv + x] * orow[r * dv + x];
        dY[r * dv1] = -D * f;
        for (int64_t x = 0; x < dv; ++x) dY[r * dv1 + 1 + x] = scale * grow[r * dv + x] * f;
        for (int64_t x = 0; x < dv1; ++x) dS0[x] += c4 * dY[r * dv1 + x];
      }
      gemm(true, false, d2, dv1, tq, a, F, d2, dY, dv1, T(1), dS2, dv1);
      gemm(true, false, d, dv1, tq, b2, xt, d, dY, dv1, T(1), dS1, dv1);
      gemm(false, true, tq, d2, dv1, a, dY, dv1, S2, dv1, T(0), dF, d2);
      gemm(false, true, tq, d, dv1, b2, dY, dv1, S1, dv1, T(0), dxt, d);
      outer_features_backward<T>(xt, dF, tq, d, dxt);
      // q~ = (sigma tau) q / ||q||: the scale's gradient is sum u . dq~, and dtau = sigma times it.
      dtau += sig * normalize_rows_backward<T>(qb + i0 * d, xinv, dxt, tq, d, sig * tau[h],
                                               dq + (bh * N + i0) * d);
    }
    for (int64_t j0 = 0; j0 < M; j0 += kTileQ) {
      const int64_t tk = std::min(kTileQ, M - j0);
      normalize_rows<T>(kb + j0 * d, tk, d, sig, xt, xinv);
      outer_features<T>(xt, tk, d, F);
      for (int64_t j = 0; j < tk; ++j) {
        const T f = is_real(p, bi, j0 + j) ? inv_n : T(0);
        Y[j * dv1] = f;
        for (int64_t x = 0; x < dv; ++x) Y[j * dv1 + 1 + x] = f * vb[(j0 + j) * dv + x];
      }
      // Y holds v~ of this key tile; dY becomes dv~.
      gemm(false, true, tk, d2, dv1, T(1), Y, dv1, dS2, dv1, T(0), dF, d2);
      gemm(false, true, tk, d, dv1, T(1), Y, dv1, dS1, dv1, T(0), dxt, d);
      outer_features_backward<T>(xt, dF, tk, d, dxt);
      normalize_rows_backward<T>(kb + j0 * d, xinv, dxt, tk, d, sig, dk + (bh * M + j0) * d);
      gemm(false, false, tk, dv1, d2, T(1), F, d2, dS2, dv1, T(0), dY, dv1);
      gemm(false, false, tk, dv1, d, T(1), xt, d, dS1, dv1, T(1), dY, dv1);
      T* dvrow = dv_out + (bh * M + j0) * dv;
      for (int64_t j = 0; j < tk; ++j) {
        const T f = is_real(p, bi, j0 + j) ? inv_n : T(0);
        for (int64_t x = 0; x < dv; ++x) dvrow[j * dv + x] = f * (dY[j * dv1 + 1 + x] + dS0[1 + x]);
      }
    }
    dtau_bh[bh] = dtau;
  });
}

// ---------------------------------------------------------------- on a GPU

// The type the GPU kernels accumulate in, which they keep the normaliser in.
DType acc_dtype(DType dtype) {
  return dtype == DType::f64 ? DType::f64 : DType::f32;
}

cuda::TaylorShiftArgs cuda_args(const Problem& p, bool direct, DType dtype, const Tensor& mask) {
  cuda::TaylorShiftArgs a;
  a.B = p.s.B;
  a.H = p.s.H;
  a.N = p.s.N;
  a.M = p.s.M;
  a.d = p.s.d;
  a.dv = p.s.dv;
  a.dtype = dtype;
  a.a = p.a;
  a.b = p.b;
  a.c = p.c;
  a.direct = direct;
  a.output_normalized = p.normalized;
  a.kpm = mask.defined() ? static_cast<const uint8_t*>(mask.raw_device_data()) : nullptr;
  return a;
}

// The launchers' scratch on `device`.
// (Its launcher call sits under `if constexpr (kCudaBuilt)`, as do backward_cuda's, so that
// builds without CUDA, where these helpers are still compiled, need no definition.)
Tensor cuda_scratch(const cuda::TaylorShiftArgs& a, bool backward, Device device) {
  int64_t bytes = 0;
  if constexpr (kCudaBuilt) bytes = cuda::taylorshift_scratch_bytes(a, backward, device.index);
  return Tensor::empty({bytes}, DType::u8, device);
}

std::vector<Tensor> backward_cuda(const Problem& p, bool direct, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& tau, const Tensor& mask,
                                  const Tensor& o, const Tensor& norm, const Tensor& g) {
  const Device dev = q.device();
  Tensor dq = Tensor::empty(q.shape(), q.dtype(), dev),
         dk = Tensor::empty(k.shape(), k.dtype(), dev),
         dv = Tensor::empty(v.shape(), v.dtype(), dev),
         dtau = Tensor::empty(tau.shape(), tau.dtype(), dev);
  if constexpr (kCudaBuilt) {
    const cuda::TaylorShiftArgs a = cuda_args(p, direct, q.dtype(), mask);
    const Tensor scratch = cuda_scratch(a, true, dev);
    cuda::taylorshift_backward(a, q.raw_device_data(), k.raw_device_data(), v.raw_device_data(),
                               tau.raw_device_data(), o.raw_device_data(), norm.raw_device_data(),
                               g.raw_device_data(), dq.raw_device_data(), dk.raw_device_data(),
                               dv.raw_device_data(), dtau.raw_device_data(),
                               scratch.raw_device_data(), dev.index);
  }
  return {dq, dk, dv, dtau};
}

}  // namespace

Tensor taylorshift(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& tau,
                   const Tensor& key_padding_mask, const TaylorShiftOptions& options) {
  const Dims4 s = check_qkv("taylorshift", q, k, v, key_padding_mask, false, true);
  FORGE_CHECK(tau.defined(),
              "attention::taylorshift: tau is undefined; pass the per-head temperature [H] = [{}]",
              s.H);
  FORGE_CHECK(tau.shape() == Shape({s.H}), "attention::taylorshift: tau must be [H] = [{}], got {}",
              s.H, shape_str(tau.shape()));
  FORGE_CHECK(tau.dtype() == q.dtype() && tau.device() == q.device(),
              "attention::taylorshift: tau must be a {} {} tensor like q, got {} on {}",
              q.device().is_cpu() ? std::string("CPU") : q.device().str(), dtype_name(q.dtype()),
              dtype_name(tau.dtype()), tau.device().str());
  FORGE_CHECK(options.a > 0, "attention::taylorshift: coefficient a must be > 0, got a = {}",
              options.a);
  FORGE_CHECK(options.c >= options.b * options.b / (4 * options.a),
              "attention::taylorshift: coefficients need c >= b^2 / (4 a) = {} so that T(A) >= 0, "
              "got a = {}, "
              "b = {}, c = {}",
              options.b * options.b / (4 * options.a), options.a, options.b, options.c);
  FORGE_CHECK(options.n0 >= -1,
              "attention::taylorshift: n0 must be -1 (always efficient), 0 (d^2 + d + 1) or a "
              "length, got {}",
              options.n0);
  const int64_t n0 = options.n0 == 0 ? s.d * s.d + s.d + 1 : options.n0;
  const bool direct = options.n0 != -1 && s.N <= n0;
  const bool cuda = q.device().is_cuda();
  FORGE_CHECK(!cuda || !direct ||
                  (s.d <= cuda::kTaylorShiftDirectMaxDim && s.dv <= cuda::kTaylorShiftDirectMaxDim),
              "attention::taylorshift: on a GPU the direct form takes head dims d, dv <= {}, got "
              "d = {}, dv = {}",
              cuda::kTaylorShiftDirectMaxDim, s.d, s.dv);
  FORGE_CHECK(!cuda || direct || (s.d + 1) * (s.d + 1) * (s.dv + 1) <= INT32_MAX,
              "attention::taylorshift: on a GPU the efficient form's state of (d + 1)^2 x (dv + 1) "
              "values per batch-head must stay below 2^31, got d = {}, dv = {}; use the direct "
              "form (a larger n0)",
              s.d, s.dv);

  const Problem p{s,
                  options.a,
                  options.b,
                  options.c,
                  std::pow(double(s.d), 0.25),
                  options.output_normalized,
                  cuda ? nullptr : mask_bytes(key_padding_mask)};
  Tensor out = Tensor::empty({s.B, s.H, s.N, s.dv}, q.dtype(), q.device());
  // The per-row normaliser: rowsum(T) (direct) or Y[:, 0] (efficient), [B, H, N]
  // (on a GPU in the accumulation type).
  Tensor norm = Tensor::empty({s.B, s.H, s.N}, cuda ? acc_dtype(q.dtype()) : q.dtype(), q.device());
  FORGE_IF_CUDA(q) {
    const cuda::TaylorShiftArgs a = cuda_args(p, direct, q.dtype(), key_padding_mask);
    const Tensor scratch = cuda_scratch(a, false, q.device());
    cuda::taylorshift_forward(a, q.raw_device_data(), k.raw_device_data(), v.raw_device_data(),
                              tau.raw_device_data(), out.raw_device_data(), norm.raw_device_data(),
                              scratch.raw_device_data(), q.device().index);
  }
  if (q.device().is_cpu()) {
    FORGE_DISPATCH_FLOAT(q.dtype(), "attention::taylorshift", [&] {
      const scalar_t *qp = q.data<scalar_t>(), *kp = k.data<scalar_t>(), *vp = v.data<scalar_t>(),
                     *tp = tau.data<scalar_t>();
      if (direct)
        direct_forward<scalar_t>(p, qp, kp, vp, tp, out.data<scalar_t>(), norm.data<scalar_t>());
      else
        efficient_forward<scalar_t>(p, qp, kp, vp, tp, out.data<scalar_t>(), norm.data<scalar_t>());
    });
  }
  return autograd::record(
      "taylorshift", {q, k, v, tau}, out,
      [p, direct, q = q.detach(), k = k.detach(), v = v.detach(), tau = tau.detach(),
       mask = key_padding_mask, o = out.detach(),
       norm](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        FORGE_IF_CUDA(grads[0]) {
          return backward_cuda(p, direct, q, k, v, tau, mask, o, norm, grads[0]);
        }
        const Dims4& s = p.s;
        Tensor dq = Tensor::empty(q.shape(), q.dtype()), dk = Tensor::empty(k.shape(), k.dtype()),
               dv = Tensor::empty(v.shape(), v.dtype()),
               dtau = Tensor::zeros(tau.shape(), tau.dtype());
        Tensor dtau_bh = Tensor::empty({s.B * s.H}, tau.dtype());
        FORGE_DISPATCH_FLOAT(q.dtype(), "attention::taylorshift backward", [&] {
          const scalar_t *qp = q.data<scalar_t>(), *kp = k.data<scalar_t>(),
                         *vp = v.data<scalar_t>(), *tp = tau.data<scalar_t>(),
                         *op = o.data<scalar_t>(), *np = norm.data<scalar_t>(),
                         *gp = grads[0].data<scalar_t>();
          scalar_t *dqp = dq.data<scalar_t>(), *dkp = dk.data<scalar_t>(),
                   *dvp = dv.data<scalar_t>(), *dbh = dtau_bh.data<scalar_t>();
          if (direct)
            direct_backward<scalar_t>(p, qp, kp, vp, tp, op, np, gp, dqp, dkp, dvp, dbh);
          else
            efficient_backward<scalar_t>(p, qp, kp, vp, tp, op, np, gp, dqp, dkp, dvp, dbh);
          scalar_t* dt = dtau.data<scalar_t>();
          for (int64_t bh = 0; bh < s.B * s.H; ++bh) dt[bh % s.H] += dbh[bh];
        });
        return {dq, dk, dv, dtau};
      });
}

FormDifference taylorshift_form_difference(int64_t B, int64_t H, int64_t N, int64_t d, DType dtype,
                                           uint64_t seed) {
  Generator gen(seed);
  const Tensor q = Tensor::randn({B, H, N, d}, dtype, &gen);
  const Tensor k = Tensor::randn({B, H, N, d}, dtype, &gen);
  const Tensor v = Tensor::randn({B, H, N, d}, dtype, &gen);
  const Tensor tau = Tensor::ones({H}, dtype);
  NoGradGuard no_grad;
  const auto direct = taylorshift(q, k, v, tau, Tensor(), {.n0 = N}).to_vector<double>();
  const auto efficient = taylorshift(q, k, v, tau, Tensor(), {.n0 = -1}).to_vector<double>();
  FormDifference diff;
  for (size_t i = 0; i < direct.size(); ++i) {
    const double e = std::abs(direct[i] - efficient[i]);
    diff.mean_abs += e;
    diff.mean_rel += e / std::max(std::abs(direct[i]), 1e-30);
  }
  diff.mean_abs /= static_cast<double>(direct.size());
  diff.mean_rel /= static_cast<double>(direct.size());
  return diff;
}

std::vector<AttentionCase> taylorshift_cases() {
  struct Variant {
    const char* name;
    int64_t N, M, d, dv;
    bool mask;
    TaylorShiftOptions options;
    bool bench;
  };
  constexpr int64_t kDirect = int64_t{1} << 40;
  const std::vector<Variant> variants = {
      {"direct", 6, 6, 3, 4, false, {.n0 = kDirect}, true},
      {"efficient", 6, 6, 3, 4, false, {.n0 = -1}, true},
      {"direct+mask", 7, 7, 3, 2, true, {.n0 = kDirect}, false},
      {"efficient+mask", 7, 7, 3, 2, true, {.n0 = -1}, false},
      {"direct+cross+mask", 5, 8, 4, 3, true, {.n0 = kDirect}, false},
      {"efficient+cross+mask", 5, 8, 4, 3, true, {.n0 = -1}, false},
      {"direct+coefficients",
       6,
       6,
       3,
       3,
       false,
       {.a = 0.3, .b = -0.4, .c = 0.5, .n0 = kDirect},
       false},
      {"efficient+coefficients",
       6,
       6,
       3,
       3,
       false,
       {.a = 0.3, .b = -0.4, .c = 0.5, .n0 = -1},
       false},
      {"direct+output_normalized+mask",
       6,
       7,
       3,
       3,
       true,
       {.n0 = kDirect, .output_normalized = true},
       false},
      {"efficient+output_normalized+mask",
       6,
       7,
       3,
       3,
       true,
       {.n0 = -1, .output_normalized = true},
       false},
      // d = 2: the default switch point d^2 + d + 1 = 7 sends N = 9 to the efficient form.
      {"default_switch+mask", 9, 9, 2, 3, true, {}, false},
  };
  std::vector<AttentionCase> cases;
  for (const Variant& x : variants) {
    AttentionCase c;
    c.name = std::string("taylorshift/") + x.name;
    c.dims = {.N = x.N, .M = x.M, .d = x.d, .dv = x.dv};
    c.make_inputs = [x](const CaseDims& s) {
      std::vector<Tensor> in = case_qkv(s, 11);
      in.push_back(case_leaf({s.H}, 14, 0.5, 1.5));  // tau, one per head
      // Batch 0: the last key padded; batch 1: keys 1 and M - 2.
      if (x.mask)
        in.push_back(case_key_mask(s, [](int64_t b, int64_t j, int64_t M) {
          return b == 0 ? j == M - 1 : b == 1 && (j == 1 || j == M - 2);
        }));
      return in;
    };
    c.fn = [x](const std::vector<Tensor>& in) {
      return taylorshift(in[0], in[1], in[2], in[3], case_input(in, 4), x.options);
    };
    c.bench = x.bench;
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace forge::ops::attention
