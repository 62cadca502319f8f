// The one place ops call BLAS: row-major GEMM for f32 and f64,
// c = alpha op(a) op(b) + beta c, op(a) [n, k], op(b) [k, m], with leading
// dimensions so that tiles of larger matrices can be used in place.
// Called inside an OpenMP region, OpenBLAS (the OpenMP build) runs on the
// calling thread only; outside, it uses every thread.
#pragma once

#include <cblas.h>

#include <cstdint>

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

// The same for dense (unstrided) operands: lda, ldb, ldc follow from the shapes.
template <typename T>
void gemm(bool ta, bool tb, int64_t n, int64_t m, int64_t k, T alpha, const T* a, const T* b,
          T beta, T* c) {
  gemm(ta, tb, n, m, k, alpha, a, ta ? n : k, b, tb ? k : m, beta, c, m);
}

}  // namespace forge::ops
