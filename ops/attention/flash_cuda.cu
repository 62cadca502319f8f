// The tiled ("flash") softmax-attention kernels (see flash_cuda.h for the
// contract). Three kernels and a preprocess, all over square tiles of kTile
// query rows x kTile keys held in shared memory:
//   forward:  a block per (query tile, bh) walks the key tiles its rows can see:
//             S = Q K^T, online softmax (running max m and sum l per row, l of
//             the undropped probabilities), O = O exp(m_old - m_new) + dropout(P) V;
//             at the end o = O / l and lse = m + log l.
//   backward: D = rowsum(do * o) per row (into `scratch`); a block per (key tile, bh)
//             walks the query tiles that see its keys and accumulates dv and dk;
//             a block per (query tile, bh) walks its key tiles and accumulates dq.
//             Each recomputes P = exp(scale S - lse) and dS = P (dP Z - D), with
//             Z the dropout factors and dP = do v^T; no atomics, so the result
//             does not depend on scheduling.
// Tile products run on tensor cores (WMMA, 16x16x16, f32 accumulators) for bf16
// / f16 and as register-blocked FMA loops for f32 / f64; everything else (the
// softmax statistics, the accumulators of o, dk, dv, dq) is in the
// accumulation type. The tile size (64, 32 or 16) is the largest whose shared
// memory lets two blocks share an SM (else one block) for the given head dims.
#include <mma.h>

#include <climits>
#include <initializer_list>
#include <type_traits>

#include "core/cuda_kernels.cuh"
#include "ops/attention/flash_cuda.h"
#include "ops/attention/tile_engine.cuh"

