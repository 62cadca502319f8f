// The GPU side of matmul / linear / patch_embed on raw device pointers: GEMMs
// on cuBLAS (matmul_cuda.cpp) and the small kernels around them
// (linear_cuda.cu). Defined only in builds with CUDA; called under
// FORGE_IF_CUDA. All matrices are dense and row-major.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace forge::cuda {

// For i in [0, batch): C_i = op(A_i) op(B_i), or C_i += op(A_i) op(B_i) with
// `accumulate`. op(A_i) is (n, k): A_i is (n, k), or (k, n) with ta; op(B_i) is
// (k, m): B_i is (k, m), or (m, k) with tb; C_i is (n, m). A_i starts at
// a + i * stride_a elements (stride 0: one matrix for every i), B_i likewise,
// C_i at c + i * n * m. A and B are ab_dtype (f32, f64, bf16, f16); C is
// ab_dtype, or f32 for bf16 / f16 operands (autocast). The sums run in f32 (f64
// for f64); `tf32` lets f32 operands go through TF32 tensor cores.
struct GemmArgs {
  bool ta = false, tb = false;
  int64_t n = 0, m = 0, k = 0, batch = 1;
  DType ab_dtype = DType::f32;
  const void* a = nullptr;
  int64_t stride_a = 0;
  const void* b = nullptr;
  int64_t stride_b = 0;
  DType c_dtype = DType::f32;
  void* c = nullptr;
  bool accumulate = false;
  bool tf32 = false;
};
void gemm(const GemmArgs& g, int device);

// Every row of out (rows, cols) set to `row` (cols), both `dtype`: the bias that
// a GEMM then accumulates into (linear_cuda.cu).
void fill_rows(DType dtype, const void* row, void* out, int64_t rows, int64_t cols, int device);

// out (batch, cols, rows) = in (batch, rows, cols) transposed per batch, plus
// bias[r] (rows, out_dtype) on every out[b, :, r] when bias is not null,
// converted from in_dtype to out_dtype: the same dtype, bf16 / f16 -> f32 or
// f32 -> bf16 / f16 (linear_cuda.cu). patch_embed moves the convolution's
// channels-first output to tokens-first with it, and its gradient back.
void transpose_batched(DType in_dtype, const void* in, DType out_dtype, void* out, const void* bias,
                       int64_t batch, int64_t rows, int64_t cols, int device);

}  // namespace forge::cuda
