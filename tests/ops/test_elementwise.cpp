// Elementwise ops: forward values against hand-computed numbers and a naive
// broadcasting loop (f32 and f64), numerically extreme inputs, gradients at
// the kinks, gradcheck in f64 for every differentiable op over several shapes
// and broadcasts, and the errors for bad shapes, dtypes and masks.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/threading.h"
#include "ops/elementwise/elementwise.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using autograd::backward;
using namespace testing;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

const DType kFloatTypes[] = {DType::f32, DType::f64};

Tensor make(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f64) {
  return Tensor::from_vector<double>(values, shape).to(dtype);
}

double tol_for(DType dt) {
  return dt == DType::f32 ? 2e-6 : 1e-12;
}

// Moves every value of a leaf at least `gap` away from `point`, keeping its side,
// so that gradcheck's finite differences never straddle a kink.
Tensor away_from(Tensor t, double point, double gap = 0.1) {
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] += p[i] >= point ? gap : -gap;
  return t;
}

// Reference broadcast in f64: out[idx] = f(a[idx mapped], b[idx mapped]), one
// element at a time with explicit index arithmetic.
Tensor naive_binary(const Tensor& a, const Tensor& b,
                    const std::function<double(double, double)>& f) {
  const Shape out = ops::broadcast_shapes(a.shape(), b.shape());
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  auto offset = [&](int64_t i, const Shape& in) {
    int64_t off = 0, stride = 1;
    for (size_t d = out.size(); d-- > 0;) {
      const int64_t idx = i % out[d];
      i /= out[d];
      const int64_t rel = static_cast<int64_t>(d) - static_cast<int64_t>(out.size() - in.size());
      if (rel >= 0) {
        const int64_t size = in[static_cast<size_t>(rel)];
        if (size != 1) off += idx * stride;
        stride *= size;
      }
    }
    return off;
  };
  std::vector<double> r(static_cast<size_t>(shape_numel(out)));
  for (size_t i = 0; i < r.size(); ++i) {
    const auto k = static_cast<int64_t>(i);
    r[i] = f(av[static_cast<size_t>(offset(k, a.shape()))],
             bv[static_cast<size_t>(offset(k, b.shape()))]);
  }
  return make(r, out);
}

// ---- broadcasting ----

TEST(ElementwiseBroadcast, ShapesFollowNumpyRules) {
  EXPECT_EQ(ops::broadcast_shapes({2, 3}, {3}), (Shape{2, 3}));
  EXPECT_EQ(ops::broadcast_shapes({2, 1, 4}, {3, 1}), (Shape{2, 3, 4}));
  EXPECT_EQ(ops::broadcast_shapes({}, {2, 3}), (Shape{2, 3}));
  EXPECT_EQ(ops::broadcast_shapes({5, 1}, {}), (Shape{5, 1}));
  EXPECT_EQ(ops::broadcast_shapes({1}, {0}), (Shape{0}));
  EXPECT_EQ(ops::broadcast_shapes({4, 1, 1}, {1, 3, 2}), (Shape{4, 3, 2}));
}

TEST(ElementwiseBroadcast, IncompatibleShapesNameBoth) {
  expect_error([] { ops::broadcast_shapes({2, 3}, {4}); }, {"[2, 3]", "[4]"});
  const Tensor a = Tensor::zeros({2, 3}, DType::f64), b = Tensor::zeros({2}, DType::f64);
  expect_error([&] { ops::add(a, b); }, {"add", "[2, 3]", "[2]"});
  expect_error(
      [&] {
        ops::mul(a, Tensor::zeros({3, 3}, DType::f64));
      },
      {"mul", "[2, 3]", "[3, 3]"});
  expect_error(
      [&] {
        (void)(a / Tensor::zeros({4, 1, 2}, DType::f64));
      },
      {"div", "[2, 3]", "[4, 1, 2]"});
  const Tensor cond = Tensor::zeros({2, 3}, DType::boolean);
  expect_error([&] { ops::where(cond, a, Tensor::zeros({5}, DType::f64)); },
               {"where", "[2, 3]", "[5]"});
}

// ---- binary ops ----

TEST(ElementwiseBinary, SameShapeValues) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = make({1, -2, 3.5, 0, 10, -4}, {2, 3}, dt),
                 b = make({2, 4, -0.5, 1, -8, 0.25}, {2, 3}, dt);
    const double t = tol_for(dt);
    Tensor s = ops::add(a, b);
    EXPECT_EQ(s.dtype(), dt);
    EXPECT_EQ(s.shape(), (Shape{2, 3}));
    expect_values(s, {3, 2, 3, 1, 2, -3.75}, t);
    expect_values(ops::sub(a, b), {-1, -6, 4, -1, 18, -4.25}, t);
    expect_values(ops::mul(a, b), {2, -8, -1.75, 0, -80, -1}, t);
    expect_values(ops::div(a, b), {0.5, -0.5, -7, 0, -1.25, -16}, t);
  }
}

