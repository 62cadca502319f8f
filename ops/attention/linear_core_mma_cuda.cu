// The non-causal linear-attention core on tensor cores (LinearEngine::mma,
// issue 30; see linear_core_cuda.h): bf16 / f16 operands, f32 accumulators,
// F and dv of 64 or 128. Every product is an m16n8k16 mma of the tile engine
// (tile_engine.cuh) on 64-row tiles staged in swizzled shared memory, and the
// feature map is applied while a tile is staged (FusedMap::elu_plus_one: q
// and k are read raw, so no feature tensor ever reaches device memory; with
// FusedMap::none the features come precomputed in f32 and are rounded to T
// as they are staged).
//
// With X = phi(rows) and per-row weights, the kernels (one 64-row tile per
// block unless said otherwise):
//   state_kernel   per (batch-head, part of `part` rows): the partial state
//                  S = sum_j X_j^T (w_j Y_j)  [F, dv] (an mma of X^T, read
//                  with transposed ldmatrix, and Y), z = sum_j u_j X_j [F]
//                  (f32 sums of the staged values), into [BH, parts, E].
//                  Keys: X = phi(K) (0 on padding), Y = V, w = u = 1.
//                  Queries (backward): X = phi(Q), Y = dO, w = 1/den, u = gd.
//   reduce_kernel  the parts of each batch-head summed in order (no atomics:
//                  repeated runs are bit-identical).
//   query_kernel   num = phi(Q) S, den = phi(Q) . z + eps (1 un-normalised),
//                  o = num / den. Backward: gd = -(dO . num) / den^2,
//                  dphi(Q) = (dO S^T) / den + gd z^T, dq = dphi(Q) phi'(q);
//                  1/den and gd of every row saved for the gradient state.
//   key_kernel     with (R, r) the gradient state of the queries:
//                  dphi(K) = V R^T + r, dk = dphi(K) phi'(k) keep,
//                  dV = phi(K) R.
// The parts are sized from the shapes alone (about kTargetBlocks blocks in
// all), so the summation order, and so the result, does not depend on the GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "core/allocator.h"
#include "core/cuda_kernels.cuh"
#include "ops/attention/linear_core_cuda.h"
#include "ops/attention/tile_engine.cuh"

