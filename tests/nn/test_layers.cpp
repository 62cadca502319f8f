// Initialisers and the basic layers: shapes, values against primitive ops,
// gradients (f64 gradcheck), dropout modes and chunked feed-forward.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/engine.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace forge::nn {
namespace {

using namespace forge::testing;

struct Moments {
  double mean = 0, std = 0, min = 1e300, max = -1e300;
};

Moments moments(const Tensor& t) {
  const auto v = t.to_vector<double>();
  Moments m;
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.std += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(m.std / static_cast<double>(v.size()));
  return m;
}

TEST(NnInit, XavierNormalAndUniform) {
  Generator g(5);
  Tensor w = Tensor::empty({300, 500});
  init::xavier_normal_(w, 2.0, &g);
  Moments m = moments(w);
  const double std = 2.0 * std::sqrt(2.0 / 800.0);
  EXPECT_NEAR(m.mean, 0.0, 0.01 * std);
  EXPECT_NEAR(m.std, std, 0.01 * std);
  init::xavier_uniform_(w, 1.0, &g);
  m = moments(w);
  const double bound = std::sqrt(6.0 / 800.0);
  EXPECT_GE(m.min, -bound);
  EXPECT_LE(m.max, bound);
  EXPECT_NEAR(m.std, bound / std::sqrt(3.0), 0.01 * bound);
  EXPECT_EQ(init::fans({4, 3, 2, 5}), (std::pair<int64_t, int64_t>{30, 40}));
}

TEST(NnInit, TruncNormalStaysInside) {
  Generator g(6);
  Tensor w = Tensor::empty({200000}, DType::f64);
  init::trunc_normal_(w, 0.5, 1.0, -0.5, 1.5, &g);  // +-1 std around the mean
  const Moments m = moments(w);
  EXPECT_GE(m.min, -0.5);
  EXPECT_LE(m.max, 1.5);
  EXPECT_NEAR(m.mean, 0.5, 0.01);
  // A normal truncated at +-1 std has std sqrt(1 - 2 phi(1) / (2 Phi(1) - 1)) = 0.5379.
  EXPECT_NEAR(m.std, 0.5379, 0.005);
  Tensor narrow_interval = Tensor::empty({4});
  EXPECT_THROW(init::trunc_normal_(narrow_interval, 0.0, 1.0, 10.0, 11.0, &g), Error);
}

TEST(NnInit, SeededAndInPlace) {
  Generator g1(9), g2(9);
  Tensor a = Tensor::empty({64}), b = Tensor::empty({64});
  const TensorImpl* before = a.impl_ptr().get();
  init::normal_(a, 1.0, 2.0, &g1);
  init::normal_(b, 1.0, 2.0, &g2);
  EXPECT_EQ(a.impl_ptr().get(), before);
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  init::ones_(a);
  init::zeros_(b);
  expect_close(a, Tensor::ones({64}), 0.0);
  expect_close(b, Tensor::zeros({64}), 0.0);
}

TEST(NnLayers, LinearInitValueAndGrad) {
  Generator g(1);
  Linear big(400, 300, true, DType::f32, &g);
  const double bound = 1.0 / 20.0;
  const Moments w = moments(big.weight), b = moments(big.bias);
  EXPECT_GE(w.min, -bound);
  EXPECT_LE(w.max, bound);
  EXPECT_NEAR(w.std, bound / std::sqrt(3.0), 0.02 * bound);
  EXPECT_GE(b.min, -bound);
  EXPECT_LE(b.max, bound);

  Linear lin(3, 2, true, DType::f64, &g);
  lin.weight.copy_from(Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}));
  lin.bias.copy_from(Tensor::from_vector<double>({0.5, -1}));
  const Tensor y = lin.forward(Tensor::from_vector<double>({1, 0, -1, 2, 1, 0}, {2, 3}));
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  forge::testing::expect_values(y, {1 - 3 + 0.5, 4 - 6 - 1, 2 + 2 + 0.5, 8 + 5 - 1});

  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        lin.weight = in[1];
        lin.bias = in[2];
        return lin.forward(in[0]);
      },
      {leaf64({2, 4, 3}, 1), lin.weight, lin.bias});
  Linear no_bias(3, 2, false);
  EXPECT_FALSE(no_bias.bias.defined());
  EXPECT_EQ(no_bias.num_parameters(), 6);
}

