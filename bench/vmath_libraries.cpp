// The measurement behind core/vmath.h's choice of library: glibc's libmvec
// against SLEEF (Debian's libsleef-dev, optional: this program is built only
// where it is installed), each function's AVX-512 vector form called directly
// over 64 Ki elements, f32 and f64, 1 thread. Prints ns per element and the
// largest error in ULP against libm in double (long double for f64 would be
// better; double against double counts libm's own error, under 1 ULP).
//
//   build/bench/bench_vmath_libraries
#include <immintrin.h>
#include <sleef.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

extern "C" {  // libmvec by its x86-64 vector ABI names (see core/vmath.cpp)
__m512 _ZGVeN16v_expf(__m512);
__m512 _ZGVeN16v_expm1f(__m512);
__m512 _ZGVeN16v_logf(__m512);
__m512 _ZGVeN16v_tanhf(__m512);
__m512 _ZGVeN16v_erff(__m512);
__m512 _ZGVeN16v_erfcf(__m512);
__m512d _ZGVeN8v_exp(__m512d);
__m512d _ZGVeN8v_expm1(__m512d);
__m512d _ZGVeN8v_log(__m512d);
__m512d _ZGVeN8v_tanh(__m512d);
__m512d _ZGVeN8v_erf(__m512d);
__m512d _ZGVeN8v_erfc(__m512d);
}

namespace {

template <typename T, typename V, typename F>
void measure(const char* library, const char* name, F f, double (*ref)(double), double lo,
             double hi) {
  constexpr size_t W = sizeof(V) / sizeof(T);
  std::vector<T> x(size_t{1} << 16), y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<T>(lo + (hi - lo) * static_cast<double>(i) / static_cast<double>(x.size()));
  const int reps = 200;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < x.size(); i += W) {
      V v;
      std::memcpy(&v, &x[i], sizeof(V));
      v = f(v);
      std::memcpy(&y[i], &v, sizeof(V));
    }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = ref(static_cast<double>(x[i]));
    const T w = static_cast<T>(want);
    if (w == 0 || !std::isfinite(w)) continue;
    const double ulp =
        static_cast<double>(std::nextafter(std::fabs(w), T(INFINITY)) - std::fabs(w));
    worst = std::max(worst, std::fabs(static_cast<double>(y[i]) - want) / ulp);
  }
  std::printf("| %s | %s | %s | %.3f | %.2f |\n", name, sizeof(T) == 4 ? "f32" : "f64", library,
              s / reps / static_cast<double>(x.size()) * 1e9, worst);
}

}  // namespace

int main() {
  std::printf(
      "| function | dtype | library | ns / element | max error (ULP) |\n|---|---|---|---|---|\n");
// NAME is also libm's function, the reference.
#define FORGE_MEASURE(T, V, NAME, SLEEF, MVEC, LO, HI)               \
  {                                                                  \
    double (*ref)(double) = [](double v) { return std::NAME(v); };   \
    measure<T, V>(                                                   \
        "SLEEF", #NAME, [](V v) { return SLEEF(v); }, ref, LO, HI);  \
    measure<T, V>(                                                   \
        "libmvec", #NAME, [](V v) { return MVEC(v); }, ref, LO, HI); \
  }
// Each function in f32 and f64 by its SLEEF (ULP: its accuracy suffix) and
// libmvec names; inputs in [LO, HI32) and [LO, HI64).
#define FORGE_FUNCTION(NAME, ULP, LO, HI32, HI64)                                               \
  FORGE_MEASURE(float, __m512, NAME, Sleef_##NAME##f16_##ULP##avx512f, _ZGVeN16v_##NAME##f, LO, \
                HI32)                                                                           \
  FORGE_MEASURE(double, __m512d, NAME, Sleef_##NAME##d8_##ULP##avx512f, _ZGVeN8v_##NAME, LO, HI64)
  FORGE_FUNCTION(exp, u10, -20, 20, 20)
  FORGE_FUNCTION(expm1, u10, -8, 8, 8)
  FORGE_FUNCTION(log, u10, 1e-3, 100, 100)
  FORGE_FUNCTION(tanh, u10, -6, 6, 6)
  FORGE_FUNCTION(erf, u10, -6, 6, 6)
  FORGE_FUNCTION(erfc, u15, -6, 9, 25)
  return 0;
}