namespace forge::cuda {

namespace {

constexpr int kRows = 64;              // rows of a staged tile
constexpr int kRowWarps = kRows / 16;  // warps of the query and key kernels, 16 rows each
constexpr int kRowThreads = kRowWarps * kWarp;
constexpr int64_t kTargetBlocks = 264;  // state blocks aimed at: 2 per SM of a 132-SM H200

// ---- feature maps, applied as tiles are staged ----
struct Identity {
  static __device__ __forceinline__ float value(float x) { return x; }
  static __device__ __forceinline__ float slope(float) { return 1.f; }
};
struct EluPlusOne {  // elu(x) + 1: x + 1 for x > 0, else exp(x)
  static __device__ __forceinline__ float value(float x) { return x > 0.f ? x + 1.f : expf(x); }
  static __device__ __forceinline__ float slope(float x) { return x > 0.f ? 1.f : expf(x); }
};

// Eight consecutive values of src (32-byte aligned for f32, 16-byte for T) as f32.
template <typename Src>
__device__ __forceinline__ void load8(float (&x)[8], const Src* src) {
  if constexpr (std::is_same_v<Src, float>) {
    const float4 a = reinterpret_cast<const float4*>(src)[0];
    const float4 b = reinterpret_cast<const float4*>(src)[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(src);
    const Src* h = reinterpret_cast<const Src*>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = to_acc<float>(h[i]);
  }
}

// Two consecutive values of src / into dst (f32 or T).
template <typename Src>
__device__ __forceinline__ float2 load2(const Src* src) {
  if constexpr (std::is_same_v<Src, float>) {
    return *reinterpret_cast<const float2*>(src);
  } else {
    return make_float2(to_acc<float>(src[0]), to_acc<float>(src[1]));
  }
}
template <typename Dst>
__device__ __forceinline__ void store2(Dst* dst, float x, float y) {
  if constexpr (std::is_same_v<Dst, float>) {
    *reinterpret_cast<float2*>(dst) = make_float2(x, y);
  } else {
    *reinterpret_cast<uint32_t*>(dst) = tiles::pack2<Dst>(x, y);
  }
}

// Rows [row0, row0 + kRows) of src [len, kCols] into the swizzled tile of T:
// Map::value(x) times scale(r) (r: the row within the tile), rows past len 0.
// Each thread stages 16-byte chunks of 8 values; sum(r, c, vals) sees the
// staged f32 values of each chunk before rounding (c: its first column).
// Every one of the block's kThreads threads calls it; synchronise after.
template <int kCols, int kThreads, typename Map, typename T, typename Src, typename Scale,
          typename Sum>
__device__ __forceinline__ void stage_rows(T* tile, const Src* src, int64_t row0, int64_t len,
                                           const Scale& scale, const Sum& sum) {
  constexpr int kChunks = kCols / 8;
  for (int e = threadIdx.x; e < kRows * kChunks; e += kThreads) {
    const int r = e / kChunks, c = e % kChunks * 8;
    float x[8] = {};
    if (row0 + r < len) {
      load8(x, src + (row0 + r) * kCols + c);
      const float s = scale(r);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = Map::value(x[i]) * s;
    }
    sum(r, c, x);
    uint4 packed;
    packed.x = tiles::pack2<T>(x[0], x[1]);
    packed.y = tiles::pack2<T>(x[2], x[3]);
    packed.z = tiles::pack2<T>(x[4], x[5]);
    packed.w = tiles::pack2<T>(x[6], x[7]);
    *reinterpret_cast<uint4*>(tile + tiles::swizzled<kCols>(r, c)) = packed;
  }
}

// A [kRows(k), kCols(n)] ... or [F, dv] f32 matrix (kRowsOf rows) into a swizzled tile of T.
template <int kRowsOf, int kCols, int kThreads, typename T>
__device__ __forceinline__ void stage_matrix(T* tile, const float* src) {
  constexpr int kChunks = kCols / 8;
  for (int e = threadIdx.x; e < kRowsOf * kChunks; e += kThreads) {
    const int r = e / kChunks, c = e % kChunks * 8;
    float x[8];
    load8(x, src + r * kCols + c);
    uint4 packed;
    packed.x = tiles::pack2<T>(x[0], x[1]);
    packed.y = tiles::pack2<T>(x[2], x[3]);
    packed.z = tiles::pack2<T>(x[4], x[5]);
    packed.w = tiles::pack2<T>(x[6], x[7]);
    *reinterpret_cast<uint4*>(tile + tiles::swizzled<kCols>(r, c)) = packed;
  }
}

// A state [kF * kDv + kF] (f32): its matrix [kF, kDv] into a swizzled tile
// of T, its vector [kF] into `vec`.
template <int kF, int kDv, int kThreads, typename T>
__device__ __forceinline__ void stage_state(T* tile, float* vec, const float* state) {
  stage_matrix<kF, kDv, kThreads>(tile, state);
  for (int f = threadIdx.x; f < kF; f += kThreads) vec[f] = state[kF * kDv + f];
}

// The A fragment of rows [m0, m0 + 16), columns [k0, k0 + 16) of the
// transpose of a swizzled [k, m] tile (A = tile^T, as phi(K)^T in phi(K)^T V):
// matrix q of the four holds m-block q % 2 and k-block q / 2, each read
// transposed.
template <int kCols, typename T>
__device__ __forceinline__ void load_a_transposed(uint32_t (&a)[4], const T* tile, int m0, int k0) {
  const int lane = threadIdx.x % 32;
  tiles::ldmatrix_x4_trans(
      a, tile + tiles::swizzled<kCols>(k0 + lane / 16 * 8 + lane % 8, m0 + (lane / 8) % 2 * 8));
}

// acc[kN / 8] (+)= A B over k in [0, kK) for one warp's 16 rows: A rows
// [m0, m0 + 16) of a swizzled [*, kK] tile (kTransA: the transpose of a
// swizzled [kK, *] tile, columns [m0, m0 + 16)), and B = a swizzled [kK, kN]
// tile (kTransB: the transpose of a swizzled [kN, kK] tile).
template <int kK, int kN, bool kTransA, bool kTransB, int kLdA, typename T>
__device__ __forceinline__ void warp_product(float (&acc)[kN / 8][4], const T* a_tile, int m0,
                                             const T* b_tile) {
#pragma unroll
  for (int k0 = 0; k0 < kK; k0 += 16) {
    uint32_t a[4];
    if constexpr (kTransA)
      load_a_transposed<kLdA>(a, a_tile, m0, k0);
    else
      tiles::load_a<kLdA>(a, a_tile, m0, k0);
#pragma unroll
    for (int n0 = 0; n0 < kN; n0 += 16) {
      uint32_t b[4];
      if constexpr (kTransB)
        tiles::load_b_transposed<kK>(b, b_tile, n0, k0);
      else
        tiles::load_b<kN>(b, b_tile, k0, n0);
      tiles::mma_16816<T>(acc[n0 / 8], a, b[0], b[1]);
      tiles::mma_16816<T>(acc[n0 / 8 + 1], a, b[2], b[3]);
    }
  }
}

// Whether row j of batch-head bh is a real key (keep null: every row).
__device__ __forceinline__ float kept(const uint8_t* keep, int64_t H, int64_t M, int64_t bh,
                                      int64_t j) {
  return keep == nullptr || keep[bh / H * M + j] != 0 ? 1.f : 0.f;
}

__host__ __device__ __forceinline__ int64_t state_size(int64_t F, int64_t dv) {
  return F * dv + F;
}

// ---- the partial states ----
// Block: part p of batch-head bh (blockIdx.x = bh * parts + p), rows
// [p part, (p + 1) part) of x [BH, len, kF] (Src) and y [BH, len, kDv] (T);
// kF / 16 warps, warp w the state rows [16 w, 16 w + 16). out [BH, parts, E].
template <typename T, typename Src, typename Map, int kF, int kDv>
__global__ void __launch_bounds__(kF * 2)
    state_kernel(const Src* x, const T* y, const float* w, const float* u, const uint8_t* keep,
                 int64_t H, int64_t len, int64_t part, int64_t parts, float* out) {
  constexpr int kThreads = kF * 2;
  constexpr int kXChunks = kF / 8;  // 16-byte chunks a row of x
  static_assert(kThreads % kXChunks == 0, "a thread stages one fixed column chunk of x");
  extern __shared__ __align__(128) unsigned char smem[];
  T* sx = reinterpret_cast<T*>(smem);                          // [kRows, kF]
  T* sy = sx + kRows * kF;                                     // [kRows, kDv]
  float* colsum = reinterpret_cast<float*>(sy + kRows * kDv);  // [kThreads, 8]
  const int warp = threadIdx.x / kWarp;
  const int64_t bh = blockIdx.x / parts, p = blockIdx.x % parts;
  const int64_t first = bh * len + p * part;  // the part's first row
  const int64_t rows = min(part, len - p * part);
  const Src* xs = x + first * kF;
  const T* ys = y + first * kDv;

  float acc[kDv / 8][4] = {};
  float z[8] = {};  // this thread's column chunk (threadIdx.x % kXChunks), summed over its rows
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int64_t j0 = p * part + r0;  // the tile's first row within the batch-head
    stage_rows<kF, kThreads, Map>(
        sx, xs, r0, rows, [&](int r) { return kept(keep, H, len, bh, j0 + r); },
        [&](int r, int, const float(&v)[8]) {
          const float uj = r0 + r < rows && u != nullptr ? u[first + r0 + r] : 1.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) z[i] += uj * v[i];
        });
    stage_rows<kDv, kThreads, Identity>(
        sy, ys, r0, rows, [&](int r) { return w != nullptr ? w[first + r0 + r] : 1.f; },
        [](int, int, const float(&)[8]) {});
    __syncthreads();
    warp_product<kRows, kDv, true, false, kF>(acc, sx, 16 * warp, sy);
    __syncthreads();
  }

