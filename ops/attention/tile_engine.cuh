// The tile engine of the CUDA attention kernels (issue 29), at header level.
// Two paths:
// - tensor cores, for bf16 / f16 operands with f32 accumulators (sm_80 and
//   later): 16-byte asynchronous tile loads into swizzled shared memory,
//   ldmatrix fragment loads, mma.sync m16n8k16 products; a kernel built on it
//   keeps its operand fragments and accumulators in registers, and shared
//   memory only stages tiles (softmax / local: flash_cuda.cu's mma sections);
// - FMA, for products in f32 / f64 (and the families whose bf16 / f16 kernels
//   still compute in the accumulation type): fma_tile_product, a 64 x 64
//   output tile per block of 256 threads, operands read through accessors
//   (FAVOR+, the linear-family core, TaylorShift).
//
// Fragments of one warp (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4:
//   A [16 x 16] row-major, 4 registers of two 16-bit values:
//     a[0] = (row g,     cols 2t, 2t+1)   a[1] = (row g + 8, cols 2t, 2t+1)
//     a[2] = (row g,     cols 2t+8, 2t+9) a[3] = (row g + 8, cols 2t+8, 2t+9)
//   B [16 x 8] (k x n), 2 registers: b[0] = (k 2t, 2t+1; col g), b[1] = (k 2t+8, 2t+9; col g)
//   C [16 x 8] f32, 4 registers: c[0], c[1] = (row g, cols 2t, 2t+1), c[2], c[3] = (row g + 8, ...)
// so the C fragments of two adjacent n-tiles, packed in pairs, are the A
// fragment of the next product (FlashAttention-2's P V without shared memory).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace forge::cuda::tiles {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through registers (cp.async.cg:
// cached in L2 only). With `valid` false the 16 bytes are zero-filled and src
// is not read (src-size 0).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

// Closes the group of cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until at most kPending committed groups are still in flight (the
// calling thread's own copies; a __syncthreads() makes them visible to all).
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8 x 8 matrices of 16-bit values from shared memory; lanes 8m .. 8m + 7
// give the addresses of matrix m's rows, and r[m] is its fragment (lane: row
// lane / 4, values 2 (lane % 4), +1). `trans` loads each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// c += a b, one m16n8k16 product of T (bf16 or f16) with f32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "mma_16816 takes bf16 or f16 operands");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T and packed, x in the low half (the smaller column).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// ---- swizzled tiles ----
// A row-major tile of 16-bit values with kCols columns (a multiple of 64: 8 or
// more 16-byte chunks a row). Chunk c of row r is stored at chunk c ^ (r % 8)
// of that row, so the 8 rows one ldmatrix matrix reads, or 8 rows written at
// the same column, fall in 8 different 16-byte bank groups: no bank conflicts
// without padding.
template <int kCols>
__device__ __forceinline__ int swizzled(int r, int c) {
  static_assert(kCols % 64 == 0, "swizzled tiles have a multiple of 64 columns");
  return r * kCols + (((c >> 3) ^ (r & 7)) << 3) + (c & 7);
}

// Rows [row0, row0 + kRows) of src [len, kCols] (global, dense, 16-byte
// aligned) into the swizzled tile, asynchronously; rows past len are zeros.
// Every one of the block's kThreads threads calls it; commit and wait after.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* src, int64_t row0, int64_t len) {
  constexpr int kChunks = kCols / 8;
  for (int e = threadIdx.x; e < kRows * kChunks; e += kThreads) {
    const int r = e / kChunks, c = e % kChunks * 8;
    const int64_t row = row0 + r;
    const bool valid = row < len;
    cp_async16(tile + swizzled<kCols>(r, c), valid ? src + row * kCols + c : src, valid);
  }
}

// The A fragment of rows [r0, r0 + 16), columns [k0, k0 + 16) of a swizzled
// row-major tile.
template <int kCols, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int r0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(a, tile + swizzled<kCols>(r0 + lane % 16, k0 + lane / 16 * 8));
}

// B fragments of the product with the transpose of a swizzled [n, k] tile
// (B = tile^T, as K in Q K^T), for the n-tiles n0 and n0 + 8 and k-step k0:
// b[0], b[1] of n-tile n0, then b[0], b[1] of n-tile n0 + 8.
template <int kCols, typename T>
__device__ __forceinline__ void load_b_transposed(uint32_t (&b)[4], const T* tile, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(b, tile + swizzled<kCols>(n0 + lane % 8 + lane / 16 * 8, k0 + (lane / 8) % 2 * 8));
}

// B fragments of the product with a swizzled [k, n] tile (B = tile, as V in
// P V), for the k-step k0 and the n-tiles n0 and n0 + 8, in the order above.
template <int kCols, typename T>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const T* tile, int k0, int n0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4_trans(b,
                    tile + swizzled<kCols>(k0 + lane % 8 + (lane / 8) % 2 * 8, n0 + lane / 16 * 8));
}

