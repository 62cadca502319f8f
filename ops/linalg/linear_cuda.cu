// The small kernels around the GEMM-shaped ops (see matmul_cuda.h): the bias
// rows that linear's GEMM accumulates into, and the per-batch transpose that
// takes patch_embed's convolution output from channels-first to tokens-first
// (adding the bias) and its gradient back.
#include <string>

#include "core/cuda_kernels.cuh"
#include "ops/linalg/matmul_cuda.h"

namespace forge::cuda {

namespace {

// One block per row (grid-stride over rows), its threads along the row.
template <typename T>
__global__ void fill_rows_kernel(const T* row, T* out, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = row[c];
}

// The transpose's blocks are (kTile, kTileRows) threads moving one kTile x
// kTile tile, kTile / kTileRows values per thread.
constexpr int kTile = 32;
constexpr int kTileRows = 8;
constexpr int64_t kMaxGridY = 65535;

// in (batch, R, C) -> out (batch, C, R) [+ bias[r]]. Block (x, y) holds batch
// x / c_tiles, columns [c0, c0 + kTile) with c0 = (x % c_tiles) kTile, and
// row tiles y, y + gridDim.y, ...: it reads a tile along the rows of `in`
// (threadIdx.x over c) and writes it along the rows of `out` (threadIdx.x over
// r), so both sides are coalesced. The tile is computed in the accumulation
// type of Out (f32, or f64 for f64), with one rounding on the store.
template <typename In, typename Out>
__global__ void transpose_kernel(const In* in, const Out* bias, Out* out, int64_t R, int64_t C,
                                 int64_t c_tiles, int64_t r_tiles) {
  using A = acc_t<Out>;
  __shared__ A tile[kTile][kTile + 1];  // +1: the column reads hit distinct banks
  const int64_t b = blockIdx.x / c_tiles;
  const int64_t c0 = (blockIdx.x % c_tiles) * kTile;
  const In* src = in + b * R * C;
  Out* dst = out + b * R * C;
  for (int64_t rt = blockIdx.y; rt < r_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTile;
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < R && c < C) tile[i][threadIdx.x] = to_acc<A>(src[r * C + c]);
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (r < R && c < C) {
        A v = tile[threadIdx.x][i];
        if (bias != nullptr) v += to_acc<A>(bias[r]);
        dst[c * R + r] = from_acc<Out>(v);
      }
    }
    __syncthreads();  // the next row tile overwrites `tile`
  }
}

template <typename In, typename Out>
void launch_transpose(const void* in, const void* bias, void* out, int64_t batch, int64_t rows,
                      int64_t cols, int device) {
  const int64_t c_tiles = (cols + kTile - 1) / kTile, r_tiles = (rows + kTile - 1) / kTile;
  if (batch * c_tiles > 2147483647)
    fail(
        "patch_embed (CUDA): too many tiles for one grid (batch x columns / 32 >= 2^31); split "
        "the batch");
  const dim3 grid(static_cast<unsigned>(batch * c_tiles),
                  static_cast<unsigned>(std::min(r_tiles, kMaxGridY)));
  transpose_kernel<In, Out><<<grid, dim3(kTile, kTileRows), 0, stream(device)>>>(
      static_cast<const In*>(in), static_cast<const Out*>(bias), static_cast<Out*>(out), rows, cols,
      c_tiles, r_tiles);
  FORGE_CUDA_CHECK_LAUNCH("transpose_batched");
}

}  // namespace

void fill_rows(DType dtype, const void* row, void* out, int64_t rows, int64_t cols, int device) {
  if (rows == 0 || cols == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "linear (bias)", [&] {
    fill_rows_kernel<<<grid_for(rows, device, 1), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(row), static_cast<scalar_t*>(out), rows, cols);
    FORGE_CUDA_CHECK_LAUNCH("fill_rows");
  });
}

void transpose_batched(DType in_dtype, const void* in, DType out_dtype, void* out, const void* bias,
                       int64_t batch, int64_t rows, int64_t cols, int device) {
  if (batch == 0 || rows == 0 || cols == 0) return;
  DeviceGuard guard(device);
  if (in_dtype == out_dtype) {
    FORGE_CUDA_DISPATCH_FLOAT(in_dtype, "patch_embed (transpose)", [&] {
      launch_transpose<scalar_t, scalar_t>(in, bias, out, batch, rows, cols, device);
    });
  } else if (in_dtype == DType::bf16 && out_dtype == DType::f32) {
    launch_transpose<__nv_bfloat16, float>(in, bias, out, batch, rows, cols, device);
  } else if (in_dtype == DType::f16 && out_dtype == DType::f32) {
    launch_transpose<__half, float>(in, bias, out, batch, rows, cols, device);
  } else if (in_dtype == DType::f32 && out_dtype == DType::bf16) {
    launch_transpose<float, __nv_bfloat16>(in, bias, out, batch, rows, cols, device);
  } else if (in_dtype == DType::f32 && out_dtype == DType::f16) {
    launch_transpose<float, __half>(in, bias, out, batch, rows, cols, device);
  } else {
    fail((std::string("patch_embed (CUDA transpose): cannot convert ") + dtype_name(in_dtype) +
          " to " + dtype_name(out_dtype) +
          "; expected the same dtype, bf16 / f16 -> f32 or f32 -> bf16 / f16")
             .c_str());
  }
}

}  // namespace forge::cuda
