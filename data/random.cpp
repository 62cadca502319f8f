#include "data/random.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/vmath.h"

namespace forge::data {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t Rng::mix(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x243f6a8885a308d3ULL;
  for (uint64_t p : parts) h = splitmix64(h ^ splitmix64(p));
  return h;
}

uint64_t Rng::next_u64() {
  const uint64_t hi = next_u32();
  return (hi << 32) | next_u32();
}

double Rng::uniform() {
  const uint32_t hi = next_u32();
  return Generator::words_to_unit_f64(hi, next_u32());
}

int64_t Rng::randint(int64_t n) {
  FORGE_CHECK(n > 0, "Rng::randint: n must be positive, got {}", n);
  const uint64_t un = static_cast<uint64_t>(n);
  const uint64_t limit = UINT64_MAX - UINT64_MAX % un;  // reject the biased tail
  uint64_t x;
  do x = next_u64();
  while (x >= limit);
  return static_cast<int64_t>(x % un);
}

int64_t Rng::randint(int64_t lo, int64_t hi) {
  FORGE_CHECK(lo <= hi, "Rng::randint: empty range [{}, {}]", lo, hi);
  return lo + randint(hi - lo + 1);
}

double Rng::normal() {
  const double u1 = 1.0 - uniform();  // (0, 1]
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

void Rng::normals(float* out, int64_t n) {
  int64_t i = 0;
  while (i < n && counter_ % 4 != 0) out[i++] = static_cast<float>(normal());
  // From a block boundary on, one Philox block holds the four words of a normal.
  constexpr int64_t kBatch = 256;
  double u1[kBatch], u2[kBatch];
  while (i < n) {
    const int64_t m = std::min(kBatch, n - i);
    for (int64_t j = 0; j < m; ++j) {
      const Philox4x32 w = Generator::block(seed_, 0, counter_ / 4 + static_cast<uint64_t>(j));
      u1[j] = 1.0 - Generator::words_to_unit_f64(w[0], w[1]);
      u2[j] = 2.0 * std::numbers::pi * Generator::words_to_unit_f64(w[2], w[3]);
    }
    counter_ += 4 * static_cast<uint64_t>(m);
    vmath::log(u1, u1, m);
    vmath::cos(u2, u2, m);
    for (int64_t j = 0; j < m; ++j) out[i + j] = static_cast<float>(std::sqrt(-2.0 * u1[j]) * u2[j]);
    i += m;
  }
}

double Rng::gamma(double shape) {
  FORGE_CHECK(shape > 0, "Rng::gamma: shape must be positive, got {}", shape);
  if (shape < 1) {  // Gamma(a) = Gamma(a + 1) * U^(1/a)
    const double u = 1.0 - uniform();
    return gamma(shape + 1) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9 * d);
  for (;;) {
    double x, v;
    do {
      x = normal();
      v = 1 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = 1.0 - uniform();
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
  }
}

double Rng::beta(double a, double b) {
  const double x = gamma(a), y = gamma(b);
  return x / (x + y);
}

}  // namespace forge::data