// One step of a two-stage cp.async pipeline: with a next tile, load_next()
// issues its copies into the other stage and this waits for all but those;
// without, for everything. Then every thread may read the current stage.
template <typename Load>
__device__ __forceinline__ void next_stage(bool has_next, Load&& load_next) {
  if (has_next) {
    load_next();
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

// This thread's part of a warp's [16, kCols] f32 accumulator fragments (n-tiles
// of 8 columns, C layout above), rows row0 + g and row0 + g + 8 times
// scale[0] and scale[1], rounded to T into a swizzled tile.
template <int kCols, typename T>
__device__ __forceinline__ void stage_fragments(T* tile, const float (&acc)[kCols / 8][4], int row0,
                                                const float (&scale)[2]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n)
      *reinterpret_cast<uint32_t*>(tile + swizzled<kCols>(row0 + g + 8 * r, n * 8 + 2 * t)) =
          pack2<T>(acc[n][2 * r] * scale[r], acc[n][2 * r + 1] * scale[r]);
}

// Rows [row0, row0 + kRows) of dst [len, kCols] (global, dense, 16-byte
// aligned) = the swizzled tile, 16 bytes a store; rows past len are skipped.
// Every one of the block's kThreads threads calls it.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void store_tile(T* dst, const T* tile, int64_t row0, int64_t len) {
  constexpr int kChunks = kCols / 8;
  for (int e = threadIdx.x; e < kRows * kChunks; e += kThreads) {
    const int r = e / kChunks, c = e % kChunks * 8;
    if (row0 + r < len)
      *reinterpret_cast<uint4*>(dst + (row0 + r) * kCols + c) =
          *reinterpret_cast<const uint4*>(tile + swizzled<kCols>(r, c));
  }
}

// ---- FMA tile products ----
// A block of kFmaThreads = 256 threads (kFmaSide x kFmaSide) accumulates a
// kFmaTile x kFmaTile = 64 x 64 output tile, each thread kFmaPer x kFmaPer =
// 4 x 4 entries: its entry [r][c] is output row fma_row(r), column
// fma_col(c). Both operands go through shared memory in k-steps of
// kFmaDepth (16; 8 for f64, which keeps the kernels that hold a [64, 65]
// matrix beside it under 48 KiB of static shared memory).
constexpr int kFmaTile = 64;
constexpr int kFmaSide = 16;
constexpr int kFmaPer = kFmaTile / kFmaSide;
constexpr int kFmaThreads = kFmaSide * kFmaSide;

template <typename A>
constexpr int kFmaDepth = sizeof(A) == 8 ? 8 : 16;

template <typename A>
struct FmaSmem {
  A a[kFmaDepth<A>][kFmaTile + 1];  // a[k][m], padded against bank conflicts
  A b[kFmaDepth<A>][kFmaTile + 1];  // b[k][n]
};

__device__ __forceinline__ int fma_row(int r) {
  return static_cast<int>(threadIdx.x) / kFmaSide + kFmaSide * r;
}
__device__ __forceinline__ int fma_col(int c) {
  return static_cast<int>(threadIdx.x) % kFmaSide + kFmaSide * c;
}

// acc[r][c] += sum_{k < K} ga(fma_row(r), k) gb(k, fma_col(c)): the block's
// 64 x 64 tile of the product of a [64, K] and a [K, 64] operand, summed in
// the order of k. ga(m, k) and gb(k, n) return one element in A and must give
// 0 for rows / columns outside their operand (they are called only for k <
// K). kFastA: consecutive k of ga are adjacent in memory (else consecutive m
// are), so the shared-memory fill runs along that index and a warp's global
// loads coalesce; kFastB likewise for gb's k (else n). Every thread of the
// block calls it with the same K; it synchronises the block before returning.
template <bool kFastA, bool kFastB, typename A, typename GA, typename GB>
__device__ void fma_tile_product(A (&acc)[kFmaPer][kFmaPer], int64_t K, FmaSmem<A>& sm,
                                 const GA& ga, const GB& gb) {
  constexpr int D = kFmaDepth<A>;
  for (int64_t k0 = 0; k0 < K; k0 += D) {
    for (int e = threadIdx.x; e < D * kFmaTile; e += kFmaThreads) {
      const int kk = kFastA ? e % D : e / kFmaTile, m = kFastA ? e / D : e % kFmaTile;
      sm.a[kk][m] = k0 + kk < K ? ga(m, k0 + kk) : A(0);
    }
    for (int e = threadIdx.x; e < D * kFmaTile; e += kFmaThreads) {
      const int kk = kFastB ? e % D : e / kFmaTile, n = kFastB ? e / D : e % kFmaTile;
      sm.b[kk][n] = k0 + kk < K ? gb(k0 + kk, n) : A(0);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < D; ++kk) {
      A x[kFmaPer], y[kFmaPer];
#pragma unroll
      for (int r = 0; r < kFmaPer; ++r) {
        x[r] = sm.a[kk][fma_row(r)];
        y[r] = sm.b[kk][fma_col(r)];
      }
#pragma unroll
      for (int r = 0; r < kFmaPer; ++r)
#pragma unroll
        for (int c = 0; c < kFmaPer; ++c) acc[r][c] += x[r] * y[c];
    }
    __syncthreads();
  }
}

}  // namespace forge::cuda::tiles
