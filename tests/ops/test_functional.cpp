// softmax, log_softmax, layer_norm, dropout, cross_entropy and mse_loss:
// hand-computed values in f32 and f64, naive oracles for the strided paths,
// gradcheck in f64 for every op and option, dropout's mask rule and
// determinism, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <string>

#include "autograd/engine.h"
#include "core/threading.h"
#include "ops/nn/functional.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using ops::CrossEntropyOptions;
using ops::Reduction;
using namespace testing;

#define EXPECT_ERROR_HAS(stmt, text)                       \
  do {                                                     \
    const std::string msg_ = error_of([&] { stmt; });      \
    EXPECT_NE(msg_.find(text), std::string::npos) << msg_; \
  } while (0)

const char* reduction_name(Reduction r) {
  return r == Reduction::mean ? "mean" : r == Reduction::sum ? "sum" : "none";
}

// ---- softmax / log_softmax ----

// The oracle: exp(x) / sum exp(x) along `dim` by direct loops over (outer, C, inner), in f64.
Tensor naive_softmax(const Tensor& x, int64_t dim, bool log) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  int64_t outer = 1, C = x.size(d), inner = 1;
  for (int64_t k = 0; k < d; ++k) outer *= x.size(k);
  for (int64_t k = d + 1; k < x.dim(); ++k) inner *= x.size(k);
  const auto xv = x.to_vector<double>();
  std::vector<double> y(xv.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c)
        s += std::exp(xv[static_cast<size_t>((o * C + c) * inner + i)]);
      for (int64_t c = 0; c < C; ++c) {
        const size_t k = static_cast<size_t>((o * C + c) * inner + i);
        y[k] = log ? xv[k] - std::log(s) : std::exp(xv[k]) / s;
      }
    }
  }
  return Tensor::from_vector(y, x.shape());
}

template <typename T>
class FunctionalSoftmaxValues : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(FunctionalSoftmaxValues, FloatTypes);

TYPED_TEST(FunctionalSoftmaxValues, HandValues) {
  using T = TypeParam;
  const T l2 = static_cast<T>(std::log(2.0)), l3 = static_cast<T>(std::log(3.0));
  // exp gives 1, 2, 3: probabilities 1/6, 2/6, 3/6.
  const Tensor x = Tensor::from_vector(std::vector<T>{0, l2, l3});
  Tensor y = ops::softmax(x);
  EXPECT_EQ(y.dtype(), x.dtype());
  expect_values(y, {1.0 / 6, 2.0 / 6, 3.0 / 6}, 1e-6);
  expect_values(ops::log_softmax(x), {std::log(1.0 / 6), std::log(2.0 / 6), std::log(3.0 / 6)},
                1e-6);
  // Along dim 0: columns exp (1, 3) and (1, 1).
  const Tensor c = Tensor::from_vector(std::vector<T>{0, 0, l3, 0}, {2, 2});
  expect_values(ops::softmax(c, 0), {0.25, 0.5, 0.75, 0.5}, 1e-6);
  expect_values(ops::log_softmax(c, 0),
                {std::log(0.25), std::log(0.5), std::log(0.75), std::log(0.5)}, 1e-6);
  // Large logits: a naive exp would overflow.
  const Tensor big = Tensor::from_vector(std::vector<T>{1000, 1000, 0, -1000}, {2, 2});
  expect_values(ops::softmax(big, -1), {0.5, 0.5, 1, 0}, 1e-6);
  expect_values(ops::log_softmax(big, -1), {-std::log(2.0), -std::log(2.0), 0, -1000}, 1e-4);
}

TEST(FunctionalSoftmax, EveryDimMatchesNaive) {
  for (const Shape& s :
       std::vector<Shape>{{7}, {3, 5}, {2, 3, 4}, {2, 3, 300}, {3, 600}, {64, 600}}) {
    const Tensor x = leaf64(s, 21, -4, 4).detach();
    for (int64_t d = 0; d < x.dim(); ++d) {
      for (bool log : {false, true}) {
        SCOPED_TRACE(
            fmt::format("{} of {} along {}", log ? "log_softmax" : "softmax", shape_str(s), d));
        const Tensor want = naive_softmax(x, d, log);
        expect_close(log ? ops::log_softmax(x, d) : ops::softmax(x, d), want, 1e-12);
        const Tensor x32 = x.to(DType::f32);
        expect_close((log ? ops::log_softmax(x32, d) : ops::softmax(x32, d)).to(DType::f64), want,
                     1e-5);
      }
    }
  }
}

