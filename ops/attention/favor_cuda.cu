// Performer FAVOR+ attention on the GPU (see favor_cuda.h; the math is the CPU
// op's, ops/attention/favor.cpp, and ATTENTION.md "favor").
//
// Forward, per batch-head:
//   1. Feature maps. The projected maps (softmax, relu) run one tiled GEMM
//      x' = (c x) W^T per 64 rows, looping over every feature tile so that the
//      map can follow in its epilogue: relu(x') + 1e-3 directly; the softmax
//      query map r (exp(x' - diag(x) - max_f x') + eps) after the row max is
//      known; the softmax key map needs the key stabiliser first (the max of
//      x' over the real keys: over all of them, or over j' <= j for the prefix
//      one), so the GEMM leaves x' with each row's max and diag(x), a small
//      scan forms the stabiliser and an elementwise pass applies the exp.
//      no_projection: a softmax over each query row, and over the keys of
//      each feature column (causal: exp(k)).
//   2. Attention on the features. Every option but one is linear attention on
//      phi(q), phi(k) (padding keys 0) through the shared core
//      (linear_core_cuda.h): non-causal, and causal with the normaliser state
//      starting at 1e-6 per feature (the "+ 1e-6 sum phi(q_i)" of the CPU op).
//      The causal softmax map with the prefix stabiliser gives each query
//      its own key features phi_i(k_j) = r exp(M_j - M_i) g_j + r eps, with
//      g_j = exp(k'_j - diag(k_j) - M_j): that is favor's own chunkwise scan.
//
// The prefix scan, in chunks of kT = 64 positions. The state of a chunk is one
// [F + 1, dv + 1] matrix: rows f < F hold sum_j exp(M_j - M_ref) g_j [v_j, 1]
// (S and z, relative to a reference stabiliser M_ref), row F holds the plain
// sums [sum_j v_j, n] over real keys (the beta terms). Kernels: the local
// state of every chunk (a GEMM over the chunk), an exclusive scan over chunks
// (one thread per state element, rescaling rows f < F by exp(M_old - M_new)
// when the reference moves), then each chunk's output from its incoming
// state and the intra-chunk [64, 64] matrix of phi_i(k_j) . phi(q_i). The
// backward runs the same scan forward (for d phi(q)) and a reverse one over
// the queries' [phi(q_i) alpha exp(M_ref - M_i), beta sum phi(q_i)] x
// [dnum_i, dden_i] (for dg and dv), as the CPU op's two sweeps do. Memory per
// batch-head: the [N, F] features and one state per chunk, (N / 64) (F + 1)
// (dv + 1) values; never [N, F, dv].
//
// Backward of the feature maps: d(x') from d(phi) elementwise (times the exp
// part for softmax, the x' > 0 gate for relu; padding keys 0), then one tiled
// GEMM dx = c d(x') W plus d(diag) c^2 x, with d(diag) = -sum_f d(x')
// (the maxima are stop-grad). W gets no gradient.
//
// Every tiled kernel runs kTileThreads = 256 threads on a 64 x 64 output tile
// (each thread 4 x 4 outputs) through the tile engine's FMA product
// (tile_engine.cuh), in the accumulation type.
#include <cmath>
#include <limits>

#include "core/cuda_kernels.cuh"
#include "core/cuda_tensor.h"
#include "ops/attention/favor_cuda.h"
#include "ops/attention/linear_core_cuda.h"
#include "ops/attention/tile_engine.cuh"