TEST(ElementwiseBinary, BroadcastMatchesNaiveLoop) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 3}, {3}},          {{2, 1, 4}, {3, 1}},       {{}, {2, 3}},
      {{2, 3}, {}},           {{4, 1}, {1, 5}},          {{1}, {3, 1, 2}},
      {{2, 3, 1}, {1, 1, 5}}, {{3, 1, 2, 1}, {4, 1, 5}}, {{2, 3, 4}, {2, 3, 4}},
      {{1, 3, 1}, {2, 3, 4}}};
  const std::vector<std::pair<const char*, std::function<double(double, double)>>> fns = {
      {"add", [](double x, double y) { return x + y; }},
      {"sub", [](double x, double y) { return x - y; }},
      {"mul", [](double x, double y) { return x * y; }},
      {"div", [](double x, double y) { return x / y; }}};
  uint64_t seed = 10;
  for (const auto& [sa, sb] : cases) {
    const Tensor a = leaf64(sa, seed++).detach(), b = leaf64(sb, seed++, 0.5, 2.0).detach();
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(shape_str(sa) + " op " + shape_str(sb) + " " + dtype_name(dt));
      const Tensor a_t = a.to(dt), b_t = b.to(dt);
      const Tensor got[] = {ops::add(a_t, b_t), ops::sub(a_t, b_t), ops::mul(a_t, b_t),
                            ops::div(a_t, b_t)};
      for (size_t k = 0; k < fns.size(); ++k) {
        SCOPED_TRACE(fns[k].first);
        EXPECT_EQ(got[k].dtype(), dt);
        expect_close(got[k].to(DType::f64), naive_binary(a, b, fns[k].second),
                     dt == DType::f32 ? 1e-5 : 1e-14);
      }
    }
  }
}

// Enough elements to split across threads, with rows that do not divide the
// per-thread chunks, so runs start and end mid-row.
TEST(ElementwiseBinary, LargeBroadcastAcrossThreads) {
  const int saved = num_threads();
  set_num_threads(3);
  const Tensor a = leaf64({37, 1, 1001}, 1).detach(), b = leaf64({5, 1}, 2).detach();
  expect_close(ops::add(a, b), naive_binary(a, b, [](double x, double y) { return x + y; }), 1e-15);
  const Tensor c = leaf64({7, 1}, 3).detach(), d = leaf64({1, 9001}, 4).detach();
  expect_close(ops::mul(c, d), naive_binary(c, d, [](double x, double y) { return x * y; }), 1e-15);
  const Tensor e = leaf64({70001}, 5).detach(), s = leaf64({}, 6).detach();
  expect_close(ops::sub(s, e), naive_binary(s, e, [](double x, double y) { return x - y; }), 1e-15);
  set_num_threads(saved);
}

TEST(ElementwiseBinary, ZeroSizedOperands) {
  const Tensor a = Tensor::zeros({0, 3}, DType::f32), b = Tensor::ones({3}, DType::f32);
  EXPECT_EQ(ops::add(a, b).shape(), (Shape{0, 3}));
  EXPECT_EQ(ops::mul(Tensor::zeros({0}, DType::f64), Tensor::ones({1}, DType::f64)).shape(),
            (Shape{0}));
  EXPECT_EQ(ops::sum_to(Tensor::zeros({0, 3}, DType::f64), {3}).to_vector<double>(),
            (std::vector<double>{0, 0, 0}));
}

TEST(ElementwiseBinary, ScalarOpsAndOperators) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const double t = tol_for(dt);
    const Tensor a = make({1, -2, 4}, {3}, dt), b = make({2, 2, -1}, {3}, dt);
    expect_values(ops::add(a, 1.5), {2.5, -0.5, 5.5}, t);
    expect_values(ops::mul(a, -3.0), {-3, 6, -12}, t);
    expect_values(a + b, {3, 0, 3}, t);
    expect_values(a - b, {-1, -4, 5}, t);
    expect_values(a * b, {2, -4, -4}, t);
    expect_values(a / b, {0.5, -1, -4}, t);
    expect_values(a + 2.0, {3, 0, 6}, t);
    expect_values(a - 2.0, {-1, -4, 2}, t);
    expect_values(a * 2.0, {2, -4, 8}, t);
    expect_values(a / 4.0, {0.25, -0.5, 1}, t);
    expect_values(2.0 + a, {3, 0, 6}, t);
    expect_values(2.0 - a, {1, 4, -2}, t);
    expect_values(2.0 * a, {2, -4, 8}, t);
    expect_values(-a, {-1, 2, -4}, t);
    EXPECT_EQ((a + 2.0).dtype(), dt);
  }
}

// ---- sum_to and expand ----

