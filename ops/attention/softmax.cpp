// softmax attention (scaled dot-product, ATTENTION.md "softmax") on the CPU and,
// through the kernels of flash_cuda.cu, the GPU, computed in tiles with an
// online softmax (FlashAttention-style) so that no N x M buffer ever exists.
// The forward saves the output and the per-row logsumexp L [B, H, N]; the
// backward recomputes every score tile from q, k and L. Dropout is keyed by
// (seed, offset, first) and recomputed, never stored.
//
// The kernels are templates over In, the type q, k, v and the incoming
// gradient are multiplied in, and T, the accumulation type of scores,
// probabilities, outputs and gradients: In = T (f32 or f64), or, under bf16
// autocast on the CPU (ops/autocast.h) with at least kMinBf16Keys keys, In =
// BF16 with T = f32: every tile product then runs on oneDNN's bf16 GEMM
// (ops/blas.h) with the probability and dS tiles rounded to bf16 as operands,
// and o, L and the gradients stay f32.

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/attention/attention.h"
#include "ops/attention/cases.h"
#include "ops/attention/common.h"
#include "ops/attention/flash_attention.h"
#include "ops/autocast.h"
#include "ops/blas.h"

namespace forge::ops::attention {

namespace {

// Query rows and key columns of one tile: a 64 x 128 score tile (32 KiB in
// f32) stays in L2 together with its q, k, v rows for d, dv up to 128.
constexpr int64_t kTileQ = 64;
constexpr int64_t kTileK = 128;

// Everything the kernels share: sizes, options and the dropout stream.
struct Plan {
  int64_t B = 0, H = 0, N = 0, M = 0, d = 0, dv = 0;
  double scale = 0;
  bool causal = false;
  const uint8_t* kpm = nullptr;              // [B, M], 1 = real token; null: no mask
  double p = 0;                              // dropout probability
  uint64_t seed = 0, offset = 0, first = 0;  // Generator::reserve_rows