namespace forge::cuda {

namespace {

constexpr int kT = 64;             // output tile edge, and the prefix scan's chunk length
constexpr int kTileThreads = 256;  // 16 x 16 threads per tile, 4 x 4 outputs each
constexpr int kWarps = kTileThreads / kWarp;
constexpr int kColRows = 32;  // key rows at a time in the column softmax (blocks of 32 x 32)
// Normaliser floor of the non-causal core: a query that sees no real key has
// num = 0 and den = 0 and gets o = 0, as the CPU op's den = 1 gives; a query
// that sees one has den >= eps^2 = 1e-8 (softmax map: every feature of
// phi(q) and of each real phi(k) is >= r eps), or more (relu: >= 1e-6 F;
// no_projection: 1), far above the floor.
constexpr double kEmptyRowDen = 1e-20;

// The tiled kernels' products are the tile engine's FMA tile product
// (tile_engine.cuh): thread threadIdx.x owns the outputs at rows tile_row(0..3),
// columns tile_col(0..3).
template <typename A>
using TileSmem = tiles::FmaSmem<A>;
static_assert(kT == tiles::kFmaTile && kTileThreads == tiles::kFmaThreads,
              "the kernels' tiles are the engine's");

__device__ __forceinline__ int tile_row(int a) {
  return tiles::fma_row(a);
}
__device__ __forceinline__ int tile_col(int b) {
  return tiles::fma_col(b);
}

// acc[a][b] += sum_{k < K} la(tile_row(a), k) lb(k, tile_col(b)); kAk / kBk:
// the operand is contiguous along k (tiles::fma_tile_product, whose argument
// order this keeps from the kernels' first version).
template <bool kAk, bool kBk, typename A, typename LA, typename LB>
__device__ __forceinline__ void tile_mma(A (&acc)[4][4], int64_t K, const LA& la, const LB& lb,
                                         TileSmem<A>& sm) {
  tiles::fma_tile_product<kAk, kBk>(acc, K, sm, la, lb);
}

template <typename A>
__device__ __forceinline__ void zero(A (&acc)[4][4]) {
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) acc[a][b] = A(0);
}

// Max over the 16 threads that own the same tile rows (consecutive lanes).
template <typename A>
__device__ __forceinline__ A row_group_max(A v) {
  for (int o = 8; o > 0; o /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename A>
__device__ __forceinline__ A row_group_sum(A v) {
  for (int o = 8; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float exp_acc(float x) {
  return expf(x);
}
__device__ __forceinline__ double exp_acc(double x) {
  return exp(x);
}

template <typename A>
__device__ __forceinline__ A neg_inf() {
  return -static_cast<A>(INFINITY);
}

// The factor exp(from - to) that moves a sum kept relative to the stabiliser
// `from` to `to` >= from; 0 while `from` is -inf (no real key seen yet), as the
// CPU op's rescale.
template <typename A>
__device__ __forceinline__ A rescale(A from, A to) {
  if (from == to) return A(1);
  return from == neg_inf<A>() ? A(0) : exp_acc(from - to);
}

// Whether position j of batch b is a real key (mask [B, M]; null: all real).
__device__ __forceinline__ bool real_key(const uint8_t* mask, int64_t b, int64_t M, int64_t j) {
  return mask == nullptr || mask[b * M + j] != 0;
}

// Rows are bh-major: row = bh * R + j with bh = b * H + h.
__device__ __forceinline__ bool real_row(const uint8_t* mask, int64_t row, int64_t R, int64_t H) {
  return real_key(mask, row / R / H, R, row % R);
}

// ---- feature maps ----

enum class ProjMode { query_softmax, key_softmax, relu };

// x' = (c x) W^T for rows x [rows, d] (rows = BH * R) and W [F, d], into out
// [rows, F], with the map applied:
//   query_softmax: out = r (exp(x' - diag(x) - max_f x') + eps)
//   key_softmax:   out = x'; rmax [rows] = max_f x' and diag [rows] = diag(x)
//                  (key_stabiliser_kernel and key_exp_kernel finish the map)
//   relu:          out = relu(x') + eps, 0 on padding keys (mask: keys only)
// with diag(x) = |x|^2 c^2 / 2. One block per 64 rows, over every feature tile.
template <typename T, typename A>
__global__ void __launch_bounds__(kTileThreads)
    project_kernel(const T* x, const T* W, const uint8_t* mask, A* out, A* rmax, A* diag,
                   int64_t rows, int64_t R, int64_t H, int64_t d, int64_t F, A c, A r, A eps,
                   ProjMode mode) {
  __shared__ TileSmem<A> sm;
  __shared__ A s_max[kT], s_diag[kT];
  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kT;
  for (int o = warp; o < kT; o += kWarps) {  // diag(x): a warp per row
    const int64_t row = r0 + o;
    A sq = 0;
    if (row < rows)
      for (int64_t e = lane; e < d; e += kWarp) {
        const A xe = to_acc<A>(x[row * d + e]);
        sq += xe * xe;
      }
    sq = warp_sum(sq);
    if (lane == 0) s_diag[o] = sq * c * c / 2;
  }
  A run[4];
  for (int a = 0; a < 4; ++a) run[a] = neg_inf<A>();
  for (int64_t f0 = 0; f0 < F; f0 += kT) {
    A acc[4][4];
    zero(acc);
    tile_mma<true, true>(
        acc, d,
        [&](int o, int64_t k) {
          const int64_t row = r0 + o;
          return row < rows ? to_acc<A>(x[row * d + k]) : A(0);
        },
        [&](int64_t k, int o) {
          const int64_t f = f0 + o;
          return f < F ? to_acc<A>(W[f * d + k]) : A(0);
        },
        sm);
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int64_t row = r0 + tile_row(a), f = f0 + tile_col(b);
        if (row >= rows || f >= F) continue;
        const A xp = c * acc[a][b];
        run[a] = max(run[a], xp);
        A y = xp;
        if (mode == ProjMode::relu) y = real_row(mask, row, R, H) ? max(xp, A(0)) + eps : A(0);
        out[row * F + f] = y;
      }
  }
  for (int a = 0; a < 4; ++a) run[a] = row_group_max(run[a]);
  if (tid % 16 == 0)
    for (int a = 0; a < 4; ++a) s_max[tile_row(a)] = run[a];
  __syncthreads();  // also makes the block's writes to out visible to the whole block
  if (mode == ProjMode::key_softmax) {
    if (tid < kT && r0 + tid < rows) {
      rmax[r0 + tid] = s_max[tid];
      diag[r0 + tid] = s_diag[tid];
    }
  } else if (mode == ProjMode::query_softmax) {
    for (int64_t t = tid; t < kT * F; t += kTileThreads) {  // the block's own rows, row-major
      const int o = static_cast<int>(t / F);
      const int64_t row = r0 + o;
      if (row >= rows) break;
      A& y = out[row * F + t % F];
      y = r * (exp_acc(y - (s_diag[o] + s_max[o])) + eps);
    }
  }
}

// The key stabiliser mk [BH, M] from the row maxima of x' (padding keys left
// out): prefix: the max over real keys j' <= j (-inf before the first one);
// global: the max over all real keys for every j (0 when there is none). One
// block per batch-head; each thread scans a contiguous run of keys, then a
// block scan over the runs.
template <typename A>
__global__ void key_stabiliser_kernel(const A* rmax, const uint8_t* mask, A* mk, int64_t M,
                                      int64_t H, bool prefix) {
  __shared__ A s_scan[kThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t bh = blockIdx.x, b = bh / H;
  const int64_t per = (M + kThreads - 1) / kThreads;
  const int64_t j0 = std::min<int64_t>(M, tid * per), j1 = std::min<int64_t>(M, j0 + per);
  const A* rm = rmax + bh * M;
  auto key_max = [&](int64_t j) { return real_key(mask, b, M, j) ? rm[j] : neg_inf<A>(); };
  A run = neg_inf<A>();
  for (int64_t j = j0; j < j1; ++j) run = max(run, key_max(j));
  s_scan[tid] = run;
  __syncthreads();
  for (int s = 1; s < kThreads; s *= 2) {  // inclusive max-scan over the threads' runs
    const A other = tid >= s ? s_scan[tid - s] : neg_inf<A>();
    __syncthreads();
    s_scan[tid] = max(s_scan[tid], other);
    __syncthreads();
  }
  A* out = mk + bh * M;
  if (prefix) {
    A m = tid > 0 ? s_scan[tid - 1] : neg_inf<A>();
    for (int64_t j = j0; j < j1; ++j) {
      m = max(m, key_max(j));
      out[j] = m;
    }
  } else {
    const A total = s_scan[kThreads - 1];
    const A g = total == neg_inf<A>() ? A(0) : total;
    for (int64_t j = j0; j < j1; ++j) out[j] = g;
  }
}

// In place over kf [BH * M, F] holding x': alpha exp(x' - diag - mk) + beta for
// real keys, 0 for padding ones.
template <typename A>
__global__ void key_exp_kernel(A* kf, const A* diag, const A* mk, const uint8_t* mask, int64_t rows,
                               int64_t M, int64_t H, int64_t F, A alpha, A beta) {
  FORGE_GRID_STRIDE(t, rows * F) {
    const int64_t row = t / F;
    kf[t] =
        real_row(mask, row, M, H) ? alpha * exp_acc(kf[t] - (diag[row] + mk[row])) + beta : A(0);
  }
}

// no_projection queries: y = softmax of each row of x [rows, d]; a warp per row.
template <typename T, typename A>
__global__ void softmax_rows_kernel(const T* x, A* y, int64_t rows, int64_t d) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp;
       row < rows; row += warps) {
    const T* xr = x + row * d;
    A* yr = y + row * d;
    A mx = neg_inf<A>();
    for (int64_t e = lane; e < d; e += kWarp) mx = max(mx, to_acc<A>(xr[e]));
    mx = warp_max(mx);
    A sum = 0;
    for (int64_t e = lane; e < d; e += kWarp) sum += (yr[e] = exp_acc(to_acc<A>(xr[e]) - mx));
    sum = warp_sum(sum);
    for (int64_t e = lane; e < d; e += kWarp) yr[e] /= sum;
  }
}

// dx = y (dy - y . dy) per row (the backward of softmax_rows_kernel).
template <typename T, typename A>
__global__ void softmax_rows_backward_kernel(const A* y, const A* dy, T* dx, int64_t rows,
                                             int64_t d) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp;
       row < rows; row += warps) {
    const A* yr = y + row * d;
    const A* dyr = dy + row * d;
    A dot = 0;
    for (int64_t e = lane; e < d; e += kWarp) dot += yr[e] * dyr[e];
    dot = warp_sum(dot);
    for (int64_t e = lane; e < d; e += kWarp) dx[row * d + e] = from_acc<T>(yr[e] * (dyr[e] - dot));
  }
}

// Causal no_projection keys: kf = exp(k), 0 on padding keys; k [BH * M, d].
template <typename T, typename A>
__global__ void exp_keys_kernel(const T* k, const uint8_t* mask, A* kf, int64_t rows, int64_t M,
                                int64_t H, int64_t d) {
  FORGE_GRID_STRIDE(t, rows * d) {
    kf[t] = real_row(mask, t / d, M, H) ? exp_acc(to_acc<A>(k[t])) : A(0);
  }
}

// Its backward: dk = kf dkf, 0 on padding keys.
template <typename T, typename A>
__global__ void exp_keys_backward_kernel(const A* kf, const A* dkf, const uint8_t* mask, T* dk,
                                         int64_t rows, int64_t M, int64_t H, int64_t d) {
  FORGE_GRID_STRIDE(t, rows * d) {
    dk[t] = from_acc<T>(real_row(mask, t / d, M, H) ? kf[t] * dkf[t] : A(0));
  }
}

// Non-causal no_projection keys: kf = softmax over the real keys j of each
// column e of k [BH, M, d], 0 on padding keys (a column with none stays 0). A
// block of 32 x kColRows threads per (bh, 32 columns): threadIdx.x the
// column, threadIdx.y strides over keys with an online max / sum.
template <typename T, typename A>
__global__ void softmax_cols_kernel(const T* k, const uint8_t* mask, A* kf, int64_t M, int64_t H,
                                    int64_t d) {
  __shared__ A s_m[kColRows][kWarp], s_s[kColRows][kWarp];
  const int64_t groups = (d + kWarp - 1) / kWarp;
  const int64_t bh = blockIdx.x / groups, e = (blockIdx.x % groups) * kWarp + threadIdx.x;
  const int64_t b = bh / H;
  const bool column = e < d;
  const T* kb = k + bh * M * d;
  A m = neg_inf<A>(), s = 0;
  if (column)
    for (int64_t j = threadIdx.y; j < M; j += kColRows) {
      if (!real_key(mask, b, M, j)) continue;
      const A x = to_acc<A>(kb[j * d + e]);
      if (x > m) {
        s = s * exp_acc(m - x) + A(1);
        m = x;
      } else {
        s += exp_acc(x - m);
      }
    }
  s_m[threadIdx.y][threadIdx.x] = m;
  s_s[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  A mx = neg_inf<A>(), sum = 0;
  for (int y = 0; y < kColRows; ++y) mx = max(mx, s_m[y][threadIdx.x]);
  for (int y = 0; y < kColRows; ++y)
    if (s_m[y][threadIdx.x] != neg_inf<A>())
      sum += s_s[y][threadIdx.x] * exp_acc(s_m[y][threadIdx.x] - mx);
  if (!column) return;
  A* out = kf + bh * M * d;
  for (int64_t j = threadIdx.y; j < M; j += kColRows)
    out[j * d + e] = real_key(mask, b, M, j) ? exp_acc(to_acc<A>(kb[j * d + e]) - mx) / sum : A(0);
}

// Its backward per column: dk = kf (dkf - sum_j kf dkf) over real keys, 0 on
// padding keys.
template <typename T, typename A>
__global__ void softmax_cols_backward_kernel(const A* kf, const A* dkf, const uint8_t* mask, T* dk,
                                             int64_t M, int64_t H, int64_t d) {
  __shared__ A s_dot[kColRows][kWarp];
  const int64_t groups = (d + kWarp - 1) / kWarp;
  const int64_t bh = blockIdx.x / groups, e = (blockIdx.x % groups) * kWarp + threadIdx.x;
  const int64_t b = bh / H;
  const bool column = e < d;
  const A* y = kf + bh * M * d;
  const A* dy = dkf + bh * M * d;
  A dot = 0;
  if (column)
    for (int64_t j = threadIdx.y; j < M; j += kColRows)
      if (real_key(mask, b, M, j)) dot += y[j * d + e] * dy[j * d + e];
  s_dot[threadIdx.y][threadIdx.x] = dot;
  __syncthreads();
  dot = 0;
  for (int r = 0; r < kColRows; ++r) dot += s_dot[r][threadIdx.x];
  if (!column) return;
  T* out = dk + bh * M * d;
  for (int64_t j = threadIdx.y; j < M; j += kColRows)
    out[j * d + e] =
        from_acc<T>(real_key(mask, b, M, j) ? y[j * d + e] * (dy[j * d + e] - dot) : A(0));
}

// dx [rows, d] through a projected map from phi and dphi [rows, F] (forward:
// project_kernel, key_exp_kernel). With t = d(x') per feature:
//   softmax: t = dphi (phi - off), phi - off being the exp part of the map
//            (off = r eps for phi(q) and the core's phi(k), 0 for g), and
//            d(diag) = -sum_f t (the stabilisers are stop-grad);
//   relu:    t = dphi where x' > 0, i.e. phi > eps; d(diag) = 0;
//   padding keys (mask: keys only): t = 0;
//   dx = c t W + d(diag) c^2 x.
// A block per (64 rows, 64 columns of d).
template <typename T, typename A>
__global__ void __launch_bounds__(kTileThreads)
    project_backward_kernel(const T* x, const T* W, const uint8_t* mask, const A* phi,
                            const A* dphi, T* dx, int64_t rows, int64_t R, int64_t H, int64_t d,
                            int64_t F, A c, A off, bool relu, A eps) {
  __shared__ TileSmem<A> sm;
  __shared__ A s_ddiag[kT];
  __shared__ bool s_real[kT];
  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp;
  const int64_t dtiles = (d + kT - 1) / kT;
  const int64_t r0 = (blockIdx.x / dtiles) * kT, e0 = (blockIdx.x % dtiles) * kT;
  if (tid < kT) s_real[tid] = r0 + tid < rows && real_row(mask, r0 + tid, R, H);
  __syncthreads();
  auto grad_xp = [&](int o, int64_t f) -> A {
    if (!s_real[o]) return A(0);
    const int64_t at = (r0 + o) * F + f;
    return relu ? (phi[at] > eps ? dphi[at] : A(0)) : dphi[at] * (phi[at] - off);
  };
  for (int o = warp; o < kT; o += kWarps) {  // d(diag): a warp per row
    A s = 0;
    if (!relu)
      for (int64_t f = lane; f < F; f += kWarp) s += grad_xp(o, f);
    s = warp_sum(s);
    if (lane == 0) s_ddiag[o] = -s;
  }
  __syncthreads();
  A acc[4][4];
  zero(acc);
  tile_mma<true, false>(
      acc, F, grad_xp,
      [&](int64_t f, int o) {
        const int64_t e = e0 + o;
        return e < d ? to_acc<A>(W[f * d + e]) : A(0);
      },
      sm);
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int64_t row = r0 + tile_row(a), e = e0 + tile_col(b);
      if (row >= rows || e >= d) continue;
      const A xe = to_acc<A>(x[row * d + e]);
      dx[row * d + e] = from_acc<T>(c * acc[a][b] + s_ddiag[tile_row(a)] * c * c * xe);
    }
}

// out[row] = sum_f x[row, f] for x [rows, F]; a warp per row.
template <typename A>
__global__ void row_sums_kernel(const A* x, A* out, int64_t rows, int64_t F) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp;
       row < rows; row += warps) {
    A s = 0;
    for (int64_t f = lane; f < F; f += kWarp) s += x[row * F + f];
    s = warp_sum(s);
    if (lane == 0) out[row] = s;
  }
}