TEST(FunctionalSoftmax, Gradcheck) {
  for (const auto& [shape, dim] : std::vector<std::pair<Shape, int64_t>>{{{5}, 0},
                                                                         {{3, 4}, 0},
                                                                         {{3, 4}, -1},
                                                                         {{2, 3, 4}, 0},
                                                                         {{2, 3, 4}, 1},
                                                                         {{2, 3, 4}, -1},
                                                                         {{2, 3, 260}, 1}}) {
    for (bool log : {false, true}) {
      SCOPED_TRACE(
          fmt::format("{} of {} along {}", log ? "log_softmax" : "softmax", shape_str(shape), dim));
      Tensor x = leaf64(shape, 4, -2, 2);
      auto fn = [dim = dim, log](const std::vector<Tensor>& in) {
        return log ? ops::log_softmax(in[0], dim) : ops::softmax(in[0], dim);
      };
      EXPECT_GRADCHECK(fn, {x});
    }
  }
}

TEST(FunctionalSoftmax, Errors) {
  EXPECT_ERROR_HAS(ops::softmax(Tensor::zeros({2, 3}), 2), "softmax: dim 2 is out of range");
  EXPECT_ERROR_HAS(ops::log_softmax(Tensor::zeros({3}, DType::i64)),
                   "log_softmax: expected a f32 or f64 tensor");
}

// ---- layer_norm ----

template <typename T>
class FunctionalLayerNormValues : public ::testing::Test {};
TYPED_TEST_SUITE(FunctionalLayerNormValues, FloatTypes);

TYPED_TEST(FunctionalLayerNormValues, HandValues) {
  using T = TypeParam;
  const double eps = 1e-5;
  // Row [1, 2, 3, 4]: mean 2.5, variance 1.25. Row [2, 2, 2, 2]: variance 0, so xhat = 0.
  const Tensor x = Tensor::from_vector(std::vector<T>{1, 2, 3, 4, 2, 2, 2, 2}, {2, 4});
  const double r = 1 / std::sqrt(1.25 + eps);
  expect_values(ops::layer_norm(x, 1, Tensor(), Tensor(), eps),
                {-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r, 0, 0, 0, 0}, 1e-5);
  const Tensor w = Tensor::from_vector(std::vector<T>{1, 2, 1, 2}),
               b = Tensor::from_vector(std::vector<T>{0, 0, 1, 1});
  expect_values(ops::layer_norm(x, 1, w, b, eps),
                {-1.5 * r, -1.0 * r, 0.5 * r + 1, 3.0 * r + 1, 0, 0, 1, 1}, 1e-5);
  expect_values(ops::layer_norm(x, 1, Tensor(), b, eps),
                {-1.5 * r, -0.5 * r, 0.5 * r + 1, 1.5 * r + 1, 0, 0, 1, 1}, 1e-5);
  // Over the last two dims of (2, 2, 2): the second group [0, 0, 0, 4] has mean 1, variance 3.
  const Tensor x3 = Tensor::from_vector(std::vector<T>{1, 2, 3, 4, 0, 0, 0, 4}, {2, 2, 2});
  const double r2 = 1 / std::sqrt(3 + eps);
  expect_values(ops::layer_norm(x3, 2, Tensor(), Tensor(), eps),
                {-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r, -r2, -r2, -r2, 3 * r2}, 1e-5);
}

struct LayerNormCase {
  Shape x;
  int64_t normalized_ndim;
  bool weight, bias;
};

void PrintTo(const LayerNormCase& c, std::ostream* os) {
  *os << "x " << shape_str(c.x) << ", normalized_ndim " << c.normalized_ndim
      << (c.weight ? ", weight" : "") << (c.bias ? ", bias" : "");
}

class FunctionalLayerNormGrad : public ::testing::TestWithParam<LayerNormCase> {};

