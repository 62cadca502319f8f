// sum, mean, max, logsumexp and cumsum: hand-computed values in f32 and f64, a
// naive per-group oracle for every dim set (adjacent, split, all, tiled),
// gradcheck in f64 for every op, dim set and keepdim, max's tie rule,
// logsumexp's stability, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <string>

#include "autograd/engine.h"
#include "core/threading.h"
#include "ops/reduce/reduce.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using namespace testing;

enum class Kind { sum, mean, max, logsumexp };

const char* kind_name(Kind k) {
  return k == Kind::sum ? "sum" : k == Kind::mean ? "mean" : k == Kind::max ? "max" : "logsumexp";
}

Tensor apply(Kind k, const Tensor& x, const ops::Dims& dims, bool keepdim) {
  switch (k) {
    case Kind::sum:
      return ops::sum(x, dims, keepdim);
    case Kind::mean:
      return ops::mean(x, dims, keepdim);
    case Kind::max:
      return ops::max(x, dims, keepdim);
    case Kind::logsumexp:
      return ops::logsumexp(x, dims, keepdim);
  }
  return Tensor();
}

// The oracle: gathers each output's group by walking x's coordinates, then
// folds it the obvious way, in f64.
Tensor naive_reduce(Kind k, const Tensor& x, const ops::Dims& dims, bool keepdim) {
  const Shape& s = x.shape();
  const size_t nd = s.size();
  std::vector<bool> red(nd, dims.empty());
  for (int64_t d : dims) red[static_cast<size_t>(d < 0 ? d + static_cast<int64_t>(nd) : d)] = true;
  Shape out, kept;
  for (size_t d = 0; d < nd; ++d) {
    if (!red[d]) kept.push_back(s[d]);
    if (!red[d] || keepdim) out.push_back(red[d] ? 1 : s[d]);
  }
  std::vector<std::vector<double>> groups(static_cast<size_t>(shape_numel(kept)));
  const auto xv = x.to_vector<double>();
  for (int64_t flat = 0; flat < x.numel(); ++flat) {
    int64_t rem = flat, o = 0, stride = 1;
    for (size_t d = nd; d-- > 0;) {
      const int64_t c = rem % s[d];
      rem /= s[d];
      if (!red[d]) {
        o += c * stride;
        stride *= s[d];
      }
    }
    groups[static_cast<size_t>(o)].push_back(xv[static_cast<size_t>(flat)]);
  }
  std::vector<double> y;
  for (const auto& g : groups) {
    double acc = k == Kind::max ? -INFINITY : 0;
    for (double v : g)
      acc = k == Kind::max ? std::max(acc, v) : k == Kind::logsumexp ? acc + std::exp(v) : acc + v;
    if (k == Kind::mean) acc /= static_cast<double>(g.size());
    if (k == Kind::logsumexp) acc = std::log(acc);
    y.push_back(acc);
  }
  return Tensor::from_vector(y, out);
}

// x[a, b, c] = 12a + 4b + c on shape (2, 3, 4).
template <typename T>
Tensor iota234() {
  std::vector<T> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(i);
  return Tensor::from_vector(v, {2, 3, 4});
}

template <typename T>
class ReduceValues : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(ReduceValues, FloatTypes);

TYPED_TEST(ReduceValues, SumOverEachDimSet) {
  const Tensor x = iota234<TypeParam>();
  Tensor all = ops::sum(x);
  EXPECT_EQ(all.shape(), Shape{});
  EXPECT_EQ(all.dtype(), x.dtype());
  expect_values(all, {276});
  // Over a: 2(4b + c) + 12.
  expect_values(ops::sum(x, {0}), {12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34});
  // Over c: 48a + 16b + 6.
  Tensor last = ops::sum(x, {-1});
  EXPECT_EQ(last.shape(), (Shape{2, 3}));
  expect_values(last, {6, 22, 38, 54, 70, 86});
  // Over a and c (not adjacent): 60 + 32b.
  Tensor split = ops::sum(x, {0, 2});
  EXPECT_EQ(split.shape(), Shape{3});
  expect_values(split, {60, 92, 124});
  Tensor split_keep = ops::sum(x, {2, 0}, true);
  EXPECT_EQ(split_keep.shape(), (Shape{1, 3, 1}));
  expect_values(split_keep, {60, 92, 124});
  Tensor all_keep = ops::sum(x, {}, true);
  EXPECT_EQ(all_keep.shape(), (Shape{1, 1, 1}));
  expect_values(all_keep, {276});
}

