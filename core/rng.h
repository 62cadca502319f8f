// Philox 4x32-10 counter-based generator (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC'11). A stream is keyed by (seed, offset):
// draw number i of a request made at `offset` is lane i % 4 of the block with
// counter (offset + i / 4, 0, 0, 0) under key (seed_lo, seed_hi). A request of
// n values advances the offset by ceil(n / 4), so every op can compute any
// element independently (on any device) and the whole state is two integers.
#pragma once

#include <array>
#include <cstdint>

namespace forge {

using Philox4x32 = std::array<uint32_t, 4>;

// One Philox 4x32 block with 10 rounds.
Philox4x32 philox4x32_10(Philox4x32 counter, std::array<uint32_t, 2> key);

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  bool operator==(const GeneratorState&) const = default;
};

// Which rows of the global batch this process holds under data parallelism:
// `count` processes each hold rows [index b, (index + 1) b) of a global batch of
// count b rows. A property of the process, set once, not of the stream: it is
// no part of GeneratorState and never saved in a checkpoint.
struct BatchShard {
  uint64_t index = 0, count = 1;
  bool operator==(const BatchShard&) const = default;
};

// The draws of one batch-shaped request (reserve_rows): element i of the local
// tensor uses uniform(seed, offset, first + i).
struct RowDraws {
  uint64_t seed = 0, offset = 0, first = 0;
  bool operator==(const RowDraws&) const = default;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : state_{seed, 0} {}

  // Reserves blocks for `n` values and returns the offset the request starts at.
  uint64_t reserve(uint64_t n);
  uint64_t seed() const { return state_.seed; }
  uint64_t offset() const { return state_.offset; }
  void manual_seed(uint64_t seed) { state_ = {seed, 0}; }

  GeneratorState state() const { return state_; }
  void set_state(GeneratorState s) { state_ = s; }

  // index < count; the default {0, 1} is a single process.
  void set_batch_shard(BatchShard shard);
  BatchShard batch_shard() const { return shard_; }

  // Reserves the draws of a request of `n` values over a tensor whose leading
  // dimension is the local batch (x [b, ...], n = b * rest), as the single
  // process that holds the whole global batch [count b, ...] would: n * count
  // draws, of which this shard's rows are draws [n index, n (index + 1)). So the
  // masks of all shards together are the global one, bit for bit, and every
  // shard's generator advances as the global one's does (later requests, e.g.
  // a Performer redraw, stay identical on every rank). With the default shard
  // it is reserve(n) with first = 0. Requests that are not batch-shaped (random
  // weights, projection matrices) use reserve(): every rank draws all of them.
  RowDraws reserve_rows(uint64_t n);

  // The i-th 32-bit word of the stream that starts at block `offset`.
  static uint32_t word(uint64_t seed, uint64_t offset, uint64_t i);
  // Uniform in [0, 1): 24 random bits for float, 53 (two words) for double.
  static float uniform_f32(uint64_t seed, uint64_t offset, uint64_t i);
  static double uniform_f64(uint64_t seed, uint64_t offset, uint64_t i);
  // Calls fn(c, u) for c in [0, n) with u = uniform_f32(seed, offset, first + c),
  // computing each Philox block once for its four draws (the fast path of
  // dropout masks and rand).
  template <typename F>
  static void for_each_uniform_f32(uint64_t seed, uint64_t offset, uint64_t first, uint64_t n,
                                   F&& fn);
  // Words 4b .. 4b + 3 of the stream at `offset` (one Philox block).
  static Philox4x32 block(uint64_t seed, uint64_t offset, uint64_t b);
  // The f64 uniform made of two consecutive words (hi, lo), as uniform_f64.
  static double words_to_unit_f64(uint32_t hi, uint32_t lo) {
    const uint64_t bits = (static_cast<uint64_t>(hi >> 5) << 26) | (lo >> 6);  // 27 + 26 bits
    return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
  }
  static float word_to_unit_f32(uint32_t w) {
    return static_cast<float>(w >> 8) * (1.0f / 16777216.0f);
  }

 private:
  GeneratorState state_;
  BatchShard shard_;
};

template <typename F>
void Generator::for_each_uniform_f32(uint64_t seed, uint64_t offset, uint64_t first, uint64_t n,
                                     F&& fn) {
  const std::array<uint32_t, 2> key = {static_cast<uint32_t>(seed),
                                       static_cast<uint32_t>(seed >> 32)};
  uint64_t i = first;
  const uint64_t end = first + n;
  while (i < end) {
    const uint64_t block = offset + i / 4;
    const Philox4x32 w = philox4x32_10(
        {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u}, key);
    for (uint64_t lane = i % 4; lane < 4 && i < end; ++lane, ++i)
      fn(i - first, word_to_unit_f32(w[lane]));
  }
}

// The process-wide generator used when an op is given none.
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace forge
