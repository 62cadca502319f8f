// linformer: Linformer attention (Wang et al. 2020, as in linformer-pytorch),
// one autograd op with a fused CPU forward and backward (f32, f64) and a GPU
// path (f32, f64, bf16, f16).
//
//   K = E[:, :M] k + bE [k, d],  V = F[:, :M] v + bF [k, dv]  (k, v zeroed at padding)
//   P = dropout(softmax(q K^T / sqrt(d)))  [N, k],  o = P V
//
// Here k (the letter) is the projected length kdim. The projections are GEMMs
// per batch-head; the scores are computed in blocks of query rows, so the op
// holds at most a rows x kdim tile per thread (never N x M). The backward saves
// the inputs, K and V, the row log-sum-exp [B, H, N] and the dropout's Philox
// (seed, offset, first), and recomputes P.
//
// On a GPU the projections and their gradients are cuBLAS GEMMs and the
// attention over the kdim projected keys is the flash kernels (flash_cuda.h)
// with the CPU's dropout draws; the forward saves o besides, which the flash
// backward needs.

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/attention/attention.h"
#include "ops/attention/cases.h"
#include "ops/attention/common.h"
#include "ops/attention/flash_cuda.h"
#include "ops/attention/linformer_cuda.h"
#include "ops/blas.h"
#include "ops/layout/layout.h"
#include "ops/linalg/matmul.h"
#include "ops/linalg/matmul_cuda.h"
#include "ops/reduce/reduce.h"