// ---- the causal scan with the prefix stabiliser ----

// The local state of each chunk of kT positions, [F + 1, dv + 1] per (bh, chunk)
// into st [BH, chunks, F + 1, dv + 1]:
//   rows f < F: sum_{j in chunk} w_j X[j, f] Y'[j, :],   row F: sum_j w2_j Y'[j, :]
// with Y' = [Y, 1] (append_one: Y has dv columns) or Y' = Y (dv + 1 columns).
// Forward (reverse false): X = g, Y' = [v, 1], w_j = exp(M_j - M_last) (relative
// to the chunk's last stabiliser), w2_j = [j real]. Backward (reverse true):
// X = phi(q), Y' = [dnum, dden], w_j = alpha exp(M_first - M_j) (relative to
// the chunk's first), w2_j = beta sum_f phi(q_j) (sumq). A block per (bh,
// chunk, 64 rows, 64 columns of the state).
template <typename YT, typename A>
__global__ void __launch_bounds__(kTileThreads)
    chunk_state_kernel(const A* X, const YT* Y, bool append_one, const A* mk, const uint8_t* mask,
                       const A* sumq, A* st, int64_t H, int64_t N, int64_t nC, int64_t F,
                       int64_t dv, bool reverse, A alpha, A beta) {
  __shared__ TileSmem<A> sm;
  __shared__ A s_w[kT], s_w2[kT];
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t E = dv + 1, ftiles = (F + 1 + kT - 1) / kT, ctiles = (E + kT - 1) / kT;
  int64_t bid = blockIdx.x;
  const int64_t ct = bid % ctiles;
  bid /= ctiles;
  const int64_t ft = bid % ftiles;
  bid /= ftiles;
  const int64_t c = bid % nC, bh = bid / nC;
  const int64_t i0 = c * kT, L = std::min<int64_t>(kT, N - i0);
  const A* Mc = mk + bh * N + i0;
  if (tid < L) {
    if (reverse) {
      s_w[tid] = alpha * rescale(Mc[0], Mc[tid]);
      s_w2[tid] = beta * sumq[bh * N + i0 + tid];
    } else {
      s_w[tid] = rescale(Mc[tid], Mc[L - 1]);
      s_w2[tid] = real_key(mask, bh / H, N, i0 + tid) ? A(1) : A(0);
    }
  }
  __syncthreads();
  const int64_t f0 = ft * kT, c0 = ct * kT;
  const A* Xc = X + (bh * N + i0) * F;
  const YT* Yc = Y + (bh * N + i0) * (append_one ? dv : E);
  A acc[4][4];
  zero(acc);
  tile_mma<false, false>(
      acc, L,
      [&](int o, int64_t j) {
        const int64_t f = f0 + o;
        if (f < F) return s_w[j] * Xc[j * F + f];
        return f == F ? s_w2[j] : A(0);
      },
      [&](int64_t j, int o) {
        const int64_t col = c0 + o;
        if (col >= E) return A(0);
        if (append_one) return col == dv ? A(1) : to_acc<A>(Yc[j * dv + col]);
        return to_acc<A>(Yc[j * E + col]);
      },
      sm);
  A* out = st + (bh * nC + c) * (F + 1) * E;
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int64_t f = f0 + tile_row(a), col = c0 + tile_col(b);
      if (f <= F && col < E) out[f * E + col] = acc[a][b];
    }
}

