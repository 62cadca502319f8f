// Vectorised transcendental functions over arrays, from SLEEF (the library
// PyTorch's CPU kernels use): the one place kernels get exp from instead of
// calling libm per element. Each lane is SLEEF's u10 function (at most 1.0
// ULP from the exact result, in f32 and f64, so f64 stays good for
// gradcheck); the widest vectors the build's target has are used (AVX-512,
// AVX2 + FMA, else SSE2), and SLEEF's scalar u10 function for the tail.
// y may alias x.
#pragma once

#include <cstdint>

namespace forge::vmath {

void exp(const float* x, float* y, int64_t n);
void exp(const double* x, double* y, int64_t n);

}  // namespace forge::vmath
