// softmax, log_softmax, layer_norm, dropout, cross_entropy and mse_loss on the
// GPU against the CPU ops, forward and backward, in f32, f64, bf16 and f16
// (the CPU computing on the same values rounded through the 16-bit dtype):
// warp and block rows, a middle dim, large values, every layer_norm and
// cross_entropy option; dropout's mask bit for bit and the generator state
// after it; the errors for a bad target and for mixed devices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "ops/nn/functional.h"
#include "tests/cuda/cuda_test_util.h"

namespace forge {
namespace {

using ops::CrossEntropyOptions;
using ops::Reduction;
using testing::gpu;

const std::vector<DType> kDtypes = {DType::f32, DType::f64, DType::bf16, DType::f16};

bool is_16bit(DType d) {
  return d == DType::bf16 || d == DType::f16;
}

// f32 values uniform in [lo, hi) from their own seeded generator.
Tensor values(const Shape& shape, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  return testing::leaf64(shape, seed, lo, hi).detach().to(DType::f32);
}

// max |got - want| <= tolerance(dtype) * max(1, max |want|), NaN where want is.
void expect_near(const Tensor& got, const Tensor& want, DType dtype, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto a = got.to_vector<double>(), b = want.to_vector<double>();
  double diff = 0, scale = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(std::isnan(a[i]), std::isnan(b[i])) << what << " at flat index " << i;
    if (!std::isnan(b[i])) diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  EXPECT_LE(diff, testing::tolerance(dtype) * scale) << what << " (" << dtype_name(dtype) << ")";
}

using Op = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs op on the GPU in `dtype` and on the CPU (in f64 for f64, else f32) on
// the same values: float inputs become leaves rounded through dtype, others
// (class ids) are moved as they are. Both backward passes get the same seed;
// outputs and the grads of the float inputs must agree.
void expect_matches_cpu(DType dtype, const std::vector<Tensor>& inputs, const Op& op,
                        const std::string& what) {
  const DType host = dtype == DType::f64 ? DType::f64 : DType::f32;
  const auto on_host = [&](const Tensor& t) {
    return is_16bit(dtype) ? testing::round_through(t, dtype) : t.to(host).clone();
  };
  std::vector<Tensor> cpu, dev;
  for (const Tensor& t : inputs) {
    if (!is_floating(t.dtype())) {
      cpu.push_back(t);
      dev.push_back(t.to(gpu()));
      continue;
    }
    Tensor c = on_host(t);
    Tensor d = c.to(dtype).to(gpu());
    c.set_requires_grad(true);
    d.set_requires_grad(true);
    cpu.push_back(c);
    dev.push_back(d);
  }
  const Tensor yc = op(cpu), yd = op(dev);
  ASSERT_EQ(yd.device(), gpu()) << what;
  ASSERT_EQ(yd.dtype(), dtype) << what;
  expect_near(yd, yc, dtype, what + ": forward");

  Generator gen(7);
  const Tensor seed = on_host(Tensor::randn(yc.shape(), DType::f32, &gen));
  autograd::backward({yc}, {seed});
  autograd::backward({yd}, {seed.to(dtype).to(gpu())});
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!cpu[k].requires_grad()) continue;
    const std::string name = what + ": grad of input " + std::to_string(k);
    ASSERT_TRUE(dev[k].grad().defined()) << name;
    EXPECT_EQ(dev[k].grad().device(), gpu()) << name;
    expect_near(dev[k].grad(), cpu[k].grad(), dtype, name);
  }
}

TEST(CudaFunctional, SoftmaxAndLogSoftmaxMatchTheCpu) {
  FORGE_REQUIRE_CUDA();
  struct Case {
    Shape shape;
    int64_t dim;
    double lo, hi;
  };
  // A warp per row, a block per row (C > 1024), a middle dim, dim 0, and rows
  // around 1000 (exp overflows f32 without the max subtracted).
  const std::vector<Case> cases = {{{5, 37}, -1, -3, 3},      {{3, 2500}, -1, -3, 3},
                                   {{4, 6, 9}, 1, -3, 3},     {{4, 6, 9}, 0, -3, 3},
                                   {{8, 300}, -1, 980, 1020}, {{8, 300}, 0, 980, 1020}};
  for (DType dtype : kDtypes) {
    for (const Case& c : cases) {
      for (bool log : {false, true}) {
        const std::string what = std::string(log ? "log_softmax " : "softmax ") +
                                 shape_str(c.shape) + " dim " + std::to_string(c.dim);
        expect_matches_cpu(
            dtype, {values(c.shape, 11, c.lo, c.hi)},
            [&](const std::vector<Tensor>& in) {
              return log ? ops::log_softmax(in[0], c.dim) : ops::softmax(in[0], c.dim);
            },
            what);
      }
    }
  }
}

