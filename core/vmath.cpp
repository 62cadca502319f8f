#include "core/vmath.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>

// glibc's vector math library (libmvec, glibc >= 2.35), called by the names
// the x86-64 vector function ABI gives it: _ZGV<isa>N<lanes>v_<function>,
// isa e = AVX-512, d = AVX2, b = SSE2. Every lane's result is within 4 ULP
// of the exact one (glibc's documented bound; measured 1-4).
#if defined(__AVX512F__)
#define FORGE_MVEC_F32(FN) _ZGVeN16v_##FN##f
#define FORGE_MVEC_F64(FN) _ZGVeN8v_##FN
using VecF32 = __m512;
using VecF64 = __m512d;
#elif defined(__AVX2__)
#define FORGE_MVEC_F32(FN) _ZGVdN8v_##FN##f
#define FORGE_MVEC_F64(FN) _ZGVdN4v_##FN
using VecF32 = __m256;
using VecF64 = __m256d;
#else
#define FORGE_MVEC_F32(FN) _ZGVbN4v_##FN##f
#define FORGE_MVEC_F64(FN) _ZGVbN2v_##FN
using VecF32 = __m128;
using VecF64 = __m128d;
#endif

#define FORGE_MVEC_DECLARE(FN)                  \
  extern "C" VecF32 FORGE_MVEC_F32(FN)(VecF32); \
  extern "C" VecF64 FORGE_MVEC_F64(FN)(VecF64);
FORGE_MVEC_DECLARE(exp)
FORGE_MVEC_DECLARE(expm1)
FORGE_MVEC_DECLARE(log)
FORGE_MVEC_DECLARE(cos)
FORGE_MVEC_DECLARE(tanh)
FORGE_MVEC_DECLARE(erf)
FORGE_MVEC_DECLARE(erfc)
#undef FORGE_MVEC_DECLARE
#endif

namespace forge::vmath {

#if defined(__x86_64__)
namespace {

// Runs the vector function f over x in whole vectors; the tail goes through
// the same f, padded with zeros, so that an element's result never depends on
// where it sits in the array (a scalar tail would be another algorithm, and
// results would change with the threads' split of a tensor).
template <typename T, typename V, typename F>
void over_vectors(const T* x, T* y, int64_t n, F f) {
  constexpr int64_t W = sizeof(V) / sizeof(T);
  V v;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    std::memcpy(&v, x + i, sizeof(V));
    v = f(v);
    std::memcpy(y + i, &v, sizeof(V));
  }
  if (i < n) {
    T lane[W] = {};
    std::copy(x + i, x + n, lane);
    std::memcpy(&v, lane, sizeof(V));
    v = f(v);
    std::memcpy(lane, &v, sizeof(V));
    std::copy(lane, lane + (n - i), y + i);
  }
}

}  // namespace

#define FORGE_VMATH_DEFINE(FN, LIBM)                                                       \
  void FN(const float* x, float* y, int64_t n) {                                           \
    over_vectors<float, VecF32>(x, y, n, [](VecF32 v) { return FORGE_MVEC_F32(FN)(v); });  \
  }                                                                                        \
  void FN(const double* x, double* y, int64_t n) {                                         \
    over_vectors<double, VecF64>(x, y, n, [](VecF64 v) { return FORGE_MVEC_F64(FN)(v); }); \
  }
#else
// Elsewhere, libm per element (the compiler may vectorise it).
#define FORGE_VMATH_DEFINE(FN, LIBM)                   \
  void FN(const float* x, float* y, int64_t n) {       \
    for (int64_t i = 0; i < n; ++i) y[i] = LIBM(x[i]); \
  }                                                    \
  void FN(const double* x, double* y, int64_t n) {     \
    for (int64_t i = 0; i < n; ++i) y[i] = LIBM(x[i]); \
  }
#endif

FORGE_VMATH_DEFINE(exp, std::exp)
FORGE_VMATH_DEFINE(expm1, std::expm1)
FORGE_VMATH_DEFINE(log, std::log)
FORGE_VMATH_DEFINE(cos, std::cos)
FORGE_VMATH_DEFINE(tanh, std::tanh)
FORGE_VMATH_DEFINE(erf, std::erf)
FORGE_VMATH_DEFINE(erfc, std::erfc)

#undef FORGE_VMATH_DEFINE

}  // namespace forge::vmath