namespace forge::cuda {

namespace {

constexpr int kFlashThreads = 256;
constexpr int kFlashWarps = kFlashThreads / kWarp;

// Whether tile products of T run on tensor cores.
template <typename T>
constexpr bool kTensorCore = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

// Leading dims (in elements) of the shared-memory tiles: n columns plus a pad.
// Operand tiles of 16-bit types pad by 8 (rows stay 16-byte aligned, as WMMA
// and the vector loads need, and shift by 4 banks); those of f32 / f64 by 1 (an
// odd row stride: the FMA loops read columns without bank conflicts). Tiles
// in the accumulation type pad by 4 (WMMA stores f32 with a multiple of 4).
template <typename T>
__host__ __device__ constexpr int ld_op(int n) {
  return n + (kTensorCore<T> ? 8 : 1);
}
__host__ __device__ constexpr int ld_acc(int n) {
  return n + 4;
}

// Head dims rounded up to the 16 of a WMMA step; the extra columns hold zeros.
inline int pad16(int64_t n) {
  return static_cast<int>((n + 15) / 16 * 16);
}

// The launch parameters of every kernel, from FlashArgs.
struct Params {
  int64_t N = 0, M = 0, H = 0;
  int d = 0, dv = 0, dp = 0, dvp = 0;  // head dims and their 16-padded widths
  double scale = 0;
  bool causal = false;
  const uint8_t* kpm = nullptr;  // [B, M]
  int64_t window = 0, look_backward = 0, look_forward = 0;
  double dropout = 0;  // p; 0: none
  double keep = 1;     // 1 / (1 - p), the factor of a kept entry
  int64_t drop_row = 0;
  uint64_t seed = 0, offset = 0, first = 0;
  bool vec_d = false, vec_dv = false;  // tiles of width d / dv load as 16-byte vectors
};

// Shared memory is carved into 128-byte aligned arrays; on the host (base null)
// the same walk only counts the bytes, so both sides agree on the layout.
struct Carver {
  unsigned char* base = nullptr;
  size_t bytes = 0;
  template <typename X>
  __host__ __device__ X* take(int64_t n) {
    const size_t at = bytes;
    bytes += (static_cast<size_t>(n) * sizeof(X) + 127) / 128 * 128;
    return base ? reinterpret_cast<X*>(base + at) : nullptr;
  }
};

// The shared memory of each kernel, for tiles of `tile` rows: operand tiles of
// T (q, k, v, do, and P, dS as products' operands), tiles in the accumulation
// type (scores, dP, accumulators of o, dk, dv, dq), per-row statistics, and
// real[c] = 1 where key j0 + c exists and is not padding.
template <typename T>
struct ForwardSmem {
  T* q;               // [tile, ld_op(dp)]
  T* k;               // [tile, ld_op(dp)]
  T* v;               // [tile, ld_op(dvp)]
  T* p;               // [tile, ld_op(tile)] dropout(P)
  acc_t<T>* s;        // [tile, ld_acc(tile)] scores, then P
  acc_t<T>* o;        // [tile, ld_acc(dvp)] output accumulator
  acc_t<T>* row_max;  // [tile] running max m
  acc_t<T>* row_sum;  // [tile] running sum l
  uint8_t* real;      // [tile]
  __host__ __device__ ForwardSmem(Carver& c, int tile, int dp, int dvp)
      : q(c.take<T>(tile * ld_op<T>(dp))),
        k(c.take<T>(tile * ld_op<T>(dp))),
        v(c.take<T>(tile * ld_op<T>(dvp))),
        p(c.take<T>(tile * ld_op<T>(tile))),
        s(c.take<acc_t<T>>(tile * ld_acc(tile))),
        o(c.take<acc_t<T>>(tile * ld_acc(dvp))),
        row_max(c.take<acc_t<T>>(tile)),
        row_sum(c.take<acc_t<T>>(tile)),
        real(c.take<uint8_t>(tile)) {}
};

template <typename T>
struct KeyValueGradSmem {
  T* k;             // [tile, ld_op(dp)]  the block's keys
  T* v;             // [tile, ld_op(dvp)]
  T* q;             // [tile, ld_op(dp)]  the current query tile
  T* dout;          // [tile, ld_op(dvp)]
  T* pd;            // [tile, ld_op(tile)] dropout(P)
  T* ds;            // [tile, ld_op(tile)] dS
  acc_t<T>* s;      // [tile, ld_acc(tile)] scores, then P
  acc_t<T>* dp;     // [tile, ld_acc(tile)] do v^T
  acc_t<T>* dk;     // [tile, ld_acc(dp)] accumulators
  acc_t<T>* dv;     // [tile, ld_acc(dvp)]
  acc_t<T>* lse;    // [tile] of the query tile
  acc_t<T>* delta;  // [tile] D of the query tile
  uint8_t* real;    // [tile]
  __host__ __device__ KeyValueGradSmem(Carver& c, int tile, int dp_, int dvp)
      : k(c.take<T>(tile * ld_op<T>(dp_))),
        v(c.take<T>(tile * ld_op<T>(dvp))),
        q(c.take<T>(tile * ld_op<T>(dp_))),
        dout(c.take<T>(tile * ld_op<T>(dvp))),
        pd(c.take<T>(tile * ld_op<T>(tile))),
        ds(c.take<T>(tile * ld_op<T>(tile))),
        s(c.take<acc_t<T>>(tile * ld_acc(tile))),
        dp(c.take<acc_t<T>>(tile * ld_acc(tile))),
        dk(c.take<acc_t<T>>(tile * ld_acc(dp_))),
        dv(c.take<acc_t<T>>(tile * ld_acc(dvp))),
        lse(c.take<acc_t<T>>(tile)),
        delta(c.take<acc_t<T>>(tile)),
        real(c.take<uint8_t>(tile)) {}
};

template <typename T>
struct QueryGradSmem {
  T* q;             // [tile, ld_op(dp)]  the block's queries
  T* dout;          // [tile, ld_op(dvp)]
  T* k;             // [tile, ld_op(dp)]  the current key tile
  T* v;             // [tile, ld_op(dvp)]
  T* ds;            // [tile, ld_op(tile)] dS
  acc_t<T>* s;      // [tile, ld_acc(tile)] scores, then P
  acc_t<T>* dp;     // [tile, ld_acc(tile)] do v^T
  acc_t<T>* dq;     // [tile, ld_acc(dp)] accumulator
  acc_t<T>* lse;    // [tile]
  acc_t<T>* delta;  // [tile]
  uint8_t* real;    // [tile]
  __host__ __device__ QueryGradSmem(Carver& c, int tile, int dp_, int dvp)
      : q(c.take<T>(tile * ld_op<T>(dp_))),
        dout(c.take<T>(tile * ld_op<T>(dvp))),
        k(c.take<T>(tile * ld_op<T>(dp_))),
        v(c.take<T>(tile * ld_op<T>(dvp))),
        ds(c.take<T>(tile * ld_op<T>(tile))),
        s(c.take<acc_t<T>>(tile * ld_acc(tile))),
        dp(c.take<acc_t<T>>(tile * ld_acc(tile))),
        dq(c.take<acc_t<T>>(tile * ld_acc(dp_))),
        lse(c.take<acc_t<T>>(tile)),
        delta(c.take<acc_t<T>>(tile)),
        real(c.take<uint8_t>(tile)) {}
};

template <template <typename> class Smem, typename T>
size_t smem_bytes(int tile, const Params& p) {
  Carver c;
  const Smem<T> layout(c, tile, p.dp, p.dvp);
  (void)layout;
  return c.bytes;
}

// ---- device helpers ----

__device__ __forceinline__ float acc_exp(float x) {
  return expf(x);
}
__device__ __forceinline__ double acc_exp(double x) {
  return exp(x);
}
__device__ __forceinline__ float acc_log(float x) {
  return logf(x);
}
__device__ __forceinline__ double acc_log(double x) {
  return log(x);
}

// dst [kRows, ld] (shared) = rows [row0, row0 + kRows) of src [len, dim]
// (global), zero in rows >= len and in columns [dim, dim_pad). With `vec`
// (16-bit T, dim % 8 == 0, src 16-byte aligned) 8 elements move per load.
template <typename T, int kRows>
__device__ void load_tile(T* dst, int ld, const T* src, int64_t row0, int64_t len, int dim,
                          int dim_pad, bool vec) {
  if constexpr (kTensorCore<T>) {
    if (vec) {
      constexpr int kVec = 8;
      const int chunks = dim_pad / kVec;
      for (int e = threadIdx.x; e < kRows * chunks; e += kFlashThreads) {
        const int r = e / chunks, c = e % chunks * kVec;
        const int64_t row = row0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (row < len && c < dim) val = *reinterpret_cast<const uint4*>(src + row * dim + c);
        *reinterpret_cast<uint4*>(dst + r * ld + c) = val;
      }
      return;
    }
  }
  const T zero = from_acc<T>(acc_t<T>(0));
  for (int e = threadIdx.x; e < kRows * dim_pad; e += kFlashThreads) {
    const int r = e / dim_pad, c = e % dim_pad;
    const int64_t row = row0 + r;
    dst[r * ld + c] = row < len && c < dim ? src[row * dim + c] : zero;
  }
}

// real[c] = 1 where key j0 + c exists (< M) and is not padding, for the keys of batch b.
template <int kTile>
__device__ void load_real(uint8_t* real, const Params& p, int64_t b, int64_t j0) {
  for (int c = threadIdx.x; c < kTile; c += kFlashThreads) {
    const int64_t j = j0 + c;
    real[c] = j < p.M && (p.kpm == nullptr || p.kpm[b * p.M + j] != 0) ? 1 : 0;
  }
}

template <typename A>
__device__ void zero_shared(A* x, int n) {
  for (int e = threadIdx.x; e < n; e += kFlashThreads) x[e] = A(0);
}

// rows [row0, row0 + kRows) of dst [len, dim] (global) = factor * src [kRows, ld] (shared).
template <typename T, int kRows>
__device__ void store_tile(T* dst, int64_t row0, int64_t len, int dim, const acc_t<T>* src, int ld,
                           acc_t<T> factor) {
  for (int e = threadIdx.x; e < kRows * dim; e += kFlashThreads) {
    const int r = e / dim, c = e % dim;
    if (row0 + r < len) dst[(row0 + r) * dim + c] = from_acc<T>(src[r * ld + c] * factor);
  }
}

// C [kM, n] = (accumulate ? C : 0) + a b over shared memory, by the whole
// block (every thread must call it). a [kM, k] is read as a(r, c) = A[r lda + c],
// or with kTransA from its transpose A[c lda + r]; b [k, n] likewise from B.
// n and k are multiples of 16. bf16 / f16: one warp per 16 x 16 block of C on
// tensor cores; f32 / f64: each thread owns kM / 16 rows x 4 columns of every
// 64-column strip of C and accumulates in registers.
template <bool kTransA, bool kTransB, int kM, typename T>
__device__ void tile_product(acc_t<T>* C, int ldc, const T* A, int lda, const T* B, int ldb, int n,
                             int k, bool accumulate) {
  if constexpr (kTensorCore<T>) {
    namespace wmma = nvcuda::wmma;
    using LayoutA = std::conditional_t<kTransA, wmma::col_major, wmma::row_major>;
    using LayoutB = std::conditional_t<kTransB, wmma::col_major, wmma::row_major>;
    const int warp = threadIdx.x / kWarp;
    const int blocks_n = n / 16;
    for (int t = warp; t < kM / 16 * blocks_n; t += kFlashWarps) {
      const int r0 = t / blocks_n * 16, c0 = t % blocks_n * 16;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      if (accumulate) {
        wmma::load_matrix_sync(acc, C + r0 * ldc + c0, ldc, wmma::mem_row_major);
      } else {
        wmma::fill_fragment(acc, 0.0f);
      }
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb;
      for (int kk = 0; kk < k; kk += 16) {
        wmma::load_matrix_sync(fa, kTransA ? A + kk * lda + r0 : A + r0 * lda + kk, lda);
        wmma::load_matrix_sync(fb, kTransB ? B + c0 * ldb + kk : B + kk * ldb + c0, ldb);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(C + r0 * ldc + c0, acc, ldc, wmma::mem_row_major);
    }
  } else {
    using Acc = acc_t<T>;
    constexpr int kRowGroups = kFlashThreads / 16;  // threads along the rows
    constexpr int kRows = kM / kRowGroups;          // rows per thread
    static_assert(kM % kRowGroups == 0, "tile rows must be a multiple of 16");
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    // Column c0 + tx + 16 j of row ty + kRowGroups i; a column group j lies in
    // C for every thread alike (n is a multiple of 16), so the guard is uniform.
    for (int c0 = 0; c0 < n; c0 += 64) {
      Acc acc[kRows][4];
#pragma unroll
      for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = ty + kRowGroups * i, c = c0 + tx + 16 * j;
          acc[i][j] = accumulate && c0 + 16 * j < n ? C[r * ldc + c] : Acc(0);
        }
      for (int kk = 0; kk < k; ++kk) {
        Acc a[kRows], b[4];
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          const int r = ty + kRowGroups * i;
          a[i] = to_acc<Acc>(kTransA ? A[kk * lda + r] : A[r * lda + kk]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int c = c0 + tx + 16 * j;
          b[j] =
              c0 + 16 * j < n ? to_acc<Acc>(kTransB ? B[c * ldb + kk] : B[kk * ldb + c]) : Acc(0);
        }
#pragma unroll
        for (int i = 0; i < kRows; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = ty + kRowGroups * i, c = c0 + tx + 16 * j;
          if (c0 + 16 * j < n) C[r * ldc + c] = acc[i][j];
        }
    }
  }
}

// The columns [c_lo, c_hi) of the key tile [j0, j0 + kTile) that query i may
// see by position: keys < M, the band, causality (the key padding mask comes
// on top). Empty (c_lo == c_hi) when none.
template <int kTile>
__device__ __forceinline__ void visible_columns(const Params& p, int64_t i, int64_t j0, int& c_lo,
                                                int& c_hi) {
  int64_t lo = 0, hi = p.M;
  if (p.causal) hi = std::min<int64_t>(hi, i + 1);
  if (p.window > 0) {
    const int64_t u = i / p.window;
    lo = std::max<int64_t>(lo, (u - p.look_backward) * p.window);
    hi = std::min<int64_t>(hi, (u + p.look_forward + 1) * p.window);
  }
  const int64_t a = std::min<int64_t>(kTile, std::max<int64_t>(0, lo - j0));
  c_lo = static_cast<int>(a);
  c_hi = static_cast<int>(std::min<int64_t>(kTile, std::max<int64_t>(a, hi - j0)));
}

// Keys [lo, hi) seen by some query of rows [i0, i_last] (the union of their
// visible ranges: both ends grow with i).
__device__ __forceinline__ void keys_of_queries(const Params& p, int64_t i0, int64_t i_last,
                                                int64_t& lo, int64_t& hi) {
  lo = 0;
  hi = p.M;
  if (p.causal) hi = std::min<int64_t>(hi, i_last + 1);
  if (p.window > 0) {
    lo = std::max<int64_t>(0, (i0 / p.window - p.look_backward) * p.window);
    hi = std::min<int64_t>(hi, (i_last / p.window + p.look_forward + 1) * p.window);
  }
}

// Queries [lo, hi) that see some key of [j0, j_last]. Query i sees key j of
// the band iff i / w - look_backward <= j / w <= i / w + look_forward, i.e.
// j / w - look_forward <= i / w <= j / w + look_backward.
__device__ __forceinline__ void queries_of_keys(const Params& p, int64_t j0, int64_t j_last,
                                                int64_t& lo, int64_t& hi) {
  lo = p.causal ? j0 : 0;
  hi = p.N;
  if (p.window > 0) {
    lo = std::max<int64_t>(lo, (j0 / p.window - p.look_forward) * p.window);
    hi = std::min<int64_t>(hi, (j_last / p.window + p.look_backward + 1) * p.window);
  }
}

// Calls f(c, z) for every column c in [c_lo, c_hi) of the key tile at j0 in the
// row of query i of batch-head bh, z = the dropout factor of that entry (1 / (1 - p)
// or 0). Entry (bh, i, j) uses draw first + (bh N + i) drop_row + j - col0(i) of the
// Philox stream (flash_cuda.h); the lanes of the calling warp share the work by
// Philox block (4 consecutive draws), so each block is computed once.
template <typename Acc, typename F>
__device__ __forceinline__ void for_each_dropout(const Params& p, int64_t bh, int64_t i, int64_t j0,
                                                 int c_lo, int c_hi, F&& f) {
  if (c_lo >= c_hi) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t col0 = p.window > 0 ? (i / p.window - p.look_backward) * p.window : 0;
  // Draw number of column c is e0 + c; columns >= c_lo lie inside the band, so
  // their draws are >= first >= 0 even where e0 is not.
  const int64_t e0 = static_cast<int64_t>(p.first) + (bh * p.N + i) * p.drop_row + (j0 - col0);
  const int64_t blk0 = (e0 + c_lo) / 4, blk1 = (e0 + c_hi - 1) / 4;
  const Acc keep = static_cast<Acc>(p.keep);
  for (int64_t blk = blk0 + lane; blk <= blk1; blk += kWarp) {
    const PhiloxWords w = philox_block(p.seed, p.offset, static_cast<uint64_t>(blk));
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const int64_t c = 4 * blk + l - e0;
      // u >= p compared in double, as the CPU compares its f32 draw with p.
      if (c >= c_lo && c < c_hi)
        f(static_cast<int>(c),
          static_cast<double>(philox_unit_f32(w.w[l])) >= p.dropout ? keep : Acc(0));
    }
  }
}

// ---- forward ----

// One step of the online softmax on the score tile s (rows [i0, i0 + kTile),
// keys [j0, j0 + kTile)), a warp per row: with x = scale s on the visible
// entries (-inf elsewhere) and m_new = max(m, max x),
//   P = exp(x - m_new) into p (and s), l = l exp(m - m_new) + sum P,
//   o_acc rows *= exp(m - m_new), then P *= the dropout factors in p only
//   (l sums the undropped probabilities, as on the CPU).
template <typename T, int kTile>
__device__ void online_softmax_step(const Params& p, int64_t bh, int64_t i0, int64_t j0,
                                    const ForwardSmem<T>& sm, int lds, int ldp, int ldo) {
  using A = acc_t<T>;
  constexpr int kColsPerLane = (kTile + kWarp - 1) / kWarp;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const A scale = static_cast<A>(p.scale);
  const A neg_inf = -INFINITY;
  for (int r = warp; r < kTile; r += kFlashWarps) {
    const int64_t i = i0 + r;
    int c_lo = 0, c_hi = 0;
    if (i < p.N) visible_columns<kTile>(p, i, j0, c_lo, c_hi);
    A* srow = sm.s + r * lds;
    T* prow = sm.p + r * ldp;
    A x[kColsPerLane];
    A tile_max = neg_inf;
#pragma unroll
    for (int u = 0; u < kColsPerLane; ++u) {
      const int c = lane + u * kWarp;
      x[u] = c >= c_lo && c < c_hi && sm.real[c] ? srow[c] * scale : neg_inf;
      tile_max = max(tile_max, x[u]);
    }
    tile_max = warp_max(tile_max);
    const A m_old = sm.row_max[r], l_old = sm.row_sum[r];
    const A m_new = max(m_old, tile_max);
    // exp(m_old - m_new) rescales what was summed so far; 0 when nothing was
    // (m_old = -inf, and then o_acc and l are still 0).
    const A rescale = m_old == neg_inf ? A(0) : acc_exp(m_old - m_new);
    A sum = 0;
#pragma unroll
    for (int u = 0; u < kColsPerLane; ++u) {
      const int c = lane + u * kWarp;
      const A e = x[u] == neg_inf ? A(0) : acc_exp(x[u] - m_new);
      sum += e;
      if (c < kTile) {
        prow[c] = from_acc<T>(e);
        srow[c] = e;
      }
    }
    sum = warp_sum(sum);
    for (int c = lane; c < p.dvp; c += kWarp) sm.o[r * ldo + c] *= rescale;
    __syncwarp();  // every lane has read the old statistics and written its columns
    if (lane == 0) {
      sm.row_max[r] = m_new;
      sm.row_sum[r] = l_old * rescale + sum;
    }
    if (p.dropout > 0)
      for_each_dropout<A>(p, bh, i, j0, c_lo, c_hi,
                          [&](int c, A z) { prow[c] = from_acc<T>(srow[c] * z); });
  }
}

// Block: query rows [i0, i0 + kTile) of batch-head bh.
template <typename T, int kTile>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(Params p, const T* q, const T* k, const T* v, T* o, acc_t<T>* lse) {
  using A = acc_t<T>;
  static_assert(kTile % kFlashWarps == 0, "each warp owns whole rows");
  extern __shared__ __align__(128) unsigned char flash_smem[];
  Carver carver{flash_smem};
  const ForwardSmem<T> sm(carver, kTile, p.dp, p.dvp);
  const int ldq = ld_op<T>(p.dp), ldv = ld_op<T>(p.dvp), ldp = ld_op<T>(kTile);
  const int lds = ld_acc(kTile), ldo = ld_acc(p.dvp);

  // The last query tiles first: under causality they see the most keys.
  const int64_t tiles = (p.N + kTile - 1) / kTile;
  const int64_t bh = blockIdx.x / tiles, b = bh / p.H;
  const int64_t i0 = (tiles - 1 - blockIdx.x % tiles) * kTile;
  const int64_t i_last = std::min<int64_t>(i0 + kTile, p.N) - 1;
  q += bh * p.N * p.d;
  k += bh * p.M * p.d;
  v += bh * p.M * p.dv;
  o += bh * p.N * p.dv;
  lse += bh * p.N;

  load_tile<T, kTile>(sm.q, ldq, q, i0, p.N, p.d, p.dp, p.vec_d);
  zero_shared(sm.o, kTile * ldo);
  for (int r = threadIdx.x; r < kTile; r += kFlashThreads) {
    sm.row_max[r] = A(-INFINITY);
    sm.row_sum[r] = A(0);
  }
  int64_t j_lo = 0, j_hi = 0;
  keys_of_queries(p, i0, i_last, j_lo, j_hi);
  for (int64_t j0 = j_lo / kTile * kTile; j0 < j_hi; j0 += kTile) {
    __syncthreads();  // the previous tile's products are done with k, v, p
    load_tile<T, kTile>(sm.k, ldq, k, j0, p.M, p.d, p.dp, p.vec_d);
    load_tile<T, kTile>(sm.v, ldv, v, j0, p.M, p.dv, p.dvp, p.vec_dv);
    load_real<kTile>(sm.real, p, b, j0);
    __syncthreads();
    // s [kTile, kTile] = q_tile k_tile^T
    tile_product<false, true, kTile>(sm.s, lds, sm.q, ldq, sm.k, ldq, kTile, p.dp, false);
    __syncthreads();
    online_softmax_step<T, kTile>(p, bh, i0, j0, sm, lds, ldp, ldo);
    __syncthreads();
    // o_acc [kTile, dvp] += dropout(P) v_tile
    tile_product<false, false, kTile>(sm.o, ldo, sm.p, ldp, sm.v, ldv, p.dvp, kTile, true);
  }
  __syncthreads();
  // o = o_acc / l and lse = m + log l; a row that saw no key gets 0 and -inf.
  for (int e = threadIdx.x; e < kTile * p.dv; e += kFlashThreads) {
    const int r = e / p.dv, c = e % p.dv;
    const A l = sm.row_sum[r];
    if (i0 + r < p.N) o[(i0 + r) * p.dv + c] = from_acc<T>(l > A(0) ? sm.o[r * ldo + c] / l : A(0));
  }
  for (int r = threadIdx.x; r < kTile; r += kFlashThreads) {
    const A l = sm.row_sum[r];
    if (i0 + r < p.N) lse[i0 + r] = l > A(0) ? sm.row_max[r] + acc_log(l) : A(-INFINITY);
  }
}

// ---- forward on the tensor-core tile engine (tile_engine.cuh; FlashEngine::mma) ----
// FlashAttention-2's forward for bf16 / f16 with d = dv = kD (64 or 128) and
// no dropout. A block of 4 warps takes 64 query rows, a warp 16 of them: its
// Q fragments stay in registers for the whole walk over the key tiles, the
// 64-key K and V tiles stream through two shared-memory stages (cp.async:
// the next tile loads while this one is multiplied), S = Q K^T and O += P V
// are m16n8k16 products, and the online softmax runs on the S fragments in
// registers in base 2 (scale log2(e) folded in): each thread holds 2 rows x
// 16 columns of a tile, and a row's max is reduced over the 4 lanes that
// share it. P goes from the S accumulators straight into the A fragments of
// P V. The per-row sum l stays per thread until the end.
constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * kWarp;
constexpr int kMmaRows = 16 * kMmaWarps;  // query rows per block
constexpr int kMmaKeys = 64;              // keys per tile

// The number of tiles of `tile` positions that cover [lo, hi) from the tile
// boundary at or below lo (`start`).
__device__ __forceinline__ int tiles_covering(int64_t lo, int64_t hi, int64_t tile,
                                              int64_t& start) {
  start = lo / tile * tile;
  return hi > start ? static_cast<int>((hi - start + tile - 1) / tile) : 0;
}

// Stage `stage` of the key tile at j0 of batch b: K and V [kMmaKeys, kD]
// (swizzled, asynchronous: commit after) and real[c] = 1 where key j0 + c
// exists and is not padding.
template <int kD, typename T>
__device__ __forceinline__ void load_key_stage(T* sk, T* sv, uint8_t* sreal, int stage, const T* k,
                                               const T* v, int64_t j0, const Params& p, int64_t b) {
  constexpr int kN = kMmaKeys;
  tiles::load_tile_async<kN, kD, kMmaThreads>(sk + stage * kN * kD, k, j0, p.M);
  tiles::load_tile_async<kN, kD, kMmaThreads>(sv + stage * kN * kD, v, j0, p.M);
  for (int c = threadIdx.x; c < kN; c += kMmaThreads) {
    const int64_t j = j0 + c;
    sreal[stage * kN + c] = j < p.M && (p.kpm == nullptr || p.kpm[b * p.M + j] != 0) ? 1 : 0;
  }
}

template <int kD>
constexpr size_t mma_forward_smem_bytes(size_t elem) {
  // q [64, kD], k and v [2 stages][64, kD], real [2][64]
  return (kMmaRows * kD + 4 * kMmaKeys * kD) * elem + 2 * kMmaKeys;
}

template <typename T, int kD>
__global__ void __launch_bounds__(kMmaThreads)
    flash_mma_forward_kernel(Params p, const T* q, const T* k, const T* v, T* o, float* lse) {
  constexpr int kN = kMmaKeys;
  extern __shared__ __align__(128) unsigned char flash_smem[];
  T* sq = reinterpret_cast<T*>(flash_smem);                       // [kMmaRows, kD] swizzled
  T* sk = sq + kMmaRows * kD;                                     // [2][kN, kD]
  T* sv = sk + 2 * kN * kD;                                       // [2][kN, kD]
  uint8_t* sreal = reinterpret_cast<uint8_t*>(sv + 2 * kN * kD);  // [2][kN]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int g = lane / 4, t = lane % 4;

  // The last query tiles first: under causality they see the most keys.
  const int64_t tiles = (p.N + kMmaRows - 1) / kMmaRows;
  const int64_t bh = blockIdx.x / tiles, b = bh / p.H;
  const int64_t i0 = (tiles - 1 - blockIdx.x % tiles) * kMmaRows;
  const int64_t i_last = std::min<int64_t>(i0 + kMmaRows, p.N) - 1;
  q += bh * p.N * kD;
  k += bh * p.M * kD;
  v += bh * p.M * kD;
  o += bh * p.N * kD;
  lse += bh * p.N;

  int64_t j_lo = 0, j_hi = 0, j_start = 0;
  keys_of_queries(p, i0, i_last, j_lo, j_hi);
  const int key_tiles = tiles_covering(j_lo, j_hi, kN, j_start);
  tiles::load_tile_async<kMmaRows, kD, kMmaThreads>(sq, q, i0, p.N);
  if (key_tiles > 0) load_key_stage<kD>(sk, sv, sreal, 0, k, v, j_start, p, b);
  tiles::cp_async_commit();

  const float scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  const float neg_inf = -INFINITY;
  // This thread's two rows (g and g + 8 of the warp's 16) and their statistics
  // in base 2: m = max of scale log2(e) s so far, l = this thread's part of sum 2^(x - m).
  const int64_t rows[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
  float m[2] = {neg_inf, neg_inf}, l[2] = {0.f, 0.f};
  float acc[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
  uint32_t qa[kD / 16][4];

  for (int it = 0; it < key_tiles; ++it) {
    const int stage = it & 1;
    const int64_t j0 = j_start + static_cast<int64_t>(it) * kN;
    // The next tile loads while this one is multiplied.
    tiles::next_stage(it + 1 < key_tiles,
                      [&] { load_key_stage<kD>(sk, sv, sreal, stage ^ 1, k, v, j0 + kN, p, b); });
    if (it == 0)
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) tiles::load_a<kD>(qa[kk], sq, warp * 16, kk * 16);
    const T* skt = sk + stage * kN * kD;
    const T* svt = sv + stage * kN * kD;
    const uint8_t* real = sreal + stage * kN;

    // S [16, kN] of this warp = Q K^T
    float s[kN / 8][4];
#pragma unroll
    for (int n = 0; n < kN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
      for (int n2 = 0; n2 < kN / 16; ++n2) {
        uint32_t bf[4];
        tiles::load_b_transposed<kD>(bf, skt, n2 * 16, kk * 16);
        tiles::mma_16816<T>(s[2 * n2], qa[kk], bf[0], bf[1]);
        tiles::mma_16816<T>(s[2 * n2 + 1], qa[kk], bf[2], bf[3]);
      }

      // Online softmax on the fragments: entry (r, n, e) is row rows[r], column
      // n * 8 + 2t + e of the tile, register s[n][2 r + e].
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int c_lo = 0, c_hi = 0;
      if (rows[r] < p.N) visible_columns<kN>(p, rows[r], j0, c_lo, c_hi);
      float tile_max = neg_inf;
#pragma unroll
      for (int n = 0; n < kN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = n * 8 + 2 * t + e;
          const float x = c >= c_lo && c < c_hi && real[c] ? s[n][2 * r + e] * scale_log2 : neg_inf;
          s[n][2 * r + e] = x;
          tile_max = fmaxf(tile_max, x);
        }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_new = fmaxf(m[r], tile_max);
      // 0 while the row has seen no key (then acc and l are still 0).
      const float rescale = m[r] == neg_inf ? 0.f : exp2f(m[r] - m_new);
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = s[n][2 * r + e];
          const float pr = x == neg_inf ? 0.f : exp2f(x - m_new);
          s[n][2 * r + e] = pr;
          sum += pr;
        }
      l[r] = l[r] * rescale + sum;
      m[r] = m_new;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        acc[n][2 * r] *= rescale;
        acc[n][2 * r + 1] *= rescale;
      }
    }

    // O [16, kD] += P V, P's A fragments packed from the S accumulators.
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      const uint32_t pa[4] = {tiles::pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                              tiles::pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              tiles::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              tiles::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int n2 = 0; n2 < kD / 16; ++n2) {
        uint32_t bf[4];
        tiles::load_b<kD>(bf, svt, kk * 16, n2 * 16);
        tiles::mma_16816<T>(acc[2 * n2], pa, bf[0], bf[1]);
        tiles::mma_16816<T>(acc[2 * n2 + 1], pa, bf[2], bf[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  tiles::cp_async_wait<0>();  // the Q tile, when no key tile was walked
  __syncthreads();

  // o = acc / l through the Q tile's shared memory (rows of 16-byte chunks
  // stored coalesced), lse = (m + log2 l) ln 2; a row that saw no key gets 0
  // and -inf.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float total = l[r];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    inv[r] = total > 0.f ? 1.f / total : 0.f;
    if (t == 0 && rows[r] < p.N)
      lse[rows[r]] = total > 0.f ? (m[r] + log2f(total)) * 0.6931471805599453f : neg_inf;
  }
  tiles::stage_fragments<kD>(sq, acc, warp * 16, inv);
  __syncthreads();
  tiles::store_tile<kMmaRows, kD, kMmaThreads>(o, sq, i0, p.N);
}

// ---- backward ----

// From s = q_tile k_tile^T and dp = do_tile v_tile^T (rows [i0, i0 + kTile),
// keys [j0, j0 + kTile)) and the rows' lse and D, as in the forward:
//   P = exp(scale s - lse) on the visible entries (0 elsewhere, and in rows
//   with lse = -inf), kept in s; Pd = dropout(P) = P Z into pd (if given);
//   dS = P (dP Z - D) into ds, where dP Z is the gradient of the undropped P.
template <typename T, int kTile>
__device__ void probabilities_and_grad(const Params& p, int64_t bh, int64_t i0, int64_t j0,
                                       acc_t<T>* s, acc_t<T>* dp, int lds, T* pd, T* ds, int ldp,
                                       const acc_t<T>* lse, const acc_t<T>* delta,
                                       const uint8_t* real) {
  using A = acc_t<T>;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const A scale = static_cast<A>(p.scale);
  const A neg_inf = -INFINITY;
  for (int r = warp; r < kTile; r += kFlashWarps) {
    const int64_t i = i0 + r;
    const A L = lse[r];
    int c_lo = 0, c_hi = 0;
    if (i < p.N && L != neg_inf) visible_columns<kTile>(p, i, j0, c_lo, c_hi);
    A* srow = s + r * lds;
    A* dprow = dp + r * lds;
    for (int c = lane; c < kTile; c += kWarp) {
      const A prob = c >= c_lo && c < c_hi && real[c] ? acc_exp(srow[c] * scale - L) : A(0);
      srow[c] = prob;
      if (pd) pd[r * ldp + c] = from_acc<T>(prob);
    }
    if (p.dropout > 0) {
      __syncwarp();  // srow written by other lanes
      for_each_dropout<A>(p, bh, i, j0, c_lo, c_hi, [&](int c, A z) {
        if (pd) pd[r * ldp + c] = from_acc<T>(srow[c] * z);
        dprow[c] *= z;
      });
    }
    __syncwarp();
    const A D = delta[r];
    for (int c = lane; c < kTile; c += kWarp)
      ds[r * ldp + c] = from_acc<T>(srow[c] * (dprow[c] - D));
  }
}

// lse and D of query rows [i0, i0 + kTile) into shared memory (-inf and 0 past N).
template <typename A, int kTile>
__device__ void load_row_stats(A* lse_s, A* delta_s, const A* lse, const A* delta, int64_t i0,
                               int64_t N) {
  for (int r = threadIdx.x; r < kTile; r += kFlashThreads) {
    const int64_t i = i0 + r;
    lse_s[r] = i < N ? lse[i] : A(-INFINITY);
    delta_s[r] = i < N ? delta[i] : A(0);
  }
}

// Block: keys [j0, j0 + kTile) of batch-head bh; over the query tiles that see them:
//   dv_tile += Pd^T do_tile,  dk_tile += dS^T q_tile;  at the end dk *= scale.
template <typename T, int kTile>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_kv_kernel(Params p, const T* q, const T* k, const T* v, const T* dout,
                             const acc_t<T>* lse, const acc_t<T>* delta, T* dk, T* dv) {
  using A = acc_t<T>;
  extern __shared__ __align__(128) unsigned char flash_smem[];
  Carver carver{flash_smem};
  const KeyValueGradSmem<T> sm(carver, kTile, p.dp, p.dvp);
  const int ldq = ld_op<T>(p.dp), ldv = ld_op<T>(p.dvp), ldp = ld_op<T>(kTile);
  const int lds = ld_acc(kTile), ldk_acc = ld_acc(p.dp), ldv_acc = ld_acc(p.dvp);

  const int64_t tiles = (p.M + kTile - 1) / kTile;
  const int64_t bh = blockIdx.x / tiles, b = bh / p.H;
  const int64_t j0 = blockIdx.x % tiles * kTile;
  const int64_t j_last = std::min<int64_t>(j0 + kTile, p.M) - 1;
  q += bh * p.N * p.d;
  k += bh * p.M * p.d;
  v += bh * p.M * p.dv;
  dout += bh * p.N * p.dv;
  lse += bh * p.N;
  delta += bh * p.N;
  dk += bh * p.M * p.d;
  dv += bh * p.M * p.dv;

  load_tile<T, kTile>(sm.k, ldq, k, j0, p.M, p.d, p.dp, p.vec_d);
  load_tile<T, kTile>(sm.v, ldv, v, j0, p.M, p.dv, p.dvp, p.vec_dv);
  load_real<kTile>(sm.real, p, b, j0);
  zero_shared(sm.dk, kTile * ldk_acc);
  zero_shared(sm.dv, kTile * ldv_acc);
  int64_t i_lo = 0, i_hi = 0;
  queries_of_keys(p, j0, j_last, i_lo, i_hi);
  for (int64_t i0 = i_lo / kTile * kTile; i0 < i_hi; i0 += kTile) {
    __syncthreads();  // the previous tile's products are done with q, do, pd, ds
    load_tile<T, kTile>(sm.q, ldq, q, i0, p.N, p.d, p.dp, p.vec_d);
    load_tile<T, kTile>(sm.dout, ldv, dout, i0, p.N, p.dv, p.dvp, p.vec_dv);
    load_row_stats<A, kTile>(sm.lse, sm.delta, lse, delta, i0, p.N);
    __syncthreads();
    // s = q_tile k_tile^T, dp = do_tile v_tile^T   [kTile queries, kTile keys]
    tile_product<false, true, kTile>(sm.s, lds, sm.q, ldq, sm.k, ldq, kTile, p.dp, false);
    tile_product<false, true, kTile>(sm.dp, lds, sm.dout, ldv, sm.v, ldv, kTile, p.dvp, false);
    __syncthreads();
    probabilities_and_grad<T, kTile>(p, bh, i0, j0, sm.s, sm.dp, lds, sm.pd, sm.ds, ldp, sm.lse,
                                     sm.delta, sm.real);
    __syncthreads();
    // dv_acc [kTile keys, dvp] += Pd^T do_tile; dk_acc [kTile keys, dp] += dS^T q_tile
    tile_product<true, false, kTile>(sm.dv, ldv_acc, sm.pd, ldp, sm.dout, ldv, p.dvp, kTile, true);
    tile_product<true, false, kTile>(sm.dk, ldk_acc, sm.ds, ldp, sm.q, ldq, p.dp, kTile, true);
  }
  __syncthreads();
  store_tile<T, kTile>(dk, j0, p.M, p.d, sm.dk, ldk_acc, static_cast<A>(p.scale));
  store_tile<T, kTile>(dv, j0, p.M, p.dv, sm.dv, ldv_acc, A(1));
}

// Block: query rows [i0, i0 + kTile) of batch-head bh; over the key tiles they
// see: dq_tile += dS k_tile; at the end dq *= scale.
template <typename T, int kTile>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_q_kernel(Params p, const T* q, const T* k, const T* v, const T* dout,
                            const acc_t<T>* lse, const acc_t<T>* delta, T* dq) {
  using A = acc_t<T>;
  extern __shared__ __align__(128) unsigned char flash_smem[];
  Carver carver{flash_smem};
  const QueryGradSmem<T> sm(carver, kTile, p.dp, p.dvp);
  const int ldq = ld_op<T>(p.dp), ldv = ld_op<T>(p.dvp), ldp = ld_op<T>(kTile);
  const int lds = ld_acc(kTile), ldq_acc = ld_acc(p.dp);

  // The last query tiles first: under causality they see the most keys.
  const int64_t tiles = (p.N + kTile - 1) / kTile;
  const int64_t bh = blockIdx.x / tiles, b = bh / p.H;
  const int64_t i0 = (tiles - 1 - blockIdx.x % tiles) * kTile;
  const int64_t i_last = std::min<int64_t>(i0 + kTile, p.N) - 1;
  q += bh * p.N * p.d;
  k += bh * p.M * p.d;
  v += bh * p.M * p.dv;
  dout += bh * p.N * p.dv;
  lse += bh * p.N;
  delta += bh * p.N;
  dq += bh * p.N * p.d;

  load_tile<T, kTile>(sm.q, ldq, q, i0, p.N, p.d, p.dp, p.vec_d);
  load_tile<T, kTile>(sm.dout, ldv, dout, i0, p.N, p.dv, p.dvp, p.vec_dv);
  load_row_stats<A, kTile>(sm.lse, sm.delta, lse, delta, i0, p.N);
  zero_shared(sm.dq, kTile * ldq_acc);
  int64_t j_lo = 0, j_hi = 0;
  keys_of_queries(p, i0, i_last, j_lo, j_hi);
  for (int64_t j0 = j_lo / kTile * kTile; j0 < j_hi; j0 += kTile) {
    __syncthreads();  // the previous tile's product is done with k, ds
    load_tile<T, kTile>(sm.k, ldq, k, j0, p.M, p.d, p.dp, p.vec_d);
    load_tile<T, kTile>(sm.v, ldv, v, j0, p.M, p.dv, p.dvp, p.vec_dv);
    load_real<kTile>(sm.real, p, b, j0);
    __syncthreads();
    tile_product<false, true, kTile>(sm.s, lds, sm.q, ldq, sm.k, ldq, kTile, p.dp, false);
    tile_product<false, true, kTile>(sm.dp, lds, sm.dout, ldv, sm.v, ldv, kTile, p.dvp, false);
    __syncthreads();
    probabilities_and_grad<T, kTile>(p, bh, i0, j0, sm.s, sm.dp, lds, nullptr, sm.ds, ldp, sm.lse,
                                     sm.delta, sm.real);
    __syncthreads();
    // dq_acc [kTile, dp] += dS k_tile
    tile_product<false, false, kTile>(sm.dq, ldq_acc, sm.ds, ldp, sm.k, ldq, p.dp, kTile, true);
  }
  __syncthreads();
  store_tile<T, kTile>(dq, i0, p.N, p.d, sm.dq, ldq_acc, static_cast<A>(p.scale));
}

// ---- backward on the tensor-core tile engine (FlashEngine::mma) ----
// FlashAttention-2's backward, deterministic as the tiled one: a kernel per
// key tile (dk, dv) and one per query tile (dq), no atomics. Each recomputes
// P = 2^(scale log2(e) s - lse log2(e)) on S fragments in registers; dS = P
// (dP - D) with D = rowsum(do * o). The key kernel works on the transposes,
// S^T = K Q^T and dP^T = V do^T with a warp's 16 keys as the rows, so P^T and
// dS^T are the A fragments of dv += P^T do and dk += dS^T q straight from the
// accumulators; the query kernel's dS is the A fragment of dq += dS K. Q, do,
// K and V fragments are read from shared memory (ldmatrix) at each use: the
// accumulators (dk and dv, or dq) take the registers.

// The queries [lo, hi) that see key j by position (causality, the band),
// empty when the key does not exist or is padding.
__device__ __forceinline__ void queries_of_key(const Params& p, int64_t b, int64_t j, int64_t& lo,
                                               int64_t& hi) {
  lo = p.causal ? j : 0;
  hi = p.N;
  if (p.window > 0) {
    lo = std::max<int64_t>(lo, (j / p.window - p.look_forward) * p.window);
    hi = std::min<int64_t>(hi, (j / p.window + p.look_backward + 1) * p.window);
  }
  if (j >= p.M || (p.kpm != nullptr && p.kpm[b * p.M + j] == 0)) hi = lo;
}

template <int kD>
constexpr size_t mma_backward_kv_smem_bytes(size_t elem) {
  // k, v [64, kD]; q, do [2 stages][64, kD]; lse, D [2][64] floats
  return 6 * kMmaRows * kD * elem + 4 * kMmaRows * sizeof(float);
}

template <typename T, int kD>
__global__ void __launch_bounds__(kMmaThreads)
    flash_mma_backward_kv_kernel(Params p, const T* q, const T* k, const T* v, const T* dout,
                                 const float* lse, const float* delta, T* dk, T* dv) {
  constexpr int kR = kMmaRows;             // keys per block, and queries per tile
  constexpr int kSub = kD > 64 ? 32 : kR;  // queries per pass over a tile
  extern __shared__ __align__(128) unsigned char flash_smem[];
  T* sk = reinterpret_cast<T*>(flash_smem);  // [kR, kD] swizzled
  T* sv = sk + kR * kD;
  T* sq = sv + kR * kD;                                       // [2][kR, kD]
  T* sdo = sq + 2 * kR * kD;                                  // [2][kR, kD]
  float* slse = reinterpret_cast<float*>(sdo + 2 * kR * kD);  // [2][kR] lse log2(e), -inf: none
  float* sdelta = slse + 2 * kR;                              // [2][kR]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int g = lane / 4, t = lane % 4;

  const int64_t tiles = (p.M + kR - 1) / kR;
  const int64_t bh = blockIdx.x / tiles, b = bh / p.H;
  const int64_t j0 = blockIdx.x % tiles * kR;
  const int64_t j_last = std::min<int64_t>(j0 + kR, p.M) - 1;
  q += bh * p.N * kD;
  k += bh * p.M * kD;
  v += bh * p.M * kD;
  dout += bh * p.N * kD;
  lse += bh * p.N;
  delta += bh * p.N;
  dk += bh * p.M * kD;
  dv += bh * p.M * kD;

  constexpr float kLog2e = 1.4426950408889634f;
  int64_t i_lo = 0, i_hi = 0, i_start = 0;
  queries_of_keys(p, j0, j_last, i_lo, i_hi);
  const int query_tiles = tiles_covering(i_lo, i_hi, kR, i_start);
  auto load_queries = [&](int stage, int64_t i0) {
    tiles::load_tile_async<kR, kD, kMmaThreads>(sq + stage * kR * kD, q, i0, p.N);
    tiles::load_tile_async<kR, kD, kMmaThreads>(sdo + stage * kR * kD, dout, i0, p.N);
    for (int r = threadIdx.x; r < kR; r += kMmaThreads) {
      const int64_t i = i0 + r;
      const float L = i < p.N ? lse[i] : -INFINITY;
      slse[stage * kR + r] = L == -INFINITY ? L : L * kLog2e;
      sdelta[stage * kR + r] = i < p.N ? delta[i] : 0.f;
    }
  };
  tiles::load_tile_async<kR, kD, kMmaThreads>(sk, k, j0, p.M);
  tiles::load_tile_async<kR, kD, kMmaThreads>(sv, v, j0, p.M);
  if (query_tiles > 0) load_queries(0, i_start);
  tiles::cp_async_commit();

  const float scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  // This thread's two keys (rows g and g + 8 of the warp's 16) and the queries
  // that see them, counted from i_start (32-bit: registers are short at d = 128).
  int seen_lo[2], seen_hi[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int64_t lo = 0, hi = 0;
    queries_of_key(p, b, j0 + warp * 16 + g + 8 * r, lo, hi);
    const int64_t span = static_cast<int64_t>(query_tiles) * kR;
    seen_lo[r] = static_cast<int>(std::min(std::max<int64_t>(lo - i_start, 0), span));
    seen_hi[r] = static_cast<int>(std::min(std::max<int64_t>(hi - i_start, 0), span));
  }
  float acc_dk[kD / 8][4], acc_dv[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[n][e] = acc_dv[n][e] = 0.f;

  for (int it = 0; it < query_tiles; ++it) {
    const int stage = it & 1;
    const int64_t i0 = i_start + static_cast<int64_t>(it) * kR;
    tiles::next_stage(it + 1 < query_tiles, [&] { load_queries(stage ^ 1, i0 + kR); });
    const T* sqt = sq + stage * kR * kD;
    const T* sdot = sdo + stage * kR * kD;
    const float* lse_t = slse + stage * kR;
    const float* delta_t = sdelta + stage * kR;

    // The tile's queries in passes of kSub: S^T = K Q^T and dP^T = V do^T
    // [16 keys, kSub queries] of this warp (at d = 128 a pass of 32 keeps the
    // accumulators of dk and dv in registers without spilling).
#pragma unroll 1  // unrolled, K and V's fragments would stay live across passes and spill
    for (int h = 0; h < kR / kSub; ++h) {
      float st[kSub / 8][4], dpt[kSub / 8][4];
#pragma unroll
      for (int n = 0; n < kSub / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t ka[4], va[4];
        tiles::load_a<kD>(ka, sk, warp * 16, kk * 16);
        tiles::load_a<kD>(va, sv, warp * 16, kk * 16);
#pragma unroll
        for (int n2 = 0; n2 < kSub / 16; ++n2) {
          uint32_t bq[4], bo[4];
          tiles::load_b_transposed<kD>(bq, sqt, h * kSub + n2 * 16, kk * 16);
          tiles::load_b_transposed<kD>(bo, sdot, h * kSub + n2 * 16, kk * 16);
          tiles::mma_16816<T>(st[2 * n2], ka, bq[0], bq[1]);
          tiles::mma_16816<T>(st[2 * n2 + 1], ka, bq[2], bq[3]);
          tiles::mma_16816<T>(dpt[2 * n2], va, bo[0], bo[1]);
          tiles::mma_16816<T>(dpt[2 * n2 + 1], va, bo[2], bo[3]);
        }
      }
      // P^T and dS^T = P^T (dP^T - D): entry (r, n, e) is key j0 + 16 warp + g
      // + 8 r, query i0 + c with c = h kSub + n * 8 + 2t + e (register [n][2 r + e]).
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int n = 0; n < kSub / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = h * kSub + n * 8 + 2 * t + e;
            const int i = it * kR + c;  // the query i_start + i
            const float L = lse_t[c];
            const bool seen = i >= seen_lo[r] && i < seen_hi[r] && L != -INFINITY;
            const float pr = seen ? exp2f(st[n][2 * r + e] * scale_log2 - L) : 0.f;
            st[n][2 * r + e] = pr;
            dpt[n][2 * r + e] = pr * (dpt[n][2 * r + e] - delta_t[c]);
          }
          // dv += P^T do, then dk += dS^T q (the queries are the k dimension).
#pragma unroll
      for (int kk = 0; kk < kSub / 16; ++kk) {
        const uint32_t pa[4] = {tiles::pack2<T>(st[2 * kk][0], st[2 * kk][1]),
                                tiles::pack2<T>(st[2 * kk][2], st[2 * kk][3]),
                                tiles::pack2<T>(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                                tiles::pack2<T>(st[2 * kk + 1][2], st[2 * kk + 1][3])};
#pragma unroll
        for (int n2 = 0; n2 < kD / 16; ++n2) {
          uint32_t bo[4];
          tiles::load_b<kD>(bo, sdot, h * kSub + kk * 16, n2 * 16);
          tiles::mma_16816<T>(acc_dv[2 * n2], pa, bo[0], bo[1]);
          tiles::mma_16816<T>(acc_dv[2 * n2 + 1], pa, bo[2], bo[3]);
        }
      }
#pragma unroll
      for (int kk = 0; kk < kSub / 16; ++kk) {
        const uint32_t da[4] = {tiles::pack2<T>(dpt[2 * kk][0], dpt[2 * kk][1]),
                                tiles::pack2<T>(dpt[2 * kk][2], dpt[2 * kk][3]),
                                tiles::pack2<T>(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                                tiles::pack2<T>(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
        for (int n2 = 0; n2 < kD / 16; ++n2) {
          uint32_t bq[4];
          tiles::load_b<kD>(bq, sqt, h * kSub + kk * 16, n2 * 16);
          tiles::mma_16816<T>(acc_dk[2 * n2], da, bq[0], bq[1]);
          tiles::mma_16816<T>(acc_dk[2 * n2 + 1], da, bq[2], bq[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  tiles::cp_async_wait<0>();  // K, V when no query tile was walked
  __syncthreads();

  // dk = scale acc_dk and dv = acc_dv through the two query stages' shared
  // memory, stored as 16-byte rows.
  const float scale = static_cast<float>(p.scale);
  tiles::stage_fragments<kD>(sq, acc_dk, warp * 16, {scale, scale});
  tiles::stage_fragments<kD>(sq + kR * kD, acc_dv, warp * 16, {1.f, 1.f});
  __syncthreads();
  tiles::store_tile<kR, kD, kMmaThreads>(dk, sq, j0, p.M);
  tiles::store_tile<kR, kD, kMmaThreads>(dv, sq + kR * kD, j0, p.M);
}

template <int kD>
constexpr size_t mma_backward_q_smem_bytes(size_t elem) {
  // q, do [64, kD]; k, v [2 stages][64, kD]; real [2][64]
  return 6 * kMmaRows * kD * elem + 2 * kMmaKeys;
}

template <typename T, int kD>
__global__ void __launch_bounds__(kMmaThreads)
    flash_mma_backward_q_kernel(Params p, const T* q, const T* k, const T* v, const T* dout,
                                const float* lse, const float* delta, T* dq) {
  constexpr int kN = kMmaKeys;
  extern __shared__ __align__(128) unsigned char flash_smem[];
  T* sq = reinterpret_cast<T*>(flash_smem);  // [kMmaRows, kD] swizzled
  T* sdo = sq + kMmaRows * kD;
  T* sk = sdo + kMmaRows * kD;                                    // [2][kN, kD]
  T* sv = sk + 2 * kN * kD;                                       // [2][kN, kD]
  uint8_t* sreal = reinterpret_cast<uint8_t*>(sv + 2 * kN * kD);  // [2][kN]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int g = lane / 4, t = lane % 4;

  const int64_t tiles = (p.N + kMmaRows - 1) / kMmaRows;
  const int64_t bh = blockIdx.x / tiles, b = bh / p.H;
  const int64_t i0 = (tiles - 1 - blockIdx.x % tiles) * kMmaRows;
  const int64_t i_last = std::min<int64_t>(i0 + kMmaRows, p.N) - 1;
  q += bh * p.N * kD;
  k += bh * p.M * kD;
  v += bh * p.M * kD;
  dout += bh * p.N * kD;
  lse += bh * p.N;
  delta += bh * p.N;
  dq += bh * p.N * kD;

  int64_t j_lo = 0, j_hi = 0, j_start = 0;
  keys_of_queries(p, i0, i_last, j_lo, j_hi);
  const int key_tiles = tiles_covering(j_lo, j_hi, kN, j_start);
  tiles::load_tile_async<kMmaRows, kD, kMmaThreads>(sq, q, i0, p.N);
  tiles::load_tile_async<kMmaRows, kD, kMmaThreads>(sdo, dout, i0, p.N);
  if (key_tiles > 0) load_key_stage<kD>(sk, sv, sreal, 0, k, v, j_start, p, b);
  tiles::cp_async_commit();

  const float scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  const int64_t rows[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
  float lse2[2], D[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float L = rows[r] < p.N ? lse[rows[r]] : -INFINITY;
    lse2[r] = L == -INFINITY ? L : L * 1.4426950408889634f;
    D[r] = rows[r] < p.N ? delta[rows[r]] : 0.f;
  }
  float acc[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;

  for (int it = 0; it < key_tiles; ++it) {
    const int stage = it & 1;
    const int64_t j0 = j_start + static_cast<int64_t>(it) * kN;
    tiles::next_stage(it + 1 < key_tiles,
                      [&] { load_key_stage<kD>(sk, sv, sreal, stage ^ 1, k, v, j0 + kN, p, b); });
    const T* skt = sk + stage * kN * kD;
    const T* svt = sv + stage * kN * kD;
    const uint8_t* real = sreal + stage * kN;

    // S = Q K^T and dP = do V^T [16, kN] of this warp.
    float s[kN / 8][4], dp[kN / 8][4];
#pragma unroll
    for (int n = 0; n < kN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t qa[4], oa[4];
      tiles::load_a<kD>(qa, sq, warp * 16, kk * 16);
      tiles::load_a<kD>(oa, sdo, warp * 16, kk * 16);
#pragma unroll
      for (int n2 = 0; n2 < kN / 16; ++n2) {
        uint32_t bk[4], bv[4];
        tiles::load_b_transposed<kD>(bk, skt, n2 * 16, kk * 16);
        tiles::load_b_transposed<kD>(bv, svt, n2 * 16, kk * 16);
        tiles::mma_16816<T>(s[2 * n2], qa, bk[0], bk[1]);
        tiles::mma_16816<T>(s[2 * n2 + 1], qa, bk[2], bk[3]);
        tiles::mma_16816<T>(dp[2 * n2], oa, bv[0], bv[1]);
        tiles::mma_16816<T>(dp[2 * n2 + 1], oa, bv[2], bv[3]);
      }
    }
    // dS = P (dP - D) in place of dp; entry (r, n, e) is row rows[r], key j0 + n * 8 + 2t + e.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int c_lo = 0, c_hi = 0;
      if (rows[r] < p.N && lse2[r] != -INFINITY) visible_columns<kN>(p, rows[r], j0, c_lo, c_hi);
#pragma unroll
      for (int n = 0; n < kN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = n * 8 + 2 * t + e;
          const float pr = c >= c_lo && c < c_hi && real[c]
                               ? exp2f(s[n][2 * r + e] * scale_log2 - lse2[r])
                               : 0.f;
          dp[n][2 * r + e] = pr * (dp[n][2 * r + e] - D[r]);
        }
    }
    // dq += dS K (the keys are the k dimension).
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      const uint32_t da[4] = {tiles::pack2<T>(dp[2 * kk][0], dp[2 * kk][1]),
                              tiles::pack2<T>(dp[2 * kk][2], dp[2 * kk][3]),
                              tiles::pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                              tiles::pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
#pragma unroll
      for (int n2 = 0; n2 < kD / 16; ++n2) {
        uint32_t bk[4];
        tiles::load_b<kD>(bk, skt, kk * 16, n2 * 16);
        tiles::mma_16816<T>(acc[2 * n2], da, bk[0], bk[1]);
        tiles::mma_16816<T>(acc[2 * n2 + 1], da, bk[2], bk[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  tiles::cp_async_wait<0>();
  __syncthreads();

  // dq = scale acc through the Q tile's shared memory, stored as 16-byte rows.
  const float scale = static_cast<float>(p.scale);
  tiles::stage_fragments<kD>(sq, acc, warp * 16, {scale, scale});
  __syncthreads();
  tiles::store_tile<kMmaRows, kD, kMmaThreads>(dq, sq, i0, p.N);
}

// ---- launch ----

Params make_params(const FlashArgs& a, bool vec_d, bool vec_dv) {
  Params p;
  p.N = a.N;
  p.M = a.M;
  p.H = a.H;
  p.d = static_cast<int>(a.d);
  p.dv = static_cast<int>(a.dv);
  p.dp = pad16(a.d);
  p.dvp = pad16(a.dv);
  p.scale = a.scale;
  p.causal = a.causal;
  p.kpm = a.kpm;
  p.window = a.window;
  p.look_backward = a.look_backward;
  p.look_forward = a.look_forward;
  p.dropout = a.dropout;
  p.keep = a.dropout > 0 ? 1.0 / (1.0 - a.dropout) : 1.0;
  p.drop_row = a.window > 0 ? a.window * (a.look_backward + 1 + a.look_forward) : a.M;
  p.seed = a.seed;
  p.offset = a.offset;
  p.first = a.first;
  const bool half = a.dtype == DType::bf16 || a.dtype == DType::f16;
  p.vec_d = half && vec_d && a.d % 8 == 0;
  p.vec_dv = half && vec_dv && a.dv % 8 == 0;
  return p;
}

bool aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

// The largest tile whose shared memory (bytes(tile)) lets two blocks share an
// SM, else the largest that fits one block; fails naming `what` if none does.
template <typename Bytes>
int pick_tile(int device, Bytes bytes, const char* what) {
  int per_block = 0, per_sm = 0;
  FORGE_CUDA_CHECK(
      cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  FORGE_CUDA_CHECK(
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  constexpr size_t kReservedPerBlock = 1024;  // the runtime's share of each block's memory
  for (int tile : {64, 32, 16})
    if (bytes(tile) <= static_cast<size_t>(per_block) &&
        2 * (bytes(tile) + kReservedPerBlock) <= static_cast<size_t>(per_sm))
      return tile;
  for (int tile : {64, 32, 16})
    if (bytes(tile) <= static_cast<size_t>(per_block)) return tile;
  fail(what);
}

// Blocks of a 1-d grid over `count` tiles.
unsigned grid_of(int64_t count) {
  if (count > INT_MAX) fail("flash attention: more than 2^31 - 1 tiles (batch * heads * tiles)");
  return static_cast<unsigned>(count);
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
}

template <typename T, int kTile>
void launch_forward(const Params& p, int64_t BH, const void* q, const void* k, const void* v,
                    void* o, void* lse, int device) {
  const size_t bytes = smem_bytes<ForwardSmem, T>(kTile, p);
  allow_smem(flash_forward_kernel<T, kTile>, bytes);
  flash_forward_kernel<T, kTile>
      <<<grid_of(BH * ((p.N + kTile - 1) / kTile)), kFlashThreads, bytes, stream(device)>>>(
          p, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
          static_cast<T*>(o), static_cast<acc_t<T>*>(lse));
  FORGE_CUDA_CHECK_LAUNCH("flash_forward");
}

template <typename T, int kD>
void launch_mma_forward(const Params& p, int64_t BH, const void* q, const void* k, const void* v,
                        void* o, void* lse, int device) {
  const size_t bytes = mma_forward_smem_bytes<kD>(sizeof(T));
  allow_smem(flash_mma_forward_kernel<T, kD>, bytes);
  flash_mma_forward_kernel<T, kD>
      <<<grid_of(BH * ((p.N + kMmaRows - 1) / kMmaRows)), kMmaThreads, bytes, stream(device)>>>(
          p, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
          static_cast<T*>(o), static_cast<float*>(lse));
  FORGE_CUDA_CHECK_LAUNCH("flash_forward (mma)");
}

template <typename T, int kD>
void launch_mma_backward(const Params& p, int64_t BH, const void* q, const void* k, const void* v,
                         const void* dout, const void* lse, const void* delta, void* dq, void* dk,
                         void* dv, int device) {
  const auto* qt = static_cast<const T*>(q);
  const auto* kt = static_cast<const T*>(k);
  const auto* vt = static_cast<const T*>(v);
  const auto* dot = static_cast<const T*>(dout);
  const auto* lsef = static_cast<const float*>(lse);
  const auto* deltaf = static_cast<const float*>(delta);
  if (p.M > 0) {
    const size_t bytes = mma_backward_kv_smem_bytes<kD>(sizeof(T));
    allow_smem(flash_mma_backward_kv_kernel<T, kD>, bytes);
    flash_mma_backward_kv_kernel<T, kD>
        <<<grid_of(BH * ((p.M + kMmaRows - 1) / kMmaRows)), kMmaThreads, bytes, stream(device)>>>(
            p, qt, kt, vt, dot, lsef, deltaf, static_cast<T*>(dk), static_cast<T*>(dv));
    FORGE_CUDA_CHECK_LAUNCH("flash_backward (mma, dk, dv)");
  }
  if (p.N > 0) {
    const size_t bytes = mma_backward_q_smem_bytes<kD>(sizeof(T));
    allow_smem(flash_mma_backward_q_kernel<T, kD>, bytes);
    flash_mma_backward_q_kernel<T, kD>
        <<<grid_of(BH * ((p.N + kMmaRows - 1) / kMmaRows)), kMmaThreads, bytes, stream(device)>>>(
            p, qt, kt, vt, dot, lsef, deltaf, static_cast<T*>(dq));
    FORGE_CUDA_CHECK_LAUNCH("flash_backward (mma, dq)");
  }
}

// Whether FlashEngine::mma takes this forward or backward: bf16 / f16, d = dv
// = 64 or 128, no dropout, every tensor 16-byte aligned (its tile loads and
// stores are 16-byte vectors). Other cases run the tiled kernels.
bool mma_takes(const FlashArgs& a, std::initializer_list<const void*> tensors) {
  const bool engine = a.engine == FlashEngine::mma || a.engine == FlashEngine::cudnn;
  if (!engine || !(a.dtype == DType::bf16 || a.dtype == DType::f16) || a.d != a.dv ||
      !(a.d == 64 || a.d == 128) || a.dropout != 0)
    return false;
  for (const void* t : tensors)
    if (!aligned16(t)) return false;
  return true;
}

template <typename T, int kTile>
void launch_backward_kv(const Params& p, int64_t BH, const void* q, const void* k, const void* v,
                        const void* dout, const void* lse, const void* delta, void* dk, void* dv,
                        int device) {
  const size_t bytes = smem_bytes<KeyValueGradSmem, T>(kTile, p);
  allow_smem(flash_backward_kv_kernel<T, kTile>, bytes);
  flash_backward_kv_kernel<T, kTile>
      <<<grid_of(BH * ((p.M + kTile - 1) / kTile)), kFlashThreads, bytes, stream(device)>>>(
          p, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
          static_cast<const T*>(dout), static_cast<const acc_t<T>*>(lse),
          static_cast<const acc_t<T>*>(delta), static_cast<T*>(dk), static_cast<T*>(dv));
  FORGE_CUDA_CHECK_LAUNCH("flash_backward (dk, dv)");
}

template <typename T, int kTile>
void launch_backward_q(const Params& p, int64_t BH, const void* q, const void* k, const void* v,
                       const void* dout, const void* lse, const void* delta, void* dq, int device) {
  const size_t bytes = smem_bytes<QueryGradSmem, T>(kTile, p);
  allow_smem(flash_backward_q_kernel<T, kTile>, bytes);
  flash_backward_q_kernel<T, kTile>
      <<<grid_of(BH * ((p.N + kTile - 1) / kTile)), kFlashThreads, bytes, stream(device)>>>(
          p, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
          static_cast<const T*>(dout), static_cast<const acc_t<T>*>(lse),
          static_cast<const acc_t<T>*>(delta), static_cast<T*>(dq));
  FORGE_CUDA_CHECK_LAUNCH("flash_backward (dq)");
}

constexpr const char* kTooWide =
    "flash attention: the head dims need more shared memory than this GPU has (d, dv <= 256 "
    "fit an H100)";

}  // namespace

void flash_forward(const FlashArgs& a, const void* q, const void* k, const void* v, void* o,
                   void* lse, int device) {
  const int64_t BH = a.B * a.H;
  if (BH == 0 || a.N == 0) return;
  DeviceGuard guard(device);
  if (cudnn_sdpa_takes(a) && cudnn_sdpa_forward(a, q, k, v, o, lse, device)) return;
  const Params p = make_params(a, aligned16(q) && aligned16(k), aligned16(v));
  if (mma_takes(a, {q, k, v, o})) {
    const bool bf16 = a.dtype == DType::bf16;
    if (a.d == 64)
      return bf16 ? launch_mma_forward<__nv_bfloat16, 64>(p, BH, q, k, v, o, lse, device)
                  : launch_mma_forward<__half, 64>(p, BH, q, k, v, o, lse, device);
    return bf16 ? launch_mma_forward<__nv_bfloat16, 128>(p, BH, q, k, v, o, lse, device)
                : launch_mma_forward<__half, 128>(p, BH, q, k, v, o, lse, device);
  }
  FORGE_CUDA_DISPATCH_FLOAT(a.dtype, "attention (flash forward)", [&] {
    const int tile = pick_tile(
        device, [&](int t) { return smem_bytes<ForwardSmem, scalar_t>(t, p); }, kTooWide);
    if (tile == 64) return launch_forward<scalar_t, 64>(p, BH, q, k, v, o, lse, device);
    if (tile == 32) return launch_forward<scalar_t, 32>(p, BH, q, k, v, o, lse, device);
    return launch_forward<scalar_t, 16>(p, BH, q, k, v, o, lse, device);
  });
}

void flash_backward(const FlashArgs& a, const void* q, const void* k, const void* v, const void* o,
                    const void* lse, const void* dout, void* scratch, void* dq, void* dk, void* dv,
                    int device) {
  const int64_t BH = a.B * a.H;
  if (BH == 0) return;
  DeviceGuard guard(device);
  if (cudnn_sdpa_takes(a) && cudnn_sdpa_backward(a, q, k, v, o, lse, dout, dq, dk, dv, device))
    return;
  const Params p = make_params(a, aligned16(q) && aligned16(k), aligned16(v) && aligned16(dout));
  FORGE_CUDA_DISPATCH_FLOAT(a.dtype, "attention (flash backward)", [&] {
    const int64_t rows = BH * a.N;
    if (rows > 0) {
      // scratch [BH, N] = rowsum(do * o)
      row_dot_kernel<scalar_t><<<grid_for(rows * kWarp, device), kThreads, 0, stream(device)>>>(
          static_cast<const scalar_t*>(dout), static_cast<const scalar_t*>(o), rows, a.dv,
          static_cast<acc_type*>(scratch));
      FORGE_CUDA_CHECK_LAUNCH("flash_backward (rowsum(do * o))");
    }
    if constexpr (std::is_same_v<scalar_t, __nv_bfloat16> || std::is_same_v<scalar_t, __half>) {
      if (mma_takes(a, {q, k, v, o, dout, dq, dk, dv})) {
        if (a.d == 64)
          launch_mma_backward<scalar_t, 64>(p, BH, q, k, v, dout, lse, scratch, dq, dk, dv, device);
        else
          launch_mma_backward<scalar_t, 128>(p, BH, q, k, v, dout, lse, scratch, dq, dk, dv,
                                             device);
        return;
      }
    }
    if (a.M > 0) {
      const int tile = pick_tile(
          device, [&](int t) { return smem_bytes<KeyValueGradSmem, scalar_t>(t, p); }, kTooWide);
      if (tile == 64)
        launch_backward_kv<scalar_t, 64>(p, BH, q, k, v, dout, lse, scratch, dk, dv, device);
      else if (tile == 32)
        launch_backward_kv<scalar_t, 32>(p, BH, q, k, v, dout, lse, scratch, dk, dv, device);
      else
        launch_backward_kv<scalar_t, 16>(p, BH, q, k, v, dout, lse, scratch, dk, dv, device);
    }
    if (rows > 0) {
      const int tile = pick_tile(
          device, [&](int t) { return smem_bytes<QueryGradSmem, scalar_t>(t, p); }, kTooWide);
      if (tile == 64)
        launch_backward_q<scalar_t, 64>(p, BH, q, k, v, dout, lse, scratch, dq, device);
      else if (tile == 32)
        launch_backward_q<scalar_t, 32>(p, BH, q, k, v, dout, lse, scratch, dq, device);
      else
        launch_backward_q<scalar_t, 16>(p, BH, q, k, v, dout, lse, scratch, dq, device);
    }
  });
}

}  // namespace forge::cuda
