// GradScaler on CPU grads: the scaled loss and its grads, unscaling (new grad
// tensors, exact for power-of-two scales), skipped steps on inf / NaN with the
// parameters untouched, backoff and growth, checkpoint state, misuse errors,
// and the disabled pass-through.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/engine.h"
#include "ops/ops.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tests/test_util.h"

namespace forge::optim {
namespace {

using namespace forge::testing;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor param(const std::vector<double>& values, DType dtype = DType::f64) {
  Tensor p = Tensor::from_vector(values).to(dtype);
  p.set_requires_grad(true);
  return p;
}

std::vector<ParamGroup> one_group(const std::vector<Tensor>& params) {
  ParamGroup g;
  for (size_t k = 0; k < params.size(); ++k)
    g.params.emplace_back("p" + std::to_string(k), params[k]);
  return {g};
}

// Sets p's grad to `values` * scale (what backward of a scaled loss gives).
void set_scaled_grad(Tensor& p, const std::vector<double>& values, double scale) {
  std::vector<double> g(values);
  for (double& x : g) x *= scale;
  p.set_grad(Tensor::from_vector(g).to(p.dtype()));
}

TEST(GradScaler, ScaledLossGivesScaledGradsAndUnscaleRestoresThem) {
  for (DType dtype : {DType::f32, DType::f64}) {
    Tensor p = param({1.0, -2.0, 0.375}, dtype);
    SGD opt(one_group({p}), 0.1);
    GradScaler scaler;
    EXPECT_EQ(scaler.get_scale(), 65536.0);
    const Tensor loss = ops::sum(ops::mul(p, p));  // grad 2 p
    const Tensor scaled = scaler.scale(loss);
    EXPECT_EQ(scaled.item(), loss.item() * 65536.0);
    autograd::backward(scaled);
    expect_values(p.grad(), {2.0 * 65536, -4.0 * 65536, 0.75 * 65536}, 0);

    const Tensor before = p.grad();
    EXPECT_TRUE(scaler.unscale(opt));
    expect_values(p.grad(), {2.0, -4.0, 0.75}, 0);  // exact: the scale is a power of two
    // A new grad tensor; the old one keeps its values.
    EXPECT_FALSE(p.grad().same(before));
    expect_values(before, {2.0 * 65536, -4.0 * 65536, 0.75 * 65536}, 0);
    EXPECT_EQ(p.grad().dtype(), dtype);

    EXPECT_TRUE(scaler.step(opt));  // no second unscale
    expect_values(p, {1.0 - 0.2, -2.0 + 0.4, 0.375 - 0.075}, dtype == DType::f32 ? 1e-7 : 1e-15);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 65536.0);
    EXPECT_EQ(scaler.growth_tracker(), 1);
  }
}

TEST(GradScaler, StepUnscalesWhenNotDoneAndMatchesAnUnscaledStep) {
  Tensor p = param({0.5, 1.5}), q = param({-1.0});
  Tensor p_ref = param({0.5, 1.5}), q_ref = param({-1.0});
  SGDOptions o;
  o.momentum = 0.9;
  o.nesterov = true;
  SGD opt(one_group({p, q}), 0.05, o), ref(one_group({p_ref, q_ref}), 0.05, o);
  GradScaler scaler({1024, 2, 0.5, 2000, true});
  for (int t = 1; t <= 3; ++t) {
    const std::vector<double> gp = {0.1 * t, -0.3}, gq = {0.7 / t};
    set_scaled_grad(p, gp, scaler.get_scale());
    set_scaled_grad(q, gq, scaler.get_scale());
    set_scaled_grad(p_ref, gp, 1);
    set_scaled_grad(q_ref, gq, 1);
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
    ref.step();
  }
  expect_values(p, p_ref.to_vector<double>(), 0);
  expect_values(q, q_ref.to_vector<double>(), 0);
  EXPECT_EQ(opt.steps(), 3);
}

TEST(GradScaler, InfOrNanSkipsTheStepAndBacksOff) {
  for (double bad : {kInf, -kInf, kNaN}) {
    Tensor p = param({1.0, 2.0}), q = param({3.0});
    SGD opt(one_group({p, q}), 0.1);
    GradScaler scaler;
    set_scaled_grad(p, {0.5, 0.25}, scaler.get_scale());
    q.set_grad(Tensor::from_vector<double>({bad}));
    EXPECT_FALSE(scaler.unscale(opt));
    EXPECT_FALSE(scaler.step(opt));
    expect_values(p, {1.0, 2.0}, 0);
    expect_values(q, {3.0}, 0);
    EXPECT_EQ(opt.steps(), 0);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 32768.0);
    EXPECT_EQ(scaler.growth_tracker(), 0);

    // The next, finite iteration steps at the halved scale.
    set_scaled_grad(p, {0.5, 0.25}, scaler.get_scale());
    set_scaled_grad(q, {1.0}, scaler.get_scale());
    EXPECT_TRUE(scaler.step(opt));
    expect_values(p, {0.95, 1.975}, 1e-15);
    expect_values(q, {2.9}, 1e-15);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 32768.0);
  }
}