TEST(CudaFunctional, LayerNormMatchesTheCpu) {
  FORGE_REQUIRE_CUDA();
  struct Case {
    Shape shape;
    int64_t normalized_ndim;
  };
  // Warp rows, normalized_ndim 2, many rows (dweight / dbias summed in
  // chunks of several rows), and a block per row (N > 1024).
  const std::vector<Case> cases = {
      {{6, 7, 40}, 1}, {{6, 7, 40}, 2}, {{8192, 96}, 1}, {{3, 2000}, 1}};
  for (DType dtype : kDtypes) {
    for (const Case& c : cases) {
      const Shape norm(c.shape.end() - c.normalized_ndim, c.shape.end());
      const Tensor x = values(c.shape, 21, -1, 3), w = values(norm, 22, 0.5, 1.5),
                   b = values(norm, 23);
      // Inputs x; x and weight; x, weight and bias.
      for (size_t params = 0; params <= 2; ++params) {
        std::vector<Tensor> inputs = {x, w, b};
        inputs.resize(1 + params);
        expect_matches_cpu(
            dtype, inputs,
            [&](const std::vector<Tensor>& in) {
              return ops::layer_norm(in[0], c.normalized_ndim, in.size() > 1 ? in[1] : Tensor(),
                                     in.size() > 2 ? in[2] : Tensor());
            },
            "layer_norm " + shape_str(c.shape) + " over " + std::to_string(c.normalized_ndim) +
                " dims with " + std::to_string(params) + " params");
      }
    }
  }
}

TEST(CudaFunctional, CrossEntropyMatchesTheCpu) {
  FORGE_REQUIRE_CUDA();
  struct Case {
    Shape lead;
    int64_t C;
  };
  // A warp per row, and a block per row (C > 1024).
  const std::vector<Case> cases = {{{4, 5}, 11}, {{6}, 1500}};
  int run = 0;
  for (DType dtype : kDtypes) {
    for (const Case& c : cases) {
      Shape shape = c.lead;
      shape.push_back(c.C);
      const Tensor logits = values(shape, 31, -4, 4);
      for (int64_t ignore : {int64_t{-100}, int64_t{3}}) {
        // Class ids (r * 7 + 3) % C, every fourth row ignored; with ignore 3
        // the rows of class 3 are ignored too.
        const int64_t rows = shape_numel(c.lead);
        std::vector<int64_t> ids(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r)
          ids[static_cast<size_t>(r)] = r % 4 == 1 ? ignore : (r * 7 + 3) % c.C;
        for (double smoothing : {0.0, 0.1}) {
          for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
            // Alternate i64 and i32 targets.
            const DType index = ++run % 2 ? DType::i64 : DType::i32;
            const Tensor target = Tensor::from_vector(ids, c.lead).to(index);
            const CrossEntropyOptions options{ignore, smoothing, reduction};
            expect_matches_cpu(
                dtype, {logits, target},
                [&](const std::vector<Tensor>& in) {
                  return ops::cross_entropy(in[0], in[1], options);
                },
                "cross_entropy " + shape_str(shape) + " ignore " + std::to_string(ignore) +
                    " smoothing " + std::to_string(smoothing) + " reduction " +
                    std::to_string(static_cast<int>(reduction)) + " target " + dtype_name(index));
          }
        }
      }
    }
  }
}

TEST(CudaFunctional, MseLossMatchesTheCpu) {
  FORGE_REQUIRE_CUDA();
  // Small, and large enough for many partial sums per block.
  for (const Shape& shape : {Shape{7, 13}, Shape{(1 << 20) + 5}}) {
    const Tensor x = values(shape, 41), t = values(shape, 42);
    for (DType dtype : kDtypes) {
      for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
        // The large sum (about 2.8e6) is beyond f16's range.
        if (dtype == DType::f16 && reduction == Reduction::sum && x.numel() > 1000) continue;
        expect_matches_cpu(
            dtype, {x, t},
            [&](const std::vector<Tensor>& in) { return ops::mse_loss(in[0], in[1], reduction); },
            "mse_loss " + shape_str(shape) + " reduction " +
                std::to_string(static_cast<int>(reduction)));
      }
    }
  }
}

