// Philox 4x32-10 against the Random123 known answers, and the stream contract
// of rng.h: (seed, offset) addressing, ceil(n/4) reservation, replayable state.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/philox.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace forge {
namespace {

// Random123 kat_vectors, "philox4x32 10" lines: counter, key -> output.
TEST(RngPhilox, KnownAnswerZeros) {
  const Philox4x32 out = philox4x32_10({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(out, (Philox4x32{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
}

TEST(RngPhilox, KnownAnswerAllOnes) {
  const Philox4x32 out = philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                       {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(out, (Philox4x32{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(RngPhilox, KnownAnswerPi) {
  const Philox4x32 out = philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                                       {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(out, (Philox4x32{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// rng.h: word i of the stream at `offset` is lane i % 4 of the block with
// counter (offset + i / 4, 0, 0, 0) under key (seed_lo, seed_hi).
TEST(RngGenerator, WordAddressesPhiloxBlocks) {
  const uint64_t seed = 0x0123456789abcdefull, offset = (1ull << 32) + 5;
  for (uint64_t i : {0ull, 1ull, 3ull, 4ull, 7ull, 4001ull}) {
    const uint64_t block = offset + i / 4;
    const Philox4x32 out =
        philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0},
                      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    EXPECT_EQ(Generator::word(seed, offset, i), out[i % 4]) << "word " << i;
  }
}

TEST(RngGenerator, ReserveAdvancesByBlocksOfFour) {
  Generator g(7);
  EXPECT_EQ(g.reserve(0), 0u);
  EXPECT_EQ(g.offset(), 0u);
  EXPECT_EQ(g.reserve(1), 0u);
  EXPECT_EQ(g.offset(), 1u);
  EXPECT_EQ(g.reserve(4), 1u);
  EXPECT_EQ(g.offset(), 2u);
  EXPECT_EQ(g.reserve(5), 2u);
  EXPECT_EQ(g.offset(), 4u);
  EXPECT_EQ(g.reserve(1001), 4u);
  EXPECT_EQ(g.offset(), 4u + 251u);
  EXPECT_EQ(g.seed(), 7u);
}

TEST(RngGenerator, TensorDrawsReserveWhatTheyUse) {
  Generator g(1);
  Tensor::rand({10}, DType::f32, &g);  // 10 words -> 3 blocks
  EXPECT_EQ(g.offset(), 3u);
  Tensor::rand({3}, DType::f64, &g);  // 2 words per f64 -> 6 words -> 2 blocks
  EXPECT_EQ(g.offset(), 5u);
  Tensor::randn({3}, DType::f32, &g);  // 2 pairs x 2 f64 uniforms x 2 words -> 8 words -> 2 blocks
  EXPECT_EQ(g.offset(), 7u);
}

TEST(RngGenerator, SameSeedSameDraws) {
  Generator a(42), b(42);
  for (DType dt : {DType::f32, DType::f64}) {
    EXPECT_EQ(Tensor::rand({257}, dt, &a).to_vector<double>(),
              Tensor::rand({257}, dt, &b).to_vector<double>());
    EXPECT_EQ(Tensor::randn({3, 85}, dt, &a).to_vector<double>(),
              Tensor::randn({3, 85}, dt, &b).to_vector<double>());
  }
  EXPECT_EQ(a.state(), b.state());
}

TEST(RngGenerator, DifferentSeedsDiffer) {
  Generator a(1), b(2);
  const auto x = Tensor::rand({64}, DType::f32, &a).to_vector<float>();
  const auto y = Tensor::rand({64}, DType::f32, &b).to_vector<float>();
  int equal = 0;
  for (size_t i = 0; i < x.size(); ++i) equal += x[i] == y[i];
  EXPECT_LT(equal, 2);
}

TEST(RngGenerator, ConsecutiveDrawsDiffer) {
  Generator g(3);
  EXPECT_NE(Tensor::rand({16}, DType::f32, &g).to_vector<float>(),
            Tensor::rand({16}, DType::f32, &g).to_vector<float>());
}

TEST(RngGenerator, StateReplaysExactly) {
  Generator g(99);
  Tensor::rand({5}, DType::f32, &g);
  const GeneratorState saved = g.state();
  const auto r1 = Tensor::rand({100}, DType::f64, &g).to_vector<double>();
  const auto n1 = Tensor::randn({33}, DType::f32, &g).to_vector<float>();
  const GeneratorState after = g.state();

  g.set_state(saved);
  EXPECT_EQ(g.state(), saved);
  EXPECT_EQ(Tensor::rand({100}, DType::f64, &g).to_vector<double>(), r1);
  EXPECT_EQ(Tensor::randn({33}, DType::f32, &g).to_vector<float>(), n1);
  EXPECT_EQ(g.state(), after);

  // A fresh generator put into the saved state continues the same stream.
  Generator other(0);
  other.set_state(saved);
  EXPECT_EQ(Tensor::rand({100}, DType::f64, &other).to_vector<double>(), r1);
}

TEST(RngGenerator, ManualSeedRestartsTheDefaultStream) {
  manual_seed(1234);
  const auto x = Tensor::rand({20}).to_vector<float>();
  manual_seed(1234);
  EXPECT_EQ(default_generator().offset(), 0u);
  EXPECT_EQ(Tensor::rand({20}).to_vector<float>(), x);
}

TEST(RngDistribution, UniformMoments) {
  Generator g(5);
  for (DType dt : {DType::f32, DType::f64}) {
    const auto x = Tensor::rand({100000}, dt, &g).to_vector<double>();
    double sum = 0, sq = 0, lo = 1, hi = 0;
    for (double v : x) {
      sum += v;
      sq += v * v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    const double mean = sum / static_cast<double>(x.size());
    const double var = sq / static_cast<double>(x.size()) - mean * mean;
    // Standard error of the mean is 0.289 / sqrt(1e5) ~ 0.0009.
    EXPECT_NEAR(mean, 0.5, 0.005) << dtype_name(dt);
    EXPECT_NEAR(var, 1.0 / 12.0, 0.002) << dtype_name(dt);
    EXPECT_GE(lo, 0.0);
    EXPECT_LT(hi, 1.0);
    EXPECT_LT(lo, 1e-3);
    EXPECT_GT(hi, 1 - 1e-3);
  }
}

TEST(RngDistribution, NormalMoments) {
  Generator g(6);
  for (DType dt : {DType::f32, DType::f64}) {
    const auto x =
        Tensor::randn({100001}, dt, &g).to_vector<double>();  // odd: the last pair is half used
    double sum = 0, sq = 0;
    int beyond3 = 0;
    for (double v : x) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sq += v * v;
      beyond3 += std::abs(v) > 3;
    }
    const double n = static_cast<double>(x.size());
    const double mean = sum / n, std = std::sqrt(sq / n - mean * mean);
    // Standard error of the mean ~0.0032, of the std ~0.0022.
    EXPECT_NEAR(mean, 0.0, 0.02) << dtype_name(dt);
    EXPECT_NEAR(std, 1.0, 0.02) << dtype_name(dt);
    // P(|z| > 3) = 0.0027: about 270 of 1e5.
    EXPECT_GT(beyond3, 150);
    EXPECT_LT(beyond3, 400);
  }
}

// Seed 0, block 11031643, lane 3 is the word 0xffffffcc (found by search). A
// conversion that kept all 32 bits in a float (w * 2^-32) would round it to
// exactly 1.0f; the 24-bit conversion gives the largest float below 1.
TEST(RngDistribution, F32UniformNeverReachesOne) {
  const uint64_t block = 11031643;
  ASSERT_EQ(Generator::word(0, block, 3), 0xffffffccu);
  const float u = Generator::uniform_f32(0, block, 3);
  EXPECT_LT(u, 1.0f);
  EXPECT_EQ(u, 16777215.0f / 16777216.0f);
  // The same word reached through the stream position, as rand() addresses it.
  EXPECT_EQ(Generator::uniform_f32(0, 0, block * 4 + 3), u);
  EXPECT_LT(Generator::uniform_f64(0, block, 1), 1.0);  // uses words 2 and 3 of the block
}

TEST(RngDistribution, RandRejectsIntegerDtypes) {
  Generator g(0);
  EXPECT_THROW(Tensor::rand({3}, DType::i32, &g), Error);
  EXPECT_THROW(Tensor::randn({3}, DType::i64, &g), Error);
}

TEST(Philox, TheSharedBlockFunctionIsTheGenerators) {
  // core/philox.h is what the GPU kernels run; it must be the CPU stream.
  for (uint64_t b = 0; b < 8; ++b) {
    const Philox4x32 w = Generator::block(42, 7, b);
    const PhiloxWords p = philox_block(42, 7, b);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(w[static_cast<size_t>(i)], p.w[i]);
    EXPECT_EQ(philox_unit_f32(p.w[1]), Generator::uniform_f32(42, 7, 4 * b + 1));
  }
}

}  // namespace
}  // namespace forge
