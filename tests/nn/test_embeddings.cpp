// Position and patch embeddings: state-dict names, values against plain loops
// over the definitions, rotary's offset and relative-position properties (the
// interleaved pairs and local-attention's split halves),
// gradients (f64 gradcheck) and shape errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "nn/embeddings.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace forge::nn {
namespace {

using namespace forge::testing;

std::vector<std::string> names(const std::map<std::string, Tensor>& state) {
  std::vector<std::string> out;
  for (const auto& [name, _] : state) out.push_back(name);
  return out;
}

double stddev(const Tensor& t) {
  const auto v = t.to_vector<double>();
  double mean = 0, var = 0;
  for (double x : v) mean += x / static_cast<double>(v.size());
  for (double x : v) var += (x - mean) * (x - mean) / static_cast<double>(v.size());
  return std::sqrt(var);
}

// The sinusoid table from its definition, row-major (max_len, dim).
std::vector<double> naive_table(int64_t max_len, int64_t dim) {
  std::vector<double> table(static_cast<size_t>(max_len * dim));
  for (int64_t t = 0; t < max_len; ++t) {
    for (int64_t i = 0; i < dim / 2; ++i) {
      const double angle = static_cast<double>(t) / std::pow(10000.0, 2.0 * i / dim);
      table[static_cast<size_t>(t * dim + i)] = std::sin(angle);
      table[static_cast<size_t>(t * dim + dim / 2 + i)] = std::cos(angle);
    }
  }
  return table;
}

TEST(EmbeddingsAbsolute, NamesInitSliceAndGrad) {
  Generator g(1);
  AbsolutePositionalEmbedding big(1000, 64, 0.02, DType::f32, &g);
  EXPECT_EQ(names(big.state_dict()), (std::vector<std::string>{"emb.weight"}));
  EXPECT_EQ(big.emb->weight.shape(), (Shape{1000, 64}));
  EXPECT_NEAR(stddev(big.emb->weight), 0.02, 0.001);

  AbsolutePositionalEmbedding pos(10, 4, 0.02, DType::f64, &g);
  expect_close(pos.forward(3, 2), ops::narrow(pos.emb->weight, 0, 2, 3), 0.0);
  EXPECT_EQ(pos.forward(10).shape(), (Shape{10, 4}));
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        pos.emb->weight = in[0];
        return pos.forward(3, 5);
      },
      {pos.emb->weight});
  expect_error([&] { pos.forward(4, 7); }, {"max_len 10", "offset 7 + n 4"});
}

TEST(EmbeddingsFixed, TableAgainstDefinition) {
  FixedPositionalEmbedding pos(12, 6, DType::f64);
  EXPECT_EQ(names(pos.state_dict()), (std::vector<std::string>{"emb"}));
  EXPECT_EQ(pos.num_parameters(), 0);
  expect_values(pos.emb, naive_table(12, 6), 1e-14);
  const Tensor rows = pos.forward(4, 8);
  EXPECT_EQ(rows.shape(), (Shape{4, 6}));
  EXPECT_FALSE(rows.requires_grad());
  const std::vector<double> table = naive_table(12, 6);
  expect_values(rows, std::vector<double>(table.begin() + 8 * 6, table.end()), 1e-14);
  expect_values(FixedPositionalEmbedding(12, 6).emb, naive_table(12, 6), 1e-6);
  expect_error([] { FixedPositionalEmbedding(12, 5); }, {"even dim", "dim 5"});
  expect_error([&] { pos.forward(5, 8); }, {"max_len 12", "offset 8 + n 5"});
}

// Which features rotary turns together: pair j is (x_2j, x_2j+1) (interleaved,
// RotaryEmbedding) or (x_j, x_j+d/2) (half split, local-attention's rotary).
enum class RotaryPairs { interleaved, half_split };

