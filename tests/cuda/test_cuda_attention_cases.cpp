// Every case of the one attention list (ops/attention/cases.h, the list
// gradcheck and the benchmark run) on the GPU against the CPU: the output and
// every gradient in f32, f64, bf16 and f16, at the case's own dims. The
// kernel-specific shapes (several tiles, ragged tiles, long sequences, head
// dims 64 / 128) stay in each mechanism's test_cuda_attention_<name>.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "ops/attention/cases.h"
#include "tests/cuda/cuda_attention_test_util.h"

namespace forge {
namespace {

// The case's f64 inputs in the CPU dtype the reference runs in for `dtype`
// (f64 for f64, f32 otherwise), keeping which require grad.
std::vector<Tensor> reference_inputs(const ops::attention::AttentionCase& c, DType dtype) {
  std::vector<Tensor> in = c.make_inputs(c.dims);
  for (Tensor& t : in) {
    if (!t.defined() || !is_floating(t.dtype())) continue;
    const bool grad = t.requires_grad();
    t = t.detach().to(testing::cpu_dtype(dtype));
    if (grad) t.set_requires_grad(true);
  }
  return in;
}

TEST(CudaAttentionCases, EveryCaseMatchesTheCpu) {
  FORGE_REQUIRE_CUDA();
  size_t checked = 0;
  for (const auto& c : ops::attention::attention_cases()) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16})
      testing::expect_cuda_matches_cpu(c.fn, reference_inputs(c, dtype), dtype,
                                       testing::attention_tolerance(dtype),
                                       c.name + " " + dtype_name(dtype));
    ++checked;
  }
  EXPECT_EQ(checked, ops::attention::attention_cases().size());
}

}  // namespace
}  // namespace forge