// Exclusive scan of the chunk states of each batch-head over its chunks, in
// place. Forward: chunk c gets the sum over chunks c' < c, relative to the
// stabiliser M_p of the position before it (M at c kT - 1; -inf for c = 0).
// Reverse: chunk c gets the sum over chunks c' > c, relative to M at (c + 1) kT,
// the next chunk's first position (0 for the last chunk). Moving the running
// sum to another reference multiplies rows f < F by exp(M_old - M_new); row F
// (plain sums) is never rescaled. One thread per state element.
template <typename A>
__global__ void chunk_scan_kernel(A* st, const A* mk, int64_t BH, int64_t N, int64_t nC, int64_t F,
                                  int64_t dv, bool reverse) {
  const int64_t size = (F + 1) * (dv + 1);  // of one state
  FORGE_GRID_STRIDE(t, BH * size) {
    const int64_t bh = t / size, r = t % size;
    const bool scaled = r / (dv + 1) < F;
    A* s = st + bh * nC * size + r;
    const A* Mb = mk + bh * N;
    A run = 0;
    if (!reverse) {
      for (int64_t c = 0; c < nC; ++c) {
        const A local = s[c * size];  // relative to M_end(c)
        s[c * size] = run;            // relative to M_end(c - 1)
        const A m_prev = c > 0 ? Mb[c * kT - 1] : neg_inf<A>();
        const A m_end = Mb[std::min<int64_t>(N, (c + 1) * kT) - 1];
        run = (scaled ? rescale(m_prev, m_end) : A(1)) * run + local;
      }
    } else {
      for (int64_t c = nC - 1; c >= 0; --c) {
        const A local = s[c * size];  // relative to M_start(c)
        s[c * size] = run;            // relative to M_start(c + 1)
        const bool move = scaled && c < nC - 1;
        run = (move ? rescale(Mb[c * kT], Mb[(c + 1) * kT]) : A(1)) * run + local;
      }
    }
  }
}

// P' [kT, kT] of one chunk into ps: for i < L, j <= i,
//   P'_ij = phi(q_i) . phi_i(k_j)
//         = alpha exp(M_j - M_i) (phi(q_i) . g_j) + beta sum(phi(q_i)) [j real]
// and 0 elsewhere. Qc, Gc: the chunk's first rows of phi(q), g [., F]; s_m, s_real,
// s_sumq: M, realness and sum(phi(q)) of the chunk's positions (shared).
template <typename A>
__device__ void chunk_phi_matrix(const A* Qc, const A* Gc, int64_t L, int64_t F, A alpha, A beta,
                                 const A* s_m, const bool* s_real, const A* s_sumq, A (*ps)[kT + 1],
                                 TileSmem<A>& sm) {
  A acc[4][4];
  zero(acc);
  tile_mma<true, true>(
      acc, F, [&](int o, int64_t f) { return o < L ? Qc[o * F + f] : A(0); },
      [&](int64_t f, int o) { return o < L ? Gc[o * F + f] : A(0); }, sm);
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int i = tile_row(a), j = tile_col(b);
      ps[i][j] = i < L && j <= i ? alpha * rescale(s_m[j], s_m[i]) * acc[a][b] +
                                       (s_real[j] ? beta * s_sumq[i] : A(0))
                                 : A(0);
    }
  __syncthreads();
}

// Loads M, realness and (when sumq is given) sum(phi(q)) of a chunk's
// positions into shared memory (zeros past L); the caller synchronises.
template <typename A>
__device__ void load_chunk_rows(const A* mk, const uint8_t* mask, const A* sumq, int64_t bh,
                                int64_t H, int64_t N, int64_t i0, int64_t L, A* s_m, bool* s_real,
                                A* s_sumq) {
  const int tid = static_cast<int>(threadIdx.x);
  if (tid >= kT) return;
  const bool in = tid < L;
  s_m[tid] = in ? mk[bh * N + i0 + tid] : A(0);
  s_real[tid] = in && real_key(mask, bh / H, N, i0 + tid);
  if (s_sumq) s_sumq[tid] = in ? sumq[bh * N + i0 + tid] : A(0);
}