TEST_P(FunctionalLayerNormGrad, Gradcheck) {
  const LayerNormCase& c = GetParam();
  const Shape norm(c.x.end() - c.normalized_ndim, c.x.end());
  Tensor x = leaf64(c.x, 7, -2, 2);
  Tensor w = c.weight ? leaf64(norm, 8, 0.5, 1.5) : Tensor();
  Tensor b = c.bias ? leaf64(norm, 9) : Tensor();
  auto fn = [&](const std::vector<Tensor>& in) {
    return ops::layer_norm(in[0], c.normalized_ndim, in[1], in[2]);
  };
  EXPECT_GRADCHECK(fn, {x, w, b});
}

INSTANTIATE_TEST_SUITE_P(FunctionalLayerNormCases, FunctionalLayerNormGrad,
                         ::testing::Values(LayerNormCase{{3, 4}, 1, true, true},
                                           LayerNormCase{{3, 4}, 1, false, false},
                                           LayerNormCase{{3, 4}, 1, true, false},
                                           LayerNormCase{{3, 4}, 1, false, true},
                                           LayerNormCase{{2, 3, 4}, 1, true, true},
                                           LayerNormCase{{2, 3, 4}, 2, true, true},
                                           LayerNormCase{{2, 3, 4}, 2, false, false},
                                           LayerNormCase{{2, 2, 3}, 3, true, true},
                                           LayerNormCase{{3, 300}, 1, true, true}));

// The weight and bias gradients sum over rows in fixed blocks of rows, in
// parallel: many rows (several blocks, a partial last one), narrow and wide
// norms, against the sums written out here.
TEST(FunctionalLayerNorm, WeightAndBiasGradientsOverManyRows) {
  for (const int64_t N : {64, 300}) {
    SCOPED_TRACE(fmt::format("N {}", N));
    const int64_t rows = 1300;
    const Tensor x = leaf64({rows, N}, 21, -2, 2).detach();
    Tensor w = leaf64({N}, 22, 0.5, 1.5), b = leaf64({N}, 23);
    const Tensor g = leaf64({rows, N}, 24).detach();
    autograd::backward({ops::layer_norm(x, 1, w, b)}, {g});
    const auto xv = x.to_vector<double>(), gv = g.to_vector<double>();
    std::vector<double> dw(static_cast<size_t>(N), 0.0), db(dw.size(), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0, var = 0;
      for (int64_t j = 0; j < N; ++j) mean += xv[static_cast<size_t>(r * N + j)] / N;
      for (int64_t j = 0; j < N; ++j) {
        const double dlt = xv[static_cast<size_t>(r * N + j)] - mean;
        var += dlt * dlt / N;
      }
      for (int64_t j = 0; j < N; ++j) {
        const size_t e = static_cast<size_t>(r * N + j);
        dw[static_cast<size_t>(j)] += gv[e] * (xv[e] - mean) / std::sqrt(var + 1e-5);
        db[static_cast<size_t>(j)] += gv[e];
      }
    }
    expect_values(w.grad(), dw, 1e-9);
    expect_values(b.grad(), db, 1e-9);
  }
}

// Only the weight requires grad: x's gradient is skipped, weight's still right.
TEST(FunctionalLayerNorm, GradcheckWeightOnly) {
  const Tensor x = leaf64({4, 5}, 10).detach();
  Tensor w = leaf64({5}, 11);
  auto fn = [&](const std::vector<Tensor>& in) {
    return ops::layer_norm(in[0], 1, in[1], Tensor());
  };
  EXPECT_GRADCHECK(fn, {x, w});
}

TEST(FunctionalLayerNorm, Errors) {
  const Tensor x = Tensor::zeros({2, 3, 4});
  EXPECT_ERROR_HAS(ops::layer_norm(x, 0, Tensor(), Tensor()),
                   "layer_norm: normalized_ndim must be in 1..3");
  EXPECT_ERROR_HAS(ops::layer_norm(x, 4, Tensor(), Tensor()), "got 4");
  EXPECT_ERROR_HAS(ops::layer_norm(x, 2, Tensor::ones({4}), Tensor()),
                   "layer_norm: weight must have the normalised shape [3, 4]");
  EXPECT_ERROR_HAS(ops::layer_norm(x, 1, Tensor(), Tensor::ones({3})),
                   "bias must have the normalised shape [4]");
  EXPECT_ERROR_HAS(ops::layer_norm(x, 1, Tensor::ones({4}, DType::f64), Tensor()),
                   "weight must have x's dtype f32");
  EXPECT_ERROR_HAS(ops::layer_norm(Tensor::zeros({3}, DType::i32), 1, Tensor(), Tensor()),
                   "layer_norm: expected");
}

