// The linear-attention core on the GPU (see linear_core_cuda.h): attention on
// feature maps as tiled, GEMM-shaped kernels.
//
// Every product goes through the tile engine's block-level FMA routine
// (tile_engine.cuh, tiles::fma_tile_product): a block of 256 threads
// (16 x 16) accumulates a 64 x 64 output tile, each thread 4 x 4 entries
// (rows ty + 16 r, columns tx + 16 c), with both operands staged through
// shared memory in k-steps of 16 (f32) or 8 (f64). Features
// and states are in the accumulation type A; V, O, dO and dV are loaded and
// stored in the tensor dtype T.
//
// The kernels:
//   state_kernel  per (batch-head, chunk of rows j): the state
//                 [sum_j x_j (w_j y_j)^T  [F, dv],  sum_j u_j x_j  [F]]:
//                 (Kf, V) for the key states (S, z); (Qf, dO) with w = 1/den,
//                 u = gd for the gradient states (R, r).
//   scan_kernel   over the chunk states of each batch-head, in a fixed order:
//                 their total (non-causal) or, in place, the exclusive prefix
//                 (causal forward) or suffix (causal backward) sums.
//   query_kernel  per tile of <= 64 query rows inside one chunk, with (S, z)
//                 the state of the keys before the chunk (non-causal: all):
//                 num = Qf S + P V, den = Qf . z + rowsum(P) + eps, where
//                 P = visible(Qf Kf^T) inside the chunk (causal; 0 otherwise);
//                 o = num / den. Its backward form gives gn = dO / den,
//                 gd = -(dO . num) / den^2 (0 where the floor holds),
//                 dQf = gn S^T + gd z^T + G Kf with G = visible(gn V^T + gd 1^T),
//                 and saves 1/den and gd of every row.
//   key_kernel    per tile of key rows, with (R, r) the gradient state of the
//                 queries after the chunk (non-causal: all):
//                 dV = Kf R + P^T gn,  dKf = V R^T + r + G^T Qf.
// Non-causal, the states are reduced over fixed chunks of kPartial rows whose
// partial states are then summed in order (deterministic, no atomics).
// Causal, one state per chunk of C positions (64, or whole buckets of s > 1),
// so the scratch is (N / C) (F dv + F) values per batch-head: linear in N and
// never a state per position.
#include "core/allocator.h"
#include "core/cuda_kernels.cuh"
#include "ops/attention/linear_core_cuda.h"
#include "ops/attention/tile_engine.cuh"