namespace forge::ops::attention {

namespace {

constexpr int64_t kRowBlock = 128;      // query rows per score tile
constexpr int64_t kColBlock = 256;      // columns of dE / dF per task
constexpr int64_t kProjectChunk = 512;  // keys per GEMM of the projections K = E k, V = F v

struct LinformerDims {
  Dims4 s;
  int64_t kdim = 0, Mmax = 0;
  double p = 0;                              // dropout
  uint64_t seed = 0, offset = 0, first = 0;  // Generator::reserve_rows
};

template <typename T>
struct Params {
  const T *q, *k, *v, *E, *F, *bE, *bF;  // bE, bF null when absent
  const uint8_t* mask;                   // [B, M] or null
};

template <typename T>
Params<T> params(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& E,
                 const Tensor& F, const Tensor& bE, const Tensor& bF, const Tensor& mask) {
  return {q.data<T>(),
          k.data<T>(),
          v.data<T>(),
          E.data<T>(),
          F.data<T>(),
          bE.defined() ? bE.data<T>() : nullptr,
          bF.defined() ? bF.data<T>() : nullptr,
          mask_bytes(mask)};
}

// Scratch of n elements of T, counted by the allocator (unlike a std::vector).
template <typename T>
Tensor scratch(int64_t n) {
  return Tensor::empty({n}, dtype_of<T>());
}

// K_all [BH, kdim, d] and V_all [BH, kdim, dv]: the projected keys and values.
template <typename T>
void project(const Params<T>& a, const LinformerDims& L, T* K_all, T* V_all) {
  const Dims4& s = L.s;
  const int64_t M = s.M, d = s.d, dv = s.dv, kd = L.kdim;
  parallel_for(s.B * s.H, M * kd * (d + dv), [&](int64_t begin, int64_t end) {
    // Masked copies of k [M, d] and v [M, dv], one pair per thread.
    Tensor kmt = a.mask ? scratch<T>(M * d) : Tensor(),
           vmt = a.mask ? scratch<T>(M * dv) : Tensor();
    T* km = a.mask ? kmt.data<T>() : nullptr;
    T* vm = a.mask ? vmt.data<T>() : nullptr;
    for (int64_t bh = begin; bh < end; ++bh) {
      const T* kb = a.k + bh * M * d;
      const T* vb = a.v + bh * M * dv;
      if (a.mask) {
        const uint8_t* mb = a.mask + (bh / s.H) * M;
        for (int64_t j = 0; j < M; ++j) {
          const T keep = mb[j] ? T(1) : T(0);
          for (int64_t c = 0; c < d; ++c) km[j * d + c] = kb[j * d + c] * keep;
          for (int64_t c = 0; c < dv; ++c) vm[j * dv + c] = vb[j * dv + c] * keep;
        }
        kb = km;
        vb = vm;
      }
      T* K = K_all + bh * kd * d;
      T* V = V_all + bh * kd * dv;
      if (M == 0) {  // no keys: K, V are the biases alone
        std::fill(K, K + kd * d, T(0));
        std::fill(V, V + kd * dv, T(0));
      }
      // Over chunks of kProjectChunk keys: OpenBLAS runs [kdim, M] x [M, 64] at
      // 82 GFLOP/s a core with M = 4096 in one call, 95 in chunks of 512.
      for (int64_t j0 = 0; j0 < M; j0 += kProjectChunk) {
        const int64_t c = std::min(kProjectChunk, M - j0);
        const T beta = j0 == 0 ? T(0) : T(1);
        gemm(false, false, kd, d, c, T(1), a.E + j0, L.Mmax, kb + j0 * d, d, beta, K, d);
        gemm(false, false, kd, dv, c, T(1), a.F + j0, L.Mmax, vb + j0 * dv, dv, beta, V, dv);
      }
      for (int64_t r = 0; r < kd; ++r) {
        const T be = a.bE ? a.bE[r] : T(0), bf = a.bF ? a.bF[r] : T(0);
        for (int64_t c = 0; c < d; ++c) K[r * d + c] += be;
        for (int64_t c = 0; c < dv; ++c) V[r * dv + c] += bf;
      }
    }
  });
}

// The dropout factor of P[bh, i, j]: 0 or 1 / (1 - p). The draw is compared
// with p in double, as every other dropout here (and the GPU kernels) does.
template <typename T>
T keep_factor(const LinformerDims& L, int64_t bh, int64_t i, int64_t j) {
  const uint64_t idx = L.first + static_cast<uint64_t>((bh * L.s.N + i) * L.kdim + j);
  return static_cast<double>(Generator::uniform_f32(L.seed, L.offset, idx)) >= L.p
             ? T(1.0 / (1.0 - L.p))
             : T(0);
}

// o [BH, N, dv] and lse [BH, N] from q and the projections.
template <typename T>
void forward_kernel(const T* q, const T* K_all, const T* V_all, const LinformerDims& L, T* o,
                    T* lse) {
  const Dims4& s = L.s;
  const int64_t N = s.N, d = s.d, dv = s.dv, kd = L.kdim;
  const int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
  parallel_for(s.B * s.H * blocks, kRowBlock * kd * (d + dv), [&](int64_t begin, int64_t end) {
    Tensor Pt = scratch<T>(kRowBlock * kd);  // [rows, kdim], one per thread
    T* P = Pt.data<T>();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / blocks, i0 = (task % blocks) * kRowBlock,
                    rows = std::min(kRowBlock, N - i0);
      const T* K = K_all + bh * kd * d;
      gemm(false, true, rows, kd, d, scale, q + (bh * N + i0) * d, d, K, d, T(0), P, kd);
      for (int64_t r = 0; r < rows; ++r) {
        T* Pr = P + r * kd;
        softmax_row(Pr, Pr, kd, lse + bh * N + i0 + r);  // attention/common.h
        if (L.p > 0)
          for (int64_t j = 0; j < kd; ++j) Pr[j] *= keep_factor<T>(L, bh, i0 + r, j);
      }
      gemm(false, false, rows, dv, kd, T(1), P, kd, V_all + bh * kd * dv, dv, T(0),
           o + (bh * N + i0) * dv, dv);
    }
  });
}

// g = dL/do [BH, N, dv]. Writes dq, dk, dv, dE, dF (and dbE, dbF when non-null).
template <typename T>
void backward_kernel(const Params<T>& a, const T* K_all, const T* V_all, const T* lse, const T* g,
                     const LinformerDims& L, T* dq, T* dk, T* dvv, T* dE, T* dF, T* dbE, T* dbF) {
  const Dims4& s = L.s;
  const int64_t BH = s.B * s.H, N = s.N, M = s.M, d = s.d, dv = s.dv, kd = L.kdim;
  const int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
  // dK [kdim, d] and dV [kdim, dv] sum over the row tiles of a batch-head. The tiles of
  // each batch-head are split into `groups` runs (one run when there are at least as
  // many batch-heads as threads); a task walks its run serially, accumulating into its
  // own partial, so the scratch is [BH * groups, kdim, d], groups <= ceil(threads / BH),
  // not one partial per tile.
  const int64_t groups = std::min(blocks, (num_threads() + BH - 1) / BH);
  Tensor dK_t = scratch<T>(BH * groups * kd * d), dV_t = scratch<T>(BH * groups * kd * dv);
  T* dK_part = dK_t.data<T>();
  T* dV_part = dV_t.data<T>();
  parallel_for(
      BH * groups, (blocks / groups) * kRowBlock * kd * (2 * d + 2 * dv),
      [&](int64_t begin, int64_t end) {
        // Per-thread tiles [rows, kdim]: P, Pd = dropout(P), dP (then dS).
        Tensor tiles = scratch<T>(3 * kRowBlock * kd);
        T* P = tiles.data<T>();
        T* Pd = L.p > 0 ? P + kRowBlock * kd : P;
        T* dP = P + 2 * kRowBlock * kd;
        for (int64_t task = begin; task < end; ++task) {
          const int64_t bh = task / groups, grp = task % groups;
          const T* K = K_all + bh * kd * d;
          const T* V = V_all + bh * kd * dv;
          T* dK = dK_part + task * kd * d;
          T* dV = dV_part + task * kd * dv;
          for (int64_t blk = blocks * grp / groups; blk < blocks * (grp + 1) / groups; ++blk) {
            const int64_t i0 = blk * kRowBlock, rows = std::min(kRowBlock, N - i0);
            const T beta = blk == blocks * grp / groups ? T(0) : T(1);  // first tile of the run
            const T* qb = a.q + (bh * N + i0) * d;
            const T* gb = g + (bh * N + i0) * dv;
            // In the forward P = exp(S - lse) with S = scale q K^T, then Pd = dropout(P), o = Pd V.
            gemm(false, true, rows, kd, d, scale, qb, d, K, d, T(0), P, kd);
            for (int64_t r = 0; r < rows; ++r) {
              const T l = lse[bh * N + i0 + r];
              T* Pr = P + r * kd;
              for (int64_t j = 0; j < kd; ++j) Pr[j] = exp_nonpos(Pr[j] - l);
              if (L.p > 0) {
                T* Pdr = Pd + r * kd;
                for (int64_t j = 0; j < kd; ++j) Pdr[j] = Pr[j] * keep_factor<T>(L, bh, i0 + r, j);
              }
            }
            // o = Pd V: dPd = do V^T [rows, kdim], dV += Pd^T do [kdim, dv].
            gemm(false, true, rows, kd, dv, T(1), gb, dv, V, dv, T(0), dP, kd);
            gemm(true, false, kd, dv, rows, T(1), Pd, kd, gb, dv, beta, dV, dv);
            // Back through dropout (dP = dPd * keep) and the softmax: dS = P (dP - sum_j P dP).
            for (int64_t r = 0; r < rows; ++r) {
              const T* Pr = P + r * kd;
              T* dPr = dP + r * kd;
              if (L.p > 0)
                for (int64_t j = 0; j < kd; ++j) dPr[j] *= keep_factor<T>(L, bh, i0 + r, j);
              const T pd = dot(Pr, dPr, kd);
              for (int64_t j = 0; j < kd; ++j) dPr[j] = Pr[j] * (dPr[j] - pd);
            }
            // S = scale q K^T: dq = scale dS K, dK += scale dS^T q.
            gemm(false, false, rows, d, kd, scale, dP, kd, K, d, T(0), dq + (bh * N + i0) * d, d);
            gemm(true, false, kd, d, rows, scale, dP, kd, qb, d, beta, dK, d);
          }
        }
      });
  // Sum the runs into the first: dK_all [BH, kdim, d], dV_all [BH, kdim, dv].
  if (groups > 1)
    for (int64_t bh = 0; bh < BH; ++bh) {
      T* dK = dK_part + bh * groups * kd * d;
      T* dV = dV_part + bh * groups * kd * dv;
      for (int64_t t = 1; t < groups; ++t) {
        for (int64_t x = 0; x < kd * d; ++x) dK[x] += dK[t * kd * d + x];
        for (int64_t x = 0; x < kd * dv; ++x) dV[x] += dV[t * kd * dv + x];
      }
    }
  auto dK_of = [&](int64_t bh) { return dK_part + bh * groups * kd * d; };
  auto dV_of = [&](int64_t bh) { return dV_part + bh * groups * kd * dv; };
  // K = E km + bE (bE broadcast over d): dbE = row sums of dK over every batch-head.
  for (int64_t r = 0; r < kd; ++r) {
    T se = 0, sf = 0;
    for (int64_t bh = 0; bh < BH; ++bh) {
      for (int64_t c = 0; c < d; ++c) se += dK_of(bh)[r * d + c];
      for (int64_t c = 0; c < dv; ++c) sf += dV_of(bh)[r * dv + c];
    }
    if (dbE) dbE[r] = se;
    if (dbF) dbF[r] = sf;
  }
  // dk = mask (E[:, :M]^T dK) [M, d], dv = mask (F[:, :M]^T dV) [M, dv].
  parallel_for(BH, M * kd * (d + dv), [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      T* dkb = dk + bh * M * d;
      T* dvb = dvv + bh * M * dv;
      gemm(true, false, M, d, kd, T(1), a.E, L.Mmax, dK_of(bh), d, T(0), dkb, d);
      gemm(true, false, M, dv, kd, T(1), a.F, L.Mmax, dV_of(bh), dv, T(0), dvb, dv);
      if (a.mask) {
        const uint8_t* mb = a.mask + (bh / s.H) * M;
        for (int64_t j = 0; j < M; ++j)
          if (!mb[j]) {
            std::fill(dkb + j * d, dkb + (j + 1) * d, T(0));
            std::fill(dvb + j * dv, dvb + (j + 1) * dv, T(0));
          }
      }
    }
  });
  // dE[:, :M] = sum_bh dK km^T and dF[:, :M] = sum_bh dV vm^T, by column blocks;
  // per batch the heads are summed in a tile before the mask drops padded columns.
  const int64_t cblocks = (M + kColBlock - 1) / kColBlock;
  parallel_for(cblocks, s.B * s.H * kColBlock * kd * (d + dv), [&](int64_t begin, int64_t end) {
    Tensor tiles = scratch<T>(2 * kd * kColBlock);  // tE, tF [kdim, cols], one pair per thread
    T* tE = tiles.data<T>();
    T* tF = tE + kd * kColBlock;
    for (int64_t cb = begin; cb < end; ++cb) {
      const int64_t j0 = cb * kColBlock, cols = std::min(kColBlock, M - j0);
      for (int64_t b = 0; b < s.B; ++b) {
        for (int64_t h = 0; h < s.H; ++h) {
          const int64_t bh = b * s.H + h;
          const T beta = h == 0 ? T(0) : T(1);
          gemm(false, true, kd, cols, d, T(1), dK_of(bh), d, a.k + (bh * M + j0) * d, d, beta, tE,
               cols);
          gemm(false, true, kd, cols, dv, T(1), dV_of(bh), dv, a.v + (bh * M + j0) * dv, dv, beta,
               tF, cols);
        }
        const uint8_t* mb = a.mask ? a.mask + b * M + j0 : nullptr;
        for (int64_t r = 0; r < kd; ++r) {
          T* er = dE + r * L.Mmax + j0;
          T* fr = dF + r * L.Mmax + j0;
          const T* te = tE + r * cols;
          const T* tf = tF + r * cols;
          for (int64_t j = 0; j < cols; ++j) {
            const T keep = (!mb || mb[j]) ? T(1) : T(0);
            er[j] += keep * te[j];
            fr[j] += keep * tf[j];
          }
        }
      }
    }
  });
}

