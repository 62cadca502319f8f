// GPU tests of attention::taylorshift: both forms (forced, and picked by the
// default switch) against the CPU op in f32, f64, bf16 and f16, the output and
// the gradients of q, k, v and tau, over masks (a fully masked batch too),
// cross lengths, output_normalized, other coefficients, a different tau per
// head, lengths that leave partial tiles, head dims from 5 to 256 and state
// sums split over several blocks; the two forms against each other on a long
// sequence; a deterministic backward; peak memory linear in N for both forms;
// and the device checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/engine.h"
#include "ops/attention/attention.h"
#include "tests/cuda/cuda_attention_test_util.h"

namespace forge {
namespace {

using ops::attention::TaylorShiftOptions;
using namespace testing;

constexpr int64_t kForceDirect = int64_t{1} << 40;

TaylorShiftOptions form(bool direct, TaylorShiftOptions o = {}) {
  o.n0 = direct ? kForceDirect : -1;
  return o;
}

struct Case {
  std::string name;
  int64_t B, H, N, M, d, dv;
  std::vector<int64_t> pad;  // masked keys at the end of each batch (B entries); empty: no mask
  TaylorShiftOptions options;
};

// q, k, v uniform in [-1, 1), tau [H] in [0.5, 1.5) (a different value per head),
// all requiring grad, then the mask; CPU tensors of `dtype`.
std::vector<Tensor> inputs(const Case& c, DType dtype) {
  std::vector<Tensor> in = {testing::uniform({c.B, c.H, c.N, c.d}, 1, dtype),
                            testing::uniform({c.B, c.H, c.M, c.d}, 2, dtype),
                            testing::uniform({c.B, c.H, c.M, c.dv}, 3, dtype),
                            testing::uniform({c.H}, 4, dtype, 0.5, 1.5)};
  if (!c.pad.empty()) in.push_back(testing::padding_mask(c.B, c.M, c.pad));
  return in;
}

testing::AttentionFn op(const TaylorShiftOptions& o) {
  return [o](const std::vector<Tensor>& in) {
    return ops::attention::taylorshift(in[0], in[1], in[2], in[3], in.size() > 4 ? in[4] : Tensor(),
                                       o);
  };
}

void expect_matches(const Case& c, DType dtype) {
  SCOPED_TRACE(c.name);
  const DType ref = dtype == DType::f64 ? DType::f64 : DType::f32;
  testing::expect_cuda_matches_cpu(op(c.options), inputs(c, ref), dtype,
                                   testing::attention_tolerance(dtype),
                                   c.name + " in " + dtype_name(dtype));
}

// The shapes and options run in both forms. Tiles are 64 rows (both forms) and
// 64 keys (direct); N, M = 150 leave partial tiles; M = 600 splits the
// efficient form's key state over blocks (and N = 600 its query state).
std::vector<Case> both_form_cases() {
  TaylorShiftOptions coefficients;
  coefficients.a = 0.3;
  coefficients.b = -0.4;
  coefficients.c = 0.5;
  TaylorShiftOptions normalized;
  normalized.output_normalized = true;
  return {
      {"plain", 2, 2, 150, 150, 16, 24, {}, {}},
      {"mask", 2, 2, 150, 150, 16, 24, {5, 70}, {}},
      {"fully masked batch", 2, 2, 70, 90, 8, 12, {0, 90}, {}},
      {"cross N < M + mask", 2, 2, 70, 200, 16, 16, {3, 131}, {}},
      {"cross N > M", 1, 3, 200, 70, 16, 16, {}, {}},
      {"output_normalized + mask", 2, 2, 100, 130, 16, 20, {10, 40}, normalized},
      {"coefficients", 2, 2, 100, 100, 16, 16, {}, coefficients},
      {"d = 64", 1, 2, 130, 130, 64, 64, {1, 20}, {}},
      {"small odd d", 2, 2, 77, 77, 5, 7, {2, 9}, {}},
      {"split state sums + mask", 1, 2, 600, 600, 8, 8, {37}, {}},
      {"long keys + mask", 2, 1, 90, 600, 8, 6, {7, 333}, {}},
  };
}

TEST(CudaAttentionTaylorShift, BothFormsMatchTheCpu) {
  FORGE_REQUIRE_CUDA();
  for (Case c : both_form_cases())
    for (bool direct : {true, false}) {
      const std::string name = c.name;
      c.options = form(direct, c.options);
      c.name = name + (direct ? " (direct)" : " (efficient)");
      for (DType dtype : {DType::f32, DType::f64, DType::bf16}) expect_matches(c, dtype);
    }
}

TEST(CudaAttentionTaylorShift, DefaultSwitchMatchesTheCpu) {
  FORGE_REQUIRE_CUDA();
  // d = 4: the switch point d^2 + d + 1 = 21 sends N = 40 to the efficient form
  // and N = 20 (and N = 21) to the direct one.
  for (int64_t N : {20, 21, 40})
    for (DType dtype : {DType::f32, DType::f64, DType::bf16})
      expect_matches({"default switch N = " + std::to_string(N), 2, 2, N, 50, 4, 6, {3, 17}, {}},
                     dtype);
  // The efficient form does not care about the key count, only N.
  TaylorShiftOptions n0;
  n0.n0 = 30;
  for (int64_t N : {30, 31})
    expect_matches({"n0 = 30, N = " + std::to_string(N), 1, 2, N, 80, 8, 8, {}, n0}, DType::f32);
}

TEST(CudaAttentionTaylorShift, WideHeadsMatchTheCpu) {
  FORGE_REQUIRE_CUDA();
  // Direct: two and four column blocks of 64 (up to the limit, 256).
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    expect_matches({"direct d = 128, dv = 96", 1, 2, 70, 90, 128, 96, {}, form(true)}, dtype);
    expect_matches({"direct d = 200, dv = 256", 1, 2, 70, 70, 200, 256, {5}, form(true)}, dtype);
    expect_matches({"direct d = 256, dv = 130", 1, 1, 65, 66, 256, 130, {}, form(true)}, dtype);
  }
  // Efficient: a [129^2, dv + 1] state, and dv + 1 = 129 columns in one tile.
  for (DType dtype : {DType::f32, DType::bf16}) {
    expect_matches({"efficient d = 128", 1, 2, 40, 45, 128, 32, {4}, form(false)}, dtype);
    expect_matches({"efficient dv = 128", 1, 2, 70, 70, 16, 128, {}, form(false)}, dtype);
  }
}

TEST(CudaAttentionTaylorShift, HalfPrecisionMatchesTheCpu) {
  FORGE_REQUIRE_CUDA();
  for (bool direct : {true, false}) {
    const std::string name = std::string("f16 ") + (direct ? "direct" : "efficient");
    expect_matches({name, 2, 2, 100, 90, 16, 16, {3, 30}, form(direct)}, DType::f16);
  }
}

// The two forms are the same function: on the GPU too, on a long sequence.
TEST(CudaAttentionTaylorShift, FormsAgreeOnALongSequence) {
  FORGE_REQUIRE_CUDA();
  const Case c{"long", 1, 2, 2048, 2048, 16, 16, {}, {}};
  std::vector<Tensor> in_direct, in_efficient;
  for (const Tensor& t : inputs(c, DType::f32)) {
    in_direct.push_back(t.detach().to(gpu()).set_requires_grad(true));
    in_efficient.push_back(t.detach().to(gpu()).set_requires_grad(true));
  }
  const Tensor od = op(form(true))(in_direct), oe = op(form(false))(in_efficient);
  EXPECT_LE(testing::scaled_diff(oe, od), 1e-4) << "forward";
  const Tensor seed = testing::uniform(od.shape(), 99, DType::f32, -1, 1, false).to(gpu());
  autograd::backward({od}, {seed});
  autograd::backward({oe}, {seed});
  for (size_t i = 0; i < in_direct.size(); ++i)
    EXPECT_LE(testing::scaled_diff(in_efficient[i].grad(), in_direct[i].grad()), 1e-4)
        << "gradient of input " << i;
}

// The backward adds in a fixed order (no atomics): two runs give the same bits.
TEST(CudaAttentionTaylorShift, BackwardIsDeterministic) {
  FORGE_REQUIRE_CUDA();
  const Case c{"determinism", 2, 2, 600, 600, 8, 8, {0, 100}, {}};
  for (bool direct : {true, false}) {
    std::vector<std::vector<float>> runs[2];
    for (auto& grads : runs) {
      std::vector<Tensor> in;
      for (const Tensor& t : inputs(c, DType::f32)) {
        Tensor g = t.detach().to(gpu());
        if (is_floating(t.dtype())) g.set_requires_grad(true);
        in.push_back(g);
      }
      const Tensor o = op(form(direct))(in);
      autograd::backward({o},
                         {testing::uniform(o.shape(), 99, DType::f32, -1, 1, false).to(gpu())});
      for (size_t i = 0; i < 4; ++i)
        grads.push_back(testing::host_f32(in[i].grad()).to_vector<float>());
    }
    for (size_t i = 0; i < 4; ++i)
      EXPECT_EQ(runs[0][i], runs[1][i]) << (direct ? "direct" : "efficient") << ", input " << i;
  }
}

std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)> qkv_op(bool direct) {
  return [direct](const Tensor& q, const Tensor& k, const Tensor& v) {
    const Tensor tau = Tensor::ones({q.size(1)}, q.dtype(), q.device());
    return ops::attention::taylorshift(q, k, v, tau, Tensor(), form(direct));
  };
}