TEST(ElementwiseSumTo, ReducesBroadcastDims) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const double t = tol_for(dt);
    const Tensor g = make({1, 2, 3, 4, 5, 6}, {2, 3}, dt);
    expect_values(ops::sum_to(g, {3}), {5, 7, 9}, t);
    expect_values(ops::sum_to(g, {1, 3}), {5, 7, 9}, t);
    expect_values(ops::sum_to(g, {2, 1}), {6, 15}, t);
    expect_values(ops::sum_to(g, {}), {21}, t);
    EXPECT_EQ(ops::sum_to(g, {2, 1}).shape(), (Shape{2, 1}));
    EXPECT_EQ(ops::sum_to(g, {}).shape(), Shape{});
    EXPECT_TRUE(ops::sum_to(g, {2, 3}).same(g));
    // [2, 3, 4] -> [3, 1]: reduced, kept, reduced (two passes).
    std::vector<double> v(24);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
    const Tensor h = make(v, {2, 3, 4}, dt);
    // Row j of [3, 1] sums i*12 + j*4 + k over i < 2, k < 4: 8*4*j + 4*12 + 2*6.
    expect_values(ops::sum_to(h, {3, 1}), {60, 92, 124}, t);
    expect_values(ops::sum_to(h, {1, 1, 4}), {60, 66, 72, 78}, t);
    // Dropping a leading size-1 dim only reshapes.
    expect_values(ops::sum_to(make({1, 2, 3}, {1, 3}, dt), {3}), {1, 2, 3}, t);
  }
}

TEST(ElementwiseSumTo, LargeMatchesSerialSum) {
  const int saved = num_threads();
  set_num_threads(3);
  const Tensor g = leaf64({301, 257}, 7).detach();
  const auto v = g.to_vector<double>();
  std::vector<double> cols(257, 0.0), rows(301, 0.0);
  double total = 0;
  for (size_t i = 0; i < 301; ++i)
    for (size_t j = 0; j < 257; ++j) {
      cols[j] += v[i * 257 + j];
      rows[i] += v[i * 257 + j];
      total += v[i * 257 + j];
    }
  expect_values(ops::sum_to(g, {257}), cols, 1e-11);
  expect_values(ops::sum_to(g, {301, 1}), rows, 1e-11);
  expect_values(ops::sum_to(g, {}), {total}, 1e-10);
  expect_values(ops::sum_to(g.to(DType::f32), {}), {total}, 1e-2);
  set_num_threads(saved);
}

TEST(ElementwiseExpand, CopiesAlongBroadcastDims) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = make({1, 2, 3}, {3}, dt);
    Tensor e = ops::expand(x, {2, 3});
    EXPECT_EQ(e.shape(), (Shape{2, 3}));
    expect_values(e, {1, 2, 3, 1, 2, 3});
    expect_values(ops::expand(make({1, 2}, {2, 1}, dt), {2, 3}), {1, 1, 1, 2, 2, 2});
    expect_values(ops::expand(make({7}, {}, dt), {2, 2}), {7, 7, 7, 7});
    // A copy, not a view: writing into it leaves x alone.
    Tensor same = ops::expand(x, {3});
    same.fill(0);
    expect_values(x, {1, 2, 3});
  }
}

TEST(ElementwiseSumTo, ShapeErrors) {
  const Tensor g = Tensor::zeros({2, 3}, DType::f64);
  expect_error([&] { ops::sum_to(g, {4}); }, {"sum_to", "[2, 3]", "[4]"});
  expect_error([&] { ops::sum_to(g, {1, 2, 3}); }, {"sum_to", "[2, 3]", "[1, 2, 3]"});
  expect_error([&] { ops::expand(g, {3, 3}); }, {"expand", "[2, 3]", "[3, 3]"});
  expect_error([&] { ops::expand(g, {3}); }, {"expand", "[2, 3]", "[3]"});
}

// ---- unary ops ----

