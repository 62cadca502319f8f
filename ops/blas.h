// The one place ops call BLAS: row-major GEMM for f32 and f64 (OpenBLAS) and
// for bf16 operands with f32 accumulation and result (oneDNN's matmul),
// c = alpha op(a) op(b) + beta c, op(a) [n, k], op(b) [k, m], with leading
// dimensions so that tiles of larger matrices can be used in place.
// Called inside an OpenMP region, OpenBLAS (the OpenMP build) runs on the
// calling thread only; outside, it uses every thread.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace forge::ops {

inline void gemm(bool ta, bool tb, int64_t n, int64_t m, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

inline void gemm(bool ta, bool tb, int64_t n, int64_t m, int64_t k, double alpha, const double* a,
                 int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// bf16 operands (autocast on the CPU, ops/autocast.h), products summed in f32:
// oneDNN's brgemm kernels, on AVX512-BF16's dot products or AMX's tiles where
// the CPU has them (about 2.5x the f32 rate on AVX512-BF16), else its
// emulation. Inside an OpenMP region it runs on the calling thread, as BLAS.
void gemm(bool ta, bool tb, int64_t n, int64_t m, int64_t k, float alpha, const BF16* a,
          int64_t lda, const BF16* b, int64_t ldb, float beta, float* c, int64_t ldc);

// For `attnforge info`: oneDNN's version and whether this CPU multiplies
// bf16 itself (AVX512-BF16 or AMX), which `precision: bf16` on the CPU needs.
std::string bf16_gemm_summary();

// The same for dense (unstrided) operands: lda, ldb, ldc follow from the shapes.
// AB is the operands' type, C the result's (float for bf16 operands).
template <typename AB, typename C>
void gemm(bool ta, bool tb, int64_t n, int64_t m, int64_t k, C alpha, const AB* a, const AB* b,
          C beta, C* c) {
  gemm(ta, tb, n, m, k, alpha, a, ta ? n : k, b, tb ? k : m, beta, c, m);
}

}  // namespace forge::ops
