// Learning-rate schedules: lr_factor(config, step) is the multiplier of the base
// lr for the update at 0-based optimizer step `step` (the (step+1)-th update).
// The trainer calls optimizer.set_lr(base_lr * lr_factor(config, steps())) before
// each step(). With W = warmup_steps, T = total_steps, s = step:
//   warmup(s)     = (s + 1) / W for s < W, else 1 (1 when W = 0)
//   constant      1 (W must be 0: use linear_warmup for a warmup)
//   linear_warmup warmup(s): (s+1)/W up to 1, then 1; W >= 1
//   cosine        warmup(s) for s < W; then min + (1 - min) (1 + cos(pi p)) / 2
//                 with p = (s - W) / (T - W): 1 at s = W, min_lr_ratio from s = T on
//   linear_decay  warmup(s) for s < W; then 1 - (1 - min) p, min_lr_ratio from s = T on
//   step          warmup(s) * gamma^floor(s / step_size) (torch's StepLR counted in steps)
//   rsqrt         the Long Range Arena schedule (google-research/long-range-arena,
//                 lra_benchmarks/utils/train_utils.py, create_learning_rate_scheduler
//                 with its default factors "constant * linear_warmup * rsqrt_decay"):
//                 min(1, s / W) / sqrt(max(s, W)), W >= 1. LRA evaluates it at the
//                 optimizer's step count before the update, so s is 0-based here too
//                 and the first update has lr 0, as in LRA. The factor peaks at
//                 1 / sqrt(W) and multiplies the base lr, LRA's "constant" factor
//                 (its configs use learning_rate 0.05, e.g. 0.05 / sqrt(1000) at the peak).
#pragma once

#include <cstdint>
#include <string>

#include "core/names.h"

namespace forge::optim {

enum class ScheduleKind { constant, linear_warmup, cosine, step, rsqrt, linear_decay };
inline constexpr NameTable<ScheduleKind, 6> kScheduleNames{
    "schedule", {"constant", "linear_warmup", "cosine", "step", "rsqrt", "linear_decay"}};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::constant;
  int64_t warmup_steps = 0;  // W
  int64_t total_steps = 0;   // T: cosine and linear_decay reach min_lr_ratio here
  double min_lr_ratio = 0;   // cosine / linear_decay floor, in [0, 1]
  int64_t step_size = 0;     // step: decay every step_size steps (>= 1)
  double gamma = 0.1;        // step: the factor per decay (> 0)

  // Errors name the field ("ScheduleConfig.warmup_steps ..."); fields a kind
  // does not read are not checked.
  void validate() const;
};

// Validates the config, then returns the factor at `step` (>= 0).
double lr_factor(const ScheduleConfig& config, int64_t step);

}  // namespace forge::optim