// The output of one chunk for 64 columns of dv (prefix stabiliser): with the
// state (S~, z~; vs~, n~) entering the chunk, relative to M_p, s_i = exp(M_p - M_i):
//   num_i = alpha s_i phi(q_i) S~ + beta sum(phi(q_i)) vs~ + sum_{j <= i} P'_ij v_j
//   den_i = alpha s_i phi(q_i) . z~ + (beta n~ + 1e-6) sum(phi(q_i)) + sum_{j <= i} P'_ij
//   o_i = num_i / den_i; den [BH, N] is saved for the backward.
template <typename T, typename A>
__global__ void __launch_bounds__(kTileThreads)
    prefix_forward_kernel(const A* Qf, const A* G, const A* mk, const A* sumq, const A* st,
                          const T* v, const uint8_t* mask, T* out, A* den, int64_t H, int64_t N,
                          int64_t nC, int64_t F, int64_t dv, A alpha, A beta, A ceps) {
  __shared__ TileSmem<A> sm;
  __shared__ A ps[kT][kT + 1];
  __shared__ A s_m[kT], s_sumq[kT], s_qz[kT], s_s[kT], s_den[kT];
  __shared__ bool s_real[kT];
  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp;
  const int64_t E = dv + 1, ctiles = (dv + kT - 1) / kT;
  int64_t bid = blockIdx.x;
  const int64_t ct = bid % ctiles;
  bid /= ctiles;
  const int64_t c = bid % nC, bh = bid / nC;
  const int64_t i0 = c * kT, L = std::min<int64_t>(kT, N - i0);
  const A* S = st + (bh * nC + c) * (F + 1) * E;  // the state entering the chunk
  const A* Qc = Qf + (bh * N + i0) * F;
  const A* Gc = G + (bh * N + i0) * F;
  load_chunk_rows(mk, mask, sumq, bh, H, N, i0, L, s_m, s_real, s_sumq);
  const A m_p = c > 0 ? mk[bh * N + i0 - 1] : neg_inf<A>();
  if (tid < kT) s_s[tid] = tid < L ? rescale(m_p, mk[bh * N + i0 + tid]) : A(0);
  for (int o = warp; o < kT; o += kWarps) {  // phi(q_i) . z~: a warp per row
    A s = 0;
    if (o < L)
      for (int64_t f = lane; f < F; f += kWarp) s += Qc[o * F + f] * S[f * E + dv];
    s = warp_sum(s);
    if (lane == 0) s_qz[o] = s;
  }
  __syncthreads();
  chunk_phi_matrix(Qc, Gc, L, F, alpha, beta, s_m, s_real, s_sumq, ps, sm);
  if (tid < L) {
    A prow = 0;
    for (int j = 0; j <= tid; ++j) prow += ps[tid][j];
    const A n_prev = S[F * E + dv];
    const A dn = prow + alpha * s_s[tid] * s_qz[tid] + (beta * n_prev + ceps) * s_sumq[tid];
    s_den[tid] = dn;
    if (ct == 0) den[bh * N + i0 + tid] = dn;
  }
  __syncthreads();
  const int64_t c0 = ct * kT;
  A acc[4][4];
  zero(acc);
  tile_mma<true, false>(
      acc, F, [&](int o, int64_t f) { return o < L ? Qc[o * F + f] : A(0); },
      [&](int64_t f, int o) {
        const int64_t col = c0 + o;
        return col < dv ? S[f * E + col] : A(0);
      },
      sm);
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int i = tile_row(a);
      const int64_t col = c0 + tile_col(b);
      const A vs = col < dv ? S[F * E + col] : A(0);
      acc[a][b] = alpha * s_s[i] * acc[a][b] + beta * s_sumq[i] * vs;
    }
  const T* Vc = v + (bh * N + i0) * dv;
  tile_mma<true, false>(
      acc, L, [&](int o, int64_t j) { return ps[o][j]; },
      [&](int64_t j, int o) {
        const int64_t col = c0 + o;
        return col < dv ? to_acc<A>(Vc[j * dv + col]) : A(0);
      },
      sm);
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int i = tile_row(a);
      const int64_t col = c0 + tile_col(b);
      if (i < L && col < dv) out[(bh * N + i0 + i) * dv + col] = from_acc<T>(acc[a][b] / s_den[i]);
    }
}

// Per output row: dn [rows, dv + 1] = [dO / den, -(dO . o) / den] (the
// gradients of the numerator and of the normaliser); a warp per row.
template <typename T, typename A>
__global__ void prefix_grad_rows_kernel(const T* dO, const T* o, const A* den, A* dn, int64_t rows,
                                        int64_t dv) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp;
       row < rows; row += warps) {
    const A dr = den[row];
    A dot = 0;
    for (int64_t col = lane; col < dv; col += kWarp) {
      const A g = to_acc<A>(dO[row * dv + col]);
      dot += g * to_acc<A>(o[row * dv + col]);
      dn[row * (dv + 1) + col] = g / dr;
    }
    dot = warp_sum(dot);
    if (lane == 0) dn[row * (dv + 1) + dv] = -dot / dr;
  }
}

// d phi(q) and dg of one chunk for 64 features. With the forward state
// (S~' = [S~, z~] rows f < F; [vs~, n~] row F) entering the chunk, the reverse
// state R~' (rows f < F: sum_{i in later chunks} alpha exp(M_next - M_i) phi(q_i) dn_i^T,
// relative to M_next = M at the next chunk's first position) and
// D_ij = (dn_i . [v_j, 1]) exp(M_j - M_i) for j <= i in the chunk:
//   d phi(q_i) = alpha s_i (S~' dn_i) + alpha (D g)_i + beta ([vs~, n~] . dn_i)
//                + beta sum_{j <= i, real} dn_i . [v_j, 1] + 1e-6 dden_i
//   dg_j = t_j (R~' [v_j, 1]) + alpha (D^T phi(q))_j,  t_j = exp(M_j - M_next)
//          (real keys; 0 for padding ones and t_j = 0 in the last chunk).
template <typename T, typename A>
__global__ void __launch_bounds__(kTileThreads)
    prefix_grad_qk_kernel(const A* Qf, const A* G, const A* mk, const T* v, const uint8_t* mask,
                          const A* dn, const A* stf, const A* stb, A* dQf, A* dG, int64_t H,
                          int64_t N, int64_t nC, int64_t F, int64_t dv, A alpha, A beta, A ceps) {
  __shared__ TileSmem<A> sm;
  __shared__ A ds[kT][kT + 1];
  __shared__ A s_m[kT], s_s[kT], s_t[kT], s_const[kT];
  __shared__ bool s_real[kT];
  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp;
  const int64_t E = dv + 1, ftiles = (F + kT - 1) / kT;
  int64_t bid = blockIdx.x;
  const int64_t ft = bid % ftiles;
  bid /= ftiles;
  const int64_t c = bid % nC, bh = bid / nC;
  const int64_t i0 = c * kT, L = std::min<int64_t>(kT, N - i0);
  const bool last = c == nC - 1;
  const A* Sf = stf + (bh * nC + c) * (F + 1) * E;
  const A* Sb = stb + (bh * nC + c) * (F + 1) * E;
  const A* Qc = Qf + (bh * N + i0) * F;
  const A* Gc = G + (bh * N + i0) * F;
  const A* dnc = dn + (bh * N + i0) * E;
  const T* Vc = v + (bh * N + i0) * dv;
  load_chunk_rows<A>(mk, mask, nullptr, bh, H, N, i0, L, s_m, s_real, nullptr);
  if (tid < L) {
    const A m_i = mk[bh * N + i0 + tid];
    s_s[tid] = rescale(c > 0 ? mk[bh * N + i0 - 1] : neg_inf<A>(), m_i);
    s_t[tid] = last ? A(0) : rescale(m_i, mk[bh * N + i0 + kT]);
  } else if (tid < kT) {
    s_s[tid] = s_t[tid] = A(0);
  }
  for (int o = warp; o < kT; o += kWarps) {  // beta [vs~, n~] . dn_i + 1e-6 dden_i
    A s = 0;
    if (o < L)
      for (int64_t col = lane; col < E; col += kWarp) s += dnc[o * E + col] * Sf[F * E + col];
    s = warp_sum(s);
    if (lane == 0) s_const[o] = o < L ? beta * s + ceps * dnc[o * E + dv] : A(0);
  }
  __syncthreads();
  auto vv = [&](int64_t j, int64_t col) { return col < dv ? to_acc<A>(Vc[j * dv + col]) : A(1); };
  auto dn_row = [&](int o, int64_t col) { return o < L ? dnc[o * E + col] : A(0); };
  // Dm = dn [v, 1]^T; D = Dm exp(M_j - M_i) into ds; beta sum_{j <= i, real} Dm_ij into s_const.
  A acc[4][4];
  zero(acc);
  tile_mma<true, true>(
      acc, E, dn_row, [&](int64_t col, int o) { return o < L ? vv(o, col) : A(0); }, sm);
  A part[4];
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    part[a] = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int i = tile_row(a), j = tile_col(b);
      const bool in = i < L && j <= i;
      ds[i][j] = in ? acc[a][b] * rescale(s_m[j], s_m[i]) : A(0);
      if (in && s_real[j]) part[a] += acc[a][b];
    }
    part[a] = row_group_sum(part[a]);
  }
  if (tid % 16 == 0)
    for (int a = 0; a < 4; ++a) s_const[tile_row(a)] += beta * part[a];
  __syncthreads();
  const int64_t f0 = ft * kT;
  // d phi(q): alpha (s_i (dn_i S~'^T) + (D g)_i) + s_const_i
  zero(acc);
  tile_mma<true, true>(
      acc, E, dn_row,
      [&](int64_t col, int o) {
        const int64_t f = f0 + o;
        return f < F ? Sf[f * E + col] : A(0);
      },
      sm);
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) acc[a][b] *= s_s[tile_row(a)];
  tile_mma<true, false>(
      acc, L, [&](int o, int64_t j) { return ds[o][j]; },
      [&](int64_t j, int o) {
        const int64_t f = f0 + o;
        return f < F ? Gc[j * F + f] : A(0);
      },
      sm);
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int i = tile_row(a);
      const int64_t f = f0 + tile_col(b);
      if (i < L && f < F) dQf[(bh * N + i0 + i) * F + f] = alpha * acc[a][b] + s_const[i];
    }
  // dg: t_j (R~' [v_j, 1]) + alpha (D^T phi(q))_j
  zero(acc);
  tile_mma<true, true>(
      acc, E, [&](int o, int64_t col) { return o < L ? vv(o, col) : A(0); },
      [&](int64_t col, int o) {
        const int64_t f = f0 + o;
        return f < F ? Sb[f * E + col] : A(0);
      },
      sm);
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) acc[a][b] *= s_t[tile_row(a)];
  tile_mma<false, false>(
      acc, L, [&](int o, int64_t i) { return alpha * ds[i][o]; },
      [&](int64_t i, int o) {
        const int64_t f = f0 + o;
        return f < F ? Qc[i * F + f] : A(0);
      },
      sm);
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int j = tile_row(a);
      const int64_t f = f0 + tile_col(b);
      if (j < L && f < F) dG[(bh * N + i0 + j) * F + f] = s_real[j] ? acc[a][b] : A(0);
    }
}

