#include "core/rng.h"

namespace forge {

namespace {
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
}  // namespace

Philox4x32 philox4x32_10(Philox4x32 c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

uint64_t Generator::reserve(uint64_t n) {
  const uint64_t start = state_.offset;
  state_.offset += (n + 3) / 4;
  return start;
}

Philox4x32 Generator::block(uint64_t seed, uint64_t offset, uint64_t b) {
  const uint64_t counter = offset + b;
  return philox4x32_10(
      {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

uint32_t Generator::word(uint64_t seed, uint64_t offset, uint64_t i) {
  return block(seed, offset, i / 4)[i % 4];
}

float Generator::uniform_f32(uint64_t seed, uint64_t offset, uint64_t i) {
  return word_to_unit_f32(word(seed, offset, i));
}

double Generator::uniform_f64(uint64_t seed, uint64_t offset, uint64_t i) {
  // Two consecutive words of the stream: draw i of a f64 request uses words 2i, 2i+1.
  return words_to_unit_f64(word(seed, offset, 2 * i), word(seed, offset, 2 * i + 1));
}

Generator& default_generator() {
  static Generator g(0);
  return g;
}

void manual_seed(uint64_t seed) {
  default_generator().manual_seed(seed);
}

}  // namespace forge
