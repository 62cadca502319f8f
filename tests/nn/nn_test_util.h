// Helpers shared by the nn tests (and the optim and CUDA tests, which build
// the same small models): a tiny ViT, the CUDA tests' ViT and padding masks.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "nn/models.h"

namespace forge::testing {

// The tiny ViT of the model and optimizer tests: (B, 2, 8, 8) images in 4 x 4
// patches, 3 classes, D 8, depth 2, 2 heads, mlp_ratio 2, in `dtype`.
inline nn::ViTConfig tiny_vit_config(DType dtype = DType::f32) {
  return nn::ViTConfig{.image_size = 8,
                       .patch_size = 4,
                       .channels = 2,
                       .classes = 3,
                       .dim = 8,
                       .depth = 2,
                       .heads = 2,
                       .mlp_ratio = 2,
                       .dtype = dtype};
}

// The ViT of the CUDA tests: (B, 1, 28, 28) images in 7 x 7 patches (16
// patches + CLS = 17 tokens), 10 classes, D 32, depth 2, 2 heads of d = 16,
// mlp_ratio 2.
inline nn::ViTConfig mnist_vit_config() {
  return nn::ViTConfig{.image_size = 28, .patch_size = 7, .channels = 1, .classes = 10, .dim = 32,
                       .depth = 2, .heads = 2, .mlp_ratio = 2};
}

// (B, N) u8 mask of ones but for the last `pad` positions of the last row.
inline Tensor padded_mask(int64_t B, int64_t N, int64_t pad) {
  std::vector<uint8_t> m(static_cast<size_t>(B * N), 1);
  for (int64_t j = N - pad; j < N; ++j) m[static_cast<size_t>((B - 1) * N + j)] = 0;
  return Tensor::from_vector(m, {B, N});
}

}  // namespace forge::testing