TEST(ElementwiseUnary, Values) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const double t = dt == DType::f32 ? 1e-6 : 1e-14;
    const Tensor x = make({-2, -0.5, 0, 0.5, 2}, {5}, dt);
    expect_values(ops::neg(x), {2, 0.5, 0, -0.5, -2}, t);
    expect_values(ops::abs(x), {2, 0.5, 0, 0.5, 2}, t);
    expect_values(ops::square(x), {4, 0.25, 0, 0.25, 4}, t);
    expect_values(ops::relu(x), {0, 0, 0, 0.5, 2}, t);
    expect_values(ops::clamp(x, -1, 1), {-1, -0.5, 0, 0.5, 1}, t);
    expect_values(ops::clamp(x, 0.25), {0.25, 0.25, 0.25, 0.5, 2}, t);
    expect_values(ops::clamp(x, -std::numeric_limits<double>::infinity(), -0.25),
                  {-2, -0.5, -0.25, -0.25, -0.25}, t);
    expect_values(
        ops::sigmoid(x),
        {0.11920292202211755, 0.3775406687981454, 0.5, 0.6224593312018546, 0.8807970779778823}, t);
    expect_values(
        ops::tanh(x),
        {-0.9640275800758169, -0.46211715726000974, 0, 0.46211715726000974, 0.9640275800758169}, t);
    expect_values(
        ops::silu(x),
        {-0.2384058440442351, -0.1887703343990727, 0, 0.3112296656009273, 1.7615941559557646}, t);
    expect_values(ops::elu(x), {-0.8646647167633873, -0.3934693402873666, 0, 0.5, 2}, t);
    expect_values(ops::elu(x, 0.5), {-0.43233235838169365, -0.1967346701436833, 0, 0.5, 2}, t);

    const Tensor p = make({0.5, 1, 2, 4}, {2, 2}, dt);
    expect_values(ops::exp(p),
                  {1.6487212707001282, 2.718281828459045, 7.38905609893065, 54.598150033144236},
                  t * 60);
    expect_values(ops::log(p), {-0.6931471805599453, 0, 0.6931471805599453, 1.3862943611198906}, t);
    expect_values(ops::sqrt(p), {0.7071067811865476, 1, 1.4142135623730951, 2}, t);
    expect_values(ops::rsqrt(p), {1.4142135623730951, 1, 0.7071067811865476, 0.5}, t);
    expect_values(ops::pow(p, 1.5), {0.3535533905932738, 1, 2.8284271247461903, 8}, t * 10);
    expect_values(ops::pow(p, -2.0), {4, 1, 0.25, 0.0625}, t);
    expect_values(ops::pow(p, 0.0), {1, 1, 1, 1}, t);
    EXPECT_EQ(ops::exp(p).shape(), (Shape{2, 2}));
    EXPECT_EQ(ops::exp(p).dtype(), dt);
  }
}

TEST(ElementwiseUnary, GeluKnownValues) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const double t = dt == DType::f32 ? 1e-6 : 1e-14;
    const Tensor x = make({-3, -1, -0.5, 0, 0.5, 1, 3}, {7}, dt);
    expect_values(ops::gelu(x),
                  {-0.00404969409489031, -0.15865525393145707, -0.15426876936299344, 0,
                   0.34573123063700656, 0.8413447460685429, 2.99595030590511},
                  t);
    expect_values(ops::gelu(x, ops::GeluApprox::tanh),
                  {-0.0036373920817729943, -0.15880800939172324, -0.15428599017485606, 0,
                   0.34571400982514394, 0.8411919906082768, 2.996362607918227},
                  t);
  }
}

TEST(ElementwiseUnary, ExtremeInputsStayFinite) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = make({-1000, -100, 100, 1000}, {4}, dt);
    expect_values(ops::sigmoid(x), {0, 0, 1, 1}, 1e-30);
    expect_values(ops::tanh(x), {-1, -1, 1, 1}, 0);
    expect_values(ops::silu(x), {0, 0, 100, 1000}, 1e-30);
    expect_values(ops::gelu(x), {0, 0, 100, 1000}, 1e-30);
    expect_values(ops::gelu(x, ops::GeluApprox::tanh), {0, 0, 100, 1000}, 1e-30);
    expect_values(ops::elu(x), {-1, -1, 100, 1000}, 0);
    const auto e = ops::exp(x).to_vector<double>();
    EXPECT_EQ(e[0], 0.0);
    EXPECT_GE(e[1], 0.0);
    EXPECT_LT(e[1], 1e-43);
    EXPECT_TRUE(std::isinf(e[3]));
    // Far-tail sigmoid keeps its relative precision: e^-30 / (1 + e^-30).
    const double s = ops::sigmoid(make({-30}, {1}, dt)).item();
    EXPECT_NEAR(s / 9.357622968839299e-14, 1.0, dt == DType::f32 ? 1e-6 : 1e-12);
  }
}