  // Keys [0, key_end) can be seen by some query of rows [i0, i1).
  int64_t key_end(int64_t i1) const { return causal ? std::min(M, i1) : M; }
  // Causality lets query i see columns [0, row_end) of the key tile [j0, j0 + nj);
  // of those, the key padding mask keeps the real keys.
  int64_t row_end(int64_t i, int64_t j0, int64_t nj) const {
    return causal ? std::clamp<int64_t>(i - j0 + 1, 0, nj) : nj;
  }
};

// The dropout factor of one score tile: z[r, c] = 1/(1-p) where element
// (b, h, i0 + r, j0 + c) keeps, else 0; z is [ni, nj]. Element e keeps when
// Generator::uniform_f32(seed, offset, first + e) >= p.
template <typename scalar_t>
void dropout_tile(const Plan& s, int64_t bh, int64_t i0, int64_t ni, int64_t j0, int64_t nj,
                  scalar_t* z) {
  const auto keep = static_cast<scalar_t>(1.0 / (1.0 - s.p));
  for (int64_t r = 0; r < ni; ++r) {
    scalar_t* zr = z + r * nj;
    Generator::for_each_uniform_f32(
        s.seed, s.offset, s.first + static_cast<uint64_t>((bh * s.N + i0 + r) * s.M + j0),
        static_cast<uint64_t>(nj),
        [&](uint64_t c, float u) { zr[c] = u >= s.p ? keep : scalar_t(0); });
  }
}

// Forward of one query tile, rows [i0, i0 + ni) of batch-head bh:
//   S = scale q k^T (masked entries -inf), online over key tiles:
//   m_i = running row max, l_i = running sum of exp(S - m_i) (undropped),
//   acc = sum over tiles of dropout(exp(S - m_i)) v, rescaled when m_i grows;
//   o = acc / l, L = m + log l. A row with every key masked gets o = 0, L = -inf.
template <typename In, typename scalar_t>
void forward_tile(const Plan& s, const In* q, const In* k, const In* v, scalar_t* o, scalar_t* lse,
                  int64_t bh, int64_t i0, int64_t ni, std::vector<scalar_t>& work,
                  std::vector<In>& low) {
  constexpr scalar_t kNegInf = -std::numeric_limits<scalar_t>::infinity();
  const int64_t b = bh / s.H, d = s.d, dv = s.dv;
  work.resize(static_cast<size_t>(2 * kTileQ * kTileK + kTileQ * dv + 2 * kTileQ));
  scalar_t* P = work.data();              // [ni, nj]  scores, then probabilities
  scalar_t* Z = P + kTileQ * kTileK;      // [ni, nj]  dropout factors
  scalar_t* acc = Z + kTileQ * kTileK;    // [ni, dv]
  scalar_t* row_max = acc + kTileQ * dv;  // [ni]
  scalar_t* row_sum = row_max + kTileQ;   // [ni]
  std::fill(acc, acc + ni * dv, scalar_t(0));
  std::fill(row_max, row_max + ni, kNegInf);
  std::fill(row_sum, row_sum + ni, scalar_t(0));
  const In* qt = q + (bh * s.N + i0) * d;
  const int64_t j_end = s.key_end(i0 + ni);
  for (int64_t j0 = 0; j0 < j_end; j0 += kTileK) {
    const int64_t nj = std::min(kTileK, j_end - j0);
    // S [ni, nj] = scale q_tile k_tile^T
    gemm(false, true, ni, nj, d, static_cast<scalar_t>(s.scale), qt, d, k + (bh * s.M + j0) * d, d,
         scalar_t(0), P, nj);
    if (s.p > 0) dropout_tile(s, bh, i0, ni, j0, nj, Z);
    const uint8_t* real = s.kpm ? s.kpm + b * s.M + j0 : nullptr;  // [nj]
    for (int64_t r = 0; r < ni; ++r) {
      scalar_t* pr = P + r * nj;
      const int64_t c_end = s.row_end(i0 + r, j0, nj);
      if (real)
        for (int64_t c = 0; c < c_end; ++c) pr[c] = real[c] ? pr[c] : kNegInf;
      std::fill(pr + c_end, pr + nj, kNegInf);
      // The max, the exps and their sum in separate loops, each in vectors
      // (a sum fused into the exp loop keeps the compiler to scalar code).
      const scalar_t tile_max = max_of(pr, c_end);
      const scalar_t m_new = std::max(row_max[r], tile_max);
      if (m_new == kNegInf) {  // nothing visible to this row yet
        std::fill(pr, pr + nj, scalar_t(0));
        continue;
      }
      const scalar_t rescale = std::exp(row_max[r] - m_new);  // 0 when row_max was -inf
      for (int64_t c = 0; c < c_end; ++c) pr[c] = exp_nonpos(pr[c] - m_new);
      scalar_t sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < c_end; ++c) sum += pr[c];
      std::fill(pr + c_end, pr + nj, scalar_t(0));
      row_sum[r] = row_sum[r] * rescale + sum;
      row_max[r] = m_new;
      scalar_t* ar = acc + r * dv;
      for (int64_t c = 0; c < dv; ++c) ar[c] *= rescale;
      if (s.p > 0) {
        const scalar_t* zr = Z + r * nj;
        for (int64_t c = 0; c < nj; ++c) pr[c] *= zr[c];
      }
    }
    // acc [ni, dv] += dropout(P) [ni, nj] v_tile [nj, dv]
    gemm(false, false, ni, dv, nj, scalar_t(1), operand(P, ni * nj, low), nj,
         v + (bh * s.M + j0) * dv, dv, scalar_t(1), acc, dv);
  }
  for (int64_t r = 0; r < ni; ++r) {
    scalar_t* orow = o + (bh * s.N + i0 + r) * dv;
    const scalar_t* ar = acc + r * dv;
    if (row_sum[r] > 0) {
      const scalar_t inv = scalar_t(1) / row_sum[r];
      for (int64_t c = 0; c < dv; ++c) orow[c] = ar[c] * inv;
      lse[bh * s.N + i0 + r] = row_max[r] + std::log(row_sum[r]);
    } else {
      std::fill(orow, orow + dv, scalar_t(0));
      lse[bh * s.N + i0 + r] = kNegInf;
    }
  }
}

// The backward retraces forward_tile tile by tile. With Pd = dropout(P) =
// P * Z the forward was o = Pd v, so
//   dv = Pd^T do,  dPd = do v^T,  dP = dPd * Z,
//   dS = P * (dP - D) with D_i = rowsum(P * dP)_i = rowsum(do * o)_i,
//   dq = scale dS k,  dk = scale dS^T q   (S = scale q k^T).
// P is recomputed as exp(S - L) from the saved L; masked entries (and rows
// with every key masked, L = -inf) have P = 0 and so no gradient.
template <typename In, typename scalar_t>
struct Saved {
  const In *q, *k, *v;      // as in the forward
  const scalar_t *o, *lse;  // the forward's outputs
  const In* dout;           // [B, H, N, dv]
  scalar_t *dq, *dk, *dv;   // zeroed, accumulated into
};

// Scratch of one backward tile pair.
template <typename In, typename scalar_t>
struct TileWork {
  TileWork() = default;
  TileWork(const TileWork&) = delete;  // the pointers below point into buf
  TileWork& operator=(const TileWork&) = delete;
  std::vector<scalar_t> buf =
      std::vector<scalar_t>(static_cast<size_t>(4 * kTileQ * kTileK + kTileQ));
  scalar_t* P = buf.data();            // [ni, nj]  probabilities
  scalar_t* Pd = P + kTileQ * kTileK;  // [ni, nj]  dropout(P)
  scalar_t* Z = Pd + kTileQ * kTileK;  // [ni, nj]  dropout factors
  scalar_t* dS = Z + kTileQ * kTileK;  // [ni, nj]  dP, then dS
  scalar_t* D = dS + kTileQ * kTileK;  // [ni]      rowsum(do * o)
  // The tile's GEMM operands as In: the probabilities v was multiplied by
  // (P or Pd) and dS; they point into buf when In is the accumulation type.
  std::vector<In> low_p, low_s;
  const In* Pv = nullptr;
  const In* dSv = nullptr;
};

// w.D [ni] = rowsum(do * o) over query rows [i0, i0 + ni).
template <typename In, typename scalar_t>
void row_delta(const Plan& s, const Saved<In, scalar_t>& g, int64_t bh, int64_t i0, int64_t ni,
               TileWork<In, scalar_t>& w) {
  for (int64_t r = 0; r < ni; ++r) {
    const scalar_t* orow = g.o + (bh * s.N + i0 + r) * s.dv;
    const In* grow = g.dout + (bh * s.N + i0 + r) * s.dv;
    scalar_t acc = 0;
    for (int64_t c = 0; c < s.dv; ++c) acc += widen(grow[c]) * orow[c];
    w.D[r] = acc;
  }
}

// For query rows [i0, i0 + ni) and keys [j0, j0 + nj): w.P (and w.Pd with
// dropout) and w.dS, and as GEMM operands w.Pv, the probabilities the forward
// multiplied v by, and w.dSv.
template <typename In, typename scalar_t>
void grad_tile(const Plan& s, const Saved<In, scalar_t>& g, int64_t bh, int64_t i0, int64_t ni,
               int64_t j0, int64_t nj, TileWork<In, scalar_t>& w) {
  constexpr scalar_t kNegInf = -std::numeric_limits<scalar_t>::infinity();
  const int64_t b = bh / s.H;
  // S [ni, nj] = scale q_tile k_tile^T, then P = exp(S - L) where visible.
  gemm(false, true, ni, nj, s.d, static_cast<scalar_t>(s.scale), g.q + (bh * s.N + i0) * s.d, s.d,
       g.k + (bh * s.M + j0) * s.d, s.d, scalar_t(0), w.P, nj);
  const uint8_t* real = s.kpm ? s.kpm + b * s.M + j0 : nullptr;  // [nj]
  const scalar_t* Lt = g.lse + bh * s.N + i0;
  for (int64_t r = 0; r < ni; ++r) {
    scalar_t* pr = w.P + r * nj;
    const scalar_t L = Lt[r];
    const int64_t c_end = L == kNegInf ? 0 : s.row_end(i0 + r, j0, nj);
    for (int64_t c = 0; c < c_end; ++c) pr[c] = exp_nonpos(pr[c] - L);
    if (real)
      for (int64_t c = 0; c < c_end; ++c) pr[c] = real[c] ? pr[c] : scalar_t(0);
    std::fill(pr + c_end, pr + nj, scalar_t(0));
  }
  // dPd [ni, nj] = do_tile v_tile^T
  gemm(false, true, ni, nj, s.dv, scalar_t(1), g.dout + (bh * s.N + i0) * s.dv, s.dv,
       g.v + (bh * s.M + j0) * s.dv, s.dv, scalar_t(0), w.dS, nj);
  const scalar_t* Pv = w.P;
  if (s.p > 0) {
    dropout_tile(s, bh, i0, ni, j0, nj, w.Z);
    for (int64_t e = 0; e < ni * nj; ++e) {
      w.Pd[e] = w.P[e] * w.Z[e];
      w.dS[e] *= w.Z[e];
    }
    Pv = w.Pd;
  }
  // dS = P * (dP - D)
  for (int64_t r = 0; r < ni; ++r) {
    scalar_t* gr = w.dS + r * nj;
    const scalar_t* pr = w.P + r * nj;
    for (int64_t c = 0; c < nj; ++c) gr[c] = pr[c] * (gr[c] - w.D[r]);
  }
  w.Pv = operand(Pv, ni * nj, w.low_p);
  w.dSv = operand(w.dS, ni * nj, w.low_s);
}

// dv_tile [nj, dv] += Pd^T do_tile and dk_tile [nj, d] += scale dS^T q_tile.
template <typename In, typename scalar_t>
void accumulate_dk_dv(const Plan& s, const Saved<In, scalar_t>& g, int64_t bh, int64_t i0,
                      int64_t ni, int64_t j0, int64_t nj, const TileWork<In, scalar_t>& w) {
  gemm(true, false, nj, s.dv, ni, scalar_t(1), w.Pv, nj, g.dout + (bh * s.N + i0) * s.dv, s.dv,
       scalar_t(1), g.dv + (bh * s.M + j0) * s.dv, s.dv);
  gemm(true, false, nj, s.d, ni, static_cast<scalar_t>(s.scale), w.dSv, nj,
       g.q + (bh * s.N + i0) * s.d, s.d, scalar_t(1), g.dk + (bh * s.M + j0) * s.d, s.d);
}

// dq_tile [ni, d] += scale dS k_tile.
template <typename In, typename scalar_t>
void accumulate_dq(const Plan& s, const Saved<In, scalar_t>& g, int64_t bh, int64_t i0, int64_t ni,
                   int64_t j0, int64_t nj, const TileWork<In, scalar_t>& w) {
  gemm(false, false, ni, s.d, nj, static_cast<scalar_t>(s.scale), w.dSv, nj,
       g.k + (bh * s.M + j0) * s.d, s.d, scalar_t(1), g.dq + (bh * s.N + i0) * s.d, s.d);
}

// One thread owns a whole batch-head: every tile pair once, dq, dk, dv together.
template <typename In, typename scalar_t>
void backward_head(const Plan& s, const Saved<In, scalar_t>& g, int64_t bh,
                   TileWork<In, scalar_t>& w) {
  for (int64_t i0 = 0; i0 < s.N; i0 += kTileQ) {
    const int64_t ni = std::min(kTileQ, s.N - i0);
    row_delta(s, g, bh, i0, ni, w);
    const int64_t j_end = s.key_end(i0 + ni);
    for (int64_t j0 = 0; j0 < j_end; j0 += kTileK) {
      const int64_t nj = std::min(kTileK, j_end - j0);
      grad_tile(s, g, bh, i0, ni, j0, nj, w);
      accumulate_dk_dv(s, g, bh, i0, ni, j0, nj, w);
      accumulate_dq(s, g, bh, i0, ni, j0, nj, w);
    }
  }
}

// dk, dv of keys [j0, j0 + nj) from every query tile that sees them.
template <typename In, typename scalar_t>
void backward_key_tile(const Plan& s, const Saved<In, scalar_t>& g, int64_t bh, int64_t j0,
                       int64_t nj, TileWork<In, scalar_t>& w) {
  for (int64_t i0 = s.causal ? j0 / kTileQ * kTileQ : 0; i0 < s.N; i0 += kTileQ) {
    const int64_t ni = std::min(kTileQ, s.N - i0);
    row_delta(s, g, bh, i0, ni, w);
    grad_tile(s, g, bh, i0, ni, j0, nj, w);
    accumulate_dk_dv(s, g, bh, i0, ni, j0, nj, w);
  }
}

// dq of query rows [i0, i0 + ni) from every key tile they see.
template <typename In, typename scalar_t>
void backward_query_tile(const Plan& s, const Saved<In, scalar_t>& g, int64_t bh, int64_t i0,
                         int64_t ni, TileWork<In, scalar_t>& w) {
  row_delta(s, g, bh, i0, ni, w);
  const int64_t j_end = s.key_end(i0 + ni);
  for (int64_t j0 = 0; j0 < j_end; j0 += kTileK) {
    const int64_t nj = std::min(kTileK, j_end - j0);
    grad_tile(s, g, bh, i0, ni, j0, nj, w);
    accumulate_dq(s, g, bh, i0, ni, j0, nj, w);
  }
}

}  // namespace