// A finite grad that unscaling would overflow counts as non-finite too.
TEST(GradScaler, OverflowWhileUnscalingCounts) {
  Tensor p = param({1.0}, DType::f32);
  SGD opt(one_group({p}), 0.1);
  GradScaler scaler({0.25, 2, 0.5, 2000, true});
  p.set_grad(Tensor::from_vector<float>({3e38f}));
  EXPECT_FALSE(scaler.step(opt));
  expect_values(p, {1.0}, 0);
}

TEST(GradScaler, GrowsAfterGrowthIntervalFiniteStepsInARow) {
  Tensor p = param({1.0});
  SGD opt(one_group({p}), 0.0);
  GradScaler scaler({8, 2, 0.5, 3, true});
  const auto iterate = [&](double g) {
    p.set_grad(Tensor::from_vector<double>({g * scaler.get_scale()}));
    const bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  };
  EXPECT_TRUE(iterate(1));
  EXPECT_TRUE(iterate(1));
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  EXPECT_TRUE(iterate(1));
  EXPECT_EQ(scaler.get_scale(), 16.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // An overflow restarts the count: two more finite steps are not enough.
  EXPECT_TRUE(iterate(1));
  EXPECT_FALSE(iterate(kInf));
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_TRUE(iterate(1));
  EXPECT_TRUE(iterate(1));
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_TRUE(iterate(1));
  EXPECT_EQ(scaler.get_scale(), 16.0);
}

TEST(GradScaler, FactorsAreOptionsAndGrowthStaysFinite) {
  Tensor p = param({1.0});
  SGD opt(one_group({p}), 0.0);
  GradScaler scaler({100, 4, 0.25, 1, true});
  p.set_grad(Tensor::from_vector<double>({kNaN}));
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 25.0);
  p.set_grad(Tensor::from_vector<double>({1.0}));
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 100.0);

  GradScaler huge({1e308, 2, 0.5, 1, true});
  p.set_grad(Tensor::from_vector<double>({1.0}));
  huge.step(opt);
  huge.update();
  EXPECT_EQ(huge.get_scale(), 1e308);  // 2e308 is not finite: kept
  EXPECT_EQ(huge.growth_tracker(), 0);
}