// Rotary from its definition on x (..., n, d): pair j at position offset + i
// turns by (offset + i) f_j.
std::vector<double> naive_rotary(const Tensor& x, int64_t offset, RotaryPairs pairs) {
  const int64_t d = x.size(-1), n = x.size(-2);
  const auto v = x.to_vector<double>();
  std::vector<double> out(v.size());
  for (size_t row = 0; row < v.size() / static_cast<size_t>(d); ++row) {
    const auto t = static_cast<double>(offset + static_cast<int64_t>(row) % n);
    for (int64_t j = 0; j < d / 2; ++j) {
      const double angle = t / std::pow(10000.0, 2.0 * j / d);
      const bool interleaved = pairs == RotaryPairs::interleaved;
      const size_t a = row * static_cast<size_t>(d) + static_cast<size_t>(interleaved ? 2 * j : j);
      const size_t b = a + static_cast<size_t>(interleaved ? 1 : d / 2);
      out[a] = v[a] * std::cos(angle) - v[b] * std::sin(angle);
      out[b] = v[b] * std::cos(angle) + v[a] * std::sin(angle);
    }
  }
  return out;
}

TEST(EmbeddingsRotary, ValuesAndGrad) {
  RotaryEmbedding rotary(10, 6, DType::f64);
  EXPECT_EQ(names(rotary.state_dict()), (std::vector<std::string>{"emb"}));
  expect_values(rotary.emb, naive_table(10, 6), 1e-14);
  const Tensor x = leaf64({2, 3, 5, 6}, 1);
  const Tensor y = rotary.rotate(x, 3);
  EXPECT_EQ(y.shape(), x.shape());
  expect_values(y, naive_rotary(x, 3, RotaryPairs::interleaved), 1e-12);
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return rotary.rotate(in[0], 2); },
                   {leaf64({2, 4, 6}, 2)});
  expect_error(
      [&] {
        rotary.rotate(Tensor::zeros({5, 4}, DType::f64));
      },
      {"(..., n, 6)", "[5, 4]"});
  expect_error([&] { rotary.rotate(x, 6); }, {"max_len 10", "offset 6 + n 5"});
}

TEST(EmbeddingsRotary, OffsetEqualsSliceOfFullSequence) {
  RotaryEmbedding rotary(16, 8, DType::f64);
  const Tensor x = leaf64({2, 9, 8}, 3);
  const Tensor full = rotary.rotate(x);
  for (int64_t o : {0, 1, 4, 8}) {
    const int64_t n = 9 - o;
    expect_close(rotary.rotate(ops::narrow(x, 1, o, n), o), ops::narrow(full, 1, o, n), 1e-14);
  }
}

// <rotate(q) at i, rotate(k) at j> depends on i - j only.
TEST(EmbeddingsRotary, DotProductDependsOnRelativePosition) {
  const int64_t L = 12, d = 8;
  RotaryEmbedding rotary(L, d, DType::f64);
  const Tensor ones = Tensor::ones({L, 1}, DType::f64);
  const Tensor q = rotary.rotate(ones * leaf64({1, d}, 4).detach());  // (L, d), same q everywhere
  const Tensor k = rotary.rotate(ones * leaf64({1, d}, 5).detach());
  const auto dots = ops::matmul(q, k, false, true).to_vector<double>();  // (L, L)
  const auto at = [&](int64_t i, int64_t j) { return dots[static_cast<size_t>(i * L + j)]; };
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < L; ++j)
      EXPECT_NEAR(at(i, j), at(i - std::min(i, j), j - std::min(i, j)), 1e-12) << i << ", " << j;
  EXPECT_GT(std::abs(at(0, 0) - at(1, 0)), 1e-3);  // and it does depend on i - j
}