TYPED_TEST(ReduceValues, MeanMaxLogsumexpCumsum) {
  const Tensor x = iota234<TypeParam>();
  // Mean over b: 12a + 4 + c.
  expect_values(ops::mean(x, {1}), {4, 5, 6, 7, 16, 17, 18, 19});
  expect_values(ops::mean(x), {11.5});
  // Max over c: 12a + 4b + 3; over a and c: 12 + 4b + 3.
  expect_values(ops::max(x, {-1}), {3, 7, 11, 15, 19, 23});
  Tensor mk = ops::max(x, {0, 2}, true);
  EXPECT_EQ(mk.shape(), (Shape{1, 3, 1}));
  expect_values(mk, {15, 19, 23});
  // exp of the rows [0, ln 3] and [0, 0] sum to 4 and 2; of the columns to 2 and 4.
  const TypeParam l3 = static_cast<TypeParam>(std::log(3.0));
  const Tensor e = Tensor::from_vector(std::vector<TypeParam>{0, l3, 0, 0}, {2, 2});
  expect_values(ops::logsumexp(e, {1}), {std::log(4.0), std::log(2.0)}, 1e-6);
  expect_values(ops::logsumexp(e, {0}), {std::log(2.0), std::log(4.0)}, 1e-6);
  expect_values(ops::logsumexp(e), {std::log(6.0)}, 1e-6);
  const Tensor c = Tensor::from_vector(std::vector<TypeParam>{1, 2, 3, 4}, {2, 2});
  expect_values(ops::cumsum(c, 1), {1, 3, 3, 7});
  expect_values(ops::cumsum(c, 0), {1, 2, 4, 6});
  expect_values(ops::cumsum(c.view({4}), -1), {1, 3, 6, 10});
}

// Every dim set of several shapes against the oracle: adjacent dims (free
// view), split dims (the copy), size-1 dims in between, and inner widths past
// one tile.
TEST(ReduceOracle, EveryDimSetMatchesNaive) {
  const std::vector<Shape> shapes = {{7},         {3, 5},   {2, 3, 4},   {3, 1, 5, 2},
                                     {2, 3, 300}, {5, 600}, {20, 30, 40}};
  for (const Shape& s : shapes) {
    const Tensor x = leaf64(s, 11, -3, 3).detach();
    const int64_t nd = static_cast<int64_t>(s.size());
    for (int64_t mask = 0; mask < (int64_t{1} << nd); ++mask) {
      ops::Dims dims;
      for (int64_t d = 0; d < nd; ++d) {
        if (mask & (int64_t{1} << d)) dims.push_back(d);
      }
      for (bool keepdim : {false, true}) {
        for (Kind k : {Kind::sum, Kind::mean, Kind::max, Kind::logsumexp}) {
          SCOPED_TRACE(fmt::format("{} of {} over dims [{}] keepdim {}", kind_name(k), shape_str(s),
                                   fmt::join(dims, ", "), keepdim));
          expect_close(apply(k, x, dims, keepdim), naive_reduce(k, x, dims, keepdim), 1e-9);
          const Tensor y32 = apply(k, x.to(DType::f32), dims, keepdim);
          EXPECT_EQ(y32.dtype(), DType::f32);
          expect_close(y32.to(DType::f64), naive_reduce(k, x, dims, keepdim), 1e-3);
        }
      }
    }
  }
}

TEST(ReduceOracle, ScalarInputReducesToItself) {
  const Tensor x = Tensor::scalar(2.5, DType::f64);
  for (Kind k : {Kind::sum, Kind::mean, Kind::max, Kind::logsumexp}) {
    for (const ops::Dims& dims : {ops::Dims{}, ops::Dims{0}, ops::Dims{-1}}) {
      Tensor y = apply(k, x, dims, false);
      EXPECT_EQ(y.shape(), Shape{});
      expect_values(y, {2.5}, 1e-12);
    }
  }
}

struct GradCase {
  Shape shape;
  ops::Dims dims;
};

void PrintTo(const GradCase& c, std::ostream* os) {
  *os << shape_str(c.shape) << " over dims [" << fmt::format("{}", fmt::join(c.dims, ", ")) << "]";
}

class ReduceGradcheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(ReduceGradcheck, EveryOpBothKeepdims) {
  const GradCase& c = GetParam();
  for (Kind k : {Kind::sum, Kind::mean, Kind::max, Kind::logsumexp}) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(
          fmt::format("{} over [{}] keepdim {}", kind_name(k), fmt::join(c.dims, ", "), keepdim));
      // Distinct values far apart compared with gradcheck's eps, so max has no near-ties.
      Tensor x = leaf64(c.shape, 3, -2, 2);
      auto fn = [&](const std::vector<Tensor>& in) { return apply(k, in[0], c.dims, keepdim); };
      EXPECT_GRADCHECK(fn, {x});
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ReduceShapes, ReduceGradcheck,
                         ::testing::Values(GradCase{{5}, {}}, GradCase{{5}, {0}},
                                           GradCase{{3, 4}, {0}}, GradCase{{3, 4}, {-1}},
                                           GradCase{{3, 4}, {}}, GradCase{{2, 3, 4}, {0}},
                                           GradCase{{2, 3, 4}, {1}}, GradCase{{2, 3, 4}, {-1}},
                                           GradCase{{2, 3, 4}, {0, 2}}, GradCase{{2, 3, 4}, {1, 2}},
                                           GradCase{{2, 3, 4}, {}}, GradCase{{2, 1, 3, 2}, {0, 2}},
                                           GradCase{{2, 2, 3, 2}, {1, 3}},
                                           GradCase{{2, 2, 260}, {1}}));

TEST(ReduceCumsum, Gradcheck) {
  for (const auto& [shape, dim] : std::vector<std::pair<Shape, int64_t>>{
           {{6}, 0}, {{3, 4}, 0}, {{3, 4}, -1}, {{2, 3, 4}, 1}, {{2, 3, 260}, 1}}) {
    SCOPED_TRACE(fmt::format("cumsum of {} along {}", shape_str(shape), dim));
    Tensor x = leaf64(shape, 5);
    auto fn = [dim = dim](const std::vector<Tensor>& in) { return ops::cumsum(in[0], dim); };
    EXPECT_GRADCHECK(fn, {x});
  }
}

// The gradient of max lands on the first maximum of each group only, on the
// row path, the tiled path and the permuted path alike.
TEST(ReduceMax, GradientGoesToFirstMaximumOnTies) {
  Tensor row = Tensor::from_vector(std::vector<double>{1, 3, 3, 2, 5, 5, 5, 0}, {2, 4});
  row.set_requires_grad(true);
  Tensor y = ops::max(row, {1});
  expect_values(y, {3, 5});
  autograd::backward({y}, {Tensor::ones(y.shape(), DType::f64)});
  expect_values(row.grad(), {0, 1, 0, 0, 1, 0, 0, 0});

  Tensor col = Tensor::from_vector(std::vector<double>{5, 1, 5, 1, 0, 1}, {3, 2});
  col.set_requires_grad(true);
  Tensor yc = ops::max(col, {0});
  autograd::backward({yc}, {Tensor::from_vector(std::vector<double>{2, 3})});
  expect_values(col.grad(), {2, 3, 0, 0, 0, 0});

  // (2, 2, 2) over dims {0, 2}: each b has four equal values; the first in
  // (a, c) order is a = 0, c = 0.
  Tensor split = Tensor::ones({2, 2, 2}, DType::f64);
  split.set_requires_grad(true);
  Tensor ys = ops::max(split, {0, 2});
  autograd::backward({ys}, {Tensor::ones(ys.shape(), DType::f64)});
  expect_values(split.grad(), {1, 0, 1, 0, 0, 0, 0, 0});

  Tensor all = Tensor::full({3, 3}, 7.0, DType::f64);
  all.set_requires_grad(true);
  autograd::backward(ops::max(all));
  expect_values(all.grad(), {1, 0, 0, 0, 0, 0, 0, 0, 0});
}

TEST(ReduceMax, NanPropagates) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor y = ops::max(Tensor::from_vector(std::vector<double>{1, nan, 3}));
  EXPECT_TRUE(std::isnan(y.item()));
}

