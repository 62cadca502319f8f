// LAMB against a scalar reference of You et al.'s Algorithm 2 (the variant in
// optim/lamb.h) and against values worked out by hand: the trust ratio, the
// zero-norm cases, decay inside the ratio, f32.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/lamb.h"
#include "tests/optim/optim_test_util.h"
#include "tests/test_util.h"

namespace forge::optim {
namespace {

using namespace testing;

testing::ReferenceStep lamb_reference(const LambOptions& o) {
  auto m = std::make_shared<std::vector<double>[]>(2);
  auto v = std::make_shared<std::vector<double>[]>(2);
  return [o, m, v](std::vector<double>& w, const std::vector<double>& g, int k, int64_t t,
                   double lr, double wd) {
    if (m[k].empty()) {
      m[k].assign(w.size(), 0.0);
      v[k].assign(w.size(), 0.0);
    }
    const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(t));
    std::vector<double> r(w.size());
    double w_sq = 0, r_sq = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      m[k][i] = o.beta1 * m[k][i] + (1 - o.beta1) * g[i];
      v[k][i] = o.beta2 * v[k][i] + (1 - o.beta2) * g[i] * g[i];
      r[i] = (m[k][i] / bc1) / (std::sqrt(v[k][i] / bc2) + o.eps) + wd * w[i];
      w_sq += w[i] * w[i];
      r_sq += r[i] * r[i];
    }
    const double trust = w_sq > 0 && r_sq > 0 ? std::sqrt(w_sq) / std::sqrt(r_sq) : 1.0;
    for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * trust * r[i];
  };
}

TEST(OptimLamb, MatchesReferenceOverManySteps) {
  const LambOptions options[] = {{}, {0.8, 0.9, 1e-3}};
  for (const LambOptions& o : options) {
    for (double wd : {0.0, 0.01, 0.5}) {
      Problem problem;
      Lamb opt(problem.groups(wd), testing::kBaseLr, o);
      problem.run(opt, 1, 10);
      expect_near_all(problem.values(), reference_run(10, wd, lamb_reference(o)), 1e-12);
    }
  }
}

// w = (3, 4) (norm 5), g = (1, -1), eps 0, no decay: the first update has
// r = sign(g) = (1, -1), ||r|| = sqrt(2), trust = 5 / sqrt(2), so
// w = (3, 4) - lr 5 / sqrt(2) (1, -1).
TEST(OptimLamb, FirstStepByHand) {
  Tensor w = Tensor::from_vector<double>({3.0, 4.0});
  w.set_requires_grad(true);
  w.set_grad(Tensor::from_vector<double>({1.0, -1.0}));
  Lamb opt({ParamGroup{{{"w", w}}, 0, 1}}, 0.1, {0.9, 0.999, 0});
  opt.step();
  const double s = 0.1 * 5 / std::sqrt(2.0);
  forge::testing::expect_values(w, {3 - s, 4 + s}, 1e-14);

  // With decay 0.5 the decay term joins r before the norm: r = (1, -1) + 0.5 w.
  Tensor u = Tensor::from_vector<double>({3.0, 4.0});
  u.set_requires_grad(true);
  u.set_grad(Tensor::from_vector<double>({1.0, -1.0}));
  Lamb decayed({ParamGroup{{{"u", u}}, 0.5, 1}}, 0.1, {0.9, 0.999, 0});
  decayed.step();
  const double r0 = 1 + 1.5, r1 = -1 + 2.0, trust = 5 / std::sqrt(r0 * r0 + r1 * r1);
  forge::testing::expect_values(u, {3 - 0.1 * trust * r0, 4 - 0.1 * trust * r1}, 1e-14);
}

// A zero parameter (||w|| = 0) and a zero update (||r|| = 0) both take trust 1.
TEST(OptimLamb, ZeroNormsGiveTrustOne) {
  Tensor w = Tensor::zeros({2}, DType::f64);
  w.set_requires_grad(true);
  w.set_grad(Tensor::from_vector<double>({2.0, -0.5}));
  Lamb opt({ParamGroup{{{"w", w}}, 0.1, 1}}, 0.01, {0.9, 0.999, 0});
  opt.step();
  forge::testing::expect_values(w, {-0.01, 0.01}, 1e-15);  // r = sign(g), trust 1

  Tensor z = Tensor::from_vector<double>({1.0, 2.0});
  z.set_requires_grad(true);
  z.set_grad(Tensor::zeros({2}, DType::f64));
  Lamb still({ParamGroup{{{"z", z}}, 0, 1}}, 0.01);
  still.step();
  forge::testing::expect_values(z, {1.0, 2.0}, 0);
}

TEST(OptimLamb, Float32FollowsTheF64Run) {
  Problem p32(DType::f32);
  Lamb opt(p32.groups(0.01), testing::kBaseLr);
  p32.run(opt, 1, 6);
  expect_near_all(p32.values(), reference_run(6, 0.01, lamb_reference({})), 1e-5);
  EXPECT_EQ(opt.name(), "lamb");
}

// Norms over tensors larger than one summation block (kernels.h) agree with
// the reference.
TEST(OptimLamb, LargeTensorMatchesReference) {
  const int64_t n = 20000;
  std::vector<double> w0(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    w0[i] = std::sin(0.01 * i);
    g[i] = std::cos(0.003 * i) + 0.1;
  }
  Tensor w = Tensor::from_vector(w0);
  w.set_requires_grad(true);
  Lamb opt({ParamGroup{{{"w", w}}, 0.02, 1}}, 0.05);
  auto ref = lamb_reference({});
  std::vector<double> expected = w0;
  for (int64_t t = 1; t <= 3; ++t) {
    w.set_grad(Tensor::from_vector(g));
    opt.step();
    ref(expected, g, 0, t, 0.05, 0.02);
  }
  const auto got = w.to_vector<double>();
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(got[i] - expected[i]));
  EXPECT_LT(worst, 1e-12);
}

}  // namespace
}  // namespace forge::optim
