// The elementwise ops on the GPU against the CPU: every op's forward and
// backward in f32, f64, bf16 and f16 (the CPU reference computes in f64 on the
// same inputs, rounded through the 16-bit dtypes), broadcasting with its
// gradients (sum_to's kernels, with and without splits), where and masked_fill
// with masks on the GPU, and the errors for mixed devices and integer tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "ops/elementwise/elementwise.h"
#include "tests/cuda/cuda_test_util.h"

namespace forge {
namespace {

using testing::gpu;
using Op = std::function<Tensor(const std::vector<Tensor>&)>;

const DType kGpuTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

// A CPU f32 tensor uniform in [lo, hi), from its own seeded generator.
Tensor uniform(const Shape& shape, double lo, double hi, uint64_t seed) {
  Generator gen(seed);
  Tensor u = Tensor::rand(shape, DType::f32, &gen);
  float* p = u.data<float>();
  for (int64_t i = 0; i < u.numel(); ++i) p[i] = static_cast<float>(lo + (hi - lo) * p[i]);
  return u;
}

// A CPU mask (bool or u8) with about half its elements set.
Tensor random_mask(const Shape& shape, DType dtype, uint64_t seed) {
  const std::vector<float> u = uniform(shape, 0, 1, seed).to_vector<float>();
  std::vector<uint8_t> bits(u.size());
  for (size_t i = 0; i < u.size(); ++i) bits[i] = u[i] < 0.5f ? 1 : 0;
  return Tensor::from_vector(bits, shape).to(dtype);
}

// What the CPU reference computes on: the GPU's input values (x rounded
// through a 16-bit dtype) in f64, so that the reference's own rounding is far
// below every tolerance.
Tensor reference_input(const Tensor& x, DType dtype) {
  const bool half = dtype == DType::bf16 || dtype == DType::f16;
  return (half ? testing::round_through(x, dtype) : x).to(DType::f64);
}

// A GPU result equals the CPU reference within tolerance(dtype), relative to
// the reference's largest magnitude (at least 1).
void expect_matches(const Tensor& got, const Tensor& want, DType dtype, const std::string& what) {
  ASSERT_TRUE(got.defined() && want.defined()) << what;
  EXPECT_EQ(got.device(), gpu()) << what;
  EXPECT_EQ(got.dtype(), dtype) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double scale = 1, err = 0;
  for (double v : w) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < g.size(); ++i) {
    err = std::max(err, std::isnan(g[i]) != std::isnan(w[i]) ? INFINITY : std::abs(g[i] - w[i]));
  }
  EXPECT_LE(err, testing::tolerance(dtype) * scale)
      << what << " (largest reference magnitude " << scale << ")";
}

struct Input {
  Shape shape;
  double lo = -2, hi = 2;
};

// Runs op on GPU leaves of `dtype` and on the CPU reference leaves, back-
// propagates the same random output gradient through both, and compares the
// outputs and every input's gradient. The output gradient is positive, as are
// the binary ops' inputs below: in a 16-bit dtype a binary op's backward rounds
// each product before sum_to adds them, an error relative to the sum of the
// products' magnitudes, which is within the tolerance only without cancellation.
void check_op(const std::string& name, const Op& op, const std::vector<Input>& inputs,
              DType dtype) {
  const std::string what = name + " in " + dtype_name(dtype);
  std::vector<Tensor> on_gpu, on_cpu;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor x = uniform(inputs[i].shape, inputs[i].lo, inputs[i].hi, 11 + i);
    on_gpu.push_back(x.to(dtype).to(gpu()).set_requires_grad(true));
    on_cpu.push_back(reference_input(x, dtype).set_requires_grad(true));
  }
  const Tensor y_gpu = op(on_gpu), y_cpu = op(on_cpu);
  expect_matches(y_gpu, y_cpu, dtype, what + ": forward");
  const Tensor dy = uniform(y_cpu.shape(), 0.25, 1, 7);
  autograd::backward({y_gpu}, {dy.to(dtype).to(gpu())});
  autograd::backward({y_cpu}, {reference_input(dy, dtype)});
  for (size_t i = 0; i < inputs.size(); ++i) {
    expect_matches(on_gpu[i].grad(), on_cpu[i].grad(), dtype,
                   what + ": gradient of input " + std::to_string(i));
  }
}

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  double lo, hi;  // the input range (inside the domain, away from overflow)
};