// ---- the GPU path: cuBLAS projections around the flash kernels ----
// The functions that call the CUDA entry points are inline: a compiler emits
// an inline function only where it is called, and in a build without CUDA its
// only callers, the FORGE_IF_CUDA branches, are compiled away, so nothing
// there refers to the entry points that such a build does not define.

// The type the kernels accumulate in, and the dtype of lse: f64 for f64, f32
// otherwise (on the CPU, where q is f32 or f64, q's dtype).
DType acc_dtype(DType dtype) {
  return dtype == DType::f64 ? DType::f64 : DType::f32;
}

const uint8_t* device_mask(const Tensor& mask) {
  return mask.defined() ? static_cast<const uint8_t*>(mask.raw_device_data()) : nullptr;
}

// W[:, :M] (W = E or F, detached, [kdim, Mmax]) as a dense [kdim, M] matrix,
// since the GEMMs take dense operands only: W itself when M == Mmax, else a
// copy of its first M columns (kdim x M elements).
Tensor first_columns(const Tensor& W, int64_t M) {
  return W.size(1) == M ? W : ops::narrow(W, 1, 0, M);
}

// Attention of q over the kdim projected keys: no mask, no band, not causal;
// dropout element (bh, i, j) is draw first + (bh * N + i) * kdim + j, the CPU's keep_factor.
cuda::FlashArgs flash_args(const LinformerDims& L, DType dtype) {
  cuda::FlashArgs f;
  f.B = L.s.B;
  f.H = L.s.H;
  f.N = L.s.N;
  f.M = L.kdim;
  f.d = L.s.d;
  f.dv = L.s.dv;
  f.dtype = dtype;
  f.scale = 1.0 / std::sqrt(static_cast<double>(L.s.d));
  f.dropout = L.p;
  f.seed = L.seed;
  f.offset = L.offset;
  f.first = L.first;
  f.engine = flash_engine();
  return f;
}