// dv of one chunk for 64 columns (real keys; 0 for padding ones), with the
// reverse state (rows f < F: R~; row F: sv~ = sum_{i in later chunks} beta
// sum(phi(q_i)) dnum_i) and t_j as in prefix_grad_qk_kernel:
//   dv_j = t_j (R~^T g_j) + sv~ + sum_{i >= j in the chunk} P'_ij dnum_i
template <typename T, typename A>
__global__ void __launch_bounds__(kTileThreads)
    prefix_grad_v_kernel(const A* Qf, const A* G, const A* mk, const A* sumq, const uint8_t* mask,
                         const A* dn, const A* stb, T* dV, int64_t H, int64_t N, int64_t nC,
                         int64_t F, int64_t dv, A alpha, A beta) {
  __shared__ TileSmem<A> sm;
  __shared__ A ps[kT][kT + 1];
  __shared__ A s_m[kT], s_sumq[kT], s_t[kT];
  __shared__ bool s_real[kT];
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t E = dv + 1, ctiles = (dv + kT - 1) / kT;
  int64_t bid = blockIdx.x;
  const int64_t ct = bid % ctiles;
  bid /= ctiles;
  const int64_t c = bid % nC, bh = bid / nC;
  const int64_t i0 = c * kT, L = std::min<int64_t>(kT, N - i0);
  const bool last = c == nC - 1;
  const A* Sb = stb + (bh * nC + c) * (F + 1) * E;
  const A* Qc = Qf + (bh * N + i0) * F;
  const A* Gc = G + (bh * N + i0) * F;
  const A* dnc = dn + (bh * N + i0) * E;
  load_chunk_rows(mk, mask, sumq, bh, H, N, i0, L, s_m, s_real, s_sumq);
  if (tid < kT)
    s_t[tid] = tid < L && !last ? rescale(mk[bh * N + i0 + tid], mk[bh * N + i0 + kT]) : A(0);
  __syncthreads();
  chunk_phi_matrix(Qc, Gc, L, F, alpha, beta, s_m, s_real, s_sumq, ps, sm);
  const int64_t c0 = ct * kT;
  A acc[4][4];
  zero(acc);
  tile_mma<true, false>(
      acc, F, [&](int o, int64_t f) { return o < L ? Gc[o * F + f] : A(0); },
      [&](int64_t f, int o) {
        const int64_t col = c0 + o;
        return col < dv ? Sb[f * E + col] : A(0);
      },
      sm);
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int64_t col = c0 + tile_col(b);
      acc[a][b] = s_t[tile_row(a)] * acc[a][b] + (col < dv ? Sb[F * E + col] : A(0));
    }
  tile_mma<false, false>(
      acc, L, [&](int o, int64_t i) { return ps[i][o]; },
      [&](int64_t i, int o) {
        const int64_t col = c0 + o;
        return col < dv ? dnc[i * E + col] : A(0);
      },
      sm);
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int j = tile_row(a);
      const int64_t col = c0 + tile_col(b);
      if (j < L && col < dv)
        dV[(bh * N + i0 + j) * dv + col] = from_acc<T>(s_real[j] ? acc[a][b] : A(0));
    }
}

// ---- host side ----

int64_t chunks(int64_t N) {
  return (N + kT - 1) / kT;
}
int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

unsigned blocks(int64_t n) {
  if (n > std::numeric_limits<int32_t>::max())
    fail(
        "attention::favor: the CUDA launch grid would exceed 2^31 - 1 blocks; use fewer "
        "batch-heads or a shorter sequence");
  return static_cast<unsigned>(n);
}

// The workspace's parts, in the accumulation type.
template <typename A>
struct Work {
  A* Qf = nullptr;    // [BH, N, F] phi(q)
  A* Kf = nullptr;    // [BH, M, F] phi(k) (core) or g (prefix scan)
  A* mk = nullptr;    // [BH, M] key stabiliser (softmax map)
  A* diag = nullptr;  // [BH, M] diag(k) (softmax map)
  A* rmax = nullptr;  // [BH, M] max_f k' (softmax map)
  A* z0 = nullptr;    // [F] causal normaliser start, 1e-6 (core, causal)
  A* sumq = nullptr;  // [BH, N] sum_f phi(q) (prefix)
  A* stf = nullptr;   // [BH, chunks, F + 1, dv + 1] forward chunk states (prefix)
  A* stb = nullptr;   // [BH, chunks, F + 1, dv + 1] reverse chunk states (prefix, backward)
  A* dn = nullptr;    // [BH, N, dv + 1] [dnum, dden] (prefix, backward)
  A* dQf = nullptr;   // [BH, N, F] (backward)
  A* dKf = nullptr;   // [BH, M, F] (backward)
};