// The CPU kernels of the smooth ops run over glibc's vector math (core/vmath.h) in
// runs; arrays long enough for the vector bodies, the chunk boundaries and the
// tails, forward and backward, against the scalar libm formula per element.
TEST(ElementwiseUnary, LongArraysMatchScalarFormulas) {
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    std::function<double(double)> f, df;
    double lo, hi;
  };
  const double k = std::sqrt(2 / M_PI), c = 0.044715;
  auto cdf = [](double v) { return 0.5 * std::erfc(-v / std::sqrt(2.0)); };
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  auto th = [k, c](double v) { return std::tanh(k * (v + c * v * v * v)); };
  const std::vector<Case> cases = {
      {"exp", [](const Tensor& x) { return ops::exp(x); }, [](double v) { return std::exp(v); },
       [](double v) { return std::exp(v); }, -20, 20},
      {"log", [](const Tensor& x) { return ops::log(x); }, [](double v) { return std::log(v); },
       [](double v) { return 1 / v; }, 1e-3, 50},
      {"tanh", [](const Tensor& x) { return ops::tanh(x); }, [](double v) { return std::tanh(v); },
       [](double v) { return 1 - std::tanh(v) * std::tanh(v); }, -6, 6},
      {"gelu", [](const Tensor& x) { return ops::gelu(x); }, [&](double v) { return v * cdf(v); },
       [&](double v) { return cdf(v) + v * std::exp(-v * v / 2) / std::sqrt(2 * M_PI); }, -8, 8},
      {"gelu tanh", [](const Tensor& x) { return ops::gelu(x, ops::GeluApprox::tanh); },
       [&](double v) { return 0.5 * v * (1 + th(v)); },
       [&](double v) {
         return 0.5 * (1 + th(v)) + 0.5 * v * (1 - th(v) * th(v)) * k * (1 + 3 * c * v * v);
       },
       -8, 8},
      {"elu 0.7", [](const Tensor& x) { return ops::elu(x, 0.7); },
       [](double v) { return v > 0 ? v : 0.7 * std::expm1(v); },
       [](double v) { return v > 0 ? 1 : 0.7 * std::exp(v); }, -8, 8},
      {"silu", [](const Tensor& x) { return ops::silu(x); }, [&](double v) { return v * sig(v); },
       [&](double v) { return sig(v) * (1 + v * (1 - sig(v))); }, -30, 30},
      {"sigmoid", [](const Tensor& x) { return ops::sigmoid(x); }, sig,
       [&](double v) { return sig(v) * (1 - sig(v)); }, -30, 30}};
  const int64_t n = 4096 + 257 + 7;  // past one block run (4096), several chunks of 256, a tail
  for (DType dt : kFloatTypes) {
    const double tol = dt == DType::f32 ? 4e-6 : 1e-13;
    for (const Case& cs : cases) {
      SCOPED_TRACE(std::string(cs.name) + " " + dtype_name(dt));
      std::vector<double> xs(static_cast<size_t>(n)), gs(xs.size());
      for (int64_t i = 0; i < n; ++i) {
        xs[static_cast<size_t>(i)] = cs.lo + (cs.hi - cs.lo) * static_cast<double>(i) / n;
        gs[static_cast<size_t>(i)] = 0.5 + static_cast<double>(i % 7) / 7;
      }
      Tensor x = make(xs, {n}, dt);  // rounded to the dtype: the formulas see the same inputs
      x.set_requires_grad(true);
      const Tensor y = cs.op(x);
      backward({y}, {make(gs, {n}, dt)});
      const auto xv = x.to_vector<double>(), yv = y.to_vector<double>(),
                 dv = x.grad().to_vector<double>(), gv = make(gs, {n}, dt).to_vector<double>();
      for (size_t i = 0; i < xv.size(); ++i) {
        const double want = cs.f(xv[i]), dwant = gv[i] * cs.df(xv[i]);
        ASSERT_NEAR(yv[i], want, tol * std::max(1.0, std::abs(want))) << "x " << xv[i];
        ASSERT_NEAR(dv[i], dwant, tol * std::max(1.0, std::abs(dwant))) << "x " << xv[i];
      }
    }
  }
}

// Gradients exactly at the kinks, by one backward seeded with ones.
TEST(ElementwiseUnary, GradientsAtKinks) {
  auto grad_of = [](const std::function<Tensor(const Tensor&)>& f, const std::vector<double>& xs) {
    Tensor x = make(xs, {static_cast<int64_t>(xs.size())});
    x.set_requires_grad(true);
    Tensor y = f(x);
    backward({y}, {Tensor::ones(y.shape(), DType::f64)});
    return x.grad();
  };
  expect_values(grad_of([](const Tensor& x) { return ops::abs(x); }, {-2, 0, 3}), {-1, 0, 1}, 0);
  expect_values(grad_of([](const Tensor& x) { return ops::relu(x); }, {-2, 0, 3}), {0, 0, 1}, 0);
  expect_values(grad_of([](const Tensor& x) { return ops::clamp(x, -1, 1); }, {-2, -1, 0, 1, 2}),
                {0, 1, 1, 1, 0}, 0);
  expect_values(grad_of([](const Tensor& x) { return ops::clamp(x, 0.0); }, {-1, 0, 5}), {0, 1, 1},
                0);
  expect_values(grad_of([](const Tensor& x) { return ops::pow(x, 0.0); }, {0, 2}), {0, 0}, 0);
  expect_values(grad_of([](const Tensor& x) { return ops::pow(x, 2.0); }, {0, 3}), {0, 6}, 1e-12);
  expect_values(grad_of([](const Tensor& x) { return ops::elu(x); }, {0, -1}),
                {1, 0.36787944117144233}, 1e-15);
  expect_values(grad_of([](const Tensor& x) { return ops::gelu(x); }, {0}), {0.5}, 1e-15);
  expect_values(grad_of([](const Tensor& x) { return ops::gelu(x, ops::GeluApprox::tanh); }, {0}),
                {0.5}, 1e-15);
  expect_values(grad_of([](const Tensor& x) { return ops::sigmoid(x); }, {0, -1000, 1000}),
                {0.25, 0, 0}, 1e-15);
  expect_values(grad_of([](const Tensor& x) { return ops::tanh(x); }, {0, 1000}), {1, 0}, 1e-15);
  expect_values(grad_of([](const Tensor& x) { return ops::silu(x); }, {0, -1000, 1000}),
                {0.5, 0, 1}, 1e-15);
}

