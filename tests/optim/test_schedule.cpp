// Learning-rate schedules: factors at chosen steps of every kind, worked out by
// hand (the LRA rsqrt schedule included), names, and config validation.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/schedule.h"
#include "tests/test_util.h"

namespace forge::optim {
namespace {

using forge::testing::expect_error;

ScheduleConfig config(ScheduleKind kind, int64_t warmup, int64_t total = 0, double min_ratio = 0) {
  return ScheduleConfig{
      .kind = kind, .warmup_steps = warmup, .total_steps = total, .min_lr_ratio = min_ratio};
}

void expect_factors(const ScheduleConfig& c, const std::vector<std::pair<int64_t, double>>& want) {
  for (const auto& [step, factor] : want)
    EXPECT_NEAR(lr_factor(c, step), factor, 1e-15)
        << name_of(kScheduleNames, c.kind) << " at step " << step;
}

TEST(OptimSchedule, ConstantAndLinearWarmup) {
  expect_factors(config(ScheduleKind::constant, 0), {{0, 1.0}, {7, 1.0}, {100000, 1.0}});
  // (step + 1) / 4 over the first four updates, then 1.
  expect_factors(config(ScheduleKind::linear_warmup, 4),
                 {{0, 0.25}, {1, 0.5}, {2, 0.75}, {3, 1.0}, {4, 1.0}, {1000, 1.0}});
}

TEST(OptimSchedule, Cosine) {
  // W = 2, T = 6, floor 0.1: warmup 0.5, 1; then 0.1 + 0.45 (1 + cos(pi p)) with
  // p = (s - 2) / 4; the floor from s = 6 on.
  const double c45 = std::sqrt(0.5);  // cos(pi / 4)
  expect_factors(config(ScheduleKind::cosine, 2, 6, 0.1), {{0, 0.5},
                                                           {1, 1.0},
                                                           {2, 1.0},
                                                           {3, 0.1 + 0.45 * (1 + c45)},
                                                           {4, 0.55},
                                                           {5, 0.1 + 0.45 * (1 - c45)},
                                                           {6, 0.1},
                                                           {50, 0.1}});
  // No warmup, floor 0: 1 at step 0, 1/2 halfway, 0 at T.
  expect_factors(config(ScheduleKind::cosine, 0, 4), {{0, 1.0}, {2, 0.5}, {4, 0.0}, {9, 0.0}});
  // Warmup as long as the run: warmup, then the floor.
  expect_factors(config(ScheduleKind::cosine, 2, 2, 0.25), {{0, 0.5}, {1, 1.0}, {2, 0.25}});
}

TEST(OptimSchedule, LinearDecay) {
  // W = 2, T = 6, floor 0.2: 1 - 0.8 (s - 2) / 4 after the warmup.
  expect_factors(config(ScheduleKind::linear_decay, 2, 6, 0.2),
                 {{0, 0.5}, {1, 1.0}, {2, 1.0}, {3, 0.8}, {4, 0.6}, {5, 0.4}, {6, 0.2}, {9, 0.2}});
}

TEST(OptimSchedule, Step) {
  ScheduleConfig c = config(ScheduleKind::step, 0);
  c.step_size = 3;
  c.gamma = 0.5;
  expect_factors(c, {{0, 1.0}, {2, 1.0}, {3, 0.5}, {5, 0.5}, {6, 0.25}, {9, 0.125}});
  c.warmup_steps = 2;  // the warmup multiplies the decay, counted from step 0
  expect_factors(c, {{0, 0.5}, {1, 1.0}, {2, 1.0}, {3, 0.5}});
}

// LRA: min(1, s / W) / sqrt(max(s, W)), s the 0-based step. W = 4: 0 at the
// first update, 1/4 / 2 at s = 1, 1/2 from s = W, then 1 / sqrt(s).
TEST(OptimSchedule, RsqrtIsLongRangeArenas) {
  expect_factors(config(ScheduleKind::rsqrt, 4),
                 {{0, 0.0}, {1, 0.125}, {2, 0.25}, {3, 0.375}, {4, 0.5}, {16, 0.25}, {100, 0.1}});
  // LRA's defaults: warmup 1000 and learning_rate 0.05 as the base lr.
  const ScheduleConfig lra = config(ScheduleKind::rsqrt, 1000);
  EXPECT_NEAR(0.05 * lr_factor(lra, 500), 0.05 * 0.5 / std::sqrt(1000.0), 1e-17);
  EXPECT_NEAR(0.05 * lr_factor(lra, 1000), 0.05 / std::sqrt(1000.0), 1e-17);
  EXPECT_NEAR(0.05 * lr_factor(lra, 4000), 0.05 / std::sqrt(4000.0), 1e-17);
}

TEST(OptimSchedule, NamesRoundTrip) {
  for (ScheduleKind k : {ScheduleKind::constant, ScheduleKind::linear_warmup, ScheduleKind::cosine,
                         ScheduleKind::step, ScheduleKind::rsqrt, ScheduleKind::linear_decay})
    EXPECT_EQ(enum_from_name(kScheduleNames, name_of(kScheduleNames, k)), k);
  EXPECT_STREQ(name_of(kScheduleNames, ScheduleKind::rsqrt), "rsqrt");
  expect_error(
      [] { enum_from_name(kScheduleNames, "cosine_annealing"); },
      {"'cosine_annealing'", "constant, linear_warmup, cosine, step, rsqrt, linear_decay"});
}

TEST(OptimSchedule, ValidationNamesTheField) {
  expect_error([] { lr_factor(config(ScheduleKind::cosine, 10, 5), 0); },
               {"ScheduleConfig.warmup_steps", "10 > 5"});
  expect_error([] { lr_factor(config(ScheduleKind::linear_decay, 0, 0), 0); },
               {"ScheduleConfig.total_steps", "linear_decay"});
  expect_error([] { lr_factor(config(ScheduleKind::cosine, 0, 5, 1.5), 0); },
               {"ScheduleConfig.min_lr_ratio", "1.5"});
  expect_error([] { lr_factor(config(ScheduleKind::rsqrt, 0), 0); },
               {"ScheduleConfig.warmup_steps", "rsqrt"});
  expect_error([] { lr_factor(config(ScheduleKind::linear_warmup, 0), 0); },
               {"ScheduleConfig.warmup_steps", "linear_warmup"});
  expect_error([] { lr_factor(config(ScheduleKind::constant, 3), 0); },
               {"ScheduleConfig.warmup_steps", "linear_warmup"});
  expect_error([] { lr_factor(config(ScheduleKind::cosine, -1, 5), 0); },
               {"ScheduleConfig.warmup_steps", "-1"});
  ScheduleConfig s = config(ScheduleKind::step, 0);
  s.step_size = 0;
  expect_error([&] { s.validate(); }, {"ScheduleConfig.step_size"});
  s.step_size = 2;
  s.gamma = 0;
  expect_error([&] { s.validate(); }, {"ScheduleConfig.gamma"});
  expect_error([] { lr_factor(config(ScheduleKind::constant, 0), -1); }, {"step", "-1"});
}

}  // namespace
}  // namespace forge::optim