TEST(NnLayers, EmbeddingPaddingAndGrad) {
  Generator g(2);
  Embedding emb(500, 64, 3, DType::f32, &g);
  expect_close(emb.weight.slice0(3, 4), Tensor::zeros({1, 64}), 0.0);
  const Moments m = moments(emb.weight);
  EXPECT_NEAR(m.mean, 0.0, 0.02);
  EXPECT_NEAR(m.std, 1.0, 0.02);

  Embedding small(6, 4, 0, DType::f64, &g);
  const Tensor ids = Tensor::from_vector<int64_t>({5, 0, 2, 5}, {2, 2});
  const Tensor y = small.forward(ids);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 4}));
  expect_close(ops::reshape(y, {4, 4}), ops::index_select(small.weight, 0, ops::reshape(ids, {4})),
               0.0);
  autograd::backward(ops::sum(y));
  expect_close(small.weight.grad().slice0(0, 1), Tensor::zeros({1, 4}, DType::f64), 0.0);
  small.zero_grad();
  // The padding row is frozen by design, so the check uses ids without it.
  const Tensor other_ids = Tensor::from_vector<int64_t>({5, 1, 2, 5}, {2, 2});
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        small.weight = in[0];
        return small.forward(other_ids);
      },
      {small.weight});
}

TEST(NnLayers, LayerNormValueAndGrad) {
  LayerNorm ln({2, 3}, 1e-5, true, DType::f64);
  EXPECT_EQ(ln.num_parameters(), 12);
  ln.weight.copy_from(Tensor::from_vector<double>({1, 2, 3, -1, 0.5, 1}, {2, 3}));
  ln.bias.copy_from(Tensor::from_vector<double>({0, 1, 0, 0, -1, 0}, {2, 3}));
  const Tensor x = leaf64({4, 2, 3}, 3);
  // The same normalisation from primitive ops: mean and variance over the last two dims.
  const Tensor mu = ops::mean(x, {1, 2}, true);
  const Tensor var = ops::mean(ops::square(x - mu), {1, 2}, true);
  const Tensor ref = (x - mu) * ops::rsqrt(var + 1e-5) * ln.weight + ln.bias;
  expect_close(ln.forward(x), ref, 1e-12);
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        ln.weight = in[1];
        ln.bias = in[2];
        return ln.forward(in[0]);
      },
      {leaf64({3, 2, 3}, 4), ln.weight, ln.bias});
  LayerNorm plain({3}, 1e-5, false);
  EXPECT_EQ(plain.num_parameters(), 0);
  EXPECT_THROW(plain.forward(Tensor::zeros({2, 4})), Error);
}

TEST(NnLayers, DropoutModes) {
  Dropout drop(0.25);
  Generator g(4);
  drop.set_generator(&g);
  const Tensor x = Tensor::ones({1000});
  const Tensor y = drop.forward(x);
  int64_t zeros = 0;
  for (float v : y.to_vector<float>()) {
    if (v == 0.0f)
      ++zeros;
    else
      EXPECT_FLOAT_EQ(v, 1.0f / 0.75f);
  }
  EXPECT_GT(zeros, 180);
  EXPECT_LT(zeros, 320);
  // The mask comes from the module's generator: same state, same mask.
  Generator g2(4);
  drop.set_generator(&g2);
  expect_close(drop.forward(x), y, 0.0);
  drop.eval();
  expect_close(drop.forward(x), x, 0.0);
  EXPECT_THROW(Dropout(1.0), Error);
}

