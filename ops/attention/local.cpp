// local: blocked sliding-window attention (the local-attention package's
// LocalAttention), one autograd op with a fused CPU forward and backward (on a
// GPU: the tiled kernels of flash_cuda.cu restricted to the band).
//
// The sequence is cut into windows of w positions (the last one padded with
// masked positions when w does not divide N). The queries of window b see the
// keys of windows b - look_backward .. b + look_forward, a contiguous key range,
// so each window is two GEMMs on a band tile [w, bw] with
// bw = w (look_backward + 1 + look_forward): memory O(N bw), never N x N.
// The forward saves q, k, v and the per-row logsumexp; the backward recomputes
// the probabilities of each tile from them (and the dropout mask from Philox).
// Under bf16 autocast on the CPU, with bands of at least kMinBf16Keys keys,
// the tile GEMMs multiply bf16 copies of q, k, v, do and of the probability
// and dS tiles (common.h's In = BF16); everything else stays f32.

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/attention/attention.h"
#include "ops/attention/cases.h"
#include "ops/attention/common.h"
#include "ops/attention/flash_attention.h"
#include "ops/blas.h"

namespace forge::ops::attention {

namespace {

// Everything the forward and the backward share: sizes, resolved options and
// the dropout stream.
struct LocalPlan {
  int64_t B = 0, H = 0, N = 0, d = 0, dv = 0;
  int64_t w = 0, lb = 0, lf = 0, bw = 0, windows = 0;
  bool causal = false;
  double p = 0;                              // dropout
  uint64_t seed = 0, offset = 0, first = 0;  // Generator::reserve_rows
  double scale = 0;                          // d^-1/2
};

// One window's tile: queries [i0, i0 + nq), keys [j0, j1), and where key j0 sits
// in the band (band position of key j is j - band0).
struct Tile {
  int64_t i0, nq, j0, nk, band0;
};

Tile tile_of(const LocalPlan& s, int64_t win) {
  Tile t;
  t.i0 = win * s.w;
  t.nq = std::min(s.w, s.N - t.i0);
  t.band0 = (win - s.lb) * s.w;
  t.j0 = std::max<int64_t>(0, t.band0);
  int64_t j1 = std::min(s.N, (win + s.lf + 1) * s.w);
  // Causal: keys after the window's last query are masked for every row.
  if (s.causal) j1 = std::min(j1, t.i0 + t.nq);
  t.nk = j1 - t.j0;
  return t;
}

// row[c] = -inf where key j0 + c is not allowed for query i, so that the
// row's max, exp and sum below run over the whole row in vectors.
template <typename T>
void mask_row(const LocalPlan& s, const uint8_t* kpm_b, int64_t i, int64_t j0, int64_t nk, T* row) {
  // Query i (row of b) may see key j when it is in the band (given by the
  // tile), not padding, and, causal, j <= i. Two plain passes: a test of both
  // per element was a scalar loop with branches (a fifth of local w256's time).
  const T inf = std::numeric_limits<T>::infinity();
  if (kpm_b)
    for (int64_t c = 0; c < nk; ++c) row[c] = kpm_b[j0 + c] ? row[c] : -inf;
  if (s.causal) std::fill(row + std::clamp<int64_t>(i - j0 + 1, 0, nk), row + nk, -inf);
}

// dst[c] = src[c] * scale * keep / (1 - p) for the nk band positions pos0 ..
// of row (bh, i): element (bh, i, pos) keeps iff uniform_f32 draw
// first + (bh N + i) bw + pos of the reserved stream is >= p.
template <typename T>
void apply_dropout(const LocalPlan& s, int64_t bh, int64_t i, int64_t pos0, int64_t nk,
                   const T* src, T scale, T* dst) {
  const T kept = static_cast<T>(scale / (1.0 - s.p));
  Generator::for_each_uniform_f32(
      s.seed, s.offset, s.first + static_cast<uint64_t>((bh * s.N + i) * s.bw + pos0),
      static_cast<uint64_t>(nk),
      [&](uint64_t c, float u) { dst[c] = u >= s.p ? src[c] * kept : T(0); });
}

// Forward of one window of one batch-head.
// q [N, d], k [N, d], v [N, dv] of this batch-head; o [N, dv]; lse [N];
// P holds one tile (w x min(bw, N) elements). In: the GEMMs' operand type (T,
// or BF16 under bf16 autocast, common.h), P rounded to it in `low`.
template <typename In, typename T>
void forward_tile(const LocalPlan& s, int64_t bh, int64_t win, const In* q, const In* k,
                  const In* v, const uint8_t* kpm_b, T* o, T* lse, T* P, std::vector<In>& low) {
  const Tile t = tile_of(s, win);
  // S [nq, nk] = d^-1/2 q_win k_band^T
  gemm(false, true, t.nq, t.nk, s.d, static_cast<T>(s.scale), q + t.i0 * s.d, s.d, k + t.j0 * s.d,
       s.d, T(0), P, t.nk);
  const T inf = std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < t.nq; ++r) {
    const int64_t i = t.i0 + r;
    T* row = P + r * t.nk;
    T mx = -inf;
    const bool query_real = kpm_b == nullptr || kpm_b[i] != 0;
    if (query_real) {
      mask_row(s, kpm_b, i, t.j0, t.nk, row);
      mx = max_of(row, t.nk);
    }
    if (mx == -inf) {
      // A padded query, or every key masked: the row outputs 0 (lse = +inf
      // tells the backward that its probabilities are all 0).
      std::fill(row, row + t.nk, T(0));
      lse[i] = inf;
      continue;
    }
    // exp in vectors (attention/common.h), masked keys -inf -> 0; then the sum.
    for (int64_t c = 0; c < t.nk; ++c) row[c] = exp_nonpos(row[c] - mx);
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < t.nk; ++c) sum += static_cast<double>(row[c]);
    lse[i] = mx + static_cast<T>(std::log(sum));
    const T inv = static_cast<T>(1.0 / sum);
    if (s.p > 0) {
      apply_dropout(s, bh, i, t.j0 - t.band0, t.nk, row, inv, row);
    } else {
      for (int64_t c = 0; c < t.nk; ++c) row[c] *= inv;
    }
  }
  // o_win [nq, dv] = dropout(P) v_band
  gemm(false, false, t.nq, s.dv, t.nk, T(1), operand(P, t.nq * t.nk, low), t.nk, v + t.j0 * s.dv,
       s.dv, T(0), o + t.i0 * s.dv, s.dv);
}

