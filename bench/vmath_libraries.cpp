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

double exp_(double v) {
  return std::exp(v);
}
double expm1_(double v) {
  return std::expm1(v);
}
double log_(double v) {
  return std::log(v);
}
double tanh_(double v) {
  return std::tanh(v);
}
double erf_(double v) {
  return std::erf(v);
}
double erfc_(double v) {
  return std::erfc(v);
}

}  // namespace

int main() {
  std::printf(
      "| function | dtype | library | ns / element | max error (ULP) |\n|---|---|---|---|---|\n");
#define FORGE_F32(NAME, SLEEF, MVEC, REF, LO, HI)                     \
  measure<float, __m512>(                                             \
      "SLEEF", NAME, [](__m512 v) { return SLEEF(v); }, REF, LO, HI); \
  measure<float, __m512>(                                             \
      "libmvec", NAME, [](__m512 v) { return MVEC(v); }, REF, LO, HI);
#define FORGE_F64(NAME, SLEEF, MVEC, REF, LO, HI)                      \
  measure<double, __m512d>(                                            \
      "SLEEF", NAME, [](__m512d v) { return SLEEF(v); }, REF, LO, HI); \
  measure<double, __m512d>(                                            \
      "libmvec", NAME, [](__m512d v) { return MVEC(v); }, REF, LO, HI);
  FORGE_F32("exp", Sleef_expf16_u10avx512f, _ZGVeN16v_expf, exp_, -20, 20)
  FORGE_F32("expm1", Sleef_expm1f16_u10avx512f, _ZGVeN16v_expm1f, expm1_, -8, 8)
  FORGE_F32("log", Sleef_logf16_u10avx512f, _ZGVeN16v_logf, log_, 1e-3, 100)
  FORGE_F32("tanh", Sleef_tanhf16_u10avx512f, _ZGVeN16v_tanhf, tanh_, -6, 6)
  FORGE_F32("erf", Sleef_erff16_u10avx512f, _ZGVeN16v_erff, erf_, -6, 6)
  FORGE_F32("erfc", Sleef_erfcf16_u15avx512f, _ZGVeN16v_erfcf, erfc_, -6, 9)
  FORGE_F64("exp", Sleef_expd8_u10avx512f, _ZGVeN8v_exp, exp_, -20, 20)
  FORGE_F64("expm1", Sleef_expm1d8_u10avx512f, _ZGVeN8v_expm1, expm1_, -8, 8)
  FORGE_F64("log", Sleef_logd8_u10avx512f, _ZGVeN8v_log, log_, 1e-3, 100)
  FORGE_F64("tanh", Sleef_tanhd8_u10avx512f, _ZGVeN8v_tanh, tanh_, -6, 6)
  FORGE_F64("erf", Sleef_erfd8_u10avx512f, _ZGVeN8v_erf, erf_, -6, 6)
  FORGE_F64("erfc", Sleef_erfcd8_u15avx512f, _ZGVeN8v_erfc, erfc_, -6, 25)
  return 0;
}