// X [B, H, kdim, cols] = Ws x_bh + bias per batch-head, with Ws = W[:, :M]
// [kdim, M] (one matrix for every batch-head: stride 0), x [B, H, M, cols] (k
// or v) with the rows of padded keys zeroed, bias [kdim] or undefined.
inline Tensor project_cuda(const Tensor& Ws, const Tensor& bias, const Tensor& x,
                           const Tensor& mask, const LinformerDims& L) {
  const Dims4& s = L.s;
  const int device = x.device().index;
  const int64_t cols = x.size(3);
  Tensor xm = x;
  if (mask.defined()) {
    xm = Tensor::empty(x.shape(), x.dtype(), x.device());
    cuda::linformer_mask_rows(x.dtype(), x.raw_device_data(), xm.raw_device_data(),
                              device_mask(mask), s.B, s.H, s.M, cols, cuda::MaskRows::kMultiply,
                              false, device);
  }
  Tensor X = Tensor::empty({s.B, s.H, L.kdim, cols}, x.dtype(), x.device());
  if (bias.defined())
    cuda::linformer_bias_rows(x.dtype(), bias.raw_device_data(), X.raw_device_data(), s.B * s.H,
                              L.kdim, cols, device);
  cuda::gemm({.n = L.kdim,
              .m = cols,
              .k = s.M,
              .batch = s.B * s.H,
              .ab_dtype = x.dtype(),
              .a = Ws.raw_device_data(),
              .stride_a = 0,
              .b = xm.raw_device_data(),
              .stride_b = s.M * cols,
              .c_dtype = x.dtype(),
              .c = X.raw_device_data(),
              .accumulate = bias.defined(),
              .tf32 = ops::allow_tf32()},
             device);
  return X;
}