namespace {

void check_options(const Dims4& dims, const SoftmaxOptions& options) {
  FORGE_CHECK(dims.d > 0 && dims.dv > 0,
              "attention::softmax: q, k and v need a non-empty last dim, got d = {}, dv = {}",
              dims.d, dims.dv);
  FORGE_CHECK(std::isfinite(options.scale) && options.scale >= 0,
              "attention::softmax: scale must be >= 0 (0: d^-1/2), got {}", options.scale);
  FORGE_CHECK(options.dropout >= 0 && options.dropout < 1,
              "attention::softmax: dropout must be in [0, 1), got {}", options.dropout);
}

// softmax attention on a GPU: flash_attention_cuda with the sizes and the
// dropout stream `s` reserved, its draws numbered as on the CPU.
Tensor softmax_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& key_padding_mask, const Plan& s) {
  cuda::FlashArgs a;
  a.B = s.B, a.H = s.H, a.N = s.N, a.M = s.M, a.d = s.d, a.dv = s.dv;
  a.dtype = q.dtype();
  a.scale = s.scale;
  a.causal = s.causal;
  a.dropout = s.p;
  a.seed = s.seed;
  a.offset = s.offset;
  a.first = s.first;
  return flash_attention_cuda("attention::softmax", q, k, v, key_padding_mask, a);
}

}  // namespace