TEST(EmbeddingsRotary, HalfSplitValuesRelativePositionsAndGrad) {
  const Tensor x = leaf64({2, 3, 5, 6}, 6);
  expect_values(rotate_half_split(x, 7), naive_rotary(x, 7, RotaryPairs::half_split), 1e-12);
  // q at i + s and k at j + s give the same scores for every shift s.
  const Tensor q = leaf64({1, 9, 8}, 7).detach(), k = leaf64({1, 9, 8}, 8).detach();
  const auto scores = [&](int64_t s) {
    return ops::matmul(rotate_half_split(q, s), rotate_half_split(k, s), false, true);
  };
  expect_close(scores(5), scores(0), 1e-12);
  expect_close(scores(12), scores(0), 1e-12);
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return rotate_half_split(in[0], 3); },
                   {leaf64({2, 4, 6}, 9)});
  expect_error([] { rotate_half_split(Tensor::zeros({5, 3}, DType::f64)); }, {"even d", "[5, 3]"});
}

TEST(EmbeddingsAxial, SumsAgainstDefinitionAndGrad) {
  for (const auto& axial : std::vector<std::vector<int64_t>>{{3, 4}, {2, 3, 2}, {5}}) {
    Generator g(6);
    const int64_t dim = 3, total = shape_numel(axial);
    AxialPositionalEmbedding pos(dim, axial, DType::f64, &g);
    const auto state = pos.state_dict();
    ASSERT_EQ(state.size(), axial.size());
    std::vector<std::vector<double>> w;
    for (size_t i = 0; i < axial.size(); ++i) {
      Shape expected(axial.size() + 2, 1);
      expected[i + 1] = axial[i];
      expected.back() = dim;
      EXPECT_EQ(state.at("weights." + std::to_string(i)).shape(), expected);
      w.push_back(pos.weights->values[i].to_vector<double>());
    }
    // Position p has row-major coordinates (c_0, ..., c_k-1); its row is sum_i w_i[c_i].
    std::vector<double> ref;
    for (int64_t p = 2; p < total; ++p) {
      std::vector<int64_t> coord(axial.size());
      for (int64_t i = static_cast<int64_t>(axial.size()) - 1, rest = p; i >= 0; --i) {
        coord[static_cast<size_t>(i)] = rest % axial[static_cast<size_t>(i)];
        rest /= axial[static_cast<size_t>(i)];
      }
      for (int64_t e = 0; e < dim; ++e) {
        double s = 0;
        for (size_t i = 0; i < axial.size(); ++i)
          s += w[i][static_cast<size_t>(coord[i] * dim + e)];
        ref.push_back(s);
      }
    }
    const Tensor y = pos.forward(total - 2, 2);
    EXPECT_EQ(y.shape(), (Shape{total - 2, dim}));
    expect_values(y, ref, 1e-14);

    const std::vector<Tensor> params = pos.weights->values;
    EXPECT_GRADCHECK(
        [&](const std::vector<Tensor>& in) {
          for (size_t i = 0; i < in.size(); ++i) pos.weights->values[i] = in[i];
          return pos.forward(total - 1, 1);
        },
        params);
    expect_error([&] { pos.forward(total, 1); },
                 {"max_len " + std::to_string(total), "offset 1 + n " + std::to_string(total)});
  }
  Generator g(7);
  AxialPositionalEmbedding big(256, {64, 32}, DType::f32, &g);
  EXPECT_NEAR(stddev(big.weights->values[0]), 1.0, 0.05);
  EXPECT_NEAR(stddev(big.weights->values[1]), 1.0, 0.05);
  expect_error([] { AxialPositionalEmbedding(4, {3, 0}); }, {"axial_shape [3, 0]"});
}