  float* st = out + static_cast<int64_t>(blockIdx.x) * state_size(kF, kDv);
  const int lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < kDv / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(st + (16 * warp + g + 8 * h) * kDv + 8 * n + 2 * t) =
          make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
      // z: the threads of one column chunk summed in thread order.
#pragma unroll
  for (int i = 0; i < 8; ++i) colsum[threadIdx.x * 8 + i] = z[i];
  __syncthreads();
  if (threadIdx.x < kF) {
    const int f = threadIdx.x, chunk = f / 8;
    float s = 0;
    for (int th = chunk; th < kThreads; th += kXChunks) s += colsum[th * 8 + f % 8];
    st[kF * kDv + f] = s;
  }
}

// total [BH, E] = the sum over parts of states [BH, parts, E], in part order.
__global__ void reduce_kernel(const float* states, int64_t BH, int64_t parts, int64_t E,
                              float* total) {
  FORGE_GRID_STRIDE(idx, BH * E) {
    const int64_t bh = idx / E, e = idx % E;
    const float* col = states + bh * parts * E + e;
    float s = 0;
    for (int64_t p = 0; p < parts; ++p) s += col[p * E];
    total[idx] = s;
  }
}

// ---- queries ----
template <int kF, int kDv>
constexpr size_t row_smem_bytes(size_t elem) {
  // the row tile [64, kF], the state [kF, kDv], the second row tile [64, kDv]
  // (T); z or r [kF], and two values per row (f32)
  return (kRows * kF + kF * kDv + kRows * kDv) * elem + (kF + 2 * kRows) * sizeof(float);
}

// Block: query rows [i0, i0 + 64) of batch-head bh; warp w rows i0 + 16 w ...
// state [BH, E]: the key state (S, z). Forward: o. Backward: dq (Src: the
// gradient of what q is, features or raw rows) and row_inv, row_gd [BH, N].
template <typename T, typename Src, typename Map, int kF, int kDv, bool kBackward>
__global__ void __launch_bounds__(kRowThreads)
    query_kernel(const Src* q, const float* state, const T* dout, int64_t N, bool normalise,
                 float eps, T* o, Src* dq, float* row_inv, float* row_gd) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);                      // phi(Q) [64, kF]
  T* ss = sq + kRows * kF;                                 // S [kF, kDv]
  T* sy = ss + kF * kDv;                                   // o (forward) or dO (backward) [64, kDv]
  float* sz = reinterpret_cast<float*>(sy + kRows * kDv);  // z [kF]
  float* sinv = sz + kF;                                   // 1 / den [64]
  float* sgd = sinv + kRows;                               // gd [64]
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const int64_t tiles = (N + kRows - 1) / kRows;
  const int64_t bh = blockIdx.x / tiles, i0 = blockIdx.x % tiles * kRows;
  const Src* qs = q + bh * N * kF;
  const float* S = state + bh * state_size(kF, kDv);

  stage_rows<kF, kRowThreads, Map>(
      sq, qs, i0, N, [](int) { return 1.f; }, [](int, int, const float(&)[8]) {});
  stage_state<kF, kDv, kRowThreads>(ss, sz, S);
  if constexpr (kBackward)
    stage_rows<kDv, kRowThreads, Identity>(
        sy, dout + bh * N * kDv, i0, N, [](int) { return 1.f; },
        [](int, int, const float(&)[8]) {});
  __syncthreads();

  // den = phi(Q_i) . z + eps: two threads a row, half of F each.
  {
    const int r = threadIdx.x / 2, half = threadIdx.x % 2;
    float x = 0;
    for (int f = half * kF / 2; f < (half + 1) * kF / 2; ++f)
      x += to_acc<float>(sq[tiles::swizzled<kF>(r, f)]) * sz[f];
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    if (half == 0) sinv[r] = normalise ? 1.f / (x + eps) : 1.f;
  }
  __syncthreads();

  const int m0 = 16 * warp;
  const float inv[2] = {sinv[m0 + g], sinv[m0 + g + 8]};
  {
    float acc[kDv / 8][4] = {};
    warp_product<kF, kDv, false, false, kF>(acc, sq, m0, ss);  // num = phi(Q) S
    if constexpr (!kBackward) {
      tiles::stage_fragments<kDv>(sy, acc, m0, inv);  // o = num / den
      __syncthreads();
      tiles::store_tile<kRows, kDv, kRowThreads>(o + bh * N * kDv, sy, i0, N);
      return;
    } else {
      // gd = -(dO . num) / den^2, summed over the 4 lanes of a row.
      float dot[2] = {0, 0};
#pragma unroll
      for (int n = 0; n < kDv / 8; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = m0 + g + 8 * h, c = 8 * n + 2 * t;
          dot[h] += to_acc<float>(sy[tiles::swizzled<kDv>(r, c)]) * acc[n][2 * h] +
                    to_acc<float>(sy[tiles::swizzled<kDv>(r, c + 1)]) * acc[n][2 * h + 1];
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        dot[h] += __shfl_xor_sync(0xffffffffu, dot[h], 1);
        dot[h] += __shfl_xor_sync(0xffffffffu, dot[h], 2);
        if (t == 0) sgd[m0 + g + 8 * h] = normalise ? -dot[h] * inv[h] * inv[h] : 0.f;
      }
    }
  }
  if constexpr (kBackward) {
    __syncwarp();
    const float gd[2] = {sgd[m0 + g], sgd[m0 + g + 8]};
    // dphi(Q) = (dO S^T) / den + gd z^T, then dq = dphi(Q) phi'(q).
    float acc[kF / 8][4] = {};
    warp_product<kDv, kF, false, true, kDv>(acc, sy, m0, ss);
#pragma unroll
    for (int n = 0; n < kF / 8; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t i = i0 + m0 + g + 8 * h;
        const int f = 8 * n + 2 * t;
        if (i >= N) continue;
        const float2 x = load2(qs + i * kF + f);
        store2(dq + (bh * N + i) * kF + f,
               (acc[n][2 * h] * inv[h] + gd[h] * sz[f]) * Map::slope(x.x),
               (acc[n][2 * h + 1] * inv[h] + gd[h] * sz[f + 1]) * Map::slope(x.y));
      }
    if (t == 0)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t i = i0 + m0 + g + 8 * h;
        if (i < N) {
          row_inv[bh * N + i] = inv[h];
          row_gd[bh * N + i] = gd[h];
        }
      }
  }
}