// ---- selection ----

TEST(ElementwiseWhere, Values) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3}, dt), b = make({-1, -2, -3}, {3}, dt);
    const Tensor cb = Tensor::from_vector<bool>({true, false, true, false, false, true}, {2, 3});
    expect_values(ops::where(cb, a, b), {1, -2, 3, -1, -2, 6});
    const Tensor cu = Tensor::from_vector<uint8_t>({0, 7}, {2, 1});  // any non-zero byte is true
    expect_values(ops::where(cu, a, b), {-1, -2, -3, 4, 5, 6});
    Tensor w = ops::where(Tensor::from_vector<bool>({true, false, true}), Tensor::scalar(9, dt), b);
    EXPECT_EQ(w.shape(), (Shape{3}));
    expect_values(w, {9, -2, 9});
    // cond broadcasting the others up: [2, 1, 1] with [3] and [] gives [2, 1, 3].
    Tensor w3 =
        ops::where(Tensor::from_vector<bool>({false, true}, {2, 1, 1}), b, Tensor::scalar(0.5, dt));
    EXPECT_EQ(w3.shape(), (Shape{2, 1, 3}));
    expect_values(w3, {0.5, 0.5, 0.5, -1, -2, -3});
  }
}

TEST(ElementwiseMaskedFill, Values) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3}, dt);
    const Tensor m = Tensor::from_vector<bool>({false, true, true, false, false, true}, {2, 3});
    expect_values(ops::masked_fill(x, m, -7), {1, -7, -7, 4, 5, -7});
    // A causal-style row mask broadcast over rows, and -inf as the value.
    const Tensor row = Tensor::from_vector<uint8_t>({0, 0, 1}, {3});
    const auto v =
        ops::masked_fill(x, row, -std::numeric_limits<double>::infinity()).to_vector<double>();
    EXPECT_EQ(v[0], 1);
    EXPECT_EQ(v[4], 5);
    EXPECT_TRUE(std::isinf(v[2]) && v[2] < 0);
    EXPECT_TRUE(std::isinf(v[5]) && v[5] < 0);
    expect_values(ops::masked_fill(x, Tensor::from_vector<bool>({true, false}, {2, 1}), 0),
                  {0, 0, 0, 4, 5, 6});
  }
}

TEST(ElementwiseSelection, Errors) {
  const Tensor x = Tensor::zeros({2, 3}, DType::f32);
  expect_error(
      [&] {
        ops::where(Tensor::zeros({2, 3}, DType::f32), x, x);
      },
      {"where", "cond", "f32"});
  expect_error(
      [&] {
        ops::where(Tensor::zeros({2, 3}, DType::boolean), x, x.to(DType::f64));
      },
      {"where", "f32", "f64"});
  expect_error(
      [&] {
        ops::masked_fill(x, Tensor::zeros({2, 3}, DType::i64), 0);
      },
      {"masked_fill", "mask", "i64"});
  // A mask that would grow x is refused: the output keeps x's shape.
  expect_error(
      [&] {
        ops::masked_fill(x, Tensor::zeros({4, 2, 3}, DType::boolean), 0);
      },
      {"masked_fill", "[4, 2, 3]", "[2, 3]"});
  expect_error([&] { ops::masked_fill(x, Tensor::zeros({2}, DType::boolean), 0); },
               {"masked_fill", "[2]", "[2, 3]"});
}

TEST(ElementwiseErrors, DtypesAreChecked) {
  const Tensor i = Tensor::zeros({3}, DType::i64);
  expect_error([&] { ops::exp(i); }, {"exp", "i64"});
  expect_error([&] { ops::gelu(i); }, {"gelu", "i64"});
  expect_error([&] { ops::add(i, i); }, {"add", "i64"});
  expect_error([&] { ops::mul(Tensor::zeros({3}, DType::f32), Tensor::zeros({3}, DType::f64)); },
               {"mul", "f32", "f64"});
  expect_error([&] { ops::sum_to(Tensor::zeros({3}, DType::i32), {}); }, {"sum_to", "i32"});
  expect_error([&] { ops::clamp(Tensor::zeros({3}, DType::f32), 1, -1); }, {"clamp", "lo"});
}

// ---- autograd bookkeeping ----

TEST(ElementwiseAutograd, RecordsOnlyWhenNeeded) {
  const Tensor c = make({1, 2, 3}, {3});
  Tensor x = leaf64({3}, 1);
  EXPECT_FALSE(ops::add(c, c).requires_grad());
  EXPECT_EQ(ops::exp(c).grad_fn(), nullptr);
  Tensor y = ops::mul(x, c);
  EXPECT_TRUE(y.requires_grad());
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name, "mul");
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(ops::mul(x, c).requires_grad());
    EXPECT_FALSE(ops::sigmoid(x).requires_grad());
  }
  const Tensor cond = Tensor::from_vector<bool>({true, false, true});
  EXPECT_FALSE(ops::where(cond, c, c).requires_grad());
  EXPECT_TRUE(ops::where(cond, c, x).requires_grad());
}