// Backward of one window of one batch-head; retraces forward_tile. dq is
// written for the window's queries; dk, dv accumulate over the band's keys (the
// caller runs windows whose bands overlap one after another). P, Pd, dP are
// scratch tiles of w x min(bw, N) elements; low_p, low_s hold dropout(P) and
// dS as In operands.
template <typename In, typename T>
void backward_tile(const LocalPlan& s, int64_t bh, int64_t win, const In* q, const In* k,
                   const In* v, const uint8_t* kpm_b, const T* lse, const In* dout, T* dq, T* dk,
                   T* dvv, T* P, T* Pd, T* dP, std::vector<In>& low_p, std::vector<In>& low_s) {
  const Tile t = tile_of(s, win);
  // In the forward S = d^-1/2 q k^T and P = exp(S - lse) on the allowed keys.
  gemm(false, true, t.nq, t.nk, s.d, static_cast<T>(s.scale), q + t.i0 * s.d, s.d, k + t.j0 * s.d,
       s.d, T(0), P, t.nk);
  // Without dropout, dropout(P) is P itself.
  if (s.p == 0) Pd = P;
  for (int64_t r = 0; r < t.nq; ++r) {
    const int64_t i = t.i0 + r;
    T* row = P + r * t.nk;
    if (std::isinf(lse[i])) {
      std::fill(row, row + t.nk, T(0));
      if (s.p > 0) std::fill(Pd + r * t.nk, Pd + (r + 1) * t.nk, T(0));
      continue;
    }
    mask_row(s, kpm_b, i, t.j0, t.nk, row);
    for (int64_t c = 0; c < t.nk; ++c) row[c] = exp_nonpos(row[c] - lse[i]);
    if (s.p > 0) {
      // The forward's dropout(P), from the same Philox draws.
      apply_dropout(s, bh, i, t.j0 - t.band0, t.nk, row, T(1), Pd + r * t.nk);
    }
  }
  // o = dropout(P) v, so dv_band += dropout(P)^T do and dPd = d dropout(P) = do v_band^T.
  gemm(true, false, t.nk, s.dv, t.nq, T(1), operand(Pd, t.nq * t.nk, low_p), t.nk,
       dout + t.i0 * s.dv, s.dv, T(1), dvv + t.j0 * s.dv, s.dv);
  gemm(false, true, t.nq, t.nk, s.dv, T(1), dout + t.i0 * s.dv, s.dv, v + t.j0 * s.dv, s.dv, T(0),
       dP, t.nk);
  // Through dropout, dP = dPd keep / (1 - p); through the softmax,
  // dS = P (dP - sum_j P dP). With P keep / (1 - p) = Pd this is
  // dS = Pd dPd - P D, D = sum_j Pd dPd (= do . o), so the draws are not redone.
  for (int64_t r = 0; r < t.nq; ++r) {
    T* row = P + r * t.nk;
    const T* prow = Pd + r * t.nk;
    const T* drow = dP + r * t.nk;
    double dot = 0;
    for (int64_t c = 0; c < t.nk; ++c) dot += static_cast<double>(prow[c]) * drow[c];
    const T D = static_cast<T>(dot);
    for (int64_t c = 0; c < t.nk; ++c) row[c] = prow[c] * drow[c] - row[c] * D;
  }
  // S = d^-1/2 q k^T: dq_win = d^-1/2 dS k_band, dk_band += d^-1/2 dS^T q_win.
  const In* dS = operand(P, t.nq * t.nk, low_s);
  gemm(false, false, t.nq, s.d, t.nk, static_cast<T>(s.scale), dS, t.nk, k + t.j0 * s.d, s.d, T(0),
       dq + t.i0 * s.d, s.d);
  gemm(true, false, t.nk, s.d, t.nq, static_cast<T>(s.scale), dS, t.nk, q + t.i0 * s.d, s.d, T(1),
       dk + t.j0 * s.d, s.d);
}

