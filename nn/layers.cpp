// The basic layers: parameters, their PyTorch-matching initialisation, and
// forwards that are compositions of ops (autograd comes from the ops).
#include "nn/layers.h"

#include <algorithm>
#include <cmath>

#include "nn/init.h"
#include "ops/ops.h"

namespace forge::nn {

Linear::Linear(int64_t in, int64_t out, bool has_bias, DType dtype, Generator* gen)
    : in_features(in), out_features(out) {
  FORGE_CHECK(in > 0 && out > 0, "Linear: expected positive sizes, got in {} out {}", in, out);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight = Tensor::empty({out, in}, dtype);
  init::uniform_(weight, -bound, bound, gen);
  register_parameter("weight", weight);
  if (has_bias) {
    bias = Tensor::empty({out}, dtype);
    init::uniform_(bias, -bound, bound, gen);
    register_parameter("bias", bias);
  }
}

Tensor Linear::forward(const Tensor& x) {
  FORGE_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "Linear: expected input (..., {}), got {}",
              in_features, shape_str(x.shape()));
  return ops::linear(x, weight, bias);
}

Embedding::Embedding(int64_t num, int64_t dim, int64_t padding, DType dtype, Generator* gen)
    : num_embeddings(num), embedding_dim(dim), padding_idx(padding) {
  FORGE_CHECK(num > 0 && dim > 0, "Embedding: expected positive sizes, got {} x {}", num, dim);
  FORGE_CHECK(padding >= -1 && padding < num, "Embedding: padding_idx {} outside [-1, {})", padding,
              num);
  weight = Tensor::empty({num, dim}, dtype);
  init::normal_(weight, 0.0, 1.0, gen);
  if (padding >= 0) {
    Tensor row = weight.slice0(padding, padding + 1);
    init::zeros_(row);
  }
  register_parameter("weight", weight);
}

Tensor Embedding::forward(const Tensor& ids) {
  return ops::embedding(weight, ids, padding_idx);
}

LayerNorm::LayerNorm(Shape shape, double epsilon, bool elementwise_affine, DType dtype)
    : normalized_shape(std::move(shape)), eps(epsilon) {
  FORGE_CHECK(!normalized_shape.empty(), "LayerNorm: normalized_shape must name at least one dim");
  if (elementwise_affine) {
    weight = Tensor::ones(normalized_shape, dtype);
    bias = Tensor::zeros(normalized_shape, dtype);
    register_parameter("weight", weight);
    register_parameter("bias", bias);
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  const auto nd = static_cast<int64_t>(normalized_shape.size());
  FORGE_CHECK(x.dim() >= nd && Shape(x.shape().end() - nd, x.shape().end()) == normalized_shape,
              "LayerNorm: expected input (..., {}), got {}", fmt::join(normalized_shape, ", "),
              shape_str(x.shape()));
  return ops::layer_norm(x, nd, weight, bias, eps);
}

Dropout::Dropout(double rate) : p(rate) {
  FORGE_CHECK(p >= 0.0 && p < 1.0, "Dropout: expected p in [0, 1), got {}", p);
}

Tensor Dropout::forward(const Tensor& x) {
  return ops::dropout(x, p, is_training(), generator());
}

FeedForward::FeedForward(const FeedForwardOptions& o, Generator* gen) : options(o) {
  FORGE_CHECK(o.dim > 0 && o.mult > 0 && o.chunks > 0 && o.hidden >= 0,
              "FeedForward: expected dim, mult and chunks > 0 and hidden >= 0, got dim {} mult {} "
              "chunks {} hidden {}",
              o.dim, o.mult, o.chunks, o.hidden);
  const int64_t hidden = o.hidden_width();
  w1 = register_module(
      "w1", std::make_shared<Linear>(o.dim, o.glu ? 2 * hidden : hidden, true, o.dtype, gen));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout));
  w2 = register_module("w2", std::make_shared<Linear>(hidden, o.dim, true, o.dtype, gen));
}

Tensor FeedForward::forward_rows(const Tensor& rows) {
  const auto act = [&](const Tensor& t) {
    return options.activation == Activation::gelu ? ops::gelu(t) : ops::relu(t);
  };
  Tensor h = w1->forward(rows);  // (R, hidden) or (R, 2 * hidden) with GLU
  if (options.glu) {
    const int64_t hidden = options.hidden_width();
    h = act(ops::narrow(h, -1, 0, hidden)) * ops::narrow(h, -1, hidden, hidden);
  } else {
    h = act(h);
  }
  return w2->forward(dropout->forward(h));
}

Tensor FeedForward::forward(const Tensor& x) {
  FORGE_CHECK(x.dim() >= 1 && x.size(-1) == options.dim,
              "FeedForward: expected input (..., {}), got {}", options.dim, shape_str(x.shape()));
  Shape out_shape = x.shape();
  Tensor rows = ops::reshape(x, {-1, options.dim});  // (R, D), R = B * N
  const int64_t R = rows.size(0);
  if (options.chunks == 1 || R <= 4) return ops::reshape(forward_rows(rows), out_shape);
  // Pieces of a multiple of 4 rows keep the dropout stream aligned (see the header).
  const int64_t per = (R + options.chunks - 1) / options.chunks;
  const int64_t step = (per + 3) / 4 * 4;
  std::vector<Tensor> pieces;
  for (int64_t start = 0; start < R; start += step)
    pieces.push_back(forward_rows(ops::narrow(rows, 0, start, std::min(step, R - start))));
  return ops::reshape(ops::cat(pieces, 0), out_shape);
}

}  // namespace forge::nn