// ---- dropout ----

TEST(FunctionalDropout, MaskFollowsThePhiloxRule) {
  const double p = 0.3;
  Generator gen(42);
  const Tensor x = Tensor::arange(1, 1001, 1, DType::f32);
  Tensor y = ops::dropout(x, p, true, &gen);
  EXPECT_EQ(gen.offset(), 250u);  // 1000 draws reserve ceil(1000 / 4) blocks
  const auto yv = y.to_vector<float>();
  const float scale = static_cast<float>(1 / (1 - p));
  for (uint64_t i = 0; i < 1000; ++i) {
    const bool keep = Generator::uniform_f32(42, 0, i) >= p;
    EXPECT_EQ(yv[i], keep ? static_cast<float>(i + 1) * scale : 0.0f) << "element " << i;
  }
  // Same seed, same offset, f64: the same elements survive.
  Generator gen64(42);
  const auto y64 = ops::dropout(x.to(DType::f64), p, true, &gen64).to_vector<double>();
  for (size_t i = 0; i < 1000; ++i) EXPECT_EQ(y64[i] == 0, yv[i] == 0) << "element " << i;
}

TEST(FunctionalDropout, DeterministicPerSeedAndAdvancing) {
  const Tensor x = Tensor::ones({64, 33}, DType::f64);
  Generator a(5), b(5);
  const Tensor ya = ops::dropout(x, 0.5, true, &a), yb = ops::dropout(x, 0.5, true, &b);
  EXPECT_EQ(ya.to_vector<double>(), yb.to_vector<double>());
  // The generator moved on: the next mask differs.
  EXPECT_NE(ops::dropout(x, 0.5, true, &a).to_vector<double>(), ya.to_vector<double>());
  // The default generator follows manual_seed.
  manual_seed(5);
  EXPECT_EQ(ops::dropout(x, 0.5).to_vector<double>(), ya.to_vector<double>());
}

TEST(FunctionalDropout, KeptFractionAndScale) {
  const double p = 0.25;
  Generator gen(123);
  const Tensor x = Tensor::ones({1000, 1000});
  const auto y = ops::dropout(x, p, true, &gen).to_vector<float>();
  int64_t kept = 0;
  for (float v : y) {
    if (v != 0) {
      ++kept;
      EXPECT_FLOAT_EQ(v, 1 / 0.75f);
    }
  }
  // The standard deviation of the fraction is sqrt(p (1 - p) / n) ~ 4.3e-4.
  EXPECT_NEAR(static_cast<double>(kept) / 1e6, 1 - p, 3e-3);
}

TEST(FunctionalDropout, IdentityCasesDrawNothing) {
  Generator gen(9);
  Tensor x = leaf64({3, 4}, 1);
  EXPECT_TRUE(ops::dropout(x, 0.5, false, &gen).same(x));
  EXPECT_TRUE(ops::dropout(x, 0.0, true, &gen).same(x));
  EXPECT_EQ(gen.offset(), 0u);
}

TEST(FunctionalDropout, GradcheckWithFixedMask) {
  Generator gen(17);
  const GeneratorState state = gen.state();
  Tensor x = leaf64({4, 5}, 2);
  // Every evaluation restores the state, so all of them see the same mask.
  auto fn = [&](const std::vector<Tensor>& in) {
    gen.set_state(state);
    return ops::dropout(in[0], 0.4, true, &gen);
  };
  EXPECT_GRADCHECK(fn, {x});
}

TEST(FunctionalDropout, BackwardIsMaskTimesScale) {
  Generator gen(3);
  Tensor x = leaf64({50}, 3);
  Tensor y = ops::dropout(x, 0.5, true, &gen);
  autograd::backward({y}, {Tensor::ones({50}, DType::f64)});
  const auto g = x.grad().to_vector<double>(), yv = y.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i], yv[i] == 0 ? 0.0 : 2.0) << "element " << i;
}