// dx [B, H, M, cols] = Ws^T dX_bh per batch-head (Ws = W[:, :M] [kdim, M],
// dX [B, H, kdim, cols]), zero at padded keys.
inline Tensor input_grad_cuda(const Tensor& Ws, const Tensor& dX, const Tensor& mask,
                              const LinformerDims& L) {
  const Dims4& s = L.s;
  const int device = dX.device().index;
  const int64_t cols = dX.size(3);
  Tensor dx = Tensor::empty({s.B, s.H, s.M, cols}, dX.dtype(), dX.device());
  cuda::gemm({.ta = true,
              .n = s.M,
              .m = cols,
              .k = L.kdim,
              .batch = s.B * s.H,
              .ab_dtype = dX.dtype(),
              .a = Ws.raw_device_data(),
              .stride_a = 0,
              .b = dX.raw_device_data(),
              .stride_b = L.kdim * cols,
              .c_dtype = dX.dtype(),
              .c = dx.raw_device_data(),
              .tf32 = ops::allow_tf32()},
             device);
  if (mask.defined())
    cuda::linformer_mask_rows(dx.dtype(), dx.raw_device_data(), dx.raw_device_data(),
                              device_mask(mask), s.B, s.H, s.M, cols, cuda::MaskRows::kZero, false,
                              device);
  return dx;
}

struct WeightGrads {
  Tensor dW, db;  // [kdim, Mmax], [kdim] (undefined without a bias)
};

