// Shared by the CUDA tests: skipping without a GPU, moving tensors, and
// comparing a GPU result with the CPU one.
#pragma once

#include <gtest/gtest.h>

#include "core/device.h"
#include "core/tensor.h"
#include "tests/test_util.h"

// Skips the test, saying why, when this build has no CUDA backend or no GPU
// is visible (the CI machine and every developer machine): the CUDA tests run
// on the GPU machine (docs/GPU.md).
#define FORGE_REQUIRE_CUDA()                                                          \
  do {                                                                                \
    if (!::forge::cuda_built()) GTEST_SKIP() << "built without the CUDA backend";     \
    if (::forge::cuda_device_count() == 0)                                            \
      GTEST_SKIP() << "no CUDA device visible: this GPU test runs on a machine with one"; \
  } while (0)

namespace forge::testing {

inline Device gpu() {
  return Device::cuda(0);
}

// The CUDA result back on the CPU in f32 (from any floating dtype).
inline Tensor host_f32(const Tensor& t) {
  Tensor c = t.to(Device::cpu());
  return c.dtype() == DType::f32 ? c : c.to(DType::f32);
}

// Rounds a CPU f32 tensor through `dtype` (bf16 / f16) and back, so that the
// CPU reference sees exactly the inputs the GPU computes on.
inline Tensor round_through(const Tensor& t, DType dtype) {
  return t.to(dtype).to(DType::f32);
}

// Tolerances: f32 kernels agree with the CPU up to summation order; bf16 has
// 8 significant bits (relative step 2^-8), f16 11.
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return 2e-2;
    case DType::f16:
      return 3e-3;
    case DType::f64:
      return 1e-10;
    default:
      return 1e-5;
  }
}

}  // namespace forge::testing
