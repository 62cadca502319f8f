// linformer: Linformer attention (Wang et al. 2020, as in linformer-pytorch),
// one autograd op with a fused CPU forward and backward (f32, f64).
//
//   K = E[:, :M] k + bE [k, d],  V = F[:, :M] v + bF [k, dv]  (k, v zeroed at padding)
//   P = dropout(softmax(q K^T / sqrt(d)))  [N, k],  o = P V
//
// Here k (the letter) is the projected length kdim. The projections are GEMMs
// per batch-head; the scores are computed in blocks of query rows, so the op
// holds at most a rows x kdim tile per thread (never N x M). The backward saves
// the inputs, the row log-sum-exp [B, H, N] and the dropout's Philox (seed,
// offset), and recomputes K, V and P.

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/attention/attention.h"
#include "ops/attention/common.h"
#include "ops/attention/registry.h"
#include "ops/blas.h"

namespace forge::ops::attention {

namespace {

constexpr int64_t kRowBlock = 128;  // query rows per score tile
constexpr int64_t kColBlock = 256;  // columns of dE / dF per task

struct LinformerDims {
  Dims4 s;
  int64_t kdim = 0, Mmax = 0;
  double p = 0;  // dropout
  uint64_t seed = 0, offset = 0;
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
      gemm(false, false, kd, d, M, T(1), a.E, L.Mmax, kb, d, T(0), K, d);
      gemm(false, false, kd, dv, M, T(1), a.F, L.Mmax, vb, dv, T(0), V, dv);
      for (int64_t r = 0; r < kd; ++r) {
        const T be = a.bE ? a.bE[r] : T(0), bf = a.bF ? a.bF[r] : T(0);
        for (int64_t c = 0; c < d; ++c) K[r * d + c] += be;
        for (int64_t c = 0; c < dv; ++c) V[r * dv + c] += bf;
      }
    }
  });
}

// The dropout factor of P[bh, i, j]: 0 or 1 / (1 - p).
template <typename T>
T keep_factor(const LinformerDims& L, int64_t bh, int64_t i, int64_t j) {
  const uint64_t idx = static_cast<uint64_t>((bh * L.s.N + i) * L.kdim + j);
  return Generator::uniform_f32(L.seed, L.offset, idx) >= static_cast<float>(L.p)
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
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < kd; ++j) mx = std::max(mx, Pr[j]);
        T sum = 0;
        for (int64_t j = 0; j < kd; ++j) {
          Pr[j] = std::exp(Pr[j] - mx);
          sum += Pr[j];
        }
        const T inv = T(1) / sum;
        for (int64_t j = 0; j < kd; ++j) Pr[j] *= inv;
        if (L.p > 0)
          for (int64_t j = 0; j < kd; ++j) Pr[j] *= keep_factor<T>(L, bh, i0 + r, j);
        lse[bh * N + i0 + r] = mx + std::log(sum);
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
              for (int64_t j = 0; j < kd; ++j) Pr[j] = std::exp(Pr[j] - l);
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
              T dot = 0;
              for (int64_t j = 0; j < kd; ++j) dot += Pr[j] * dPr[j];
              for (int64_t j = 0; j < kd; ++j) dPr[j] = Pr[j] * (dPr[j] - dot);
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

