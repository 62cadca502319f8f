// Position and patch embeddings: tables built once in the constructors,
// forwards that slice them (or sum, for the axial one) with ops.
#include "nn/embeddings.h"

#include <cmath>

#include "nn/init.h"
#include "ops/ops.h"

namespace forge::nn {
namespace {

void check_positions(const char* who, int64_t n, int64_t offset, int64_t max_len) {
  FORGE_CHECK(n >= 0 && offset >= 0 && offset + n <= max_len,
              "{}: expected n >= 0, offset >= 0 and offset + n <= max_len {}, got offset {} + n {} "
              "= {}; build the module with a larger max_len",
              who, max_len, offset, n, offset + n);
}

// (max_len, dim): row t = cat(sin(t f), cos(t f)), f_i = 1 / 10000^(2i/dim).
Tensor sinusoid_table(const char* who, int64_t max_len, int64_t dim, DType dtype) {
  FORGE_CHECK(max_len > 0 && dim > 0 && dim % 2 == 0,
              "{}: expected max_len > 0 and an even dim > 0, got max_len {} and dim {}", who,
              max_len, dim);
  Tensor table = Tensor::empty({max_len, dim}, DType::f64);
  double* p = table.data<double>();
  const int64_t half = dim / 2;
  for (int64_t t = 0; t < max_len; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = 1.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) / dim);
      const double angle = static_cast<double>(t) * inv_freq;
      p[t * dim + i] = std::sin(angle);
      p[t * dim + half + i] = std::cos(angle);
    }
  }
  return table.to(dtype);
}

// x (..., d): each pair (x0, x1) -> (-x1, x0).
Tensor rotate_every_two(const Tensor& x) {
  Shape pairs = x.shape();
  pairs.back() /= 2;
  pairs.push_back(2);
  const Tensor p = ops::reshape(x, pairs);  // (..., d/2, 2)
  return ops::reshape(ops::cat({-ops::narrow(p, -1, 1, 1), ops::narrow(p, -1, 0, 1)}, -1),
                      x.shape());
}

}  // namespace

AbsolutePositionalEmbedding::AbsolutePositionalEmbedding(int64_t len, int64_t d, double init_std,
                                                         DType dtype, Generator* gen)
    : max_len(len), dim(d) {
  emb = register_module("emb", std::make_shared<Embedding>(len, d, -1, dtype, gen));
  init::normal_(emb->weight, 0.0, init_std, gen);
}

Tensor AbsolutePositionalEmbedding::forward(int64_t n, int64_t offset) {
  check_positions("AbsolutePositionalEmbedding", n, offset, max_len);
  return ops::narrow(emb->weight, 0, offset, n);
}

FixedPositionalEmbedding::FixedPositionalEmbedding(int64_t len, int64_t d, DType dtype)
    : max_len(len), dim(d), emb(sinusoid_table("FixedPositionalEmbedding", len, d, dtype)) {
  register_buffer("emb", emb);
}

Tensor FixedPositionalEmbedding::forward(int64_t n, int64_t offset) {
  check_positions("FixedPositionalEmbedding", n, offset, max_len);
  return ops::narrow(emb, 0, offset, n);
}

RotaryEmbedding::RotaryEmbedding(int64_t len, int64_t d, DType dtype)
    : max_len(len), head_dim(d), emb(sinusoid_table("RotaryEmbedding", len, d, dtype)) {
  register_buffer("emb", emb);
}

Tensor RotaryEmbedding::rotate(const Tensor& x, int64_t offset) {
  FORGE_CHECK(x.dim() >= 2 && x.size(-1) == head_dim,
              "RotaryEmbedding: expected x (..., n, {}), got {}", head_dim, shape_str(x.shape()));
  const int64_t n = x.size(-2), half = head_dim / 2;
  check_positions("RotaryEmbedding", n, offset, max_len);
  const Tensor table = ops::narrow(emb, 0, offset, n);  // (n, d) = (sin | cos)
  // (n, d/2) -> (n, d) with each column twice: s0 s0 s1 s1 ...
  const auto twice = [&](const Tensor& t) {
    return ops::reshape(ops::expand(ops::reshape(t, {n, half, 1}), {n, half, 2}), {n, head_dim});
  };
  const Tensor sin = twice(ops::narrow(table, 1, 0, half));
  const Tensor cos = twice(ops::narrow(table, 1, half, half));
  return x * cos + rotate_every_two(x) * sin;
}