TEST(CudaElementwise, UnaryOpsAndTheirGradientsMatchTheCpu) {
  FORGE_REQUIRE_CUDA();
  const UnaryCase cases[] = {
      {"neg", [](const Tensor& x) { return ops::neg(x); }, -2, 2},
      {"exp", [](const Tensor& x) { return ops::exp(x); }, -2, 2},
      {"log", [](const Tensor& x) { return ops::log(x); }, 0.2, 3},
      {"sqrt", [](const Tensor& x) { return ops::sqrt(x); }, 0.2, 3},
      {"rsqrt", [](const Tensor& x) { return ops::rsqrt(x); }, 0.2, 3},
      {"pow 3", [](const Tensor& x) { return ops::pow(x, 3.0); }, -2, 2},
      {"pow 0.5", [](const Tensor& x) { return ops::pow(x, 0.5); }, 0.2, 3},
      {"pow -1.5", [](const Tensor& x) { return ops::pow(x, -1.5); }, 0.5, 2},
      {"pow 0", [](const Tensor& x) { return ops::pow(x, 0.0); }, -1, 1},
      {"abs", [](const Tensor& x) { return ops::abs(x); }, -2, 2},
      {"square", [](const Tensor& x) { return ops::square(x); }, -2, 2},
      {"clamp", [](const Tensor& x) { return ops::clamp(x, -0.5, 0.7); }, -1, 1},
      {"clamp below", [](const Tensor& x) { return ops::clamp(x, 0.0); }, -1, 1},
      {"relu", [](const Tensor& x) { return ops::relu(x); }, -2, 2},
      {"gelu", [](const Tensor& x) { return ops::gelu(x); }, -4, 4},
      {"gelu tanh", [](const Tensor& x) { return ops::gelu(x, ops::GeluApprox::tanh); }, -4, 4},
      {"elu", [](const Tensor& x) { return ops::elu(x, 1.3); }, -3, 3},
      {"silu", [](const Tensor& x) { return ops::silu(x); }, -6, 6},
      {"sigmoid", [](const Tensor& x) { return ops::sigmoid(x); }, -8, 8},
      {"tanh", [](const Tensor& x) { return ops::tanh(x); }, -3, 3},
      {"add scalar", [](const Tensor& x) { return ops::add(x, 1.5); }, -2, 2},
      {"mul scalar", [](const Tensor& x) { return ops::mul(x, -2.5); }, -2, 2},
      {"x - s", [](const Tensor& x) { return x - 0.25; }, -2, 2},
      {"s - x", [](const Tensor& x) { return 3.0 - x; }, -2, 2},
      {"x / s", [](const Tensor& x) { return x / 4.0; }, -2, 2},
      {"-x", [](const Tensor& x) { return -x; }, -2, 2},
  };
  for (const UnaryCase& c : cases) {
    for (DType dt : kGpuTypes) {
      check_op(
          c.name, [&](const std::vector<Tensor>& t) { return c.f(t[0]); },
          {{{67, 129}, c.lo, c.hi}}, dt);
    }
  }
}

