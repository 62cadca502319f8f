// What elementwise.cpp (the broadcasting ops) and unary.cpp (the one-tensor
// ops) share (internal): the cost scale they give parallel_for and the check
// of a floating-point operand. Not for use outside ops/elementwise/.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace forge::ops::elementwise_detail {

// Rough cost of one element in parallel_for units: a load/store and an add is
// 1; a core/vmath.h function a few; a scalar libm call (pow) tens.
inline constexpr int64_t kCheap = 1;
inline constexpr int64_t kVectorMath = 4;
inline constexpr int64_t kPow = 32;

// f32 or f64 on the CPU; on a GPU also bf16 and f16.
inline void check_float(const Tensor& t, const char* op, const char* arg) {
  FORGE_CHECK(t.defined(), "{}: {} is an undefined tensor", op, arg);
  if (t.device().is_cuda()) {
    FORGE_CHECK(is_floating(t.dtype()),
                "{}: {} must be a f32, f64, bf16 or f16 tensor, got {}; convert it with "
                ".to(DType::f32)",
                op, arg, dtype_name(t.dtype()));
    return;
  }
  FORGE_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64,
              "{}: {} must be a f32 or f64 tensor, got {}; convert it with .to(DType::f32)", op,
              arg, dtype_name(t.dtype()));
}

}  // namespace forge::ops::elementwise_detail
