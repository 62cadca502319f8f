// Row-major GEMMs on cuBLAS (see matmul_cuda.h). cuBLAS is column-major, and
// a row-major (r, c) matrix is the column-major (c, r) one, its transpose: so
// C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T, B first.
#include "ops/linalg/matmul_cuda.h"

#include <cublas_v2.h>

#include <climits>
#include <utility>

#include "core/error.h"
#include "ops/linalg/handles_cuda.h"

namespace forge::cuda {

namespace {

// cuBLAS's type of each DType a product takes.
constexpr std::pair<DType, cudaDataType_t> kCudaTypes[] = {{DType::f32, CUDA_R_32F},
                                                           {DType::f64, CUDA_R_64F},
                                                           {DType::bf16, CUDA_R_16BF},
                                                           {DType::f16, CUDA_R_16F}};

cudaDataType_t cuda_type(DType t) {
  for (const auto& [d, c] : kCudaTypes)
    if (d == t) return c;
  fail_dtype("matmul", t);
}

// cuBLAS's sizes are 32-bit ints.
int as_int(int64_t v, const char* what) {
  FORGE_CHECK(v <= INT_MAX,
              "matmul (CUDA): {} = {} is beyond cuBLAS's 32-bit sizes; split the product", what, v);
  return static_cast<int>(v);
}

}  // namespace

void gemm(const GemmArgs& g, int device) {
  const bool low = g.ab_dtype == DType::bf16 || g.ab_dtype == DType::f16;
  FORGE_CHECK(g.c_dtype == g.ab_dtype || (low && g.c_dtype == DType::f32),
              "matmul (CUDA): operands of {} cannot give a {} result (expected {}{})",
              dtype_name(g.ab_dtype), dtype_name(g.c_dtype), dtype_name(g.ab_dtype),
              low ? " or f32" : "");
  if (g.n == 0 || g.m == 0 || g.batch == 0) return;
  DeviceGuard guard(device);
  if (g.k == 0) {
    // An empty sum: C = 0, or C unchanged when accumulating.
    if (!g.accumulate) {
      const size_t bytes = static_cast<size_t>(g.batch * g.n * g.m) * dtype_size(g.c_dtype);
      FORGE_CUDA_CHECK(cudaMemsetAsync(g.c, 0, bytes, stream(device)));
    }
    return;
  }
  const cudaDataType_t ab = cuda_type(g.ab_dtype), c = cuda_type(g.c_dtype);
  const bool f64 = g.ab_dtype == DType::f64;
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F
                                      : (g.ab_dtype == DType::f32 && g.tf32)
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  // alpha and beta have the compute type's scalar type.
  const double alpha64 = 1.0, beta64 = g.accumulate ? 1.0 : 0.0;
  const float alpha32 = 1.0f, beta32 = g.accumulate ? 1.0f : 0.0f;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;

  const int n = as_int(g.n, "n"), m = as_int(g.m, "m"), k = as_int(g.k, "k");
  // Leading dims of the row-major matrices as stored: their row lengths.
  const int lda = g.ta ? n : k, ldb = g.tb ? k : m, ldc = m;
  const cublasOperation_t op_a = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasHandle_t h = cublas_handle(device);
  if (g.batch == 1) {
    FORGE_CUBLAS_CHECK(cublasGemmEx(h, op_b, op_a, m, n, k, alpha, g.b, ab, ldb, g.a, ab, lda, beta,
                                    g.c, c, ldc, compute, CUBLAS_GEMM_DEFAULT));
  } else {
    FORGE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, op_b, op_a, m, n, k, alpha, g.b, ab, ldb, g.stride_b, g.a, ab, lda, g.stride_a, beta,
        g.c, c, ldc, g.n * g.m, as_int(g.batch, "the batch count"), compute, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace forge::cuda