TEST(CudaElementwise, BroadcastingBinaryOpsAndTheirGradientsMatchTheCpu) {
  FORGE_REQUIRE_CUDA();
  const std::pair<const char*, Op> binary_ops[] = {
      {"add", [](const std::vector<Tensor>& t) { return ops::add(t[0], t[1]); }},
      {"sub", [](const std::vector<Tensor>& t) { return ops::sub(t[0], t[1]); }},
      {"mul", [](const std::vector<Tensor>& t) { return ops::mul(t[0], t[1]); }},
      {"div", [](const std::vector<Tensor>& t) { return ops::div(t[0], t[1]); }},
      {"a + b", [](const std::vector<Tensor>& t) { return t[0] + t[1]; }},
      {"a - b", [](const std::vector<Tensor>& t) { return t[0] - t[1]; }},
      {"a * b", [](const std::vector<Tensor>& t) { return t[0] * t[1]; }},
      {"a / b", [](const std::vector<Tensor>& t) { return t[0] / t[1]; }},
  };
  const std::pair<Shape, Shape> shapes[] = {
      {{3, 4}, {3, 4}},        // flat
      {{2, 3, 4}, {4}},        // [B, N, D] + [D]
      {{2, 1, 4}, {1, 3, 1}},  // [B, 1, D] * [1, N, 1]
      {{2, 3, 4}, {}},         // a scalar tensor
      {{}, {5}},
      {{5, 1}, {1, 6}},     // an outer product
      {{4, 1, 3}, {2, 1}},  // both stretched, b with fewer dims
      {{0, 3}, {3}},        // empty
      {{2, 3, 1, 4}, {3, 5, 1}},
  };
  for (const auto& [name, op] : binary_ops) {
    for (const auto& [sa, sb] : shapes) {
      for (DType dt : kGpuTypes) {
        check_op(std::string(name) + " " + shape_str(sa) + " " + shape_str(sb), op,
                 {{sa, 0.5, 2}, {sb, 0.5, 2}}, dt);
      }
    }
  }
}

// Shapes big enough for several grid-stride rounds and for sum_to to split
// its reduction across blocks (then add the partial sums), in both kernels.
TEST(CudaElementwise, LargeBroadcastsAndTheirReductionsMatchTheCpu) {
  FORGE_REQUIRE_CUDA();
  const Op mul = [](const std::vector<Tensor>& t) { return ops::mul(t[0], t[1]); };
  const std::pair<Shape, Shape> shapes[] = {
      {{256, 1024}, {1024}},      // b's gradient: columns summed in splits
      {{600, 500}, {}},           // a full reduction, in splits
      {{64, 4096}, {64, 1}},      // rows summed in splits
      {{8, 1, 64}, {1, 300, 1}},  // two summed dims around a kept one, and the reverse
      {{600, 500}, {600, 500}},   // flat, more elements than one grid's threads
  };
  for (const auto& [sa, sb] : shapes) {
    for (DType dt : kGpuTypes) {
      // The scalar's gradient sums 300000 products (about 2.3e5): past f16's
      // largest value 65504, so its f16 result is inf by design, not by error.
      if (dt == DType::f16 && sb.empty()) continue;
      check_op("mul " + shape_str(sa) + " " + shape_str(sb), mul, {{sa, 0.5, 2}, {sb, 0.5, 2}}, dt);
    }
  }
  for (DType dt : kGpuTypes) {
    check_op(
        "gelu [600, 500]", [](const std::vector<Tensor>& t) { return ops::gelu(t[0]); },
        {{{600, 500}}}, dt);
  }
}