TEST(CudaAttentionTaylorShift, EfficientFormMemoryIsLinear) {
  FORGE_REQUIRE_CUDA();
  testing::expect_linear_memory_cuda(qkv_op(false), 2, 32, DType::f32, "taylorshift efficient");
}

// The direct form is O(N^2) in time but never holds N x N: its memory is linear too.
TEST(CudaAttentionTaylorShift, DirectFormMemoryIsLinear) {
  FORGE_REQUIRE_CUDA();
  testing::expect_linear_memory_cuda(qkv_op(true), 1, 16, DType::f32, "taylorshift direct");
}

TEST(CudaAttentionTaylorShift, ChecksDevicesAndHeadDims) {
  FORGE_REQUIRE_CUDA();
  const Tensor q = Tensor::ones({1, 2, 4, 3}, DType::f32, gpu()),
               k = Tensor::ones({1, 2, 5, 3}, DType::f32, gpu()),
               v = Tensor::ones({1, 2, 5, 2}, DType::f32, gpu());
  const std::string on_cpu =
      error_of([&] { ops::attention::taylorshift(q, k, v, Tensor::ones({2})); });
  EXPECT_NE(on_cpu.find("tau must be a cuda:0 f32 tensor like q, got f32 on cpu"),
            std::string::npos)
      << on_cpu;
  const std::string mask_on_cpu = error_of([&] {
    ops::attention::taylorshift(q, k, v, Tensor::ones({2}, DType::f32, gpu()),
                                Tensor::ones({1, 5}, DType::boolean));
  });
  EXPECT_NE(mask_on_cpu.find("key_padding_mask is on cpu but q is on cuda:0"), std::string::npos)
      << mask_on_cpu;
  const Tensor wide = Tensor::ones({1, 1, 4, 300}, DType::f32, gpu());
  const std::string too_wide = error_of([&] {
    ops::attention::taylorshift(wide, wide, wide, Tensor::ones({1}, DType::f32, gpu()), Tensor(),
                                form(true));
  });
  EXPECT_NE(too_wide.find("on a GPU the direct form takes head dims d, dv <= 256, got d = 300"),
            std::string::npos)
      << too_wide;
}

}  // namespace
}  // namespace forge