// Hands take(slot, elements) every part of the workspace, in order.
template <typename A, typename Take>
void lay_out(const FavorArgs& a, bool backward, Work<A>& w, Take&& take) {
  const int64_t BH = a.B * a.H, rq = BH * a.N, rk = BH * a.M;
  const bool soft = a.map == FavorMap::softmax, core_causal = a.causal && !a.prefix;
  const int64_t states = a.prefix ? BH * chunks(a.N) * (a.F + 1) * (a.dv + 1) : 0;
  take(w.Qf, rq * a.F);
  take(w.Kf, rk * a.F);
  take(w.mk, soft ? rk : 0);
  take(w.diag, soft ? rk : 0);
  take(w.rmax, soft ? rk : 0);
  take(w.z0, core_causal ? a.F : 0);
  take(w.sumq, a.prefix ? rq : 0);
  take(w.stf, states);
  take(w.stb, backward ? states : 0);
  take(w.dn, backward && a.prefix ? rq * (a.dv + 1) : 0);
  take(w.dQf, backward ? rq * a.F : 0);
  take(w.dKf, backward ? rk * a.F : 0);
}

template <typename A>
Work<A> carve(const FavorArgs& a, bool backward, void* workspace) {
  Work<A> w;
  A* p = static_cast<A*>(workspace);
  lay_out(a, backward, w, [&](A*& slot, int64_t n) {
    slot = n > 0 ? p : nullptr;
    p += n;
  });
  return w;
}

template <typename A>
DType acc_dtype() {
  return sizeof(A) == sizeof(double) ? DType::f64 : DType::f32;
}

// The constants of the maps in A, as the CPU op forms them in its T.
template <typename A>
struct MapConsts {
  A c, r, eps, alpha, beta;
  explicit MapConsts(const FavorArgs& a)
      : c(static_cast<A>(std::pow(static_cast<double>(a.d), -0.25))),
        r(static_cast<A>(1.0 / std::sqrt(static_cast<double>(a.F)))),
        eps(static_cast<A>(a.map == FavorMap::relu ? kFavorReluEps : kFavorSoftmaxEps)),
        alpha(a.map == FavorMap::softmax ? r : A(1)),
        beta(a.map == FavorMap::softmax ? r * eps : A(0)) {}
};

// phi(q) into w.Qf and the key map into w.Kf: phi(k) for the core, g for the
// prefix scan (with its stabiliser in w.mk).
template <typename T, typename A>
void features(const FavorArgs& a, const T* q, const T* k, const T* W, const uint8_t* mask,
              const Work<A>& w, int device) {
  const cudaStream_t s = stream(device);
  const int64_t BH = a.B * a.H, rq = BH * a.N, rk = BH * a.M;
  if (a.map == FavorMap::no_projection) {
    softmax_rows_kernel<T, A><<<grid_for(rq * kWarp, device), kThreads, 0, s>>>(q, w.Qf, rq, a.d);
    FORGE_CUDA_CHECK_LAUNCH("favor softmax_rows");
    if (a.causal) {
      exp_keys_kernel<T, A>
          <<<grid_for(rk * a.d, device), kThreads, 0, s>>>(k, mask, w.Kf, rk, a.M, a.H, a.d);
      FORGE_CUDA_CHECK_LAUNCH("favor exp_keys");
    } else {
      softmax_cols_kernel<T, A><<<blocks(BH * ceil_div(a.d, kWarp)), dim3(kWarp, kColRows), 0, s>>>(
          k, mask, w.Kf, a.M, a.H, a.d);
      FORGE_CUDA_CHECK_LAUNCH("favor softmax_cols");
    }
    return;
  }
  const MapConsts<A> mc(a);
  const bool relu = a.map == FavorMap::relu;
  project_kernel<T, A><<<blocks(ceil_div(rq, kT)), kTileThreads, 0, s>>>(
      q, W, nullptr, w.Qf, nullptr, nullptr, rq, a.N, a.H, a.d, a.F, mc.c, mc.r, mc.eps,
      relu ? ProjMode::relu : ProjMode::query_softmax);
  FORGE_CUDA_CHECK_LAUNCH("favor project (queries)");
  project_kernel<T, A><<<blocks(ceil_div(rk, kT)), kTileThreads, 0, s>>>(
      k, W, mask, w.Kf, w.rmax, w.diag, rk, a.M, a.H, a.d, a.F, mc.c, mc.r, mc.eps,
      relu ? ProjMode::relu : ProjMode::key_softmax);
  FORGE_CUDA_CHECK_LAUNCH("favor project (keys)");
  if (relu) return;
  key_stabiliser_kernel<A><<<blocks(BH), kThreads, 0, s>>>(w.rmax, mask, w.mk, a.M, a.H, a.prefix);
  FORGE_CUDA_CHECK_LAUNCH("favor key_stabiliser");
  // The prefix scan keeps g (alpha 1, beta 0); the core takes phi(k) = r g + r eps.
  key_exp_kernel<A><<<grid_for(rk * a.F, device), kThreads, 0, s>>>(
      w.Kf, w.diag, w.mk, mask, rk, a.M, a.H, a.F, a.prefix ? A(1) : mc.alpha,
      a.prefix ? A(0) : mc.beta);
  FORGE_CUDA_CHECK_LAUNCH("favor key_exp");
}

// dq and dk from w.dQf and w.dKf (the gradients of w.Qf and w.Kf).
template <typename T, typename A>
void features_backward(const FavorArgs& a, const T* q, const T* k, const T* W, const uint8_t* mask,
                       const Work<A>& w, T* dq, T* dk, int device) {
  const cudaStream_t s = stream(device);
  const int64_t BH = a.B * a.H, rq = BH * a.N, rk = BH * a.M;
  if (a.map == FavorMap::no_projection) {
    softmax_rows_backward_kernel<T, A>
        <<<grid_for(rq * kWarp, device), kThreads, 0, s>>>(w.Qf, w.dQf, dq, rq, a.d);
    FORGE_CUDA_CHECK_LAUNCH("favor softmax_rows backward");
    if (a.causal) {
      exp_keys_backward_kernel<T, A><<<grid_for(rk * a.d, device), kThreads, 0, s>>>(
          w.Kf, w.dKf, mask, dk, rk, a.M, a.H, a.d);
      FORGE_CUDA_CHECK_LAUNCH("favor exp_keys backward");
    } else {
      softmax_cols_backward_kernel<T, A>
          <<<blocks(BH * ceil_div(a.d, kWarp)), dim3(kWarp, kColRows), 0, s>>>(w.Kf, w.dKf, mask,
                                                                               dk, a.M, a.H, a.d);
      FORGE_CUDA_CHECK_LAUNCH("favor softmax_cols backward");
    }
    return;
  }
  const MapConsts<A> mc(a);
  const bool relu = a.map == FavorMap::relu;
  const int64_t dtiles = ceil_div(a.d, kT);
  // The exp part of the map: phi - r eps for phi(q) and the core's phi(k), g itself.
  const A q_off = relu ? A(0) : mc.beta, k_off = relu || a.prefix ? A(0) : mc.beta;
  project_backward_kernel<T, A><<<blocks(ceil_div(rq, kT) * dtiles), kTileThreads, 0, s>>>(
      q, W, nullptr, w.Qf, w.dQf, dq, rq, a.N, a.H, a.d, a.F, mc.c, q_off, relu, mc.eps);
  FORGE_CUDA_CHECK_LAUNCH("favor project backward (queries)");
  project_backward_kernel<T, A><<<blocks(ceil_div(rk, kT) * dtiles), kTileThreads, 0, s>>>(
      k, W, mask, w.Kf, w.dKf, dk, rk, a.M, a.H, a.d, a.F, mc.c, k_off, relu, mc.eps);
  FORGE_CUDA_CHECK_LAUNCH("favor project backward (keys)");
}