// Each optimizer's step depends on its own grads; update backs off if any overflowed.
TEST(GradScaler, SeveralOptimizers) {
  Tensor a = param({1.0}), b = param({2.0});
  SGD opt_a(one_group({a}), 0.5), opt_b(one_group({b}), 0.5);
  GradScaler scaler({4, 2, 0.5, 2000, true});
  a.set_grad(Tensor::from_vector<double>({4.0}));
  b.set_grad(Tensor::from_vector<double>({kInf}));
  EXPECT_TRUE(scaler.step(opt_a));
  EXPECT_FALSE(scaler.step(opt_b));
  expect_values(a, {0.5}, 0);
  expect_values(b, {2.0}, 0);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 2.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

// The documented order: unscale, then clip the true grads, then step.
TEST(GradScaler, ClipSeesTheUnscaledGrads) {
  Tensor p = param({0.0, 0.0});
  SGD opt(one_group({p}), 1.0);
  GradScaler scaler;
  set_scaled_grad(p, {3.0, 4.0}, scaler.get_scale());
  EXPECT_TRUE(scaler.unscale(opt));
  EXPECT_DOUBLE_EQ(clip_grad_norm({p}, 1.0), 5.0);
  EXPECT_TRUE(scaler.step(opt));
  const double coef = 1.0 / (5.0 + 1e-6);
  expect_values(p, {-3.0 * coef, -4.0 * coef}, 1e-15);
  scaler.update();
}

TEST(GradScaler, StateRoundTripAndStrictLoading) {
  Tensor p = param({1.0});
  SGD opt(one_group({p}), 0.0);
  GradScaler scaler({512, 2, 0.5, 10, true});
  for (int i = 0; i < 3; ++i) {
    p.set_grad(Tensor::from_vector<double>({1.0}));
    scaler.step(opt);
    scaler.update();
  }
  p.set_grad(Tensor::from_vector<double>({kInf}));
  scaler.step(opt);
  scaler.update();
  for (int i = 0; i < 4; ++i) {
    p.set_grad(Tensor::from_vector<double>({1.0}));
    scaler.step(opt);
    scaler.update();
  }
  const auto state = scaler.state();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state.at("scale"), 256.0);
  EXPECT_EQ(state.at("growth_tracker"), 4.0);

  GradScaler restored({512, 2, 0.5, 10, true});
  restored.set_state(state);
  EXPECT_EQ(restored.get_scale(), 256.0);
  EXPECT_EQ(restored.growth_tracker(), 4);
  // Six more finite steps grow both alike.
  for (GradScaler* s : {&scaler, &restored}) {
    for (int i = 0; i < 6; ++i) {
      p.set_grad(Tensor::from_vector<double>({1.0}));
      s->step(opt);
      s->update();
    }
    EXPECT_EQ(s->get_scale(), 512.0);
    EXPECT_EQ(s->growth_tracker(), 0);
  }

  expect_error(
      [&] {
        restored.set_state({{"scale", -1.0}, {"growth_tracker", 2.5}, {"x", 0}});
      },
      {"scale: expected a finite value > 0, found -1",
       "growth_tracker: expected a whole number in [0, 10)", "unexpected: x"});
  expect_error(
      [&] {
        restored.set_state({{"growth_tracker", 10.0}});
      },
      {"missing: scale", "found 10"});
  EXPECT_EQ(restored.get_scale(), 512.0);  // nothing changed
  EXPECT_EQ(restored.growth_tracker(), 0);
}

TEST(GradScaler, DisabledIsAPassThrough) {
  Tensor p = param({1.0, 2.0});
  SGD opt(one_group({p}), 0.5);
  GradScalerOptions o;
  o.enabled = false;
  GradScaler scaler(o);
  EXPECT_EQ(scaler.get_scale(), 1.0);
  const Tensor loss = ops::sum(p);
  EXPECT_TRUE(scaler.scale(loss).same(loss));
  const Tensor g = Tensor::from_vector<double>({2.0, kInf});
  p.set_grad(g);
  EXPECT_TRUE(scaler.unscale(opt));
  EXPECT_TRUE(p.grad().same(g));  // untouched
  EXPECT_TRUE(scaler.step(opt));  // steps whatever the grads
  expect_values(p.slice0(0, 1), {0.0}, 0);
  EXPECT_EQ(p.to_vector<double>()[1], -kInf);
  scaler.update();
  scaler.update();  // no checks either
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_EQ(opt.steps(), 1);
}

TEST(GradScaler, MisuseIsAnError) {
  Tensor p = param({1.0});
  SGD opt(one_group({p}), 0.1);
  GradScaler scaler;
  expect_error([&] { scaler.update(); }, {"GradScaler::update", "no unscale() or step()"});
  p.set_grad(Tensor::from_vector<double>({1.0}));
  scaler.unscale(opt);
  expect_error([&] { scaler.unscale(opt); }, {"GradScaler::unscale", "already unscaled"});
  scaler.step(opt);
  expect_error([&] { scaler.step(opt); }, {"GradScaler::step", "already called"});
  expect_error([&] { scaler.unscale(opt); }, {"already stepped"});
  scaler.update();
  p.set_grad(Tensor::from_vector<double>({1.0}));
  EXPECT_TRUE(scaler.unscale(opt));  // a new iteration

  expect_error([] { GradScaler s({0, 2, 0.5, 1, true}); }, {"init_scale > 0"});
  expect_error([] { GradScaler s({1, 1, 0.5, 1, true}); }, {"growth_factor > 1"});
  expect_error([] { GradScaler s({1, 2, 1, 1, true}); }, {"backoff_factor in (0, 1)"});
  expect_error([] { GradScaler s({1, 2, 0.5, 0, true}); }, {"growth_interval > 0"});
}

}  // namespace
}  // namespace forge::optim
