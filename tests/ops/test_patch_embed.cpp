// patch_embed on the CPU: against a direct convolution loop (torch's conv2d
// with stride = kernel = p, flattened to tokens), gradcheck in f64, and the
// argument errors.
#include <gtest/gtest.h>

#include "ops/linalg/conv.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using testing::leaf64;

// out[b, i * w + j, d] = bias[d] + sum_{c, u, v} x[b, c, i p + u, j p + v] weight[d, c, u, v].
Tensor naive_patch_embed(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t p) {
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), D = weight.size(0);
  const int64_t h = H / p, w = W / p;
  const auto xv = x.to_vector<double>(), wv = weight.to_vector<double>();
  const std::vector<double> bv = bias.defined() ? bias.to_vector<double>() : std::vector<double>(D);
  Tensor out = Tensor::zeros({B, h * w, D}, DType::f64);
  double* o = out.data<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < w; ++j)
        for (int64_t d = 0; d < D; ++d) {
          double s = bv[static_cast<size_t>(d)];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t u = 0; u < p; ++u)
              for (int64_t v = 0; v < p; ++v)
                s += xv[static_cast<size_t>(((b * C + c) * H + i * p + u) * W + j * p + v)] *
                     wv[static_cast<size_t>(((d * C + c) * p + u) * p + v)];
          o[(b * h * w + i * w + j) * D + d] = s;
        }
  return out;
}

TEST(PatchEmbed, MatchesDirectConvolution) {
  // Non-square images, several channels; with and without bias.
  const Tensor x = leaf64({2, 3, 8, 12}, 1), weight = leaf64({5, 3, 4, 4}, 2),
               bias = leaf64({5}, 3);
  const Tensor y = ops::patch_embed(x, weight, bias, 4);
  EXPECT_EQ(y.shape(), Shape({2, 6, 5}));
  testing::expect_close(y, naive_patch_embed(x, weight, bias, 4), 1e-12);
  testing::expect_close(ops::patch_embed(x, weight, Tensor(), 4),
                        naive_patch_embed(x, weight, Tensor(), 4), 1e-12);
  // p = 1: a per-pixel linear map.
  const Tensor w1 = leaf64({4, 3, 1, 1}, 4);
  testing::expect_close(ops::patch_embed(x, w1, Tensor(), 1), naive_patch_embed(x, w1, Tensor(), 1),
                        1e-12);
}

TEST(PatchEmbed, F32MatchesF64) {
  const Tensor x = leaf64({2, 3, 16, 16}, 5).detach(), weight = leaf64({8, 3, 8, 8}, 6).detach(),
               bias = leaf64({8}, 7).detach();
  const Tensor y32 =
      ops::patch_embed(x.to(DType::f32), weight.to(DType::f32), bias.to(DType::f32), 8);
  EXPECT_EQ(y32.dtype(), DType::f32);
  testing::expect_close(y32.to(DType::f64), naive_patch_embed(x, weight, bias, 8), 1e-5);
}

TEST(PatchEmbed, PassesGradcheck) {
  const Tensor x = leaf64({2, 2, 4, 6}, 8), weight = leaf64({3, 2, 2, 2}, 9),
               bias = leaf64({3}, 10);
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) { return ops::patch_embed(in[0], in[1], in[2], 2); },
      {x, weight, bias});
}

TEST(PatchEmbed, BadArgumentsAreErrors) {
  const Tensor x = Tensor::ones({1, 3, 8, 8}), weight = Tensor::ones({4, 3, 4, 4});
  testing::expect_error([&] { ops::patch_embed(x, weight, Tensor(), 3); },
                        {"patch 3", "[1, 3, 8, 8]"});
  testing::expect_error(
      [&] {
        ops::patch_embed(x, Tensor::ones({4, 2, 4, 4}), Tensor(), 4);
      },
      {"weight", "[4, 2, 4, 4]"});
  testing::expect_error([&] { ops::patch_embed(x, weight, Tensor::ones({5}), 4); },
                        {"bias", "[5]"});
  testing::expect_error(
      [&] {
        ops::patch_embed(Tensor::ones({3, 8, 8}), weight, Tensor(), 4);
      },
      {"(B, C, H, W)", "[3, 8, 8]"});
  testing::expect_error([&] { ops::patch_embed(x, weight.to(DType::f64), Tensor(), 4); },
                        {"f32", "f64"});
}

}  // namespace
}  // namespace forge