// The gradients of W [kdim, Mmax] and its bias from dX [B, H, kdim, cols] and
// x [B, H, M, cols]. dW[:, :M] = sum_bh dX_bh xm_bh^T (xm: x with the rows of
// padded keys zeroed) is one GEMM whose inner dimension runs over every
// batch-head and column: dX as [kdim, BH, cols] times xm as [M, BH, cols]
// transposed (copies of the size of dX and x; no atomics, one summation order).
// dW is zero beyond column M; db = the sums of dX's rows over every batch-head.
inline WeightGrads weight_grads_cuda(const Tensor& dX, const Tensor& x, const Tensor& mask,
                                     bool bias, const LinformerDims& L) {
  const Dims4& s = L.s;
  const int device = x.device().index;
  const int64_t BH = s.B * s.H, cols = x.size(3);
  const Tensor dXt = ops::permute(dX.view({BH, L.kdim, cols}), {1, 0, 2});  // [kdim, BH, cols]
  Tensor xt = Tensor::empty({s.M, BH, cols}, x.dtype(), x.device());
  cuda::linformer_mask_rows(x.dtype(), x.raw_device_data(), xt.raw_device_data(), device_mask(mask),
                            s.B, s.H, s.M, cols, cuda::MaskRows::kMultiply, true, device);
  Tensor dWs = Tensor::empty({L.kdim, s.M}, x.dtype(), x.device());
  cuda::gemm({.tb = true,
              .n = L.kdim,
              .m = s.M,
              .k = BH * cols,
              .ab_dtype = x.dtype(),
              .a = dXt.raw_device_data(),
              .b = xt.raw_device_data(),
              .c_dtype = x.dtype(),
              .c = dWs.raw_device_data(),
              .tf32 = ops::allow_tf32()},
             device);
  WeightGrads w;
  w.dW = s.M == L.Mmax ? dWs : ops::pad(dWs, {0, L.Mmax - s.M});
  if (bias) w.db = ops::sum(dXt.view({L.kdim, BH * cols}), {1});
  return w;
}

// The GPU backward: {dq, dk, dv, dE, dF, dbE, dbF} from the saved inputs, the
// forward's K, V [B, H, kdim, d / dv], o and lse, and g = dL/do.
inline std::vector<Tensor> backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& E, const Tensor& F, bool bias_E, bool bias_F,
                                         const Tensor& mask, const Tensor& K, const Tensor& V,
                                         const Tensor& o, const Tensor& lse, const Tensor& g,
                                         const LinformerDims& L) {
  const Dims4& s = L.s;
  const Device dev = q.device();
  // Through the attention: dq and the gradients of the projections dK, dV.
  Tensor dq = Tensor::empty(q.shape(), q.dtype(), dev),
         dK = Tensor::empty(K.shape(), K.dtype(), dev),
         dV = Tensor::empty(V.shape(), V.dtype(), dev);
  Tensor row_dots = Tensor::empty({s.B * s.H * s.N}, acc_dtype(q.dtype()), dev);
  cuda::flash_backward(flash_args(L, q.dtype()), q.raw_device_data(), K.raw_device_data(),
                       V.raw_device_data(), o.raw_device_data(), lse.raw_device_data(),
                       g.raw_device_data(), row_dots.raw_device_data(), dq.raw_device_data(),
                       dK.raw_device_data(), dV.raw_device_data(), dev.index);
  // Through K = E[:, :M] km + bE and V = F[:, :M] vm + bF.
  const Tensor Es = first_columns(E, s.M), Fs = first_columns(F, s.M);
  const Tensor dk = input_grad_cuda(Es, dK, mask, L), dv = input_grad_cuda(Fs, dV, mask, L);
  const WeightGrads wE = weight_grads_cuda(dK, k, mask, bias_E, L),
                    wF = weight_grads_cuda(dV, v, mask, bias_F, L);
  return {dq, dk, dv, wE.dW, wF.dW, wE.db, wF.db};
}

