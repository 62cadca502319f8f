#include "core/rng.h"

#include "core/error.h"
#include "core/philox.h"

namespace forge {

Philox4x32 philox4x32_10(Philox4x32 c, std::array<uint32_t, 2> k) {
  // The one implementation, shared with the CUDA kernels (core/philox.h).
  const PhiloxWords r = philox4x32_10_words(PhiloxWords{{c[0], c[1], c[2], c[3]}}, k[0], k[1]);
  return {r.w[0], r.w[1], r.w[2], r.w[3]};
}

uint64_t Generator::reserve(uint64_t n) {
  const uint64_t start = state_.offset;
  state_.offset += (n + 3) / 4;
  return start;
}

void Generator::set_batch_shard(BatchShard shard) {
  FORGE_CHECK(shard.count >= 1 && shard.index < shard.count,
              "Generator::set_batch_shard: need index < count and count >= 1 (process index of "
              "count data-parallel processes), got index {}, count {}",
              shard.index, shard.count);
  shard_ = shard;
}

RowDraws Generator::reserve_rows(uint64_t n) {
  return {state_.seed, reserve(n * shard_.count), n * shard_.index};
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