// ---- keys ----
// Block: key rows [j0, j0 + 64) of batch-head bh; state [BH, E]: the gradient
// state (R, r) of the queries. dk (Src) and dv.
template <typename T, typename Src, typename Map, int kF, int kDv>
__global__ void __launch_bounds__(kRowThreads)
    key_kernel(const Src* k, const T* v, const uint8_t* keep, int64_t H, int64_t M,
               const float* state, Src* dk, T* dv) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* sk = reinterpret_cast<T*>(smem);                        // phi(K) [64, kF]
  T* sr = sk + kRows * kF;                                   // R [kF, kDv]
  T* sv = sr + kF * kDv;                                     // V, then dV [64, kDv]
  float* svec = reinterpret_cast<float*>(sv + kRows * kDv);  // r [kF]
  float* skeep = svec + kF;                                  // keep [64]
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const int64_t tiles = (M + kRows - 1) / kRows;
  const int64_t bh = blockIdx.x / tiles, j0 = blockIdx.x % tiles * kRows;
  const Src* ks = k + bh * M * kF;
  const float* R = state + bh * state_size(kF, kDv);

  for (int r = threadIdx.x; r < kRows; r += kRowThreads)
    skeep[r] = j0 + r < M ? kept(keep, H, M, bh, j0 + r) : 0.f;
  __syncthreads();
  stage_rows<kF, kRowThreads, Map>(
      sk, ks, j0, M, [&](int r) { return skeep[r]; }, [](int, int, const float(&)[8]) {});
  stage_state<kF, kDv, kRowThreads>(sr, svec, R);
  stage_rows<kDv, kRowThreads, Identity>(
      sv, v + bh * M * kDv, j0, M, [](int) { return 1.f; }, [](int, int, const float(&)[8]) {});
  __syncthreads();

  const int m0 = 16 * warp;
  {
    // dphi(K) = V R^T + r; dk = dphi(K) phi'(k) keep.
    float acc[kF / 8][4] = {};
    warp_product<kDv, kF, false, true, kDv>(acc, sv, m0, sr);
#pragma unroll
    for (int n = 0; n < kF / 8; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m0 + g + 8 * h;
        const int64_t j = j0 + r;
        const int f = 8 * n + 2 * t;
        if (j >= M) continue;
        const float2 x = load2(ks + j * kF + f);
        store2(dk + (bh * M + j) * kF + f, (acc[n][2 * h] + svec[f]) * Map::slope(x.x) * skeep[r],
               (acc[n][2 * h + 1] + svec[f + 1]) * Map::slope(x.y) * skeep[r]);
      }
  }
  __syncwarp();  // the warp has read its rows of V; dV goes in their place
  {
    // dV = phi(K) R
    float acc[kDv / 8][4] = {};
    warp_product<kF, kDv, false, false, kF>(acc, sk, m0, sr);
    const float one[2] = {1.f, 1.f};
    tiles::stage_fragments<kDv>(sv, acc, m0, one);
  }
  __syncthreads();
  tiles::store_tile<kRows, kDv, kRowThreads>(dv + bh * M * kDv, sv, j0, M);
}

