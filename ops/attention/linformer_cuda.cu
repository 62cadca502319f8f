// linformer's small kernels on the GPU (see linformer_cuda.h): element-wise,
// one thread per element of a grid-stride loop, 64-bit indices.
#include "core/cuda_kernels.cuh"
#include "ops/attention/linformer_cuda.h"

namespace forge::cuda {

namespace {

// x [BH, M, cols]; element i = (bh, j, c) goes to i, or to (j, bh, c) in
// [M, BH, cols] when key_major. Each thread reads its element before writing
// it, so out may be x when not key_major.
template <typename T>
__global__ void mask_rows_kernel(const T* x, T* out, const uint8_t* mask, int64_t H, int64_t M,
                                 int64_t cols, int64_t BH, bool zero, bool key_major) {
  using A = acc_t<T>;
  const int64_t n = BH * M * cols;
  FORGE_GRID_STRIDE(i, n) {
    const int64_t c = i % cols, j = (i / cols) % M, bh = i / (cols * M);
    const bool keep = mask == nullptr || mask[(bh / H) * M + j] != 0;
    const A xv = to_acc<A>(x[i]);
    const A v = keep ? xv : (zero ? A(0) : xv * A(0));
    out[key_major ? (j * BH + bh) * cols + c : i] = from_acc<T>(v);
  }
}

// out [batch, rows, cols] = bias[r] on row r of every batch.
template <typename T>
__global__ void bias_rows_kernel(const T* bias, T* out, int64_t rows, int64_t cols, int64_t n) {
  FORGE_GRID_STRIDE(i, n) out[i] = bias[(i / cols) % rows];
}

}  // namespace

void linformer_mask_rows(DType dtype, const void* x, void* out, const uint8_t* mask, int64_t B,
                         int64_t H, int64_t M, int64_t cols, MaskRows mode, bool to_key_major,
                         int device) {
  const int64_t n = B * H * M * cols;
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "attention::linformer", [&] {
    mask_rows_kernel<scalar_t><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(x), static_cast<scalar_t*>(out), mask, H, M, cols, B * H,
        mode == MaskRows::kZero, to_key_major);
    FORGE_CUDA_CHECK_LAUNCH("linformer_mask_rows");
  });
}

void linformer_bias_rows(DType dtype, const void* bias, void* out, int64_t batch, int64_t rows,
                         int64_t cols, int device) {
  const int64_t n = batch * rows * cols;
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "attention::linformer", [&] {
    bias_rows_kernel<scalar_t><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(bias), static_cast<scalar_t*>(out), rows, cols, n);
    FORGE_CUDA_CHECK_LAUNCH("linformer_bias_rows");
  });
}

}  // namespace forge::cuda
