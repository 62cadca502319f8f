// The Philox 4x32-10 block function, written once for the host and the GPU so
// that both draw the same stream for the same (seed, offset) (core/rng.h says
// how a stream is laid out). Plain structs and integer arithmetic only.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FORGE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FORGE_HOST_DEVICE inline
#endif

namespace forge {

struct PhiloxWords {
  uint32_t w[4];
};

// One Philox 4x32 block with 10 rounds: counter c under key (k0, k1).
FORGE_HOST_DEVICE PhiloxWords philox4x32_10_words(PhiloxWords c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c.w[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c.w[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = PhiloxWords{{hi1 ^ c.w[1] ^ k0, lo1, hi0 ^ c.w[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// Block b of the stream of `seed` that starts at block `offset`: words 4b .. 4b + 3.
FORGE_HOST_DEVICE PhiloxWords philox_block(uint64_t seed, uint64_t offset, uint64_t b) {
  const uint64_t counter = offset + b;
  return philox4x32_10_words(
      PhiloxWords{{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Uniform in [0, 1) from one word: its top 24 bits (the f32 draw of every device).
FORGE_HOST_DEVICE float philox_unit_f32(uint32_t w) {
  return static_cast<float>(w >> 8) * (1.0f / 16777216.0f);
}

}  // namespace forge
