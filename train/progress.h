// Console progress: pure formatting helpers for the trainer's status line
// ("step 1200/5000 [██████▍      ] 24% 3.4k tok/s eta 12m05s").
#pragma once

#include <cstdint>
#include <string>

namespace forge::train {

// `width` cells filled in proportion to `fraction` (clamped to [0, 1]; NaN is
// 0): unicode block characters with eighth-cell resolution, or '#' and '.'
// when `unicode` is false. Always exactly `width` cells (display columns).
std::string progress_bar(double fraction, int width, bool unicode = true);

// "12.3s" below a minute, "3m05s" below an hour, "1h02m" below a day, then
// "2d03h" (rounded to the shown unit). Negative or non-finite: "--".
std::string format_duration(double seconds);

// Three significant digits or so with a k/M/G/T/P suffix: 999 -> "999",
// 1234 -> "1.2k", 12345 -> "12.3k", 123456 -> "123k", 3.4e6 -> "3.4M";
// below 1000 non-integers keep one decimal ("12.3") or three significant
// digits below 1 ("0.0123"). Non-finite: "nan", "inf", "-inf".
std::string format_count(double value);

// An exponential moving average of the time per step, for an ETA that follows
// speed changes (evaluation pauses, warm-up) without jumping at every step.
class EtaEstimator {
 public:
  // `smoothing` in (0, 1]: the weight of each new step (1: the last step only).
  explicit EtaEstimator(double smoothing = 0.1);

  // `seconds` spent on `steps` steps (> 0); weighs like `steps` updates of
  // seconds / steps each, so reporting every step or every 10 agrees.
  void add(double seconds, int64_t steps = 1);
  bool ready() const { return samples_ > 0; }
  double seconds_per_step() const;            // NaN before the first add()
  double eta(int64_t remaining_steps) const;  // seconds; NaN before the first add()

 private:
  double smoothing_;
  double average_ = 0;
  int64_t samples_ = 0;
};

}  // namespace forge::train