TEST(ReduceLogsumexp, StableForLargeMagnitudes) {
  for (DType dt : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor big =
        Tensor::from_vector(std::vector<double>{1000, 1000, 999, -1000, -1000, -1001}, {2, 3})
            .to(dt);
    Tensor y = ops::logsumexp(big, {1});
    const double tail = std::log(2.0 + std::exp(-1.0));
    expect_values(y, {1000 + tail, -1000 + tail}, dt == DType::f32 ? 1e-3 : 1e-9);
    Tensor yc = ops::logsumexp(big, {0});
    expect_values(yc, {1000, 1000, 999}, dt == DType::f32 ? 1e-3 : 1e-9);
  }
  Tensor x = Tensor::from_vector(std::vector<double>{1000, 1000});
  x.set_requires_grad(true);
  autograd::backward(ops::logsumexp(x));
  expect_values(x.grad(), {0.5, 0.5}, 1e-12);

  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(ops::logsumexp(Tensor::from_vector(std::vector<double>{-inf, -inf})).item(), -inf);
  EXPECT_EQ(ops::logsumexp(Tensor::from_vector(std::vector<double>{inf, 0})).item(), inf);
}

// Large enough to cross the parallel grain, so rows and tiles are split
// across threads; every output element is computed the same way whatever the
// split, so the results must match bit for bit.
TEST(ReduceThreads, ResultsDoNotDependOnThreadCount) {
  const int saved = num_threads();
  auto run = [](int threads) {
    set_num_threads(threads);
    std::vector<std::vector<double>> out;
    for (const auto& [shape, dims] : std::vector<std::pair<Shape, ops::Dims>>{
             {{200, 300}, {-1}}, {{200, 300}, {0}}, {{30, 40, 50}, {0, 2}}, {{30, 40, 50}, {1}}}) {
      for (Kind k : {Kind::sum, Kind::mean, Kind::max, Kind::logsumexp}) {
        Tensor x = leaf64(shape, 41);
        Tensor y = apply(k, x, dims, false);
        autograd::backward({y}, {Tensor::ones(y.shape(), DType::f64)});
        out.push_back(y.to_vector<double>());
        out.push_back(x.grad().to_vector<double>());
      }
    }
    for (int64_t dim : {0, 1}) {
      Tensor x = leaf64({200, 300}, 42);
      Tensor y = ops::cumsum(x, dim);
      autograd::backward({y}, {Tensor::ones(y.shape(), DType::f64)});
      out.push_back(y.to_vector<double>());
      out.push_back(x.grad().to_vector<double>());
    }
    return out;
  };
  const auto serial = run(1), parallel = run(4);
  set_num_threads(saved);
  EXPECT_TRUE(serial == parallel);
}

TEST(ReduceErrors, BadDimsDtypesAndEmptyMax) {
  const Tensor x = Tensor::zeros({2, 3});
  EXPECT_NE(error_of([&] { ops::sum(x, {2}); }).find("dim 2 is out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { ops::mean(x, {-3}); }).find("mean"), std::string::npos);
  const std::string dup = error_of([&] { ops::sum(x, {1, -1}); });
  EXPECT_NE(dup.find("sum: dim 1 appears more than once"), std::string::npos) << dup;
  const std::string ints = error_of([&] { ops::sum(Tensor::zeros({3}, DType::i64)); });
  EXPECT_NE(ints.find("sum: expected a f32 or f64 tensor, got i64"), std::string::npos) << ints;
  const std::string empty = error_of([&] { ops::max(Tensor::zeros({2, 0}), {1}); });
  EXPECT_NE(empty.find("max: cannot reduce over an empty group"), std::string::npos) << empty;
  EXPECT_NE(error_of([&] { ops::cumsum(x, 2); }).find("cumsum"), std::string::npos);
  EXPECT_NE(error_of([&] { ops::logsumexp(Tensor::zeros({2}, DType::i32)); }).find("logsumexp"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::sum(Tensor()); }).find("sum: expected a tensor"),
            std::string::npos);
}

TEST(ReduceValuesEmpty, SumIsZeroMeanIsNan) {
  const Tensor x = Tensor::zeros({2, 0});
  expect_values(ops::sum(x, {1}), {0, 0});
  EXPECT_TRUE(std::isnan(ops::mean(x).item()));
  EXPECT_EQ(ops::max(x, {0}).shape(), Shape{0});
}

}  // namespace
}  // namespace forge