TEST(FunctionalDropout, Errors) {
  const Tensor x = Tensor::ones({4});
  EXPECT_ERROR_HAS(ops::dropout(x, 1.0), "dropout: p must be in [0, 1), got 1");
  EXPECT_ERROR_HAS(ops::dropout(x, -0.1), "dropout: p must be in [0, 1), got -0.1");
  EXPECT_ERROR_HAS(ops::dropout(x, 1.5, false), "dropout: p must be in [0, 1)");
  EXPECT_ERROR_HAS(ops::dropout(Tensor::ones({4}, DType::i64), 0.5),
                   "dropout: expected a f32 or f64 tensor, got i64");
}

// ---- cross_entropy ----

// The oracle: per-row -log softmax with smoothing, in f64, reduced.
Tensor naive_cross_entropy(const Tensor& logits, const Tensor& target,
                           const CrossEntropyOptions& o) {
  const int64_t C = logits.size(-1), rows = logits.numel() / C;
  const auto x = logits.to_vector<double>();
  const auto t = target.to_vector<int64_t>();
  std::vector<double> loss(static_cast<size_t>(rows), 0.0);
  double total = 0, count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (t[static_cast<size_t>(r)] == o.ignore_index) continue;
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[static_cast<size_t>(r * C + c)]);
    double nll_all = 0;
    for (int64_t c = 0; c < C; ++c) nll_all += std::log(s) - x[static_cast<size_t>(r * C + c)];
    const double nll = std::log(s) - x[static_cast<size_t>(r * C + t[static_cast<size_t>(r)])];
    loss[static_cast<size_t>(r)] =
        (1 - o.label_smoothing) * nll + o.label_smoothing * nll_all / static_cast<double>(C);
    total += loss[static_cast<size_t>(r)];
    count += 1;
  }
  if (o.reduction == Reduction::none) return Tensor::from_vector(loss, target.shape());
  return Tensor::scalar(o.reduction == Reduction::sum ? total : total / count, DType::f64);
}

template <typename T>
class FunctionalCrossEntropyValues : public ::testing::Test {};
TYPED_TEST_SUITE(FunctionalCrossEntropyValues, FloatTypes);

TYPED_TEST(FunctionalCrossEntropyValues, HandValues) {
  using T = TypeParam;
  const double l2 = std::log(2.0), l3 = std::log(3.0), l6 = std::log(6.0);
  // Row 0 has probabilities 1/6, 2/6, 3/6; row 1 is uniform.
  const Tensor logits = Tensor::from_vector(
      std::vector<T>{0, static_cast<T>(l2), static_cast<T>(l3), 0, 0, 0}, {2, 3});
  const Tensor target = Tensor::from_vector(std::vector<int64_t>{2, 0});
  Tensor mean = ops::cross_entropy(logits, target);
  EXPECT_EQ(mean.shape(), Shape{});
  EXPECT_EQ(mean.dtype(), logits.dtype());
  expect_values(mean, {(l2 + l3) / 2}, 1e-6);
  expect_values(ops::cross_entropy(logits, target, {.reduction = Reduction::sum}), {l2 + l3}, 1e-6);
  Tensor none = ops::cross_entropy(logits, target, {.reduction = Reduction::none});
  EXPECT_EQ(none.shape(), Shape{2});
  expect_values(none, {l2, l3}, 1e-6);
  // Smoothing 0.1: 0.9 * (-log p[y]) + 0.1 * mean_c(-log p[c]); uniform rows are unchanged.
  expect_values(
      ops::cross_entropy(logits, target, {.label_smoothing = 0.1, .reduction = Reduction::none}),
      {0.9 * l2 + 0.1 * (l6 + l3 + l2) / 3, l3}, 1e-6);
  // Ignored rows contribute 0 and are not counted in the mean.
  const Tensor ignored = Tensor::from_vector(std::vector<int32_t>{2, -100});
  expect_values(ops::cross_entropy(logits, ignored), {l2}, 1e-6);
  expect_values(ops::cross_entropy(logits, ignored, {.reduction = Reduction::none}), {l2, 0}, 1e-6);
  expect_values(
      ops::cross_entropy(logits, target, {.ignore_index = 2, .reduction = Reduction::sum}), {l3},
      1e-6);
  const Tensor all_ignored = Tensor::from_vector(std::vector<int64_t>{-100, -100});
  EXPECT_TRUE(std::isnan(ops::cross_entropy(logits, all_ignored).item()));
  expect_values(ops::cross_entropy(logits, all_ignored, {.reduction = Reduction::sum}), {0});
}