TEST(CudaElementwise, ExpandAndSumToMatchTheCpu) {
  FORGE_REQUIRE_CUDA();
  const std::pair<Shape, Shape> expands[] = {
      {{3, 1, 5}, {2, 3, 4, 5}}, {{}, {4, 3}}, {{4, 1}, {4, 6}}, {{2, 3}, {2, 3}}};
  const std::pair<Shape, Shape> sums[] = {
      {{2, 3, 4}, {3, 1}}, {{2, 3, 4}, {}},        {{2, 3, 4}, {1, 1, 4}}, {{2, 3, 4}, {1, 3, 4}},
      {{1, 5}, {5}},       {{6, 1, 7}, {6, 1, 1}}, {{6, 5, 7}, {6, 1, 1}}, {{2, 3, 4}, {2, 3, 4}}};
  for (DType dt : kGpuTypes) {
    for (const auto& [from, to] : expands) {
      check_op(
          "expand " + shape_str(from) + " to " + shape_str(to),
          [to = to](const std::vector<Tensor>& t) { return ops::expand(t[0], to); }, {{from}}, dt);
    }
    for (const auto& [from, to] : sums) {
      check_op(
          "sum_to " + shape_str(from) + " to " + shape_str(to),
          [to = to](const std::vector<Tensor>& t) { return ops::sum_to(t[0], to); }, {{from}}, dt);
    }
  }
}

TEST(CudaElementwise, WhereAndMaskedFillWithMasksOnTheGpuMatchTheCpu) {
  FORGE_REQUIRE_CUDA();
  const Tensor cond = random_mask({2, 1, 4}, DType::boolean, 3);
  const Tensor cond_u8 = random_mask({5, 6}, DType::u8, 4);
  const Tensor mask = random_mask({1, 3, 1}, DType::boolean, 5);
  const Tensor mask_u8 = random_mask({4, 6}, DType::u8, 6);
  struct Case {
    const char* name;
    Op op;  // moves its mask to the device of its inputs
    std::vector<Input> inputs;
  };
  const Case cases[] = {
      {"where bool",
       [&](const std::vector<Tensor>& t) { return ops::where(cond.to(t[0].device()), t[0], t[1]); },
       {Input{{2, 3, 4}}, Input{{3, 1}}}},
      {"where u8 with a scalar",
       [&](const std::vector<Tensor>& t) {
         return ops::where(cond_u8.to(t[0].device()), t[0], t[1]);
       },
       {Input{{}}, Input{{5, 6}}}},
      {"masked_fill bool",
       [&](const std::vector<Tensor>& t) {
         return ops::masked_fill(t[0], mask.to(t[0].device()), -3.5);
       },
       {Input{{2, 3, 4}}}},
      {"masked_fill u8",
       [&](const std::vector<Tensor>& t) {
         return ops::masked_fill(t[0], mask_u8.to(t[0].device()), 7.25);
       },
       {Input{{4, 6}}}},
  };
  for (const Case& c : cases) {
    for (DType dt : kGpuTypes) check_op(c.name, c.op, c.inputs, dt);
  }
}

TEST(CudaElementwise, MixedDevicesAndIntegerTensorsAreErrors) {
  FORGE_REQUIRE_CUDA();
  const Tensor h = Tensor::ones({3});
  const Tensor d = Tensor::ones({3}, DType::f32, gpu());
  testing::expect_error([&] { ops::add(h, d); }, {"add", "cpu", "cuda:0"});
  testing::expect_error([&] { ops::mul(d, h); }, {"mul", "cuda:0", "cpu"});
  testing::expect_error([&] { ops::where(Tensor::ones({3}, DType::boolean), d, d); },
                        {"where", "cond", "cpu", "cuda:0"});
  testing::expect_error([&] { ops::where(Tensor::ones({3}, DType::boolean, gpu()), d, h); },
                        {"where", "cpu", "cuda:0"});
  testing::expect_error([&] { ops::masked_fill(d, Tensor::ones({3}, DType::u8), 0); },
                        {"masked_fill", "mask", "cpu", "cuda:0"});
  const Tensor i = Tensor::zeros({3}, DType::i32, gpu());
  testing::expect_error([&] { ops::exp(i); }, {"exp", "i32"});
  testing::expect_error([&] { ops::add(i, i); }, {"add", "i32"});
  testing::expect_error([&] { ops::sum_to(i, {}); }, {"sum_to", "i32"});
  testing::expect_error([&] { ops::add(d, d.to(DType::bf16)); }, {"add", "f32", "bf16"});
}

}  // namespace
}  // namespace forge
