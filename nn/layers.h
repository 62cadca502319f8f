// The basic layers. Each owns its parameters as public Tensor members (as
// PyTorch's `linear.weight`), registered under the reference libraries' names,
// and has `Tensor forward(const Tensor&)`. Parameters are created in `dtype`
// (f32 by default; f64 for gradient checks) from the module's constructor
// generator argument (the default generator when null).
#pragma once

#include <memory>

#include "nn/module.h"

namespace forge::nn {

// y = x W^T + b; x (..., in) -> (..., out). weight (out, in), bias (out).
// Initialised as torch.nn.Linear: weight by kaiming_uniform_(a = sqrt(5)),
// which is U(-1/sqrt(in), 1/sqrt(in)), and bias U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::f32,
         Generator* gen = nullptr);
  Tensor forward(const Tensor& x);

  int64_t in_features, out_features;
  Tensor weight;
  Tensor bias;  // undefined without bias
};

// ids (any shape, i32/i64) -> (ids..., dim). weight (num, dim) ~ N(0, 1) as
// torch.nn.Embedding; the padding_idx row (-1: none) starts at zero and gets
// no gradient.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx = -1,
            DType dtype = DType::f32, Generator* gen = nullptr);
  Tensor forward(const Tensor& ids);

  int64_t num_embeddings, embedding_dim, padding_idx;
  Tensor weight;
};

// Normalises over the trailing dims `normalized_shape`; weight = 1 and bias = 0
// of that shape when elementwise_affine.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     DType dtype = DType::f32);
  Tensor forward(const Tensor& x);

  Shape normalized_shape;
  double eps;
  Tensor weight, bias;  // undefined without elementwise_affine
};

// Zeroes elements with probability p in training mode (scaling the rest by
// 1/(1-p)), the identity in eval mode; draws from the module's generator.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x);

  double p;
};

enum class Activation { gelu, relu };

struct FeedForwardOptions {
  int64_t dim = 0;     // D, the input and output width
  int64_t mult = 4;    // hidden width = mult * D ...
  int64_t hidden = 0;  // ... unless set here (linformer-pytorch's dim_ff)
  int64_t hidden_width() const { return hidden > 0 ? hidden : dim * mult; }
  Activation activation = Activation::gelu;
  // GLU variant: w1 projects to 2 * hidden, split into halves (x, v) along the
  // last dim and combined as act(x) * v (GEGLU / ReGLU), as performer-pytorch
  // and linear-attention-transformer do.
  bool glu = false;
  double dropout = 0.0;  // after the activation
  // > 1: run over the rows in this many pieces so that only one piece's hidden
  // activations (rows/chunks x hidden) exist at a time.
  int64_t chunks = 1;
  DType dtype = DType::f32;
};

// Position-wise MLP: x (..., D) -> w2(dropout(act(w1 x))) (..., D), as in the
// reference transformers (lucidrains' FeedForward with names w1, w2).
//
// Chunking splits the flattened rows (B*N) rather than the sequence dim alone:
// the layer is position-wise, so the result is the same, and each piece is a
// contiguous run of the hidden activations. Piece boundaries are rounded to a
// multiple of 4 rows, so each piece's dropout request starts at the Philox
// block where the unchunked request would be: masks, outputs and gradients
// equal the unchunked ones exactly, in training too.
class FeedForward : public Module {
 public:
  explicit FeedForward(const FeedForwardOptions& options, Generator* gen = nullptr);
  Tensor forward(const Tensor& x);

  FeedForwardOptions options;
  std::shared_ptr<Linear> w1, w2;
  std::shared_ptr<Dropout> dropout;

 private:
  Tensor forward_rows(const Tensor& rows);  // (R, D) -> (R, D)
};

}  // namespace forge::nn