// The conv with kernel = stride = p, as a direct loop: out[b][patch][o].
std::vector<double> naive_patch_conv(const Tensor& images, const Tensor& weight, const Tensor& bias,
                                     int64_t p) {
  const int64_t B = images.size(0), C = images.size(1), H = images.size(2), W = images.size(3);
  const int64_t O = weight.size(0);
  const auto x = images.to_vector<double>(), w = weight.to_vector<double>();
  const auto b = bias.to_vector<double>();
  std::vector<double> out;
  for (int64_t n = 0; n < B; ++n)
    for (int64_t ph = 0; ph < H / p; ++ph)
      for (int64_t pw = 0; pw < W / p; ++pw)
        for (int64_t o = 0; o < O; ++o) {
          double s = b[static_cast<size_t>(o)];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t i = 0; i < p; ++i)
              for (int64_t j = 0; j < p; ++j)
                s += w[static_cast<size_t>(((o * C + c) * p + i) * p + j)] *
                     x[static_cast<size_t>(((n * C + c) * H + ph * p + i) * W + pw * p + j)];
          out.push_back(s);
        }
  return out;
}

TEST(EmbeddingsPatch, ConvValuesInitAndGrad) {
  Generator g(8);
  PatchEmbed big(16, 4, 3, 64, DType::f32, &g);
  EXPECT_EQ(names(big.state_dict()), (std::vector<std::string>{"proj.bias", "proj.weight"}));
  EXPECT_EQ(big.proj->weight.shape(), (Shape{64, 3, 4, 4}));
  EXPECT_EQ(big.proj->bias.shape(), (Shape{64}));
  EXPECT_EQ(big.num_patches(), 16);
  const double bound = 1.0 / std::sqrt(48.0);
  for (double v : big.proj->weight.to_vector<double>()) ASSERT_LE(std::abs(v), bound);
  for (double v : big.proj->bias.to_vector<double>()) ASSERT_LE(std::abs(v), bound);
  EXPECT_NEAR(stddev(big.proj->weight), bound / std::sqrt(3.0), 0.05 * bound);

  PatchEmbed pe(8, 4, 3, 5, DType::f64, &g);
  const Tensor images = leaf64({2, 3, 8, 12}, 9);  // H, W need only be multiples of p
  const Tensor y = pe.forward(images);
  EXPECT_EQ(y.shape(), (Shape{2, 6, 5}));
  expect_values(y, naive_patch_conv(images, pe.proj->weight, pe.proj->bias, 4), 1e-12);

  PatchEmbed small(4, 2, 2, 3, DType::f64, &g);
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        small.proj->weight = in[1];
        small.proj->bias = in[2];
        return small.forward(in[0]);
      },
      {leaf64({2, 2, 4, 4}, 10), small.proj->weight, small.proj->bias});

  expect_error(
      [&] {
        pe.forward(Tensor::zeros({1, 4, 8, 8}, DType::f64));
      },
      {"(B, 3, H, W)", "[1, 4, 8, 8]"});
  expect_error(
      [&] {
        pe.forward(Tensor::zeros({1, 3, 10, 8}, DType::f64));
      },
      {"divisible by the patch size 4", "H 10 W 8"});
  expect_error([] { PatchEmbed(10, 4, 3, 8); }, {"img_size 10 patch_size 4"});
}

TEST(EmbeddingsPrependToken, ValuesAndGrad) {
  const Tensor token = leaf64({1, 1, 4}, 11), x = leaf64({2, 3, 4}, 12);
  const Tensor y = prepend_token(token, x);
  EXPECT_EQ(y.shape(), (Shape{2, 4, 4}));
  for (int64_t b = 0; b < 2; ++b) {
    expect_close(ops::narrow(y, 0, b, 1), ops::cat({token, ops::narrow(x, 0, b, 1)}, 1), 0.0);
  }
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return prepend_token(in[0], in[1]); },
                   {token, x});
  expect_error(
      [&] {
        prepend_token(leaf64({1, 1, 5}, 13), x);
      },
      {"token (1, 1, 4)", "got [1, 1, 5]"});
  expect_error([&] { prepend_token(token, leaf64({3, 4}, 14)); }, {"(B, N, D)", "[3, 4]"});
}

}  // namespace
}  // namespace forge::nn
