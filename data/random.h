// Rng: a sequential stream of random numbers for the data pipeline
// (shuffling, augmentation, dataset generators). It reads the Philox words of
// (seed, offset 0) one after another, so a stream is fully described by its
// seed and a counter, and streams for different (run seed, epoch, index) are
// made independent by mixing those integers into the seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/rng.h"

namespace forge::data {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : seed_(seed) {}

  // A seed from several integers (splitmix64 over each in turn), e.g.
  // Rng(Rng::mix({run_seed, epoch, index})).
  static uint64_t mix(std::initializer_list<uint64_t> parts);

  // Word counter_ of the stream; a Philox block gives four words, so the
  // block of the last word read is kept for the next three.
  uint32_t next_u32() {
    const uint64_t b = counter_ / 4;
    if (b != block_index_) {
      block_ = Generator::block(seed_, 0, b);
      block_index_ = b;
    }
    return block_[counter_++ % 4];
  }
  uint64_t next_u64();
  double uniform();  // [0, 1), 53 random bits
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int64_t randint(int64_t n);               // uniform in [0, n), unbiased; n > 0
  int64_t randint(int64_t lo, int64_t hi);  // uniform in [lo, hi]
  bool bernoulli(double p) { return uniform() < p; }
  double normal();                  // standard normal (Box-Muller, one value per call)
  // n normals, as n calls of normal() rounded to float (the same words; log
  // and cos from core/vmath.h, within a few ULP of libm's in f64, so a value
  // may differ from normal()'s in its last float bit), in batches.
  void normals(float* out, int64_t n);
  double gamma(double shape);       // Gamma(shape, 1), Marsaglia-Tsang; shape > 0
  double beta(double a, double b);  // Beta(a, b) from two gammas

  template <typename T>
  void shuffle(std::vector<T>& v) {  // Fisher-Yates
    for (int64_t i = static_cast<int64_t>(v.size()) - 1; i > 0; --i)
      std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(randint(i + 1))]);
  }

  uint64_t seed() const { return seed_; }
  uint64_t counter() const { return counter_; }
  void set_counter(uint64_t c) { counter_ = c; }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
  uint64_t block_index_ = UINT64_MAX;  // the block held in block_ (none yet)
  Philox4x32 block_{};
};

}  // namespace forge::data
