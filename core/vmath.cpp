#include "core/vmath.h"

#include <immintrin.h>
#include <sleef.h>

namespace forge::vmath {

void exp(const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, Sleef_expf16_u10avx512f(_mm512_loadu_ps(x + i)));
#elif defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, Sleef_expf8_u10avx2(_mm256_loadu_ps(x + i)));
#else
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(y + i, Sleef_expf4_u10sse2(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) y[i] = Sleef_expf_u10(x[i]);
}

void exp(const double* x, double* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 8 <= n; i += 8)
    _mm512_storeu_pd(y + i, Sleef_expd8_u10avx512f(_mm512_loadu_pd(x + i)));
#elif defined(__AVX2__) && defined(__FMA__)
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(y + i, Sleef_expd4_u10avx2(_mm256_loadu_pd(x + i)));
#else
  for (; i + 2 <= n; i += 2) _mm_storeu_pd(y + i, Sleef_expd2_u10sse2(_mm_loadu_pd(x + i)));
#endif
  for (; i < n; ++i) y[i] = Sleef_exp_u10(x[i]);
}

}  // namespace forge::vmath