TEST(ElementwiseAutograd, BinaryGradientsSumToInputShapes) {
  Tensor a = leaf64({2, 3}, 1), b = leaf64({3}, 2);
  backward({ops::mul(a, b)}, {Tensor::ones({2, 3}, DType::f64)});
  ASSERT_TRUE(a.grad().defined() && b.grad().defined());
  EXPECT_EQ(a.grad().shape(), (Shape{2, 3}));
  EXPECT_EQ(b.grad().shape(), (Shape{3}));
  expect_close(a.grad(), ops::expand(b.detach(), {2, 3}), 1e-15);
  const auto av = a.to_vector<double>();
  expect_values(b.grad(), {av[0] + av[3], av[1] + av[4], av[2] + av[5]}, 1e-15);

  // Only the operand that requires grad receives one.
  Tensor p = leaf64({}, 3);
  const Tensor q = make({1, 2, 3, 4}, {2, 2});
  backward({ops::sub(q, p)}, {Tensor::ones({2, 2}, DType::f64)});
  expect_values(p.grad(), {-4}, 1e-15);
}

// ---- gradcheck (f64) ----

TEST(ElementwiseGradcheck, BinaryOpsBroadcastBothRequiringGrad) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 3}, {3}}, {{2, 1, 4}, {3, 1}}, {{}, {2, 3}},          {{2, 3}, {}},
      {{3}, {3}},    {{4, 1}, {1, 5}},    {{1, 3, 1}, {2, 1, 2}}};
  const std::vector<std::pair<const char*, Fn>> fns = {
      {"add", [](const std::vector<Tensor>& in) { return ops::add(in[0], in[1]); }},
      {"sub", [](const std::vector<Tensor>& in) { return ops::sub(in[0], in[1]); }},
      {"mul", [](const std::vector<Tensor>& in) { return ops::mul(in[0], in[1]); }},
      {"div", [](const std::vector<Tensor>& in) { return ops::div(in[0], in[1]); }}};
  uint64_t seed = 100;
  for (const auto& [sa, sb] : cases) {
    for (const auto& [name, fn] : fns) {
      SCOPED_TRACE(std::string(name) + " " + shape_str(sa) + " " + shape_str(sb));
      // Divisors kept in [0.5, 1.5) so that 1/b is smooth.
      EXPECT_GRADCHECK(fn, {leaf64(sa, seed++), leaf64(sb, seed++, 0.5, 1.5)});
    }
  }
}

TEST(ElementwiseGradcheck, BinaryOpsOneOperandConstant) {
  const Tensor c = leaf64({2, 3}, 1, 0.5, 1.5).detach();
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::mul(c, in[0]); },
                   {leaf64({3}, 2)});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::div(in[0], c); },
                   {leaf64({2, 1}, 3)});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::div(c, in[0]); },
                   {leaf64({1, 3}, 4, 0.5, 1.5)});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::sub(c, in[0]); },
                   {leaf64({}, 5)});
  // The same tensor as both operands: the two gradients add up.
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return ops::mul(in[0], in[0]); },
                   {leaf64({2, 2}, 6)});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return ops::div(in[0], in[0]); },
                   {leaf64({3}, 7, 0.5, 1.5)});
}

TEST(ElementwiseGradcheck, ScalarOpsAndOperators) {
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return ops::add(in[0], 3.0); },
                   {leaf64({2, 3}, 1)});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return ops::mul(in[0], -2.5); },
                   {leaf64({2, 3}, 2)});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return (2.0 - in[0]) / 4.0 + 1.0; },
                   {leaf64({4}, 3)});
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) { return -(in[0] * in[1] - in[1] / 2.0) * 3.0; },
      {leaf64({2, 3}, 4), leaf64({3}, 5)});
}

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> fn;
  double lo, hi;  // input range
  double kink;    // NaN when smooth; else inputs are moved away from it
};