namespace forge::cuda {

namespace {

constexpr int kTile = 64;              // rows and columns of a block's output tile
constexpr int kSide = 16;              // the block is kSide x kSide threads
constexpr int kPer = kTile / kSide;    // entries per thread along each side
constexpr int kBlock = kSide * kSide;  // 256 threads
constexpr int kWarps = kBlock / kWarp;
constexpr int64_t kPartial = 256;  // rows per partial state of the non-causal reductions

// Every product is the tile engine's FMA tile product (tile_engine.cuh).
template <typename A>
using TileSmem = tiles::FmaSmem<A>;
static_assert(kTile == tiles::kFmaTile && kSide == tiles::kFmaSide && kBlock == tiles::kFmaThreads,
              "the kernels' tiles are the engine's");

// The sum over the 16 threads of a block row (tx = 0..15: half a warp); every
// thread of the warp must call it.
template <typename A>
__device__ __forceinline__ A side_sum(A v) {
  for (int o = kSide / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Whether the query at position i sees the key at position j of its own chunk
// (causal): j <= i for buckets of 1, else j in an earlier bucket.
__device__ __forceinline__ bool visible(int64_t i, int64_t j, int64_t bucket) {
  return bucket == 1 ? j <= i : j / bucket < i / bucket;
}

// Values of one state: S [F, dv] row-major, then z [F].
__host__ __device__ __forceinline__ int64_t state_size(int64_t F, int64_t dv) {
  return F * dv + F;
}

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Output tiles of 64 along a dimension of n (at least one, so that a state's
// z is written when dv = 0).
__host__ __device__ __forceinline__ int64_t tiles_of(int64_t n) {
  return n > kTile ? ceil_div(n, kTile) : 1;
}

template <typename T, typename A>
struct Core {
  const A* qf;    // [BH, N, F]
  const A* kf;    // [BH, M, F]
  const T* v;     // [BH, M, dv]
  const T* dout;  // [BH, N, dv]; backward only
  int64_t N, M, F, dv, bucket;
  bool normalise;
  bool intra;  // causal chunks of <= 64 positions that see part of themselves
  A eps, den_min;
};

// The rows one block of a row kernel handles.
struct RowBlock {
  int64_t bh, chunk, r0;  // r0: the first row, within the batch-head
  int rows;               // 0..64
};

// How the rows of each batch-head (len of them) split into blocks: chunks of
// `chunk` rows (one state each), each cut into `tiles` tiles of <= 64 rows.
struct Tiling {
  int64_t len, chunk, chunks, tiles;

  int64_t blocks(int64_t BH) const { return BH * chunks * tiles; }

  __device__ RowBlock at(int64_t b) const {
    const int64_t per_bh = chunks * tiles;
    RowBlock rb;
    rb.bh = b / per_bh;
    rb.chunk = b % per_bh / tiles;
    rb.r0 = rb.chunk * chunk + b % tiles * kTile;
    const int64_t end = min(min((rb.chunk + 1) * chunk, len), rb.r0 + kTile);
    rb.rows = static_cast<int>(max(end - rb.r0, int64_t{0}));
    return rb;
  }
};

// Per block (blockIdx.x = bh * chunks + c, blockIdx.y = a 64 x 64 tile of
// F x dv): the state of rows j in [c chunk, (c + 1) chunk) of x [BH, len, F]
// and y [BH, len, dv],
//   S[f, e] = sum_j x[j, f] w[j] y[j, e],   z[f] = sum_j u[j] x[j, f]
// (w, u [BH, len]; null: 1), into out [BH, chunks, state_size] (z by the
// blocks of the first dv tile).
template <typename T, typename A>
__global__ void __launch_bounds__(kBlock)
    state_kernel(const A* x, const T* y, const A* w, const A* u, int64_t len, int64_t chunk,
                 int64_t chunks, int64_t F, int64_t dv, A* out) {
  __shared__ TileSmem<A> sm;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const int64_t bh = blockIdx.x / chunks, c = blockIdx.x % chunks;
  const int64_t e_tiles = tiles_of(dv);
  const int64_t f0 = blockIdx.y / e_tiles * kTile, e0 = blockIdx.y % e_tiles * kTile;
  const int64_t base = bh * len + c * chunk;  // the chunk's first row
  const int64_t rows = min(chunk, len - c * chunk);
  const A* xs = x + base * F;
  const T* ys = y + base * dv;
  A acc[kPer][kPer] = {};
  tiles::fma_tile_product<false, false>(
      acc, rows, sm, [&](int m, int64_t j) { return f0 + m < F ? xs[j * F + f0 + m] : A(0); },
      [&](int64_t j, int n) {
        return e0 + n < dv ? (w ? w[base + j] : A(1)) * to_acc<A>(ys[j * dv + e0 + n]) : A(0);
      });
  A* st = out + static_cast<int64_t>(blockIdx.x) * state_size(F, dv);
#pragma unroll
  for (int r = 0; r < kPer; ++r)
#pragma unroll
    for (int cc = 0; cc < kPer; ++cc) {
      const int64_t f = f0 + ty + kSide * r, e = e0 + tx + kSide * cc;
      if (f < F && e < dv) st[f * dv + e] = acc[r][cc];
    }
  if (e0 == 0 && threadIdx.x < kTile && f0 + threadIdx.x < F) {
    const int64_t f = f0 + threadIdx.x;
    A s = 0;
    for (int64_t j = 0; j < rows; ++j) s += (u ? u[base + j] : A(1)) * xs[j * F + f];
    st[F * dv + f] = s;
  }
}

enum class Scan { total, prefix, suffix };

// Per entry e of the states [BH, chunks, E] of a batch-head, in chunk order
// (suffix: from the last chunk), starting from init[e - z_at] for entries
// e >= z_at when init is given (else 0): `total` writes the sum to
// total [BH, E]; `prefix` / `suffix` overwrite each chunk's entry with the sum
// of the chunks before / after it (plus init).
template <typename A>
__global__ void scan_kernel(A* states, int64_t BH, int64_t chunks, int64_t E, int64_t z_at,
                            const A* init, Scan mode, A* total) {
  constexpr int kBatch = 8;  // chunks loaded ahead of the running sum
  FORGE_GRID_STRIDE(idx, BH * E) {
    const int64_t bh = idx / E, e = idx % E;
    A run = init != nullptr && e >= z_at ? init[e - z_at] : A(0);
    A* col = states + bh * chunks * E + e;  // entry e of chunk c: col[c * E]
    for (int64_t c0 = 0; c0 < chunks; c0 += kBatch) {
      A t[kBatch] = {};
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t c = mode == Scan::suffix ? chunks - 1 - (c0 + b) : c0 + b;
        if (c0 + b < chunks) t[b] = col[c * E];
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t c = mode == Scan::suffix ? chunks - 1 - (c0 + b) : c0 + b;
        if (c0 + b < chunks) {
          if (mode != Scan::total) col[c * E] = run;
          run += t[b];
        }
      }
    }
    if (mode == Scan::total) total[bh * E + e] = run;
  }
}

// num [rows, 64] = Qf S (+ P V) for the output columns [e0, e0 + 64) of a
// query block (see query_kernel).
template <typename T, typename A>
__device__ void numerator_tile(A (&acc)[kPer][kPer], const Core<T, A>& p, const A* qf, const A* S,
                               const T* v, const A (*sp)[kTile + 1], int rows, int64_t e0,
                               TileSmem<A>& sm) {
  const int64_t F = p.F, dv = p.dv;
  tiles::fma_tile_product<true, false>(
      acc, F, sm, [&](int m, int64_t f) { return m < rows ? qf[m * F + f] : A(0); },
      [&](int64_t f, int n) { return e0 + n < dv ? S[f * dv + e0 + n] : A(0); });
  if (p.intra)
    tiles::fma_tile_product<true, false>(
        acc, rows, sm, [&](int m, int64_t j) { return sp[m][j]; },
        [&](int64_t j, int n) { return e0 + n < dv ? to_acc<A>(v[j * dv + e0 + n]) : A(0); });
}

// One block per tile of query rows (see the file comment). states: per
// (bh, chunk) the state of the keys the chunk's queries see before it.
// Forward: o. Backward: dqf, row_inv = 1/den and row_gd = gd [BH, N].
template <typename T, typename A, bool kBackward>
__global__ void __launch_bounds__(kBlock)
    query_kernel(Core<T, A> p, Tiling tl, const A* states, T* o, A* dqf, A* row_inv, A* row_gd) {
  __shared__ TileSmem<A> sm;
  __shared__ A sp[kTile][kTile + 1];  // P [i][j] of the chunk; in the backward later G
  __shared__ A s_inv[kTile];          // 1 / den per row
  __shared__ A s_gd[kTile];           // gd per row
  __shared__ A s_dot[kTile];          // dO . num per row
  __shared__ bool s_live[kTile];      // den carries gradient (normalised, not floored)
  const RowBlock rb = tl.at(blockIdx.x);
  if (rb.rows == 0) return;
  const int rows = rb.rows, tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t F = p.F, dv = p.dv;
  const A* S = states + (rb.bh * tl.chunks + rb.chunk) * state_size(F, dv);
  const A* z = S + F * dv;
  const int64_t row0 = rb.bh * p.N + rb.r0;
  const A* qf = p.qf + row0 * F;
  // Causal inside the chunk: the keys at the same positions (N == M).
  const int64_t key0 = p.intra ? rb.bh * p.M + rb.r0 : 0;
  const A* kf = p.kf + key0 * F;
  const T* v = p.v + key0 * p.dv;

  // P = visible(Qf Kf^T) over the chunk.
  if (p.intra) {
    A acc[kPer][kPer] = {};
    tiles::fma_tile_product<true, true>(
        acc, F, sm, [&](int m, int64_t f) { return m < rows ? qf[m * F + f] : A(0); },
        [&](int64_t f, int n) { return n < rows ? kf[n * F + f] : A(0); });
#pragma unroll
    for (int r = 0; r < kPer; ++r)
#pragma unroll
      for (int c = 0; c < kPer; ++c) {
        const int i = ty + kSide * r, j = tx + kSide * c;
        const bool on = i < rows && j < rows && visible(rb.r0 + i, rb.r0 + j, p.bucket);
        sp[i][j] = on ? acc[r][c] : A(0);
      }
    __syncthreads();
  }

  // den = max(Qf . z + rowsum(P) + eps, den_min), one warp per row.
  for (int i = warp; i < kTile; i += kWarps) {
    A den = 1;
    bool live = false;
    if (i < rows && p.normalise) {
      A x = 0;
      for (int64_t f = lane; f < F; f += kWarp) x += qf[i * F + f] * z[f];
      if (p.intra)
        for (int j = lane; j < kTile; j += kWarp) x += sp[i][j];
      x = warp_sum(x) + p.eps;
      live = !(x <= p.den_min);
      den = live ? x : p.den_min;
    }
    if (lane == 0) {
      s_inv[i] = A(1) / den;
      s_live[i] = live;
      s_dot[i] = 0;
    }
  }
  __syncthreads();

  const T* dout = kBackward ? p.dout + row0 * dv : nullptr;
  for (int64_t e0 = 0; e0 < dv; e0 += kTile) {
    A acc[kPer][kPer] = {};
    numerator_tile(acc, p, qf, S, v, sp, rows, e0, sm);
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      const int i = ty + kSide * r;
      if constexpr (!kBackward) {
        if (i < rows)
#pragma unroll
          for (int c = 0; c < kPer; ++c) {
            const int64_t e = e0 + tx + kSide * c;
            if (e < dv) o[(row0 + i) * dv + e] = from_acc<T>(acc[r][c] * s_inv[i]);
          }
      } else {
        A part = 0;
        if (i < rows)
#pragma unroll
          for (int c = 0; c < kPer; ++c) {
            const int64_t e = e0 + tx + kSide * c;
            if (e < dv) part += to_acc<A>(dout[i * dv + e]) * acc[r][c];
          }
        part = side_sum(part);
        if (tx == 0 && i < rows) s_dot[i] += part;
      }
    }
  }
  if constexpr (kBackward) {
    __syncthreads();
    // gd = -(dO . o) / den = -(dO . num) / den^2 where den carries gradient.
    if (threadIdx.x < rows) {
      const int i = threadIdx.x;
      const A inv = s_inv[i];
      const A gd = s_live[i] ? -s_dot[i] * inv * inv : A(0);
      s_gd[i] = gd;
      row_inv[row0 + i] = inv;
      row_gd[row0 + i] = gd;
    }
    __syncthreads();
    const auto gn = [&](int m, int64_t e) {
      return m < rows ? to_acc<A>(dout[m * dv + e]) * s_inv[m] : A(0);
    };
    // G = visible(gn V^T + gd 1^T) over the chunk, in place of P.
    if (p.intra) {
      A acc[kPer][kPer] = {};
      tiles::fma_tile_product<true, true>(acc, dv, sm, gn, [&](int64_t e, int n) {
        return n < rows ? to_acc<A>(v[n * dv + e]) : A(0);
      });
#pragma unroll
      for (int r = 0; r < kPer; ++r)
#pragma unroll
        for (int c = 0; c < kPer; ++c) {
          const int i = ty + kSide * r, j = tx + kSide * c;
          const bool on = i < rows && j < rows && visible(rb.r0 + i, rb.r0 + j, p.bucket);
          sp[i][j] = on ? acc[r][c] + s_gd[i] : A(0);
        }
      __syncthreads();
    }
    // dQf = gn S^T + G Kf + gd z^T.
    for (int64_t f0 = 0; f0 < F; f0 += kTile) {
      A acc[kPer][kPer] = {};
      tiles::fma_tile_product<true, true>(acc, dv, sm, gn, [&](int64_t e, int n) {
        return f0 + n < F ? S[(f0 + n) * dv + e] : A(0);
      });
      if (p.intra)
        tiles::fma_tile_product<true, false>(
            acc, rows, sm, [&](int m, int64_t j) { return sp[m][j]; },
            [&](int64_t j, int n) { return f0 + n < F ? kf[j * F + f0 + n] : A(0); });
#pragma unroll
      for (int r = 0; r < kPer; ++r)
#pragma unroll
        for (int c = 0; c < kPer; ++c) {
          const int i = ty + kSide * r;
          const int64_t f = f0 + tx + kSide * c;
          if (i < rows && f < F) dqf[(row0 + i) * F + f] = acc[r][c] + s_gd[i] * z[f];
        }
    }
  }
}

// One block per tile of key rows (see the file comment). grads: per
// (bh, chunk) the gradient state (R, r) of the queries after the chunk
// (non-causal: of every query); row_inv, row_gd from query_kernel.
template <typename T, typename A>
__global__ void __launch_bounds__(kBlock)
    key_kernel(Core<T, A> p, Tiling tl, const A* grads, const A* row_inv, const A* row_gd, A* dkf,
               T* dv_out) {
  __shared__ TileSmem<A> sm;
  __shared__ A sp[kTile][kTile + 1];  // P [i][j] of the chunk, later G
  __shared__ A s_inv[kTile];          // 1 / den of the chunk's queries
  __shared__ A s_gd[kTile];           // gd of the chunk's queries
  const RowBlock rb = tl.at(blockIdx.x);
  if (rb.rows == 0) return;
  const int rows = rb.rows, tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const int64_t F = p.F, dv = p.dv;
  const A* R = grads + (rb.bh * tl.chunks + rb.chunk) * state_size(F, dv);
  const A* r_vec = R + F * dv;
  const int64_t key0 = rb.bh * p.M + rb.r0;
  const A* kf = p.kf + key0 * F;
  const T* v = p.v + key0 * dv;
  // Causal inside the chunk: the queries at the same positions (N == M).
  const A* qf = p.qf + (p.intra ? key0 * F : 0);
  const T* dout = p.dout + (p.intra ? key0 * dv : 0);
  const auto gn = [&](int64_t i, int64_t e) { return to_acc<A>(dout[i * dv + e]) * s_inv[i]; };

  // P = visible(Qf Kf^T) over the chunk, and the chunk's query rows.
  if (p.intra) {
    if (threadIdx.x < rows) {
      s_inv[threadIdx.x] = row_inv[key0 + threadIdx.x];
      s_gd[threadIdx.x] = row_gd[key0 + threadIdx.x];
    }
    A acc[kPer][kPer] = {};
    tiles::fma_tile_product<true, true>(
        acc, F, sm, [&](int m, int64_t f) { return m < rows ? qf[m * F + f] : A(0); },
        [&](int64_t f, int n) { return n < rows ? kf[n * F + f] : A(0); });
#pragma unroll
    for (int r = 0; r < kPer; ++r)
#pragma unroll
      for (int c = 0; c < kPer; ++c) {
        const int i = ty + kSide * r, j = tx + kSide * c;
        const bool on = i < rows && j < rows && visible(rb.r0 + i, rb.r0 + j, p.bucket);
        sp[i][j] = on ? acc[r][c] : A(0);
      }
    __syncthreads();
  }

  // dV = Kf R + P^T gn.
  for (int64_t e0 = 0; e0 < dv; e0 += kTile) {
    A acc[kPer][kPer] = {};
    tiles::fma_tile_product<true, false>(
        acc, F, sm, [&](int m, int64_t f) { return m < rows ? kf[m * F + f] : A(0); },
        [&](int64_t f, int n) { return e0 + n < dv ? R[f * dv + e0 + n] : A(0); });
    if (p.intra)
      tiles::fma_tile_product<false, false>(
          acc, rows, sm, [&](int m, int64_t i) { return sp[i][m]; },
          [&](int64_t i, int n) { return e0 + n < dv ? gn(i, e0 + n) : A(0); });
#pragma unroll
    for (int r = 0; r < kPer; ++r)
#pragma unroll
      for (int c = 0; c < kPer; ++c) {
        const int j = ty + kSide * r;
        const int64_t e = e0 + tx + kSide * c;
        if (j < rows && e < dv) dv_out[(key0 + j) * dv + e] = from_acc<T>(acc[r][c]);
      }
  }

  // G = visible(gn V^T + gd 1^T) over the chunk, in place of P.
  if (p.intra) {
    A acc[kPer][kPer] = {};
    tiles::fma_tile_product<true, true>(
        acc, dv, sm, [&](int m, int64_t e) { return m < rows ? gn(m, e) : A(0); },
        [&](int64_t e, int n) { return n < rows ? to_acc<A>(v[n * dv + e]) : A(0); });
    __syncthreads();  // every read of P is done (also when dv = 0)
#pragma unroll
    for (int r = 0; r < kPer; ++r)
#pragma unroll
      for (int c = 0; c < kPer; ++c) {
        const int i = ty + kSide * r, j = tx + kSide * c;
        const bool on = i < rows && j < rows && visible(rb.r0 + i, rb.r0 + j, p.bucket);
        sp[i][j] = on ? acc[r][c] + s_gd[i] : A(0);
      }
    __syncthreads();
  }

  // dKf = V R^T + G^T Qf + r.
  for (int64_t f0 = 0; f0 < F; f0 += kTile) {
    A acc[kPer][kPer] = {};
    tiles::fma_tile_product<true, true>(
        acc, dv, sm, [&](int m, int64_t e) { return m < rows ? to_acc<A>(v[m * dv + e]) : A(0); },
        [&](int64_t e, int n) { return f0 + n < F ? R[(f0 + n) * dv + e] : A(0); });
    if (p.intra)
      tiles::fma_tile_product<false, false>(
          acc, rows, sm, [&](int m, int64_t i) { return sp[i][m]; },
          [&](int64_t i, int n) { return f0 + n < F ? qf[i * F + f0 + n] : A(0); });
#pragma unroll
    for (int r = 0; r < kPer; ++r)
#pragma unroll
      for (int c = 0; c < kPer; ++c) {
        const int j = ty + kSide * r;
        const int64_t f = f0 + tx + kSide * c;
        if (j < rows && f < F) dkf[(key0 + j) * F + f] = acc[r][c] + r_vec[f];
      }
  }
}

// ---- launchers ----

// Positions per causal chunk: 64, or whole buckets of s > 1 (as many as fit
// in 64; one bucket when s >= 64), so a chunk boundary is a bucket boundary.
int64_t causal_chunk(int64_t bucket) {
  if (bucket == 1) return kTile;
  if (bucket >= kTile) return bucket;
  return kTile / bucket * bucket;
}

// The interface's preconditions on the causal form (the ops check their own
// arguments with messages of their own; this guards the core's index math).
void check_args(const LinearCoreArgs& a) {
  if (!a.causal) return;
  if (a.N != a.M) fail("linear attention core: causal needs N == M");
  if (a.bucket < 1 || a.N % a.bucket != 0)
    fail("linear attention core: causal needs a bucket >= 1 that divides N");
}

unsigned grid_x(int64_t blocks) {
  if (blocks > 0x7fffffff) fail("linear attention core: too many rows for one launch");
  return static_cast<unsigned>(blocks);
}

template <typename T>
Core<T, acc_t<T>> make_core(const LinearCoreArgs& a, const void* qf, const void* kf, const void* v,
                            const void* dout) {
  using A = acc_t<T>;
  Core<T, A> p;
  p.qf = static_cast<const A*>(qf);
  p.kf = static_cast<const A*>(kf);
  p.v = static_cast<const T*>(v);
  p.dout = static_cast<const T*>(dout);
  p.N = a.N;
  p.M = a.M;
  p.F = a.F;
  p.dv = a.dv;
  p.bucket = a.causal ? a.bucket : 1;
  p.normalise = a.normalise;
  const int64_t C = causal_chunk(p.bucket);
  p.intra = a.causal && C <= kTile && (p.bucket == 1 || C > p.bucket);
  p.eps = static_cast<A>(a.eps);
  p.den_min = static_cast<A>(a.den_min);
  return p;
}

// The query (and causal key) tiling: causal, chunks of causal_chunk positions;
// non-causal, one chunk of every row (one state).
Tiling row_tiling(const LinearCoreArgs& a, int64_t len) {
  if (!a.causal) return {len, std::max<int64_t>(len, 1), 1, ceil_div(len, kTile)};
  const int64_t C = causal_chunk(a.bucket);
  return {len, C, ceil_div(len, C), ceil_div(C, kTile)};
}

// The states of `chunks` chunks of `chunk` rows of x, y (see state_kernel).
template <typename T, typename A>
void launch_states(const A* x, const T* y, const A* w, const A* u, int64_t BH, int64_t len,
                   int64_t chunk, int64_t chunks, int64_t F, int64_t dv, A* out, int device) {
  if (BH * chunks == 0) return;
  const dim3 grid(grid_x(BH * chunks), static_cast<unsigned>(tiles_of(F) * tiles_of(dv)));
  state_kernel<T, A>
      <<<grid, kBlock, 0, stream(device)>>>(x, y, w, u, len, chunk, chunks, F, dv, out);
  FORGE_CUDA_CHECK_LAUNCH("linear_core state_kernel");
}

template <typename A>
void launch_scan(A* states, int64_t BH, int64_t chunks, int64_t F, int64_t dv, const A* init,
                 Scan mode, A* total, int device) {
  const int64_t E = state_size(F, dv);
  if (BH * E == 0) return;
  scan_kernel<A><<<grid_for(BH * E, device), kThreads, 0, stream(device)>>>(
      states, BH, chunks, E, F * dv, init, mode, total);
  FORGE_CUDA_CHECK_LAUNCH("linear_core scan_kernel");
}

template <typename T>
void forward_impl(const LinearCoreArgs& a, const void* qf, const void* kf, const void* v, void* o,
                  int device) {
  using A = acc_t<T>;
  const Core<T, A> p = make_core<T>(a, qf, kf, v, nullptr);
  const auto* z0 = static_cast<const A*>(a.z0);
  const int64_t E = state_size(a.F, a.dv);
  const Tiling rows = row_tiling(a, a.N);
  // The key state(s) each query chunk starts from: [BH, rows.chunks, E].
  Scratch states(device, static_cast<size_t>(a.BH * rows.chunks * E) * sizeof(A));
  if (a.causal) {
    launch_states<T, A>(p.kf, p.v, nullptr, nullptr, a.BH, a.M, rows.chunk, rows.chunks, a.F, a.dv,
                        states.as<A>(), device);
    launch_scan<A>(states.as<A>(), a.BH, rows.chunks, a.F, a.dv, z0, Scan::prefix, nullptr, device);
  } else {
    const int64_t parts = ceil_div(a.M, kPartial);
    Scratch partial(device, static_cast<size_t>(a.BH * parts * E) * sizeof(A));
    launch_states<T, A>(p.kf, p.v, nullptr, nullptr, a.BH, a.M, kPartial, parts, a.F, a.dv,
                        partial.as<A>(), device);
    launch_scan<A>(partial.as<A>(), a.BH, parts, a.F, a.dv, z0, Scan::total, states.as<A>(),
                   device);
  }
  if (rows.blocks(a.BH) == 0) return;
  query_kernel<T, A, false><<<grid_x(rows.blocks(a.BH)), kBlock, 0, stream(device)>>>(
      p, rows, states.as<A>(), static_cast<T*>(o), nullptr, nullptr, nullptr);
  FORGE_CUDA_CHECK_LAUNCH("linear_core query_kernel");
}

template <typename T>
void backward_impl(const LinearCoreArgs& a, const void* qf, const void* kf, const void* v,
                   const void* dout, void* dqf, void* dkf, void* dv, int device) {
  using A = acc_t<T>;
  const Core<T, A> p = make_core<T>(a, qf, kf, v, dout);
  const auto* z0 = static_cast<const A*>(a.z0);
  const int64_t E = state_size(a.F, a.dv);
  const Tiling q_rows = row_tiling(a, a.N), k_rows = row_tiling(a, a.M);
  // Per query row: 1 / den, then gd: [2, BH, N].
  Scratch row_stats(device, static_cast<size_t>(2 * a.BH * a.N) * sizeof(A));
  A* row_inv = row_stats.as<A>();
  A* row_gd = row_inv + a.BH * a.N;
  // Causal: the state of each chunk (the key prefix, later the gradient
  // suffix), [BH, chunks, E]. Non-causal: the total key state, later the total
  // gradient state, [BH, 1, E], summed from partial states [BH, parts, E].
  Scratch states(device, static_cast<size_t>(a.BH * q_rows.chunks * E) * sizeof(A));
  const int64_t parts = a.causal ? 0 : std::max(ceil_div(a.M, kPartial), ceil_div(a.N, kPartial));
  Scratch partial(device, static_cast<size_t>(a.BH * parts * E) * sizeof(A));

  // The key states and the query side: dQf, 1/den and gd.
  if (a.causal) {
    launch_states<T, A>(p.kf, p.v, nullptr, nullptr, a.BH, a.M, q_rows.chunk, q_rows.chunks, a.F,
                        a.dv, states.as<A>(), device);
    launch_scan<A>(states.as<A>(), a.BH, q_rows.chunks, a.F, a.dv, z0, Scan::prefix, nullptr,
                   device);
  } else {
    const int64_t k_parts = ceil_div(a.M, kPartial);
    launch_states<T, A>(p.kf, p.v, nullptr, nullptr, a.BH, a.M, kPartial, k_parts, a.F, a.dv,
                        partial.as<A>(), device);
    launch_scan<A>(partial.as<A>(), a.BH, k_parts, a.F, a.dv, z0, Scan::total, states.as<A>(),
                   device);
  }
  if (q_rows.blocks(a.BH) > 0) {
    query_kernel<T, A, true><<<grid_x(q_rows.blocks(a.BH)), kBlock, 0, stream(device)>>>(
        p, q_rows, states.as<A>(), nullptr, static_cast<A*>(dqf), row_inv, row_gd);
    FORGE_CUDA_CHECK_LAUNCH("linear_core query_kernel (backward)");
  }

  // The gradient states (R, r) = (sum Qf_i gn_i^T, sum gd_i Qf_i) and the key side.
  const auto* go = static_cast<const T*>(dout);
  if (a.causal) {
    launch_states<T, A>(p.qf, go, row_inv, row_gd, a.BH, a.N, q_rows.chunk, q_rows.chunks, a.F,
                        a.dv, states.as<A>(), device);
    launch_scan<A>(states.as<A>(), a.BH, q_rows.chunks, a.F, a.dv, nullptr, Scan::suffix, nullptr,
                   device);
  } else {
    const int64_t q_parts = ceil_div(a.N, kPartial);
    launch_states<T, A>(p.qf, go, row_inv, row_gd, a.BH, a.N, kPartial, q_parts, a.F, a.dv,
                        partial.as<A>(), device);
    launch_scan<A>(partial.as<A>(), a.BH, q_parts, a.F, a.dv, nullptr, Scan::total, states.as<A>(),
                   device);
  }
  if (k_rows.blocks(a.BH) > 0) {
    key_kernel<T, A><<<grid_x(k_rows.blocks(a.BH)), kBlock, 0, stream(device)>>>(
        p, k_rows, states.as<A>(), row_inv, row_gd, static_cast<A*>(dkf), static_cast<T*>(dv));
    FORGE_CUDA_CHECK_LAUNCH("linear_core key_kernel");
  }
}

}  // namespace

void linear_core_forward(const LinearCoreArgs& a, const void* Qf, const void* Kf, const void* V,
                         void* O, int device) {
  check_args(a);
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(a.dtype, "attention linear core",
                            [&] { forward_impl<scalar_t>(a, Qf, Kf, V, O, device); });
}

void linear_core_backward(const LinearCoreArgs& a, const void* Qf, const void* Kf, const void* V,
                          const void* dO, void* dQf, void* dKf, void* dV, int device) {
  check_args(a);
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(a.dtype, "attention linear core backward", [&] {
    backward_impl<scalar_t>(a, Qf, Kf, V, dO, dQf, dKf, dV, device);
  });
}

}  // namespace forge::cuda