FeedForwardOptions ff_options(bool glu, Activation act, int64_t chunks, double dropout = 0.0) {
  return FeedForwardOptions{.dim = 4,
                            .mult = 2,
                            .activation = act,
                            .glu = glu,
                            .dropout = dropout,
                            .chunks = chunks,
                            .dtype = DType::f64};
}

TEST(NnLayers, FeedForwardValue) {
  for (bool glu : {false, true}) {
    for (Activation act : {Activation::gelu, Activation::relu}) {
      Generator g(7);
      FeedForward ff(ff_options(glu, act, 1), &g);
      EXPECT_EQ(ff.w1->weight.shape(), (Shape{glu ? 16 : 8, 4}));
      const Tensor x = leaf64({2, 5, 4}, 8);
      const auto f = [&](const Tensor& t) {
        return act == Activation::gelu ? ops::gelu(t) : ops::relu(t);
      };
      Tensor h = ops::linear(x, ff.w1->weight, ff.w1->bias);
      h = glu ? f(ops::narrow(h, -1, 0, 8)) * ops::narrow(h, -1, 8, 8) : f(h);
      const Tensor ref = ops::linear(h, ff.w2->weight, ff.w2->bias);
      const Tensor y = ff.forward(x);
      EXPECT_EQ(y.shape(), (Shape{2, 5, 4}));
      expect_close(y, ref, 1e-12);
    }
  }
}

TEST(NnLayers, FeedForwardExplicitHiddenWidth) {
  FeedForwardOptions o = ff_options(true, Activation::relu, 1);
  o.hidden = 6;  // linformer-pytorch's dim_ff, independent of mult
  FeedForward ff(o);
  EXPECT_EQ(ff.w1->weight.shape(), (Shape{12, 4}));
  EXPECT_EQ(ff.w2->weight.shape(), (Shape{4, 6}));
  EXPECT_EQ(ff.forward(Tensor::zeros({2, 3, 4}, DType::f64)).shape(), (Shape{2, 3, 4}));
}

TEST(NnLayers, FeedForwardGradcheck) {
  for (bool glu : {false, true}) {
    Generator g(10);
    FeedForward ff(ff_options(glu, Activation::gelu, 3), &g);
    EXPECT_GRADCHECK(
        [&](const std::vector<Tensor>& in) {
          ff.w1->weight = in[1];
          ff.w1->bias = in[2];
          ff.w2->weight = in[3];
          ff.w2->bias = in[4];
          return ff.forward(in[0]);
        },
        {leaf64({2, 3, 4}, 11), ff.w1->weight, ff.w1->bias, ff.w2->weight, ff.w2->bias});
  }
}

// Chunked and unchunked runs of the same weights agree in values and in every
// gradient, with dropout active (the masks line up, see layers.h).
TEST(NnLayers, FeedForwardChunkedEqualsUnchunked) {
  for (int64_t chunks : {2, 3, 7}) {
    Generator init_a(12), init_b(12);
    FeedForward a(ff_options(true, Activation::gelu, 1, 0.3), &init_a);
    FeedForward b(ff_options(true, Activation::gelu, chunks, 0.3), &init_b);
    Generator da(13), db(13);
    a.set_generator(&da);
    b.set_generator(&db);
    const Tensor xa = leaf64({3, 9, 4}, 14), xb = leaf64({3, 9, 4}, 14);
    const Tensor ya = a.forward(xa), yb = b.forward(xb);
    EXPECT_EQ(max_abs_diff(ya, yb), 0.0) << chunks << " chunks";
    EXPECT_EQ(da.offset(), db.offset());
    const Tensor w = leaf64({3, 9, 4}, 15).detach();
    autograd::backward(ops::sum(ya * w));
    autograd::backward(ops::sum(yb * w));
    EXPECT_LE(max_abs_diff(xa.grad(), xb.grad()), 1e-14);
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_LE(max_abs_diff(pa[i].second.grad(), pb[i].second.grad()), 1e-13) << pa[i].first;
  }
}

}  // namespace
}  // namespace forge::nn