// q, k [B, H, N, d], v [B, H, N, dv] (of In) -> o [B, H, N, dv], lse [B, H, N] (of T).
template <typename In, typename T>
void local_forward(const LocalPlan& s, const Tensor& q, const Tensor& k, const Tensor& v,
                   const uint8_t* kpm, Tensor& o, Tensor& lse) {
  const In* qp = q.data<In>();
  const In* kp = k.data<In>();
  const In* vp = v.data<In>();
  T* op = o.data<T>();
  T* lp = lse.data<T>();
  const int64_t items = s.B * s.H * s.windows;
  parallel_for(items, s.w * s.bw * (s.d + s.dv), [&](int64_t begin, int64_t end) {
    // The band tile, from the tracked allocator so the peak counter sees it.
    Tensor P = Tensor::empty({s.w, std::min(s.bw, s.N)}, dtype_of<T>());
    std::vector<In> low;
    for (int64_t it = begin; it < end; ++it) {
      const int64_t bh = it / s.windows, win = it % s.windows;
      const uint8_t* kpm_b = kpm ? kpm + (bh / s.H) * s.N : nullptr;
      forward_tile(s, bh, win, qp + bh * s.N * s.d, kp + bh * s.N * s.d, vp + bh * s.N * s.dv,
                   kpm_b, op + bh * s.N * s.dv, lp + bh * s.N, P.data<T>(), low);
    }
  });
}

// The gradients of q, k, v (of T) from do [B, H, N, dv] (q, k, v and do of In).
template <typename In, typename T>
std::vector<Tensor> local_backward(const LocalPlan& s, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const uint8_t* kpm, const Tensor& lse,
                                   const Tensor& dout) {
  Tensor dq = Tensor::empty(q.shape(), dtype_of<T>());
  Tensor dk = Tensor::zeros(k.shape(), dtype_of<T>());
  Tensor dv = Tensor::zeros(v.shape(), dtype_of<T>());
  const In* qp = q.data<In>();
  const In* kp = k.data<In>();
  const In* vp = v.data<In>();
  const T* lp = lse.data<T>();
  const In* gp = dout.data<In>();
  T* dqp = dq.data<T>();
  T* dkp = dk.data<T>();
  T* dvp = dv.data<T>();
  // Windows win and win + stride never share a key, so each colour class
  // (win % stride) runs in parallel without races on dk, dv.
  const int64_t stride = s.lb + s.lf + 1;
  for (int64_t colour = 0; colour < std::min(stride, s.windows); ++colour) {
    const int64_t per_bh = (s.windows - colour + stride - 1) / stride;
    parallel_for(
        s.B * s.H * per_bh, 2 * s.w * s.bw * (s.d + s.dv), [&](int64_t begin, int64_t end) {
          const int64_t tile = s.w * std::min(s.bw, s.N);
          Tensor scratch = Tensor::empty({3, tile}, dtype_of<T>());
          T* sp = scratch.data<T>();
          std::vector<In> low_p, low_s;
          for (int64_t it = begin; it < end; ++it) {
            const int64_t bh = it / per_bh, win = colour + (it % per_bh) * stride;
            const uint8_t* kpm_b = kpm ? kpm + (bh / s.H) * s.N : nullptr;
            backward_tile(s, bh, win, qp + bh * s.N * s.d, kp + bh * s.N * s.d,
                          vp + bh * s.N * s.dv, kpm_b, lp + bh * s.N, gp + bh * s.N * s.dv,
                          dqp + bh * s.N * s.d, dkp + bh * s.N * s.d, dvp + bh * s.N * s.dv, sp,
                          sp + tile, sp + 2 * tile, low_p, low_s);
          }
        });
  }
  return {dq, dk, dv};
}

