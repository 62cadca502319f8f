// Vectorised transcendental functions over arrays: the one place CPU kernels
// get exp, expm1, log, cos, tanh, erf and erfc from instead of calling libm per
// element. On x86-64 they are glibc's vector math library (libmvec), in the
// widest vectors the build's target has (AVX-512, AVX2, else SSE2), within 4
// ULP of the exact result in f32 and f64 (so f64 stays good for gradcheck).
// libmvec beat SLEEF (Debian's libsleef-dev) at 11 of these 12 functions on
// this project's machine, 2-4x at erf, erfc, tanh and expm1 (see
// docs/PERFORMANCE.md); SLEEF's exp was 15% faster in f32. An element's result
// does not depend on its position in the array (the tail is computed as a
// padded vector). y may alias x.
#pragma once

#include <cstdint>

namespace forge::vmath {

void exp(const float* x, float* y, int64_t n);
void exp(const double* x, double* y, int64_t n);
void expm1(const float* x, float* y, int64_t n);
void expm1(const double* x, double* y, int64_t n);
void log(const float* x, float* y, int64_t n);
void log(const double* x, double* y, int64_t n);
void cos(const float* x, float* y, int64_t n);
void cos(const double* x, double* y, int64_t n);
void tanh(const float* x, float* y, int64_t n);
void tanh(const double* x, double* y, int64_t n);
void erf(const float* x, float* y, int64_t n);
void erf(const double* x, double* y, int64_t n);
void erfc(const float* x, float* y, int64_t n);
void erfc(const double* x, double* y, int64_t n);

}  // namespace forge::vmath