TEST(ElementwiseGradcheck, UnaryOps) {
  const double smooth = std::numeric_limits<double>::quiet_NaN();
  const std::vector<UnaryCase> cases = {
      {"neg", [](const Tensor& x) { return ops::neg(x); }, -2, 2, smooth},
      {"exp", [](const Tensor& x) { return ops::exp(x); }, -2, 2, smooth},
      {"log", [](const Tensor& x) { return ops::log(x); }, 0.2, 3, smooth},
      {"sqrt", [](const Tensor& x) { return ops::sqrt(x); }, 0.2, 3, smooth},
      {"rsqrt", [](const Tensor& x) { return ops::rsqrt(x); }, 0.2, 3, smooth},
      {"pow 2.5", [](const Tensor& x) { return ops::pow(x, 2.5); }, 0.2, 3, smooth},
      {"pow -1.5", [](const Tensor& x) { return ops::pow(x, -1.5); }, 0.2, 3, smooth},
      {"pow 3", [](const Tensor& x) { return ops::pow(x, 3.0); }, 0.2, 3, smooth},
      {"abs", [](const Tensor& x) { return ops::abs(x); }, -2, 2, 0},
      {"square", [](const Tensor& x) { return ops::square(x); }, -2, 2, smooth},
      {"clamp both", [](const Tensor& x) { return ops::clamp(x, -0.5, 0.5); }, -0.4, 0.4, smooth},
      {"clamp lo", [](const Tensor& x) { return ops::clamp(x, 0.3); }, -1, 1.6, 0.3},
      {"clamp hi",
       [](const Tensor& x) {
         return ops::clamp(x, -std::numeric_limits<double>::infinity(), -0.3);
       },
       -1.6, 1, -0.3},
      {"relu", [](const Tensor& x) { return ops::relu(x); }, -2, 2, 0},
      {"gelu", [](const Tensor& x) { return ops::gelu(x); }, -3, 3, smooth},
      {"gelu tanh", [](const Tensor& x) { return ops::gelu(x, ops::GeluApprox::tanh); }, -3, 3,
       smooth},
      {"elu", [](const Tensor& x) { return ops::elu(x); }, -2, 2, 0},
      {"elu 0.7", [](const Tensor& x) { return ops::elu(x, 0.7); }, -2, 2, 0},
      {"silu", [](const Tensor& x) { return ops::silu(x); }, -4, 4, smooth},
      {"sigmoid", [](const Tensor& x) { return ops::sigmoid(x); }, -4, 4, smooth},
      {"tanh", [](const Tensor& x) { return ops::tanh(x); }, -3, 3, smooth}};
  const std::vector<Shape> shapes = {{}, {5}, {2, 3, 4}};
  uint64_t seed = 200;
  for (const UnaryCase& c : cases) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(std::string(c.name) + " " + shape_str(shape));
      Tensor x = leaf64(shape, seed++, c.lo, c.hi);
      if (!std::isnan(c.kink)) away_from(x, c.kink);
      EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return c.fn(in[0]); }, {x});
    }
  }
  // Clamped-away elements get exactly zero gradient; gradcheck sees it as well.
  Tensor outside = away_from(leaf64({6}, 300, -2, 2), 0, 0.6);
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return ops::clamp(in[0], -0.5, 0.5); },
                   {outside});
}

TEST(ElementwiseGradcheck, SumToAndExpand) {
  const std::vector<std::pair<Shape, Shape>> cases = {{{2, 3}, {3}},       {{2, 3}, {2, 1}},
                                                      {{2, 3, 4}, {3, 1}}, {{2, 3}, {}},
                                                      {{1, 3}, {3}},       {{2, 3}, {2, 3}}};
  uint64_t seed = 400;
  for (const auto& c : cases) {
    const Shape big = c.first, small = c.second;
    SCOPED_TRACE(shape_str(big) + " <-> " + shape_str(small));
    EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::sum_to(in[0], small); },
                     {leaf64(big, seed++)});
    EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::expand(in[0], big); },
                     {leaf64(small, seed++)});
  }
}

TEST(ElementwiseGradcheck, WhereAndMaskedFill) {
  const Tensor cond = Tensor::from_vector<bool>({true, false, false, true, true, false}, {2, 3});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::where(cond, in[0], in[1]); },
                   {leaf64({2, 3}, 1), leaf64({2, 3}, 2)});
  // a and b broadcast up to cond's shape; their gradients sum back.
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::where(cond, in[0], in[1]); },
                   {leaf64({3}, 3), leaf64({2, 1}, 4)});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::where(cond, in[0], in[1]); },
                   {leaf64({}, 5), leaf64({2, 3}, 6)});
  // cond broadcasts: [2, 1, 1] against [3] and [4, 1] gives [2, 4, 3].
  const Tensor c3 = Tensor::from_vector<uint8_t>({1, 0}, {2, 1, 1});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return ops::where(c3, in[0], in[1]); },
                   {leaf64({3}, 7), leaf64({4, 1}, 8)});

  const Tensor mask = Tensor::from_vector<bool>({false, true, false}, {3});
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) { return ops::masked_fill(in[0], mask, -1e9); },
      {leaf64({2, 3}, 9)});
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) { return ops::masked_fill(in[0], cond, 0.0); },
      {leaf64({2, 3}, 10)});
}

TEST(ElementwiseGradcheck, Composite) {
  // A gated MLP-style expression mixing broadcasts and activations.
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return ops::silu(in[0] * in[1]) * ops::sigmoid(in[0] + in[2]) +
               ops::gelu(in[2], ops::GeluApprox::tanh);
      },
      {leaf64({2, 3}, 1), leaf64({3}, 2), leaf64({2, 1}, 3)});
}

}  // namespace
}  // namespace forge
