// Console progress formatting: bars, durations, counts and the ETA average.
#include "train/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace forge::train {

std::string progress_bar(double fraction, int width, bool unicode) {
  if (width <= 0) return "";
  const double f = std::isnan(fraction) ? 0.0 : std::clamp(fraction, 0.0, 1.0);
  // In eighths of a cell; the ASCII bar shows whole cells only.
  const auto eighths = static_cast<int64_t>(std::floor(f * width * 8));
  const auto full = static_cast<int>(eighths / 8);
  const auto part = static_cast<int>(eighths % 8);
  std::string out;
  for (int i = 0; i < full; ++i) out += unicode ? "\u2588" : "#";
  int used = full;
  if (unicode && part > 0) {
    // U+2589 is seven eighths, ..., U+258F one eighth: three UTF-8 bytes E2 96 xx.
    out += "\xE2\x96";
    out += static_cast<char>(0x90 - part);
    ++used;
  }
  out.append(static_cast<size_t>(width - used), unicode ? ' ' : '.');
  return out;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--";
  if (seconds < 59.95) return fmt::format("{:.1f}s", seconds);
  if (seconds >= 1e9) return fmt::format("{:.3g}d", seconds / 86400);
  const int64_t s = std::llround(seconds);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  const int64_t m = std::llround(seconds / 60);
  if (m < 24 * 60) return fmt::format("{}h{:02}m", m / 60, m % 60);
  const int64_t h = std::llround(seconds / 3600);
  return fmt::format("{}d{:02}h", h / 24, h % 24);
}

std::string format_count(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value < 0) return "-" + format_count(-value);
  if (value < 999.5 || (value < 1000 && value == std::floor(value))) {
    if (value == std::floor(value) || value >= 99.95) return fmt::format("{:.0f}", value);
    if (value >= 1) return fmt::format("{:.1f}", value);
    return fmt::format("{:.3g}", value);
  }
  double scale = 1;
  for (const char* suffix : {"k", "M", "G", "T", "P"}) {
    scale *= 1000;
    const double s = value / scale;
    if (s < 99.95) return fmt::format("{:.1f}{}", s, suffix);
    if (s < 999.5) return fmt::format("{:.0f}{}", s, suffix);
  }
  return fmt::format("{:.3g}", value);
}

EtaEstimator::EtaEstimator(double smoothing) : smoothing_(smoothing) {
  FORGE_CHECK(smoothing > 0 && smoothing <= 1,
              "EtaEstimator: smoothing must be in (0, 1], found {}", smoothing);
}

void EtaEstimator::add(double seconds, int64_t steps) {
  FORGE_CHECK(steps > 0, "EtaEstimator::add: steps must be positive, found {}", steps);
  FORGE_CHECK(std::isfinite(seconds) && seconds >= 0,
              "EtaEstimator::add: seconds must be finite and non-negative, found {}", seconds);
  const double per_step = seconds / static_cast<double>(steps);
  if (samples_ == 0) {
    average_ = per_step;
  } else {
    const double weight = 1 - std::pow(1 - smoothing_, static_cast<double>(steps));
    average_ += weight * (per_step - average_);
  }
  samples_ += steps;
}

double EtaEstimator::seconds_per_step() const {
  return ready() ? average_ : std::numeric_limits<double>::quiet_NaN();
}

double EtaEstimator::eta(int64_t remaining_steps) const {
  return seconds_per_step() * static_cast<double>(std::max<int64_t>(remaining_steps, 0));
}

}  // namespace forge::train
