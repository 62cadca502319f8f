// Elementwise ops with NumPy broadcasting, each with its backward: f32 and
// f64 on the CPU; f32, f64, bf16 and f16 on a GPU (all operands on one device).
// Binary ops broadcast their inputs; their backward sums the gradient back to
// each input's shape (sum_to).
#pragma once

#include <limits>

#include "core/tensor.h"

namespace forge::ops {

// The broadcast of two shapes (NumPy rules); an error names both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Sums `g` over the dimensions that broadcasting added or stretched, giving a
// tensor of `shape` (the reverse of broadcasting `shape` to g's shape).
Tensor sum_to(const Tensor& g, const Shape& shape);
// Broadcasts x to `shape` (a copy); backward is sum_to.
Tensor expand(const Tensor& x, const Shape& shape);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor abs(const Tensor& x);  // gradient 0 at 0
Tensor square(const Tensor& x);
// Limits may be +-infinity for a one-sided clamp; gradient passes where lo <= x <= hi.
Tensor clamp(const Tensor& x, double lo = -std::numeric_limits<double>::infinity(),
             double hi = std::numeric_limits<double>::infinity());
Tensor relu(const Tensor& x);
enum class GeluApprox { none, tanh };  // none: x * Phi(x) with erf; tanh: the GPT-2 form
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::none);
Tensor elu(const Tensor& x, double alpha = 1.0);
Tensor silu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);

// cond (bool or u8) ? a : b, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// x with `value` wherever mask (bool or u8, broadcast to x) is true.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

}  // namespace forge::ops

namespace forge {
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator-(const Tensor& a);
}  // namespace forge