// ---- launchers ----

unsigned grid_of(int64_t blocks) {
  if (blocks > 0x7fffffff) fail("linear attention core (mma): too many rows for one launch");
  return static_cast<unsigned>(blocks);
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
}

// A row kernel (query_kernel, key_kernel) over the 64-row tiles of len rows
// of every batch-head, with the shared memory row_smem_bytes gives.
template <int kF, int kDv, typename T, typename Kernel, typename... Args>
void launch_rows(Kernel kernel, int64_t BH, int64_t len, int device, const char* what,
                 Args... args) {
  const int64_t blocks = BH * ((len + kRows - 1) / kRows);
  if (blocks == 0) return;
  const size_t bytes = row_smem_bytes<kF, kDv>(sizeof(T));
  allow_smem(kernel, bytes);
  kernel<<<grid_of(blocks), kRowThreads, bytes, stream(device)>>>(args...);
  FORGE_CUDA_CHECK_LAUNCH(what);
}

// Rows per partial state: a multiple of 64 giving about kTargetBlocks blocks
// over every batch-head (from the shapes alone: the same order on every GPU).
int64_t part_rows(int64_t BH, int64_t len) {
  const int64_t per = (BH * len + kTargetBlocks - 1) / kTargetBlocks;
  return std::max<int64_t>(kRows, (per + kRows - 1) / kRows * kRows);
}

