// Shared argument checks and shape bookkeeping of the attention ops (internal).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace forge::ops::attention {

struct Dims4 {
  int64_t B = 0, H = 0, N = 0, M = 0, d = 0, dv = 0;
};

// Checks q [B,H,N,d], k [B,H,M,d], v [B,H,M,dv], the optional mask [B,M]
// (bool/u8), one floating dtype (f32/f64; also bf16/f16 on a GPU) and one
// device -- the CPU unless `cuda_ok` -- and N == M when `self_only`; every
// error names the op, the argument, expected and found.
Dims4 check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& key_padding_mask, bool self_only, bool cuda_ok = false);

// The mask's bytes (1 = real token), or null when there is no mask.
const uint8_t* mask_bytes(const Tensor& key_padding_mask);

// Inputs of the registries' gradcheck cases (registry.h): a f64 tensor uniform
// in [lo, hi) from its own generator, requiring grad; and a [B, M] bool key
// padding mask with the last pad[b] keys of batch b masked (B = pad.size()).
Tensor gradcheck_leaf(const Shape& shape, uint64_t seed, double lo = -1, double hi = 1);
Tensor gradcheck_padding_mask(int64_t M, const std::vector<int64_t>& pad);

}  // namespace forge::ops::attention