TEST(FunctionalCrossEntropy, ThreeDimLogitsMatchNaive) {
  const Tensor logits = leaf64({2, 3, 5}, 31, -3, 3).detach();
  const Tensor target = Tensor::from_vector(std::vector<int64_t>{0, 4, -100, 2, 2, 1}, {2, 3});
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
    for (double eps : {0.0, 0.3}) {
      SCOPED_TRACE(fmt::format("{} smoothing {}", reduction_name(r), eps));
      const CrossEntropyOptions o{.label_smoothing = eps, .reduction = r};
      const Tensor want = naive_cross_entropy(logits, target, o);
      expect_close(ops::cross_entropy(logits, target, o), want, 1e-12);
      expect_close(
          ops::cross_entropy(logits.to(DType::f32), target.to(DType::i32), o).to(DType::f64), want,
          1e-5);
    }
  }
  // Rows longer than the kernel's runs of 256 (its vector bodies and tails).
  const Tensor wide = leaf64({4, 600}, 32, -3, 3).detach();
  const Tensor wide_target = Tensor::from_vector(std::vector<int64_t>{0, 599, 256, 300}, {4});
  const CrossEntropyOptions smooth{.label_smoothing = 0.1};
  expect_close(ops::cross_entropy(wide, wide_target, smooth),
               naive_cross_entropy(wide, wide_target, smooth), 1e-12);
  expect_close(ops::cross_entropy(wide.to(DType::f32), wide_target, smooth).to(DType::f64),
               naive_cross_entropy(wide, wide_target, smooth), 1e-5);
  // Large logits stay finite.
  const Tensor big = Tensor::from_vector(std::vector<double>{1000, 0, -1000}, {1, 3});
  expect_values(ops::cross_entropy(big, Tensor::from_vector(std::vector<int64_t>{1})), {1000},
                1e-9);
}

TEST(FunctionalCrossEntropy, Gradcheck) {
  struct Case {
    Shape logits;
    std::vector<int64_t> target;
  };
  const std::vector<Case> cases = {
      {{4, 5}, {1, -100, 4, 0}},
      {{2, 3, 4}, {3, 0, -100, 1, 2, 2}},
      {{6}, {5}},
      {{2, 300}, {7, 299}}};  // rows longer than the kernel's runs of 256
  for (const Case& c : cases) {
    const Shape lead(c.logits.begin(), c.logits.end() - 1);
    for (DType tdt : {DType::i64, DType::i32}) {
      const Tensor target = Tensor::from_vector(c.target, lead).to(tdt);
      for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
        for (double eps : {0.0, 0.25}) {
          SCOPED_TRACE(fmt::format("logits {} target {} {} smoothing {}", shape_str(c.logits),
                                   dtype_name(tdt), reduction_name(r), eps));
          Tensor logits = leaf64(c.logits, 12, -2, 2);
          const CrossEntropyOptions o{.label_smoothing = eps, .reduction = r};
          auto fn = [&](const std::vector<Tensor>& in) {
            return ops::cross_entropy(in[0], in[1], o);
          };
          EXPECT_GRADCHECK(fn, {logits, target});
        }
      }
    }
  }
}

TEST(FunctionalCrossEntropy, Errors) {
  const Tensor logits = Tensor::zeros({2, 3});
  EXPECT_ERROR_HAS(ops::cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{0, 7})),
                   "cross_entropy: target 7 at position [1] is out of range for 3 classes");
  EXPECT_ERROR_HAS(ops::cross_entropy(logits, Tensor::from_vector(std::vector<int32_t>{-1, 0})),
                   "target -1 at position [0]");
  EXPECT_ERROR_HAS(
      ops::cross_entropy(Tensor::zeros({2, 2, 3}),
                         Tensor::from_vector(std::vector<int64_t>{0, 1, 3, 0}, {2, 2})),
      "target 3 at position [1, 0]");
  EXPECT_ERROR_HAS(ops::cross_entropy(logits, Tensor::zeros({3}, DType::i64)),
                   "cross_entropy: target must have the leading shape [2] of logits [2, 3]");
  EXPECT_ERROR_HAS(ops::cross_entropy(logits, Tensor::zeros({2}, DType::f32)),
                   "expected an i32 or i64 index tensor, got f32");
  EXPECT_ERROR_HAS(
      ops::cross_entropy(logits, Tensor::zeros({2}, DType::i64), {.label_smoothing = 1.5}),
      "label_smoothing must be in [0, 1], got 1.5");
  EXPECT_ERROR_HAS(
      ops::cross_entropy(Tensor::zeros({2, 3}, DType::i64), Tensor::zeros({2}, DType::i64)),
      "cross_entropy: expected a f32 or f64 tensor");
}

