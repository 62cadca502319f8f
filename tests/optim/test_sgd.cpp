// SGD against PyTorch's numbers (torch.optim.SGD) and a scalar reference of its
// update over several steps: momentum, dampening, Nesterov, weight decay, f32.
#include <gtest/gtest.h>

#include "optim/sgd.h"
#include "tests/optim/optim_test_util.h"
#include "tests/test_util.h"

namespace forge::optim {
namespace {

using namespace testing;

// torch.optim.SGD's update, element by element in doubles.
testing::ReferenceStep sgd_reference(const SGDOptions& o) {
  auto buf = std::make_shared<std::vector<double>[]>(2);
  return [o, buf](std::vector<double>& p, const std::vector<double>& g0, int k, int64_t t,
                  double lr, double wd) {
    std::vector<double>& b = buf[k];
    if (b.empty()) b.assign(p.size(), 0.0);
    for (size_t i = 0; i < p.size(); ++i) {
      double g = g0[i] + wd * p[i];
      if (o.momentum != 0) {
        b[i] = t == 1 ? g : o.momentum * b[i] + (1 - o.dampening) * g;
        g = o.nesterov ? g + o.momentum * b[i] : b[i];
      }
      p[i] -= lr * g;
    }
  };
}

// Five steps of the shared problem (optim_test_util.h) in torch 1.13, f64:
// torch.optim.SGD([{'params': [w], 'weight_decay': WD},
//                  {'params': [b], 'weight_decay': 0, 'lr': 0.05}], lr=0.1, ...),
// printed with '%.17g'; w then b.
TEST(OptimSGD, MatchesPyTorch) {
  struct Case {
    SGDOptions options;
    double weight_decay;
    std::vector<double> torch;
  };
  const Case cases[] = {
      // momentum=0.9, dampening=0.1, weight_decay 0.01
      {{0.9, 0.1, false},
       0.01,
       {-0.071581732149096744, 0.098237136873796718, 0.30003381357491349, 0.41261878303595034,
        0.37474707753557568, 0.39530484632542867, 0.092560799284380088, -0.15325841510008736,
        0.40952502923185696}},
      // momentum=0.9, nesterov=True, weight_decay 0.05
      {{0.9, 0, true},
       0.05,
       {-0.07935790986893608, 0.34718872034567844, 0.2711419418882719, 0.080380326933614202,
        0.45922549389479095, 0.42812950536890843, 0.091107328022334996, -0.097377516443990439,
        0.25632012445820418}},
      // no momentum, weight_decay 0.01
      {{},
       0.01,
       {0.30305617786566519, -0.63209071083731327, 0.28271145088381855, 1.2921493757009836,
        -0.27766787867759229, 0.23544247091657286, 0.16993298660463324, -0.30570621272544762,
        0.67493976301227265}},
  };
  for (const Case& c : cases) {
    Problem problem;
    SGD opt(problem.groups(c.weight_decay), testing::kBaseLr, c.options);
    problem.run(opt, 1, 5);
    expect_near_all(problem.values(), c.torch, 1e-14);
    expect_near_all(reference_run(5, c.weight_decay, sgd_reference(c.options)), c.torch, 1e-14);
  }
}

TEST(OptimSGD, MatchesReferenceOverManySteps) {
  const SGDOptions options[] = {{}, {0.5, 0, false}, {0.9, 0.3, false}, {0.8, 0, true}};
  for (const SGDOptions& o : options) {
    for (double wd : {0.0, 0.1}) {
      Problem problem;
      SGD opt(problem.groups(wd), testing::kBaseLr, o);
      problem.run(opt, 1, 9);
      EXPECT_EQ(opt.steps(), 9);
      expect_near_all(problem.values(), reference_run(9, wd, sgd_reference(o)), 1e-12);
    }
  }
}

TEST(OptimSGD, Float32FollowsTheF64Run) {
  const SGDOptions nesterov{0.9, 0, true};
  Problem p32(DType::f32);
  SGD opt(p32.groups(0.01), testing::kBaseLr, nesterov);
  p32.run(opt, 1, 6);
  EXPECT_EQ(p32.w.dtype(), DType::f32);
  expect_near_all(p32.values(), reference_run(6, 0.01, sgd_reference(nesterov)), 1e-5);
}

TEST(OptimSGD, RejectsBadOptions) {
  Problem p;
  forge::testing::expect_error(
      [&] {
        SGD bad(p.groups(0), 0.1, {-0.1, 0, false});
      },
      {"momentum", "-0.1"});
  forge::testing::expect_error(
      [&] {
        SGD bad(p.groups(0), 0.1, {0.9, 1.5, false});
      },
      {"dampening", "1.5"});
  forge::testing::expect_error(
      [&] {
        SGD bad(p.groups(0), 0.1, {0, 0, true});
      },
      {"nesterov", "momentum"});
  // Nesterov with dampening is refused, as PyTorch does.
  forge::testing::expect_error(
      [&] {
        SGD bad(p.groups(0), 0.1, {0.9, 0.1, true});
      },
      {"nesterov", "dampening 0.1"});
  forge::testing::expect_error([&] { SGD bad(p.groups(0), -1.0); }, {"lr", "-1"});
}

TEST(OptimSGD, SlotsFollowMomentum) {
  Problem p;
  SGD plain(p.groups(0), 0.1);
  EXPECT_EQ(plain.state_dict().count("momentum_buffer.w"), 0u);
  SGD heavy(p.groups(0), 0.1, {0.9, 0, false});
  const auto state = heavy.state_dict();
  ASSERT_EQ(state.count("momentum_buffer.w"), 1u);
  EXPECT_EQ(state.at("momentum_buffer.w").shape(), (Shape{2, 3}));
  EXPECT_EQ(heavy.name(), "sgd");
}

}  // namespace
}  // namespace forge::optim