// The chunk states of the prefix scan into st, then their exclusive scan
// (chunk_state_kernel and chunk_scan_kernel).
template <typename YT, typename A>
void chunk_states(const FavorArgs& a, const A* X, const YT* Y, bool append_one, const A* mk,
                  const uint8_t* mask, const A* sumq, A* st, bool reverse, int device) {
  const cudaStream_t s = stream(device);
  const MapConsts<A> mc(a);
  const int64_t BH = a.B * a.H, nC = chunks(a.N);
  const int64_t tiles = ceil_div(a.F + 1, kT) * ceil_div(a.dv + 1, kT);
  chunk_state_kernel<YT, A><<<blocks(BH * nC * tiles), kTileThreads, 0, s>>>(
      X, Y, append_one, mk, mask, sumq, st, a.H, a.N, nC, a.F, a.dv, reverse, mc.alpha, mc.beta);
  FORGE_CUDA_CHECK_LAUNCH("favor chunk_state");
  chunk_scan_kernel<A><<<grid_for(BH * (a.F + 1) * (a.dv + 1), device), kThreads, 0, s>>>(
      st, mk, BH, a.N, nC, a.F, a.dv, reverse);
  FORGE_CUDA_CHECK_LAUNCH("favor chunk_scan");
}

LinearCoreArgs core_args(const FavorArgs& a, const void* z0) {
  LinearCoreArgs c;
  c.BH = a.B * a.H;
  c.N = a.N;
  c.M = a.M;
  c.F = a.F;
  c.dv = a.dv;
  c.dtype = a.dtype;
  c.causal = a.causal;
  c.normalise = true;
  c.eps = 0;
  if (a.causal) {
    c.z0 = z0;  // 1e-6 on every feature: + 1e-6 sum phi(q_i) in den_i
  } else {
    c.den_min = kEmptyRowDen;
  }
  return c;
}

template <typename T>
void forward_impl(const FavorArgs& a, const T* q, const T* k, const T* v, const T* W,
                  const uint8_t* mask, T* o, void* den, void* workspace, int device) {
  using A = acc_t<T>;
  const Work<A> w = carve<A>(a, false, workspace);
  features<T, A>(a, q, k, W, mask, w, device);
  if (!a.prefix) {
    if (a.causal) fill(acc_dtype<A>(), device, w.z0, a.F, kFavorCausalEps);
    linear_core_forward(core_args(a, w.z0), w.Qf, w.Kf, v, o, device);
    return;
  }
  const cudaStream_t s = stream(device);
  const MapConsts<A> mc(a);
  const int64_t BH = a.B * a.H, rows = BH * a.N, nC = chunks(a.N);
  row_sums_kernel<A><<<grid_for(rows * kWarp, device), kThreads, 0, s>>>(w.Qf, w.sumq, rows, a.F);
  FORGE_CUDA_CHECK_LAUNCH("favor row_sums");
  chunk_states<T, A>(a, w.Kf, v, true, w.mk, mask, nullptr, w.stf, false, device);
  prefix_forward_kernel<T, A><<<blocks(BH * nC * ceil_div(a.dv, kT)), kTileThreads, 0, s>>>(
      w.Qf, w.Kf, w.mk, w.sumq, w.stf, v, mask, o, static_cast<A*>(den), a.H, a.N, nC, a.F, a.dv,
      mc.alpha, mc.beta, static_cast<A>(kFavorCausalEps));
  FORGE_CUDA_CHECK_LAUNCH("favor prefix_forward");
}

template <typename T>
void backward_impl(const FavorArgs& a, const T* q, const T* k, const T* v, const T* W,
                   const uint8_t* mask, const T* o, const void* den, const T* dO, T* dq, T* dk,
                   T* dv, void* workspace, int device) {
  using A = acc_t<T>;
  const Work<A> w = carve<A>(a, true, workspace);
  features<T, A>(a, q, k, W, mask, w, device);
  if (!a.prefix) {
    if (a.causal) fill(acc_dtype<A>(), device, w.z0, a.F, kFavorCausalEps);
    linear_core_backward(core_args(a, w.z0), w.Qf, w.Kf, v, dO, w.dQf, w.dKf, dv, device);
  } else {
    const cudaStream_t s = stream(device);
    const MapConsts<A> mc(a);
    const int64_t BH = a.B * a.H, rows = BH * a.N, nC = chunks(a.N);
    const A ceps = static_cast<A>(kFavorCausalEps);
    row_sums_kernel<A><<<grid_for(rows * kWarp, device), kThreads, 0, s>>>(w.Qf, w.sumq, rows, a.F);
    FORGE_CUDA_CHECK_LAUNCH("favor row_sums");
    prefix_grad_rows_kernel<T, A><<<grid_for(rows * kWarp, device), kThreads, 0, s>>>(
        dO, o, static_cast<const A*>(den), w.dn, rows, a.dv);
    FORGE_CUDA_CHECK_LAUNCH("favor prefix_grad_rows");
    chunk_states<T, A>(a, w.Kf, v, true, w.mk, mask, nullptr, w.stf, false, device);
    chunk_states<A, A>(a, w.Qf, w.dn, false, w.mk, mask, w.sumq, w.stb, true, device);
    prefix_grad_qk_kernel<T, A><<<blocks(BH * nC * ceil_div(a.F, kT)), kTileThreads, 0, s>>>(
        w.Qf, w.Kf, w.mk, v, mask, w.dn, w.stf, w.stb, w.dQf, w.dKf, a.H, a.N, nC, a.F, a.dv,
        mc.alpha, mc.beta, ceps);
    FORGE_CUDA_CHECK_LAUNCH("favor prefix_grad_qk");
    prefix_grad_v_kernel<T, A><<<blocks(BH * nC * ceil_div(a.dv, kT)), kTileThreads, 0, s>>>(
        w.Qf, w.Kf, w.mk, w.sumq, mask, w.dn, w.stb, dv, a.H, a.N, nC, a.F, a.dv, mc.alpha,
        mc.beta);
    FORGE_CUDA_CHECK_LAUNCH("favor prefix_grad_v");
  }
  features_backward<T, A>(a, q, k, W, mask, w, dq, dk, device);
}

}  // namespace

int64_t favor_workspace_elems(const FavorArgs& a, bool backward) {
  int64_t total = 0;
  Work<float> w;
  lay_out(a, backward, w, [&](float*&, int64_t n) { total += n; });
  return total;
}

void favor_forward(const FavorArgs& a, const void* q, const void* k, const void* v, const void* W,
                   const uint8_t* mask, void* o, void* den, void* workspace, int device) {
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(a.dtype, "attention::favor", [&] {
    forward_impl<scalar_t>(a, static_cast<const scalar_t*>(q), static_cast<const scalar_t*>(k),
                           static_cast<const scalar_t*>(v), static_cast<const scalar_t*>(W), mask,
                           static_cast<scalar_t*>(o), den, workspace, device);
  });
}

void favor_backward(const FavorArgs& a, const void* q, const void* k, const void* v, const void* W,
                    const uint8_t* mask, const void* o, const void* den, const void* dO, void* dq,
                    void* dk, void* dv, void* workspace, int device) {
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(a.dtype, "attention::favor backward", [&] {
    backward_impl<scalar_t>(a, static_cast<const scalar_t*>(q), static_cast<const scalar_t*>(k),
                            static_cast<const scalar_t*>(v), static_cast<const scalar_t*>(W), mask,
                            static_cast<const scalar_t*>(o), den, static_cast<const scalar_t*>(dO),
                            static_cast<scalar_t*>(dq), static_cast<scalar_t*>(dk),
                            static_cast<scalar_t*>(dv), workspace, device);
  });
}

}  // namespace forge::cuda
