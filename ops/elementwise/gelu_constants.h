// The constants of gelu and its derivative, shared by the CPU ops
// (unary.cpp) and the CUDA kernels (elementwise_cuda.cu) so that both
// compute the same formula.
#pragma once

namespace forge::ops::gelu_constants {

constexpr double kInvSqrt2 = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1 / sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

}  // namespace forge::ops::gelu_constants
