// Adam and AdamW against PyTorch's numbers (torch.optim.Adam / AdamW) and a
// scalar reference of their updates: L2 vs decoupled decay, betas, eps, bias
// correction, f32.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/adam.h"
#include "tests/optim/optim_test_util.h"
#include "tests/test_util.h"

namespace forge::optim {
namespace {

using namespace testing;

// PyTorch's documented Adam / AdamW update, element by element in doubles.
testing::ReferenceStep adam_reference(const AdamOptions& o, bool decoupled) {
  auto m = std::make_shared<std::vector<double>[]>(2);
  auto v = std::make_shared<std::vector<double>[]>(2);
  return [o, decoupled, m, v](std::vector<double>& p, const std::vector<double>& g0, int k,
                              int64_t t, double lr, double wd) {
    if (m[k].empty()) {
      m[k].assign(p.size(), 0.0);
      v[k].assign(p.size(), 0.0);
    }
    const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(t));
    for (size_t i = 0; i < p.size(); ++i) {
      double g = g0[i];
      if (decoupled)
        p[i] *= 1 - lr * wd;
      else
        g += wd * p[i];
      m[k][i] = o.beta1 * m[k][i] + (1 - o.beta1) * g;
      v[k][i] = o.beta2 * v[k][i] + (1 - o.beta2) * g * g;
      const double m_hat = m[k][i] / bc1, v_hat = v[k][i] / bc2;
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  };
}

// Five steps of the shared problem (optim_test_util.h) in torch 1.13, f64:
// torch.optim.Adam / AdamW([{'params': [w], 'weight_decay': 0.1},
//   {'params': [b], 'weight_decay': 0, 'lr': 0.05}], lr=0.1, betas=(0.9, 0.99),
//   eps=1e-8), printed with '%.17g'; w then b.
TEST(OptimAdam, MatchesPyTorch) {
  const AdamOptions o{0.9, 0.99, 1e-8};
  const std::vector<double> torch_adam = {
      0.07187474262284034,  -0.69995048562803741, 0.29603734565633677,
      1.5001746792720867,   -0.22671485604506858, 0.42110346557125256,
      0.061775254108802524, -0.16446714096141729, 0.65015914916196904};
  const std::vector<double> torch_adamw = {
      0.063418640380637298, -0.65121009982721334, 0.32091343971709263,
      1.4123944179416772,   -0.2042375911585112,  0.43266766081077124,
      0.061775254108802524, -0.16446714096141729, 0.65015914916196904};
  Problem pa, pw;
  Adam adam(pa.groups(0.1), testing::kBaseLr, o);
  AdamW adamw(pw.groups(0.1), testing::kBaseLr, o);
  pa.run(adam, 1, 5);
  pw.run(adamw, 1, 5);
  expect_near_all(pa.values(), torch_adam, 1e-14);
  expect_near_all(pw.values(), torch_adamw, 1e-14);
  expect_near_all(reference_run(5, 0.1, adam_reference(o, false)), torch_adam, 1e-14);
  expect_near_all(reference_run(5, 0.1, adam_reference(o, true)), torch_adamw, 1e-14);
  EXPECT_EQ(adam.name(), "adam");
  EXPECT_EQ(adamw.name(), "adamw");
}

// set_multi_tensor gathers GPU parameters only: CPU parameters take the
// same updates with it on, to the last bit.
TEST(OptimAdam, MultiTensorLeavesCpuUpdatesAsTheyAre) {
  const AdamOptions o{0.9, 0.99, 1e-8};
  Problem plain, gathered;
  AdamW a(plain.groups(0.1), testing::kBaseLr, o), b(gathered.groups(0.1), testing::kBaseLr, o);
  plain.run(a, 1, 4);
  set_multi_tensor(true);
  gathered.run(b, 1, 4);
  set_multi_tensor(false);
  EXPECT_EQ(gathered.values(), plain.values());
}

TEST(OptimAdam, MatchesReferenceOverManySteps) {
  const AdamOptions options[] = {{}, {0.8, 0.9, 1e-3}, {0.0, 0.5, 0.0}};
  for (const AdamOptions& o : options) {
    for (bool decoupled : {false, true}) {
      for (double wd : {0.0, 0.3}) {
        Problem problem;
        std::unique_ptr<Optimizer> opt;
        if (decoupled)
          opt = std::make_unique<AdamW>(problem.groups(wd), testing::kBaseLr, o);
        else
          opt = std::make_unique<Adam>(problem.groups(wd), testing::kBaseLr, o);
        problem.run(*opt, 1, 12);
        expect_near_all(problem.values(), reference_run(12, wd, adam_reference(o, decoupled)),
                        1e-12);
      }
    }
  }
}

// The first update moves each element by lr sign(g) (up to eps): m_hat = g and
// sqrt(v_hat) = |g| whatever the betas.
TEST(OptimAdam, FirstStepIsLrTimesSign) {
  Tensor p = Tensor::from_vector<double>({1.0, -2.0, 3.0});
  p.set_requires_grad(true);
  p.set_grad(Tensor::from_vector<double>({0.5, -4.0, 1e-3}));
  Adam opt({ParamGroup{{{"p", p}}, 0, 1}}, 0.01, {0.9, 0.999, 0});
  opt.step();
  forge::testing::expect_values(p, {0.99, -1.99, 2.99}, 1e-15);
}

TEST(OptimAdam, Float32FollowsTheF64Run) {
  const AdamOptions o{0.9, 0.99, 1e-8};
  Problem p32(DType::f32);
  AdamW opt(p32.groups(0.1), testing::kBaseLr, o);
  p32.run(opt, 1, 6);
  EXPECT_EQ(opt.state_dict().at("exp_avg.w").dtype(), DType::f32);
  expect_near_all(p32.values(), reference_run(6, 0.1, adam_reference(o, true)), 1e-5);
}

TEST(OptimAdam, RejectsBadOptions) {
  Problem p;
  forge::testing::expect_error(
      [&] {
        Adam bad(p.groups(0), 0.1, {1.0, 0.999, 1e-8});
      },
      {"Adam", "beta1", "[0, 1)"});
  forge::testing::expect_error(
      [&] {
        AdamW bad(p.groups(0), 0.1, {0.9, -0.1, 1e-8});
      },
      {"AdamW", "beta2"});
  forge::testing::expect_error(
      [&] {
        Adam bad(p.groups(0), 0.1, {0.9, 0.999, -1});
      },
      {"eps", "-1"});
}

}  // namespace
}  // namespace forge::optim