namespace {
std::atomic<cuda::FlashEngine> g_flash_engine{cuda::FlashEngine::tiled};
}  // namespace

void set_flash_engine(cuda::FlashEngine engine) {
  g_flash_engine.store(engine);
}

cuda::FlashEngine flash_engine() {
  return g_flash_engine.load();
}

Tensor softmax(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
               const SoftmaxOptions& options) {
  const Dims4 dims = check_qkv("softmax", q, k, v, key_padding_mask, options.causal, true);
  check_options(dims, options);
  Plan s;
  s.B = dims.B, s.H = dims.H, s.N = dims.N, s.M = dims.M, s.d = dims.d, s.dv = dims.dv;
  s.scale = options.scale > 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(dims.d));
  s.causal = options.causal;
  s.p = options.dropout;
  if (s.p > 0) {
    // One draw per score element (b, h, i, j), reserved once per call; b is
    // the local batch (a shard of the global one under data parallelism).
    Generator& g = options.gen ? *options.gen : default_generator();
    const RowDraws r = g.reserve_rows(static_cast<uint64_t>(s.B * s.H * s.N * s.M));
    s.seed = r.seed, s.offset = r.offset, s.first = r.first;
  }
  FORGE_IF_CUDA(q) return softmax_cuda(q, k, v, key_padding_mask, s);
  s.kpm = mask_bytes(key_padding_mask);
  // Under bf16 autocast (f32 inputs) the tiles multiply bf16 copies of q, k, v
  // once a key tile is full (common.h): one oneDNN call costs about half a
  // microsecond before any work (docs/PERFORMANCE.md), more than the f32 GEMM
  // of a smaller tile saves (ViT-Ti's 17 x 17 tiles in bf16: 20.6-20.9
  // instead of 19.8 ms a step), while from M = 256 the bf16 tiles are
  // 1.45-1.57x faster.
  const CpuOperands in = cpu_operands(q, k, v, s.M);
  const Tensor &qc = in.q, &kc = in.k, &vc = in.v;
  const bool cast = in.low;
  Tensor out = Tensor::empty({s.B, s.H, s.N, s.dv}, q.dtype());
  Tensor lse = Tensor::empty({s.B, s.H, s.N}, q.dtype());  // logsumexp of each score row
  const int64_t q_tiles = (s.N + kTileQ - 1) / kTileQ;
  // In: the operands' element type; T: the accumulation type (q's dtype).
  const auto forward = [&]<typename In, typename T>() {
    const In* qp = qc.data<In>();
    const In* kp = kc.data<In>();
    const In* vp = vc.data<In>();
    T* op = out.data<T>();
    T* lp = lse.data<T>();
    // Query tiles are independent: one task per (b, h, query tile).
    parallel_for(s.B * s.H * q_tiles, kTileQ * s.M * (s.d + s.dv), [&](int64_t t0, int64_t t1) {
      std::vector<T> work;
      std::vector<In> low;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t i0 = (t % q_tiles) * kTileQ;
        forward_tile(s, qp, kp, vp, op, lp, t / q_tiles, i0, std::min(kTileQ, s.N - i0), work, low);
      }
    });
  };
  if (cast) {
    forward.template operator()<BF16, float>();
  } else {
    FORGE_DISPATCH_FLOAT(q.dtype(), "attention::softmax",
                         [&] { forward.template operator()<scalar_t, scalar_t>(); });
  }
  if (!autograd::needs_grad({q, k, v})) return out;
  return autograd::record(
      "attention::softmax", {q, k, v}, out,
      [s, q = qc, k = kc, v = vc, o = out.detach(), lse, cast, mask = key_padding_mask,
       need_q = q.requires_grad(), need_k = k.requires_grad(),
       need_v = v.requires_grad()](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        const Tensor dout = cast ? grads[0].to(DType::bf16) : grads[0];
        const DType dtype = o.dtype();  // of the outputs and the gradients
        Tensor dq = Tensor::zeros(q.shape(), dtype), dk = Tensor::zeros(k.shape(), dtype),
               dv = Tensor::zeros(v.shape(), dtype);
        const auto backward = [&]<typename In, typename T>() {
          const Saved<In, T> g{q.data<In>(), k.data<In>(),  v.data<In>(),
                               o.data<T>(),  lse.data<T>(), dout.data<In>(),
                               dq.data<T>(), dk.data<T>(),  dv.data<T>()};
          const int64_t pair_cost = kTileQ * kTileK * (2 * s.d + 2 * s.dv);
          const int64_t q_tiles = (s.N + kTileQ - 1) / kTileQ,
                        k_tiles = (s.M + kTileK - 1) / kTileK;
          if (s.B * s.H >= num_threads()) {
            parallel_for(s.B * s.H, q_tiles * k_tiles * pair_cost, [&](int64_t h0, int64_t h1) {
              TileWork<In, T> w;
              for (int64_t bh = h0; bh < h1; ++bh) backward_head(s, g, bh, w);
            });
            return;
          }
          // Fewer batch-heads than threads: one pass for dk, dv over key tiles
          // and one for dq over query tiles (each recomputes P and dS), so
          // every thread writes its own rows.
          parallel_for(s.B * s.H * k_tiles, q_tiles * pair_cost, [&](int64_t t0, int64_t t1) {
            TileWork<In, T> w;
            for (int64_t t = t0; t < t1; ++t) {
              const int64_t j0 = (t % k_tiles) * kTileK;
              backward_key_tile(s, g, t / k_tiles, j0, std::min(kTileK, s.M - j0), w);
            }
          });
          parallel_for(s.B * s.H * q_tiles, k_tiles * pair_cost, [&](int64_t t0, int64_t t1) {
            TileWork<In, T> w;
            for (int64_t t = t0; t < t1; ++t) {
              const int64_t i0 = (t % q_tiles) * kTileQ;
              backward_query_tile(s, g, t / q_tiles, i0, std::min(kTileQ, s.N - i0), w);
            }
          });
        };
        if (cast) {
          backward.template operator()<BF16, float>();
        } else {
          FORGE_DISPATCH_FLOAT(dtype, "attention::softmax backward",
                               [&] { backward.template operator()<scalar_t, scalar_t>(); });
        }
        return {need_q ? dq : Tensor(), need_k ? dk : Tensor(), need_v ? dv : Tensor()};
      });
}

