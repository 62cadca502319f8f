// Position and patch embeddings of the reference transformers, under their
// parameter names: performer-pytorch (absolute, fixed sinusoidal, rotary), the
// axial_positional_embedding package (linear-attention-transformer) and timm
// (PatchEmbed, the CLS token). Positional forwards take a length n and an
// offset (the first position, for incremental decoding) and return (n, dim)
// rows that broadcast over the batch.
#pragma once

#include <memory>
#include <vector>

#include "nn/layers.h"
#include "nn/module.h"

namespace forge::nn {

// Learned positions: weight (max_len, dim) ~ N(0, init_std^2), as the child
// Embedding "emb" (parameter "emb.weight").
class AbsolutePositionalEmbedding : public Module {
 public:
  AbsolutePositionalEmbedding(int64_t max_len, int64_t dim, double init_std = 0.02,
                              DType dtype = DType::f32, Generator* gen = nullptr);
  Tensor forward(int64_t n, int64_t offset = 0);  // (n, dim)

  int64_t max_len, dim;
  std::shared_ptr<Embedding> emb;
};

// Sinusoids, buffer "emb" (max_len, dim): row t = cat(sin(t f), cos(t f)) with
// f_i = 10000^(-2i/dim), i < dim/2; dim must be even.
class FixedPositionalEmbedding : public Module {
 public:
  FixedPositionalEmbedding(int64_t max_len, int64_t dim, DType dtype = DType::f32);
  Tensor forward(int64_t n, int64_t offset = 0);  // (n, dim), no gradient

  int64_t max_len, dim;
  Tensor emb;
};

// Rotary position embedding with interleaved pairs (performer-pytorch): pair
// (x_2i, x_2i+1) at position t turns by the angle t f_i. The module keeps the
// FixedPositionalEmbedding table of width d as buffer "emb", as performer's
// layer_pos_emb does, so its state dict matches; sin and cos are taken from it
// on each call.
class RotaryEmbedding : public Module {
 public:
  RotaryEmbedding(int64_t max_len, int64_t head_dim, DType dtype = DType::f32);
  // x (..., n, d) at positions offset..offset+n-1 -> x cos + rotate_every_two(x) sin,
  // (..., n, d); differentiable in x.
  Tensor rotate(const Tensor& x, int64_t offset = 0);

  int64_t max_len, head_dim;
  Tensor emb;
};

// Rotary positions with split halves (lucidrains' local-attention:
// SinusoidalEmbeddings and apply_rotary_pos_emb with rotate_half): the pair
// (x_i, x_{i + d/2}) at position t turns by the angle t f_i, f_i =
// 10000^(-2i/d). x (..., n, d) at positions offset..offset+n-1 -> (..., n, d);
// d even; differentiable in x.
Tensor rotate_half_split(const Tensor& x, int64_t offset = 0);

// Summed axial positions (axial_positional_embedding): one N(0, 1) parameter
// per axis, "weights.i" of shape (1, 1.., axial_shape[i], 1.., dim) with the
// axis at position 1 + i; position p is the sum of the rows of p's row-major
// coordinates, over prod(axial_shape) positions.
class AxialPositionalEmbedding : public Module {
 public:
  AxialPositionalEmbedding(int64_t dim, std::vector<int64_t> axial_shape, DType dtype = DType::f32,
                           Generator* gen = nullptr);
  Tensor forward(int64_t n, int64_t offset = 0);  // (n, dim)

  // The per-axis parameters under "0", "1", ... (torch.nn.ParameterList). The
  // module holds pointers into `values`: rebind elements, never resize.
  struct Weights : Module {
    explicit Weights(std::vector<Tensor> params);
    std::vector<Tensor> values;
  };

  int64_t dim;
  std::vector<int64_t> axial_shape;
  std::shared_ptr<Weights> weights;
};

// timm's PatchEmbed: a Conv2d with kernel = stride = patch_size, child "proj"
// with weight (dim, in_chans, p, p) and bias (dim), both U(-1/sqrt(fan_in),
// 1/sqrt(fan_in)) with fan_in = in_chans p p as torch's Conv2d. Images of any
// H, W divisible by p are accepted; num_patches() is for img_size x img_size.
class PatchEmbed : public Module {
 public:
  PatchEmbed(int64_t img_size, int64_t patch_size, int64_t in_chans, int64_t dim,
             DType dtype = DType::f32, Generator* gen = nullptr);
  // images (B, C, H, W) -> (B, (H/p)(W/p), dim), patches in row-major order.
  Tensor forward(const Tensor& images);
  int64_t num_patches() const;

  struct Proj : Module {
    Proj(int64_t in_chans, int64_t dim, int64_t patch_size, DType dtype, Generator* gen);
    Tensor weight, bias;
  };

  int64_t img_size, patch_size, in_chans, dim;
  std::shared_ptr<Proj> proj;
};

// token (1, 1, D), x (B, N, D) -> (B, N + 1, D) with the token first (a CLS token).
Tensor prepend_token(const Tensor& token, const Tensor& x);

}  // namespace forge::nn