// local attention on a GPU: flash_attention_cuda with the band (window,
// look_backward, look_forward), the dropout draws numbered by band position as
// above, and rows whose query is padding set to 0.
Tensor local_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                  const LocalPlan& s) {
  if (s.B * s.H * s.N * s.dv == 0 || s.d == 0) {
    // Nothing to attend with (as on the CPU): o = 0 and no gradient.
    Tensor o = Tensor::zeros({s.B, s.H, s.N, s.dv}, q.dtype(), q.device());
    if (!autograd::needs_grad({q, k, v})) return o;
    return autograd::record("attention::local", {q, k, v}, o,
                            [q = q.detach(), k = k.detach(),
                             v = v.detach()](const std::vector<Tensor>&) -> std::vector<Tensor> {
                              return {Tensor::zeros(q.shape(), q.dtype(), q.device()),
                                      Tensor::zeros(k.shape(), k.dtype(), k.device()),
                                      Tensor::zeros(v.shape(), v.dtype(), v.device())};
                            });
  }
  cuda::FlashArgs a;
  a.B = s.B, a.H = s.H, a.N = s.N, a.M = s.N, a.d = s.d, a.dv = s.dv;
  a.dtype = q.dtype();
  a.scale = s.scale;
  a.causal = s.causal;
  a.window = s.w, a.look_backward = s.lb, a.look_forward = s.lf;
  a.dropout = s.p;
  a.seed = s.seed;
  a.offset = s.offset;
  a.first = s.first;
  return flash_attention_cuda("attention::local", q, k, v, key_padding_mask, a, true);
}

}  // namespace

Tensor local(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
             const LocalOptions& options) {
  const Dims4 dims = check_qkv("local", q, k, v, key_padding_mask, true, true);
  FORGE_CHECK(options.window >= 1, "attention::local: options.window must be >= 1, got {}",
              options.window);
  FORGE_CHECK(options.look_backward >= 0,
              "attention::local: options.look_backward must be >= 0, got {}",
              options.look_backward);
  FORGE_CHECK(
      options.look_forward >= -1,
      "attention::local: options.look_forward must be >= 0 (or -1: 0 when causal, else 1), got {}",
      options.look_forward);
  FORGE_CHECK(options.dropout >= 0 && options.dropout < 1,
              "attention::local: options.dropout must be in [0, 1), got {}", options.dropout);
  LocalPlan s;
  s.B = dims.B;
  s.H = dims.H;
  s.N = dims.N;
  s.d = dims.d;
  s.dv = dims.dv;
  s.w = options.window;
  s.lb = options.look_backward;
  s.lf = options.look_forward >= 0 ? options.look_forward : (options.causal ? 0 : 1);
  s.bw = s.w * (s.lb + 1 + s.lf);
  s.windows = (s.N + s.w - 1) / s.w;
  s.causal = options.causal;
  s.p = options.dropout;
  s.scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  if (s.p > 0) {
    // One draw per (b, h, i, band position), reserved once per call; b is
    // the local batch (a shard of the global one under data parallelism).
    Generator& g = options.gen ? *options.gen : default_generator();
    const RowDraws r = g.reserve_rows(static_cast<uint64_t>(s.B * s.H * s.N * s.bw));
    s.seed = r.seed, s.offset = r.offset, s.first = r.first;
  }
  FORGE_IF_CUDA(q) return local_cuda(q, k, v, key_padding_mask, s);
  // Under bf16 autocast (f32 inputs) the tiles multiply bf16 copies of q, k, v
  // when a band holds at least kMinBf16Keys keys (common.h).
  const CpuOperands in = cpu_operands(q, k, v, std::min(s.bw, s.N));
  const Tensor &qc = in.q, &kc = in.k, &vc = in.v;
  const bool cast = in.low;
  Tensor o = Tensor::empty({s.B, s.H, s.N, s.dv}, q.dtype());
  Tensor lse = Tensor::empty({s.B, s.H, s.N}, q.dtype());
  if (o.numel() > 0 && s.d > 0) {
    if (cast) {
      local_forward<BF16, float>(s, qc, kc, vc, mask_bytes(key_padding_mask), o, lse);
    } else {
      FORGE_DISPATCH_FLOAT(q.dtype(), "attention::local", [&] {
        local_forward<scalar_t, scalar_t>(s, qc, kc, vc, mask_bytes(key_padding_mask), o, lse);
      });
    }
  } else {
    o.fill(0.0);
  }
  if (!autograd::needs_grad({q, k, v})) return o;
  return autograd::record(
      "attention::local", {q, k, v}, o,
      [s, q = qc, k = kc, v = vc, kpm = key_padding_mask, lse, cast,
       dtype = q.dtype()](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0 || s.d == 0)
          return {Tensor::zeros(q.shape(), dtype), Tensor::zeros(k.shape(), dtype),
                  Tensor::zeros(v.shape(), dtype)};
        if (cast)
          return local_backward<BF16, float>(s, q, k, v, mask_bytes(kpm), lse,
                                             grads[0].to(DType::bf16));
        return FORGE_DISPATCH_FLOAT(dtype, "attention::local backward", [&] {
          return local_backward<scalar_t, scalar_t>(s, q, k, v, mask_bytes(kpm), lse, grads[0]);
        });
      });
}