Tensor rotate_half_split(const Tensor& x, int64_t offset) {
  FORGE_CHECK(x.dim() >= 2 && x.size(-1) % 2 == 0 && offset >= 0,
              "rotate_half_split: expected x (..., n, d) with an even d and offset >= 0, got {} "
              "and offset {}",
              shape_str(x.shape()), offset);
  const int64_t n = x.size(-2), d = x.size(-1), half = d / 2;
  const Tensor table =  // (n, d) = (sin | cos) of the angles t f_i
      ops::narrow(sinusoid_table("rotate_half_split", offset + n, d, x.dtype()), 0, offset, n)
          .to(x.device());
  const Tensor sin = ops::narrow(table, 1, 0, half), cos = ops::narrow(table, 1, half, half);
  const Tensor x1 = ops::narrow(x, -1, 0, half), x2 = ops::narrow(x, -1, half, half);
  return ops::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
}

AxialPositionalEmbedding::Weights::Weights(std::vector<Tensor> params) : values(std::move(params)) {
  for (size_t i = 0; i < values.size(); ++i) register_parameter(std::to_string(i), values[i]);
}

AxialPositionalEmbedding::AxialPositionalEmbedding(int64_t d, std::vector<int64_t> shape,
                                                   DType dtype, Generator* gen)
    : dim(d), axial_shape(std::move(shape)) {
  bool positive = dim > 0 && !axial_shape.empty();
  for (int64_t s : axial_shape) positive = positive && s > 0;
  FORGE_CHECK(positive,
              "AxialPositionalEmbedding: expected dim > 0 and a non-empty axial_shape of positive "
              "sizes, got dim {} and axial_shape [{}]",
              dim, fmt::join(axial_shape, ", "));
  std::vector<Tensor> params;
  for (size_t i = 0; i < axial_shape.size(); ++i) {
    Shape s(axial_shape.size() + 2, 1);  // (1, 1.., axial_shape[i], 1.., dim)
    s[i + 1] = axial_shape[i];
    s.back() = dim;
    params.push_back(Tensor::empty(s, dtype));
    init::normal_(params.back(), 0.0, 1.0, gen);
  }
  weights = register_module("weights", std::make_shared<Weights>(std::move(params)));
}

Tensor AxialPositionalEmbedding::forward(int64_t n, int64_t offset) {
  check_positions("AxialPositionalEmbedding", n, offset, shape_numel(axial_shape));
  Tensor sum = weights->values[0];
  for (size_t i = 1; i < weights->values.size(); ++i) sum = sum + weights->values[i];
  // sum is (1, axial_shape..., dim); its rows in row-major order are the positions.
  return ops::narrow(ops::reshape(sum, {-1, dim}), 0, offset, n);
}

PatchEmbed::Proj::Proj(int64_t in_chans, int64_t dim, int64_t p, DType dtype, Generator* gen) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_chans * p * p));
  weight = Tensor::empty({dim, in_chans, p, p}, dtype);
  bias = Tensor::empty({dim}, dtype);
  init::uniform_(weight, -bound, bound, gen);
  init::uniform_(bias, -bound, bound, gen);
  register_parameter("weight", weight);
  register_parameter("bias", bias);
}

PatchEmbed::PatchEmbed(int64_t img, int64_t patch, int64_t chans, int64_t d, DType dtype,
                       Generator* gen)
    : img_size(img), patch_size(patch), in_chans(chans), dim(d) {
  FORGE_CHECK(img > 0 && patch > 0 && chans > 0 && d > 0 && img % patch == 0,
              "PatchEmbed: expected positive sizes with img_size divisible by patch_size, got "
              "img_size {} patch_size {} in_chans {} dim {}",
              img, patch, chans, d);
  proj = register_module("proj", std::make_shared<Proj>(chans, d, patch, dtype, gen));
}

int64_t PatchEmbed::num_patches() const {
  return (img_size / patch_size) * (img_size / patch_size);
}

Tensor PatchEmbed::forward(const Tensor& images) {
  FORGE_CHECK(images.dim() == 4 && images.size(1) == in_chans,
              "PatchEmbed: expected images (B, {}, H, W), got {}", in_chans,
              shape_str(images.shape()));
  const int64_t H = images.size(2), W = images.size(3), p = patch_size;
  FORGE_CHECK(H % p == 0 && W % p == 0,
              "PatchEmbed: expected H and W divisible by the patch size {}, got H {} W {}; resize "
              "or pad the images",
              p, H, W);
  // The Conv2d(kernel = stride = p): a linear map per patch on the CPU, a
  // cuDNN convolution on the GPU (ops/linalg/conv.h).
  return ops::patch_embed(images, proj->weight, proj->bias, p);
}

Tensor prepend_token(const Tensor& token, const Tensor& x) {
  FORGE_CHECK(x.dim() == 3, "prepend_token: expected x (B, N, D), got {}", shape_str(x.shape()));
  FORGE_CHECK(token.shape() == (Shape{1, 1, x.size(2)}),
              "prepend_token: expected token (1, 1, {}) to match x {}, got {}", x.size(2),
              shape_str(x.shape()), shape_str(token.shape()));
  return ops::cat({ops::expand(token, {x.size(0), 1, x.size(2)}), x}, 1);
}

}  // namespace forge::nn