namespace {

// q, k, v at the case's dims and, when `pad` is given, a key padding mask with
// the last pad[b] keys of batch b masked.
AttentionCase softmax_case(const std::string& name, int64_t N, int64_t M, std::vector<int64_t> pad,
                           SoftmaxOptions options, uint64_t seed, bool bench = false) {
  AttentionCase c = qkv_case("softmax/" + name, N, M, seed, std::move(pad));
  // Dropout draws from a generator seeded afresh on every call, so each
  // evaluation of fn sees the same dropout mask.
  c.fn = [=](const std::vector<Tensor>& in) {
    Generator gen(seed + 3);
    SoftmaxOptions o = options;
    o.gen = &gen;
    return softmax(in[0], in[1], in[2], case_input(in, 3), o);
  };
  c.bench = bench;
  return c;
}

}  // namespace

std::vector<AttentionCase> softmax_cases() {
  SoftmaxOptions causal;
  causal.causal = true;
  SoftmaxOptions scaled;
  scaled.scale = 0.9;
  SoftmaxOptions dropout;
  dropout.dropout = 0.3;
  SoftmaxOptions causal_dropout = causal;
  causal_dropout.dropout = 0.25;
  causal_dropout.scale = 1.3;
  constexpr int64_t kEveryKey = std::numeric_limits<int64_t>::max();
  return {
      softmax_case("plain", 6, 6, {}, {}, 11, true),
      softmax_case("causal", 7, 7, {}, causal, 21, true),
      softmax_case("mask", 6, 6, kCasePad, {}, 31),
      softmax_case("causal+mask", 7, 7, {2, 0}, causal, 41),
      // Batch 1 has every key masked: its rows are 0 with zero gradient.
      softmax_case("cross+mask", 5, 8, {3, kEveryKey}, {}, 51),
      softmax_case("scale", 6, 9, {}, scaled, 61),
      softmax_case("dropout", 6, 7, {0, 2}, dropout, 71),
      softmax_case("causal+mask+dropout+scale", 8, 8, {1, 0}, causal_dropout, 81),
  };
}

}  // namespace forge::ops::attention