std::vector<AttentionCase> local_cases() {
  // N and the options vary per case; the benchmark's rows are the local-attention
  // package's windows 64 and 256 (its usual window_size 256, look_backward 1).
  struct Spec {
    const char* name;
    int64_t N, window, look_backward, look_forward;
    bool causal, mask;
    double dropout;
    bool bench;
  };
  const Spec specs[] = {
      {"local/default", 8, 4, 1, -1, false, false, 0, false},
      {"local/window-not-dividing-N", 7, 3, 1, -1, false, false, 0, false},
      {"local/look_backward=0+look_forward=0", 8, 2, 0, 0, false, false, 0, false},
      {"local/look_backward=2+look_forward=2", 9, 2, 2, 2, false, false, 0, false},
      {"local/causal", 9, 4, 1, -1, true, false, 0, false},
      {"local/causal+look_backward=2+look_forward=1", 7, 2, 2, 1, true, false, 0, false},
      {"local/mask", 9, 4, 1, -1, false, true, 0, false},
      {"local/causal+mask", 7, 3, 1, -1, true, true, 0, false},
      {"local/dropout", 8, 3, 1, 1, false, false, 0.3, false},
      {"local/causal+mask+dropout", 9, 4, 2, 0, true, true, 0.25, false},
      {"local/w64", 8, 64, 1, -1, false, false, 0, true},
      {"local/w64+causal", 8, 64, 1, -1, true, false, 0, true},
      {"local/w256", 8, 256, 1, -1, false, false, 0, true},
      {"local/w256+causal", 8, 256, 1, -1, true, false, 0, true},
  };
  std::vector<AttentionCase> cases;
  for (const Spec& sp : specs) {
    AttentionCase c;
    c.name = sp.name;
    c.dims.N = c.dims.M = sp.N;
    c.make_inputs = [sp](const CaseDims& s) {
      std::vector<Tensor> in = case_qkv(s, 11);
      // Batch 0: the last two positions padded (a padded query row); batch 1:
      // a padded key in the middle.
      if (sp.mask)
        in.push_back(case_key_mask(s, [](int64_t b, int64_t j, int64_t M) {
          return b == 0 ? j >= M - 2 : b == 1 && j == 2;
        }));
      return in;
    };
    c.fn = [sp](const std::vector<Tensor>& in) {
      LocalOptions o;
      o.window = sp.window;
      o.look_backward = sp.look_backward;
      o.look_forward = sp.look_forward;
      o.causal = sp.causal;
      o.dropout = sp.dropout;
      // A fresh generator per call: every evaluation draws the same dropout mask.
      Generator g(5);
      o.gen = &g;
      return local(in[0], in[1], in[2], case_input(in, 3), o);
    };
    c.bench = sp.bench;
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace forge::ops::attention