void check_projection(const char* name, const Tensor& t, const Tensor& q, const Shape& expected) {
  FORGE_CHECK(t.defined(), "attention::linformer: {} is undefined; expected {}", name,
              shape_str(expected));
  FORGE_CHECK(t.device().is_cpu(), "attention::linformer: {} is on {}; this op runs on the CPU",
              name, t.device().str());
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
  L.s = check_qkv("linformer", q, k, v, key_padding_mask, false);
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
    L.seed = gen.seed();
    L.offset = gen.reserve(static_cast<uint64_t>(L.s.B * L.s.H * L.s.N * L.kdim));
  }
  const Dims4& s = L.s;
  const Tensor mask = key_padding_mask.defined() ? key_padding_mask.detach() : Tensor();
  Tensor o = Tensor::empty({s.B, s.H, s.N, s.dv}, q.dtype()),
         lse = Tensor::empty({s.B, s.H, s.N}, q.dtype());
  FORGE_DISPATCH_FLOAT(q.dtype(), "attention::linformer", [&] {
    const Params<scalar_t> a = params<scalar_t>(q, k, v, E, F, bias_E, bias_F, mask);
    // K [BH, kdim, d], V [BH, kdim, dv]
    Tensor K = scratch<scalar_t>(s.B * s.H * L.kdim * s.d),
           V = scratch<scalar_t>(s.B * s.H * L.kdim * s.dv);
    project(a, L, K.data<scalar_t>(), V.data<scalar_t>());
    forward_kernel(a.q, K.data<scalar_t>(), V.data<scalar_t>(), L, o.data<scalar_t>(),
                   lse.data<scalar_t>());
  });
  return autograd::record(
      "attention::linformer", {q, k, v, E, F, bias_E, bias_F}, o,
      [q = q.detach(), k = k.detach(), v = v.detach(), E = E.detach(), F = F.detach(),
       bE = bias_E.defined() ? bias_E.detach() : Tensor(),
       bF = bias_F.defined() ? bias_F.detach() : Tensor(), mask, lse,
       L](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        const Tensor g = grads[0];
        const Dims4& s = L.s;
        Tensor dq = Tensor::empty(q.shape(), q.dtype()), dk = Tensor::empty(k.shape(), k.dtype()),
               dv = Tensor::empty(v.shape(), v.dtype()), dE = Tensor::zeros(E.shape(), E.dtype()),
               dF = Tensor::zeros(F.shape(), F.dtype());
        Tensor dbE = bE.defined() ? Tensor::empty(bE.shape(), bE.dtype()) : Tensor(),
               dbF = bF.defined() ? Tensor::empty(bF.shape(), bF.dtype()) : Tensor();
        FORGE_DISPATCH_FLOAT(q.dtype(), "attention::linformer backward", [&] {
          const Params<scalar_t> a = params<scalar_t>(q, k, v, E, F, bE, bF, mask);
          Tensor K = scratch<scalar_t>(s.B * s.H * L.kdim * s.d),
                 V = scratch<scalar_t>(s.B * s.H * L.kdim * s.dv);
          project(a, L, K.data<scalar_t>(), V.data<scalar_t>());
          backward_kernel(a, K.data<scalar_t>(), V.data<scalar_t>(), lse.data<scalar_t>(),
                          g.data<scalar_t>(), L, dq.data<scalar_t>(), dk.data<scalar_t>(),
                          dv.data<scalar_t>(), dE.data<scalar_t>(), dF.data<scalar_t>(),
                          dbE.defined() ? dbE.data<scalar_t>() : nullptr,
                          dbF.defined() ? dbF.data<scalar_t>() : nullptr);
        });
        return {dq, dk, dv, dE, dF, dbE, dbF};
      });
}

std::vector<GradcheckCase> linformer_gradcheck_cases() {
  struct Config {
    const char* name;
    int64_t M, Mmax;
    bool mask, bias;
    double dropout;
  };
  std::vector<GradcheckCase> cases;
  for (const Config& c :
       {Config{"full", 7, 7, false, true, 0}, Config{"mask", 7, 7, true, true, 0},
        Config{"short", 6, 9, false, true, 0}, Config{"short+mask", 5, 8, true, true, 0},
        Config{"no_bias", 7, 7, false, false, 0}, Config{"dropout", 7, 7, false, true, 0.3},
        Config{"short+mask+dropout", 6, 8, true, true, 0.25}}) {
    GradcheckCase gc;
    gc.name = std::string("linformer/") + c.name;
    gc.make_inputs = [c] {
      const int64_t kdim = 4;
      std::vector<Tensor> in = {
          gradcheck_leaf({2, 2, 6, 3}, 51), gradcheck_leaf({2, 2, c.M, 3}, 52),
          gradcheck_leaf({2, 2, c.M, 4}, 53), gradcheck_leaf({kdim, c.Mmax}, 54),
          gradcheck_leaf({kdim, c.Mmax}, 55)};
      if (c.bias) {
        in.push_back(gradcheck_leaf({kdim}, 56));
        in.push_back(gradcheck_leaf({kdim}, 57));
      }
      if (c.mask) {
        Tensor m = Tensor::ones({2, c.M}, DType::boolean);
        bool* p = m.data<bool>();
        p[c.M - 1] = false;  // batch 0: last key padded; batch 1: last two
        p[2 * c.M - 2] = p[2 * c.M - 1] = false;
        in.push_back(m);
      }
      return in;
    };
    // Dropout: every call restores the same generator state, so fn is a function.
    gc.fn = [c, gen = std::make_shared<Generator>(77)](const std::vector<Tensor>& in) {
      gen->set_state({77, 5});
      const size_t mask_at = c.bias ? 7 : 5;
      return linformer(in[0], in[1], in[2], in[3], in[4], c.bias ? in[5] : Tensor(),
                       c.bias ? in[6] : Tensor(), c.mask ? in[mask_at] : Tensor(),
                       LinformerOptions{c.dropout, gen.get()});
    };
    cases.push_back(std::move(gc));
  }
  return cases;
}

}  // namespace forge::ops::attention
