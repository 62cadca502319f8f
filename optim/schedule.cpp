// The learning-rate schedules (see schedule.h).
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace forge::optim {
namespace {

// Linear warmup from 1 / W at step 0 to 1 at step W - 1.
double warmup(int64_t warmup_steps, int64_t step) {
  if (step >= warmup_steps) return 1.0;
  return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
}

// Progress from the end of warmup (0) to total_steps (1), clamped.
double progress(const ScheduleConfig& c, int64_t step) {
  if (step >= c.total_steps) return 1.0;
  return static_cast<double>(step - c.warmup_steps) /
         static_cast<double>(c.total_steps - c.warmup_steps);
}

}  // namespace

void ScheduleConfig::validate() const {
  const char* k = name_of(kScheduleNames, kind);
  FORGE_CHECK(warmup_steps >= 0, "ScheduleConfig.warmup_steps: expected >= 0, got {}",
              warmup_steps);
  switch (kind) {
    case ScheduleKind::constant:
      FORGE_CHECK(warmup_steps == 0,
                  "ScheduleConfig.warmup_steps: the constant schedule has no warmup, got {} (use "
                  "linear_warmup)",
                  warmup_steps);
      break;
    case ScheduleKind::linear_warmup:
    case ScheduleKind::rsqrt:
      FORGE_CHECK(warmup_steps >= 1,
                  "ScheduleConfig.warmup_steps: the {} schedule needs >= 1, got {}", k,
                  warmup_steps);
      break;
    case ScheduleKind::cosine:
    case ScheduleKind::linear_decay:
      FORGE_CHECK(total_steps >= 1,
                  "ScheduleConfig.total_steps: the {} schedule needs >= 1, got {}", k, total_steps);
      FORGE_CHECK(warmup_steps <= total_steps,
                  "ScheduleConfig.warmup_steps: the {} schedule needs warmup_steps <= total_steps, "
                  "got {} > {}",
                  k, warmup_steps, total_steps);
      FORGE_CHECK(min_lr_ratio >= 0 && min_lr_ratio <= 1,
                  "ScheduleConfig.min_lr_ratio: expected a value in [0, 1], got {}", min_lr_ratio);
      break;
    case ScheduleKind::step:
      FORGE_CHECK(step_size >= 1, "ScheduleConfig.step_size: the step schedule needs >= 1, got {}",
                  step_size);
      FORGE_CHECK(std::isfinite(gamma) && gamma > 0,
                  "ScheduleConfig.gamma: the step schedule needs a finite gamma > 0, got {}",
                  gamma);
      break;
  }
}

double lr_factor(const ScheduleConfig& c, int64_t step) {
  c.validate();
  FORGE_CHECK(step >= 0, "lr_factor: expected a step >= 0, got {}", step);
  switch (c.kind) {
    case ScheduleKind::constant:
      return 1.0;
    case ScheduleKind::linear_warmup:
      return warmup(c.warmup_steps, step);
    case ScheduleKind::cosine:
      if (step < c.warmup_steps) return warmup(c.warmup_steps, step);
      return c.min_lr_ratio +
             (1 - c.min_lr_ratio) * 0.5 * (1 + std::cos(std::numbers::pi * progress(c, step)));
    case ScheduleKind::linear_decay:
      if (step < c.warmup_steps) return warmup(c.warmup_steps, step);
      return 1 - (1 - c.min_lr_ratio) * progress(c, step);
    case ScheduleKind::step:
      return warmup(c.warmup_steps, step) *
             std::pow(c.gamma, static_cast<double>(step / c.step_size));
    case ScheduleKind::rsqrt: {
      const auto s = static_cast<double>(step), w = static_cast<double>(c.warmup_steps);
      return std::min(1.0, s / w) / std::sqrt(std::max(s, w));
    }
  }
  FORGE_FAIL("lr_factor: unknown ScheduleKind {}", static_cast<int>(c.kind));
}

}  // namespace forge::optim