void check_projection(const char* name, const Tensor& t, const Tensor& q, const Shape& expected) {
  FORGE_CHECK(t.defined(), "attention::linformer: {} is undefined; expected {}", name,
              shape_str(expected));
  FORGE_CHECK(t.device() == q.device(), "attention::linformer: {} is on {} but q is on {}", name,
              t.device().str(), q.device().str());
  FORGE_CHECK(t.dtype() == q.dtype(), "attention::linformer: {} is {} but q is {}", name,
              dtype_name(t.dtype()), dtype_name(q.dtype()));
  FORGE_CHECK(t.shape() == expected, "attention::linformer: {} must be {}, got {}", name,
              shape_str(expected), shape_str(t.shape()));
}

}  // namespace

Tensor linformer(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& E,
                 const Tensor& F, const Tensor& bias_E, const Tensor& bias_F,
                 const Tensor& key_padding_mask, const LinformerOptions& options) {
  LinformerDims L;
  L.s = check_qkv("linformer", q, k, v, key_padding_mask, false, true);
  FORGE_CHECK(E.defined() && E.dim() == 2, "attention::linformer: E must be [kdim, Mmax], got {}",
              E.defined() ? shape_str(E.shape()) : std::string("an undefined tensor"));
  L.kdim = E.size(0);
  L.Mmax = E.size(1);
  check_projection("E", E, q, {L.kdim, L.Mmax});
  check_projection("F", F, q, {L.kdim, L.Mmax});
  if (bias_E.defined()) check_projection("bias_E", bias_E, q, {L.kdim});
  if (bias_F.defined()) check_projection("bias_F", bias_F, q, {L.kdim});
  FORGE_CHECK(L.kdim > 0, "attention::linformer: E must have kdim >= 1 rows, got {}",
              shape_str(E.shape()));
  FORGE_CHECK(L.s.M <= L.Mmax,
              "attention::linformer: k has M = {} positions but E, F [kdim, Mmax] cover Mmax = {}; "
              "make E, F for "
              "at least M positions or shorten the input",
              L.s.M, L.Mmax);
  FORGE_CHECK(options.dropout >= 0 && options.dropout < 1,
              "attention::linformer: dropout must be in [0, 1), got {}", options.dropout);
  L.p = options.dropout;
  if (L.p > 0) {
    Generator& gen = options.gen ? *options.gen : default_generator();
    // One draw per (b, h, i, projected key); b is the local batch (a shard of
    // the global one under data parallelism).
    const RowDraws r = gen.reserve_rows(static_cast<uint64_t>(L.s.B * L.s.H * L.s.N * L.kdim));
    L.seed = r.seed, L.offset = r.offset, L.first = r.first;
  }
  const Dims4& s = L.s;
  const Tensor mask = key_padding_mask.defined() ? key_padding_mask.detach() : Tensor();
  Tensor o = Tensor::empty({s.B, s.H, s.N, s.dv}, q.dtype(), q.device()),
         lse = Tensor::empty({s.B, s.H, s.N}, acc_dtype(q.dtype()), q.device());
  // The projections K [B, H, kdim, d] and V [B, H, kdim, dv], saved for the backward
  // (no N in their size).
  Tensor K, V;
  FORGE_IF_CUDA(q) {
    FORGE_CHECK(s.d <= cuda::kFlashMaxHeadDim && s.dv <= cuda::kFlashMaxHeadDim,
                "attention::linformer: on a GPU the head dims must be <= {}, got d = {}, dv = {}",
                cuda::kFlashMaxHeadDim, s.d, s.dv);
    K = project_cuda(first_columns(E.detach(), s.M), bias_E, k, mask, L);
    V = project_cuda(first_columns(F.detach(), s.M), bias_F, v, mask, L);
    cuda::flash_forward(flash_args(L, q.dtype()), q.raw_device_data(), K.raw_device_data(),
                        V.raw_device_data(), o.raw_device_data(), lse.raw_device_data(),
                        q.device().index);
  }
  if (q.device().is_cpu()) {
    FORGE_DISPATCH_FLOAT(q.dtype(), "attention::linformer", [&] {
      const Params<scalar_t> a = params<scalar_t>(q, k, v, E, F, bias_E, bias_F, mask);
      K = Tensor::empty({s.B, s.H, L.kdim, s.d}, q.dtype());
      V = Tensor::empty({s.B, s.H, L.kdim, s.dv}, q.dtype());
      project(a, L, K.data<scalar_t>(), V.data<scalar_t>());
      forward_kernel(a.q, K.data<scalar_t>(), V.data<scalar_t>(), L, o.data<scalar_t>(),
                     lse.data<scalar_t>());
    });
  }
  return autograd::record(
      "attention::linformer", {q, k, v, E, F, bias_E, bias_F}, o,
      [q = q.detach(), k = k.detach(), v = v.detach(), E = E.detach(), F = F.detach(),
       bE = bias_E.defined() ? bias_E.detach() : Tensor(),
       bF = bias_F.defined() ? bias_F.detach() : Tensor(), mask, lse, K, V,
       o = q.device().is_cuda() ? o.detach() : Tensor(),
       L](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        const Tensor g = grads[0];
        FORGE_IF_CUDA(g) {
          return backward_cuda(q, k, v, E, F, bE.defined(), bF.defined(), mask, K, V, o, lse, g, L);
        }
        Tensor dq = Tensor::empty(q.shape(), q.dtype()), dk = Tensor::empty(k.shape(), k.dtype()),
               dv = Tensor::empty(v.shape(), v.dtype()), dE = Tensor::zeros(E.shape(), E.dtype()),
               dF = Tensor::zeros(F.shape(), F.dtype());
        Tensor dbE = bE.defined() ? Tensor::empty(bE.shape(), bE.dtype()) : Tensor(),
               dbF = bF.defined() ? Tensor::empty(bF.shape(), bF.dtype()) : Tensor();
        FORGE_DISPATCH_FLOAT(q.dtype(), "attention::linformer backward", [&] {
          const Params<scalar_t> a = params<scalar_t>(q, k, v, E, F, bE, bF, mask);
          backward_kernel(a, K.data<scalar_t>(), V.data<scalar_t>(), lse.data<scalar_t>(),
                          g.data<scalar_t>(), L, dq.data<scalar_t>(), dk.data<scalar_t>(),
                          dv.data<scalar_t>(), dE.data<scalar_t>(), dF.data<scalar_t>(),
                          dbE.defined() ? dbE.data<scalar_t>() : nullptr,
                          dbF.defined() ? dbF.data<scalar_t>() : nullptr);
        });
        return {dq, dk, dv, dE, dF, dbE, dbF};
      });
}