// total [BH, E] = the state of x, y over len rows (see state_kernel), through
// partial states in `scratch`.
template <typename T, typename Src, typename Map, int kF, int kDv>
void launch_state(const Src* x, const T* y, const float* w, const float* u, const uint8_t* keep,
                  int64_t H, int64_t BH, int64_t len, float* total, int device) {
  const int64_t E = state_size(kF, kDv);
  const int64_t part = part_rows(BH, len), parts = (len + part - 1) / part;
  Scratch partial(device,
                  static_cast<size_t>(std::max<int64_t>(BH * parts * E, 1)) * sizeof(float));
  if (BH * parts > 0) {
    const size_t bytes = (kRows * kF + kRows * kDv) * sizeof(T) + kF * 2 * 8 * sizeof(float);
    auto kernel = state_kernel<T, Src, Map, kF, kDv>;
    allow_smem(kernel, bytes);
    kernel<<<grid_of(BH * parts), kF * 2, bytes, stream(device)>>>(x, y, w, u, keep, H, len, part,
                                                                   parts, partial.as<float>());
    FORGE_CUDA_CHECK_LAUNCH("linear_core (mma) state_kernel");
  }
  if (BH * E == 0) return;
  reduce_kernel<<<grid_for(BH * E, device), kThreads, 0, stream(device)>>>(partial.as<float>(), BH,
                                                                           parts, E, total);
  FORGE_CUDA_CHECK_LAUNCH("linear_core (mma) reduce_kernel");
}

template <typename T, typename Src, typename Map, int kF, int kDv>
void forward_impl(const LinearMmaArgs& m, const void* qf, const void* kf, const void* v, void* o,
                  int device) {
  const LinearCoreArgs& a = m.core;
  Scratch state(device, static_cast<size_t>(a.BH * state_size(kF, kDv)) * sizeof(float));
  launch_state<T, Src, Map, kF, kDv>(static_cast<const Src*>(kf), static_cast<const T*>(v), nullptr,
                                     nullptr, m.keep, m.H, a.BH, a.M, state.as<float>(), device);
  launch_rows<kF, kDv, T>(query_kernel<T, Src, Map, kF, kDv, false>, a.BH, a.N, device,
                          "linear_core (mma) query_kernel", static_cast<const Src*>(qf),
                          static_cast<const float*>(state.as<float>()),
                          static_cast<const T*>(nullptr), a.N, a.normalise,
                          static_cast<float>(a.eps), static_cast<T*>(o), static_cast<Src*>(nullptr),
                          static_cast<float*>(nullptr), static_cast<float*>(nullptr));
}

