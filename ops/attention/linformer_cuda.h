// The small kernels around linformer's GEMMs on the GPU (linformer_cuda.cu):
// dropping padded key rows and broadcasting the projection biases. The GEMMs
// themselves are cuBLAS (ops/linalg/matmul_cuda.h) and the attention is the
// flash kernels (flash_cuda.h). Defined only in builds with CUDA; linformer.cpp
// calls them under FORGE_IF_CUDA. All tensors are dense and row-major, of
// `dtype` (f32, f64, bf16, f16).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace forge::cuda {

// How linformer_mask_rows treats a padded row: kMultiply writes x * 0 (as the
// CPU's masked copy of k and v: a NaN stays NaN), kZero writes 0 (as the CPU
// clears the gradient rows of padded keys).
enum class MaskRows { kMultiply, kZero };

// x [B*H, M, cols] (k, v or their gradients) with the rows of padded keys
// (mask [B, M] byte 0; a non-zero byte is a real token) dropped per `mode`.
// mask null: every row kept. With `to_key_major`, out is [M, B*H, cols]
// (out[j, bh, c] = x[bh, j, c]), the layout whose rows fold every
// batch-head into one GEMM's inner dimension; otherwise out is [B*H, M, cols]
// and may be x itself.
void linformer_mask_rows(DType dtype, const void* x, void* out, const uint8_t* mask, int64_t B,
                         int64_t H, int64_t M, int64_t cols, MaskRows mode, bool to_key_major,
                         int device);

// out [batch, rows, cols]: out[b, r, c] = bias[r] (bias [rows]), the start
// that the projection GEMM accumulates into.
void linformer_bias_rows(DType dtype, const void* bias, void* out, int64_t batch, int64_t rows,
                         int64_t cols, int device);

}  // namespace forge::cuda