std::vector<AttentionCase> linformer_cases() {
  // E and F are [k, M + short_by]: short_by > 0 is a sequence shorter than the
  // projection's length (linformer-pytorch slices E and F to the input's M).
  struct Config {
    const char* name;
    int64_t M, short_by;
    bool mask, bias;
    double dropout;
    bool bench;
  };
  std::vector<AttentionCase> cases;
  for (const Config& x :
       {Config{"full", 7, 0, false, true, 0, true}, Config{"mask", 7, 0, true, true, 0, false},
        Config{"short", 6, 3, false, true, 0, false},
        Config{"short+mask", 5, 3, true, true, 0, false},
        Config{"no_bias", 7, 0, false, false, 0, false},
        Config{"dropout", 7, 0, false, true, 0.3, false},
        Config{"short+mask+dropout", 6, 2, true, true, 0.25, false}}) {
    AttentionCase c;
    c.name = std::string("linformer/") + x.name;
    c.dims.M = x.M;
    c.dims.k = 4;
    c.make_inputs = [x](const CaseDims& s) {
      const int64_t k = s.k > 0 ? s.k : 256, length = s.M + x.short_by;
      std::vector<Tensor> in = case_qkv(s, 51);
      in.push_back(case_leaf({k, length}, 54));
      in.push_back(case_leaf({k, length}, 55));
      if (x.bias) {
        in.push_back(case_leaf({k}, 56));
        in.push_back(case_leaf({k}, 57));
      }
      // Batch 0: the last key padded; batch 1: the last two.
      if (x.mask) in.push_back(case_padding_mask(s, {1, 2}));
      return in;
    };
    // Dropout: every call restores the same generator state, so fn is a function.
    c.fn = [x, gen = std::make_shared<Generator>(77)](const std::vector<Tensor>& in) {
      gen->set_state({77, 5});
      const size_t mask_at = x.bias ? 7 : 5;
      return linformer(in[0], in[1], in[2], in[3], in[4], x.bias ? in[5] : Tensor(),
                       x.bias ? in[6] : Tensor(), x.mask ? in[mask_at] : Tensor(),
                       LinformerOptions{x.dropout, gen.get()});
    };
    c.bench = x.bench;
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace forge::ops::attention
