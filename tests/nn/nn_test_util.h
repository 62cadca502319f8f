// Helpers shared by the nn tests (and the optim tests, which build the same
// small models): a tiny ViT and padding masks.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "nn/models.h"

namespace forge::testing {

// The tiny ViT of the model and optimizer tests: (B, 2, 8, 8) images in 4 x 4
// patches, 3 classes, D 8, depth 2, 2 heads, mlp_ratio 2, in `dtype`.
inline nn::ViTConfig tiny_vit_config(DType dtype = DType::f32) {
  nn::ViTConfig c;
  c.image_size = 8;
  c.patch_size = 4;
  c.channels = 2;
  c.classes = 3;
  c.dim = 8;
  c.depth = 2;
  c.heads = 2;
  c.mlp_ratio = 2;
  c.dtype = dtype;
  return c;
}

// (B, N) u8 mask of ones but for the last `pad` positions of the last row.
inline Tensor padded_mask(int64_t B, int64_t N, int64_t pad) {
  std::vector<uint8_t> m(static_cast<size_t>(B * N), 1);
  for (int64_t j = N - pad; j < N; ++j) m[static_cast<size_t>((B - 1) * N + j)] = 0;
  return Tensor::from_vector(m, {B, N});
}

}  // namespace forge::testing