TEST(CudaFunctional, DropoutMaskIsBitIdenticalToTheCpu) {
  FORGE_REQUIRE_CUDA();
  // n = 3,004,001: not a multiple of 4, and several sweeps of the grid. Values
  // in [0.5, 2) keep every kept element non-zero in every dtype.
  const Tensor x = values({1001, 3001}, 51, 0.5, 2.0);
  const Tensor g = values({1001, 3001}, 53);
  for (DType dtype : kDtypes) {
    for (double p : {0.1, 0.5}) {
      const std::string what = std::string(dtype_name(dtype)) + " p " + std::to_string(p);
      const DType host = dtype == DType::f64 ? DType::f64 : DType::f32;
      Tensor xc = is_16bit(dtype) ? testing::round_through(x, dtype) : x.to(host).clone();
      Tensor xd = xc.to(dtype).to(gpu());
      xc.set_requires_grad(true);
      xd.set_requires_grad(true);
      // The same generator state, at a non-zero offset, on both sides.
      Generator gen_c(1234), gen_d(1234);
      gen_c.reserve(10);
      gen_d.reserve(10);
      const Tensor yc = ops::dropout(xc, p, true, &gen_c);
      const Tensor yd = ops::dropout(xd, p, true, &gen_d);
      EXPECT_EQ(gen_d.state(), gen_c.state()) << what;
      // ceil(10 / 4) blocks reserved first, then ceil(n / 4).
      EXPECT_EQ(gen_d.offset(), static_cast<uint64_t>(3 + (x.numel() + 3) / 4)) << what;

      const auto a = yd.to_vector<double>(), b = yc.to_vector<double>();
      int64_t pattern_mismatches = 0, value_mismatches = 0, dropped = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        pattern_mismatches += (a[i] == 0) != (b[i] == 0);
        value_mismatches += std::memcmp(&a[i], &b[i], sizeof(double)) != 0;
        dropped += b[i] == 0;
      }
      EXPECT_EQ(pattern_mismatches, 0) << what;
      EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(a.size()), p, 0.01) << what;
      // f32 and f64 compute x * scale exactly as the CPU does.
      if (!is_16bit(dtype)) {
        EXPECT_EQ(value_mismatches, 0) << what;
      } else {
        expect_near(yd, yc, dtype, what);
      }

      const Tensor gc = is_16bit(dtype) ? testing::round_through(g, dtype) : g.to(host);
      autograd::backward({yc}, {gc});
      autograd::backward({yd}, {gc.to(dtype).to(gpu())});
      if (!is_16bit(dtype)) {
        const auto da = xd.grad().to_vector<double>(), db = xc.grad().to_vector<double>();
        EXPECT_EQ(std::memcmp(da.data(), db.data(), da.size() * sizeof(double)), 0) << what;
      } else {
        expect_near(xd.grad(), xc.grad(), dtype, what + ": grad");
      }
    }
  }
}

TEST(CudaFunctional, BadTargetsAndMixedDevicesAreClearErrors) {
  FORGE_REQUIRE_CUDA();
  const Tensor logits = values({2, 2, 3}, 61).to(gpu());
  for (DType index : {DType::i64, DType::i32}) {
    const Tensor high = Tensor::from_vector<int64_t>({0, -100, 2, 7}, {2, 2}).to(index).to(gpu());
    testing::expect_error([&] { ops::cross_entropy(logits, high); },
                          {"target 7 at position [1, 1] is out of range for 3 classes"});
    const Tensor negative = Tensor::from_vector<int64_t>({0, -1, 2, 1}, {2, 2}).to(index).to(gpu());
    testing::expect_error([&] { ops::cross_entropy(logits, negative); },
                          {"target -1 at position [0, 1]", "ignore_index -100"});
  }
  // The device is still usable, and a valid call works.
  const Tensor ok = Tensor::from_vector<int64_t>({0, 1, 2, 1}, {2, 2}).to(gpu());
  EXPECT_TRUE(std::isfinite(ops::cross_entropy(logits, ok).item()));

  testing::expect_error(
      [&] {
        ops::cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1, 2, 1}, {2, 2}));
      },
      {"target is on cpu", "logits is on cuda:0", "one device"});
  testing::expect_error([&] { ops::layer_norm(logits, 1, Tensor::ones({3}), Tensor()); },
                        {"weight is on cpu", "x is on cuda:0"});
  testing::expect_error(
      [&] {
        ops::mse_loss(logits, values({2, 2, 3}, 62));
      },
      {"target is on cpu", "input is on cuda:0"});
}

}  // namespace
}  // namespace forge