template <typename T, typename Src, typename Map, int kF, int kDv>
void backward_impl(const LinearMmaArgs& m, const void* qf, const void* kf, const void* v,
                   const void* dout, void* dqf, void* dkf, void* dv, int device) {
  const LinearCoreArgs& a = m.core;
  const auto* qs = static_cast<const Src*>(qf);
  const auto* ks = static_cast<const Src*>(kf);
  const auto* go = static_cast<const T*>(dout);
  Scratch state(device, static_cast<size_t>(a.BH * state_size(kF, kDv)) * sizeof(float));
  // 1 / den, then gd of every query row: [2, BH, N].
  Scratch rows(device, static_cast<size_t>(std::max<int64_t>(2 * a.BH * a.N, 1)) * sizeof(float));
  float* row_inv = rows.as<float>();
  float* row_gd = row_inv + a.BH * a.N;

  // The key state, then the query side: dq, 1/den, gd.
  launch_state<T, Src, Map, kF, kDv>(ks, static_cast<const T*>(v), nullptr, nullptr, m.keep, m.H,
                                     a.BH, a.M, state.as<float>(), device);
  launch_rows<kF, kDv, T>(query_kernel<T, Src, Map, kF, kDv, true>, a.BH, a.N, device,
                          "linear_core (mma) query_kernel (backward)", qs,
                          static_cast<const float*>(state.as<float>()), go, a.N, a.normalise,
                          static_cast<float>(a.eps), static_cast<T*>(nullptr),
                          static_cast<Src*>(dqf), row_inv, row_gd);

  // The gradient state (R, r) = (sum phi(Q_i)^T dO_i / den_i, sum gd_i phi(Q_i)), then the keys.
  launch_state<T, Src, Map, kF, kDv>(qs, go, row_inv, row_gd, nullptr, 1, a.BH, a.N,
                                     state.as<float>(), device);
  launch_rows<kF, kDv, T>(key_kernel<T, Src, Map, kF, kDv>, a.BH, a.M, device,
                          "linear_core (mma) key_kernel", ks, static_cast<const T*>(v), m.keep, m.H,
                          a.M, static_cast<const float*>(state.as<float>()), static_cast<Src*>(dkf),
                          static_cast<T*>(dv));
}

// Calls fn.template operator()<T, Src, Map, kF, kDv>() for the case.
template <typename Fn>
void dispatch(const LinearMmaArgs& m, const Fn& fn) {
  const auto with_type = [&]<typename T>() {
    const auto with_map = [&]<typename Src, typename Map>() {
      const int64_t F = m.core.F, dv = m.core.dv;
      if (F == 64 && dv == 64)
        fn.template operator()<T, Src, Map, 64, 64>();
      else if (F == 64 && dv == 128)
        fn.template operator()<T, Src, Map, 64, 128>();
      else if (F == 128 && dv == 64)
        fn.template operator()<T, Src, Map, 128, 64>();
      else
        fn.template operator()<T, Src, Map, 128, 128>();
    };
    if (m.map == FusedMap::elu_plus_one)
      with_map.template operator()<T, EluPlusOne>();
    else
      with_map.template operator()<float, Identity>();
  };
  if (m.core.dtype == DType::bf16)
    with_type.template operator()<__nv_bfloat16>();
  else
    with_type.template operator()<__half>();
}

void check_mma_args(const LinearMmaArgs& m) {
  if (!linear_mma_takes(m.core))
    fail("linear attention core (mma): the case is not one the tensor-core kernels take");
  if (m.map == FusedMap::none && m.keep != nullptr)
    fail("linear attention core (mma): a key mask goes with a fused feature map only");
}

}  // namespace

bool linear_mma_takes(const LinearCoreArgs& a, std::initializer_list<const void*> tensors) {
  const auto side = [](int64_t n) { return n == 64 || n == 128; };
  for (const void* t : tensors)
    if (reinterpret_cast<uintptr_t>(t) % 16 != 0) return false;
  return (a.dtype == DType::bf16 || a.dtype == DType::f16) && !a.causal && side(a.F) &&
         side(a.dv) && a.z0 == nullptr && a.den_min == -std::numeric_limits<double>::infinity();
}

void linear_mma_forward(const LinearMmaArgs& m, const void* Qf, const void* Kf, const void* V,
                        void* O, int device) {
  check_mma_args(m);
  DeviceGuard guard(device);
  dispatch(m, [&]<typename T, typename Src, typename Map, int kF, int kDv>() {
    forward_impl<T, Src, Map, kF, kDv>(m, Qf, Kf, V, O, device);
  });
}

void linear_mma_backward(const LinearMmaArgs& m, const void* Qf, const void* Kf, const void* V,
                         const void* dO, void* dQf, void* dKf, void* dV, int device) {
  check_mma_args(m);
  DeviceGuard guard(device);
  dispatch(m, [&]<typename T, typename Src, typename Map, int kF, int kDv>() {
    backward_impl<T, Src, Map, kF, kDv>(m, Qf, Kf, V, dO, dQf, dKf, dV, device);
  });
}

}  // namespace forge::cuda