// ---- mse_loss ----

template <typename T>
class FunctionalMseValues : public ::testing::Test {};
TYPED_TEST_SUITE(FunctionalMseValues, FloatTypes);

TYPED_TEST(FunctionalMseValues, HandValues) {
  using T = TypeParam;
  const Tensor x = Tensor::from_vector(std::vector<T>{1, 2, 3}),
               t = Tensor::from_vector(std::vector<T>{0, 2, 5});
  expect_values(ops::mse_loss(x, t), {5.0 / 3}, 1e-6);
  expect_values(ops::mse_loss(x, t, Reduction::sum), {5});
  Tensor none = ops::mse_loss(x, t, Reduction::none);
  EXPECT_EQ(none.shape(), Shape{3});
  expect_values(none, {1, 0, 4});
}

TEST(FunctionalMse, Gradcheck) {
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
    SCOPED_TRACE(reduction_name(r));
    Tensor x = leaf64({3, 4}, 13), t = leaf64({3, 4}, 14);
    auto fn = [r](const std::vector<Tensor>& in) { return ops::mse_loss(in[0], in[1], r); };
    EXPECT_GRADCHECK(fn, {x, t});
    const Tensor fixed = t.detach();
    EXPECT_GRADCHECK(fn, {x, fixed});
  }
}

TEST(FunctionalMse, Errors) {
  EXPECT_ERROR_HAS(ops::mse_loss(Tensor::zeros({2, 3}), Tensor::zeros({3, 2})),
                   "mse_loss: input [2, 3] and target [3, 2] must have the same shape");
  EXPECT_ERROR_HAS(ops::mse_loss(Tensor::zeros({2}), Tensor::zeros({2}, DType::f64)),
                   "mse_loss: input (f32) and target (f64) must have the same dtype");
}

// Large enough to cross the parallel grain, so rows and column blocks are
// split across threads; each element is computed the same way whatever the
// split, so forward and backward must match bit for bit.
TEST(FunctionalThreads, ResultsDoNotDependOnThreadCount) {
  const int saved = num_threads();
  auto run = [](int threads) {
    set_num_threads(threads);
    std::vector<std::vector<double>> out;
    auto keep = [&](const Tensor& y, const std::vector<Tensor>& inputs) {
      autograd::backward({y}, {Tensor::ones(y.shape(), DType::f64)});
      out.push_back(y.to_vector<double>());
      for (const Tensor& t : inputs) out.push_back(t.grad().to_vector<double>());
    };
    for (int64_t dim : {0, 1}) {
      Tensor x = leaf64({300, 400}, 51);
      keep(ops::softmax(x, dim), {x});
      Tensor z = leaf64({300, 400}, 52);
      keep(ops::log_softmax(z, dim), {z});
    }
    Tensor x = leaf64({300, 400}, 53), w = leaf64({400}, 54), b = leaf64({400}, 55);
    keep(ops::layer_norm(x, 1, w, b), {x, w, b});
    Tensor logits = leaf64({500, 100}, 56);
    std::vector<int64_t> t(500);
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = i % 7 == 0 ? -100 : static_cast<int64_t>(i * 37 % 100);
    keep(ops::cross_entropy(logits, Tensor::from_vector(t), {.label_smoothing = 0.1}), {logits});
    Generator gen(57);
    Tensor d = leaf64({300, 400}, 58);
    keep(ops::dropout(d, 0.3, true, &gen), {d});
    Tensor a = leaf64({300, 400}, 59), c = leaf64({300, 400}, 60);
    keep(ops::mse_loss(a, c), {a, c});
    return out;
  };
  const auto serial = run(1), parallel = run(4);
  set_num_threads(saved);
  EXPECT_TRUE(serial == parallel);
}

}  // namespace
}  // namespace forge
