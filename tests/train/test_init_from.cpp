// model.init_from: a ViT from attnforge names and from timm's (fused qkv
// split back), a position embedding resampled for another image size, a
// fresh head for other classes, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/rng.h"
#include "core/safetensors.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "tests/test_util.h"
#include "train/init_from.h"

namespace forge::train {
namespace {

nn::ViTConfig small_vit(int64_t image_size, int64_t classes) {
  return nn::ViTConfig{.image_size = image_size,
                       .patch_size = 7,
                       .channels = 1,
                       .classes = classes,
                       .dim = 8,
                       .depth = 2,
                       .heads = 2,
                       .mlp_ratio = 2};
}

void expect_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const Tensor x = a.to(DType::f64), y = b.to(DType::f64);
  for (int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(x.data<double>()[i], y.data<double>()[i]) << what << " at " << i;
}

// timm's names for our ViT's state dict, written from timm's VisionTransformer
// (blocks.L.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}, norm, head).
std::map<std::string, Tensor> timm_state(const std::map<std::string, Tensor>& ours, int64_t depth) {
  std::map<std::string, Tensor> t;
  const std::map<std::string, std::string> top = {
      {"cls_token", "cls_token"},
      {"pos_embed", "pos_embed"},
      {"patch_embed.proj.weight", "patch_embed.proj.weight"},
      {"patch_embed.proj.bias", "patch_embed.proj.bias"},
      {"norm.weight", "transformer.norm.norm.weight"},
      {"norm.bias", "transformer.norm.norm.bias"},
      {"head.weight", "head.weight"},
      {"head.bias", "head.bias"}};
  for (const auto& [timm, mine] : top) t[timm] = ours.at(mine);
  for (int64_t l = 0; l < depth; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".",
                      o = "transformer.layers." + std::to_string(l) + ".";
    for (const char* leaf : {"weight", "bias"}) {
      const std::string x = std::string(".") + leaf;
      t[b + "norm1" + x] = ours.at(o + "attn_norm.norm" + x);
      t[b + "attn.qkv" + x] = ops::cat({ours.at(o + "attn.to_q" + x), ours.at(o + "attn.to_k" + x),
                                        ours.at(o + "attn.to_v" + x)},
                                       0);
      t[b + "attn.proj" + x] = ours.at(o + "attn.to_out" + x);
      t[b + "norm2" + x] = ours.at(o + "ff_norm.norm" + x);
      t[b + "mlp.fc1" + x] = ours.at(o + "ff.w1" + x);
      t[b + "mlp.fc2" + x] = ours.at(o + "ff.w2" + x);
    }
  }
  return t;
}

TEST(InitFrom, TimmNamesLoadEveryTensor) {
  testing::TempDir dir;
  Generator g1(1), g2(2);
  nn::ViT source(small_vit(28, 10), &g1), target(small_vit(28, 10), &g2);
  const auto ours = source.state_dict();
  const std::string file = dir.file("timm.safetensors");
  auto timm = timm_state(ours, 2);
  timm["blocks.0.ls1.gamma"] = Tensor::zeros({8});  // timm's layer scale: not ours
  safetensors::save(file, timm);
  const InitReport r = init_from(target, file);
  EXPECT_TRUE(r.timm_names);
  EXPECT_EQ(r.loaded.size(), ours.size());
  EXPECT_TRUE(r.missing.empty()) << r.summary();
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"blocks.0.ls1.gamma"});
  for (const auto& [name, t] : target.state_dict()) expect_equal(t, ours.at(name), name);
}

// 28 -> 56 pixels at patch 7: a 4x4 grid of positions becomes 8x8. A grid
// constant along rows stays so; the class token's row is copied; the head
// for 12 classes instead of 10 keeps its initialisation.
TEST(InitFrom, PositionsResampledAndAFreshHead) {
  testing::TempDir dir;
  Generator g1(1), g2(2);
  nn::ViT source(small_vit(28, 10), &g1), target(small_vit(56, 12), &g2);
  auto state = source.state_dict();
  Tensor pos = Tensor::empty({1, 17, 8});
  for (int64_t t = 0; t < 17; ++t)
    for (int64_t c = 0; c < 8; ++c)
      pos.data<float>()[t * 8 + c] = t == 0 ? 5.0f : static_cast<float>((t - 1) / 4 + c);  // by row
  state["pos_embed"] = pos;
  const std::string file = dir.file("vit28.safetensors");
  safetensors::save(file, state);
  const Tensor head_before = target.state_dict().at("head.weight").to(DType::f32);
  const InitReport r = init_from(target, file);
  ASSERT_EQ(r.resized.size(), 1u) << r.summary();
  EXPECT_NE(r.resized[0].find("[1, 17, 8] -> [1, 65, 8]"), std::string::npos) << r.resized[0];
  EXPECT_EQ(r.fresh.size(), 2u) << r.summary();  // head.weight and head.bias
  expect_equal(target.state_dict().at("head.weight"), head_before, "head.weight");
  const Tensor p = target.state_dict().at("pos_embed");
  for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(p.data<float>()[c], 5.0f);  // the class token
  for (int64_t y = 0; y < 8; ++y) {
    const float* row = p.data<float>() + (1 + y * 8) * 8;
    for (int64_t x = 1; x < 8; ++x)
      EXPECT_NEAR(row[x * 8], row[0], 1e-5) << "row " << y;  // constant along x
    if (y > 0) {
      EXPECT_GE(row[0], (row - 64)[0] - 1e-5) << "row " << y;  // rising down the rows
    }
  }
  EXPECT_NEAR(p.data<float>()[(1 + 0) * 8], 0.0f, 1e-5);   // the first row keeps its value
  EXPECT_NEAR(p.data<float>()[(1 + 63) * 8], 3.0f, 1e-5);  // and the last
}

TEST(InitFrom, OtherShapesAndNothingThatFitsAreErrors) {
  testing::TempDir dir;
  Generator g1(1), g2(2);
  nn::ViTConfig wide = small_vit(28, 10);
  wide.dim = 16;
  nn::ViT source(wide, &g1), target(small_vit(28, 10), &g2);
  const std::string file = dir.file("wide.safetensors");
  safetensors::save(file, source.state_dict());
  testing::expect_error([&] { init_from(target, file); },
                        {"model.init_from", "is [", "must match"});
  safetensors::save(file, {{"something.else", Tensor::zeros({3})}});
  testing::expect_error([&] { init_from(target, file); }, {"no tensor of the source fits"});
  testing::expect_error([&] { init_from(target, dir.file("none")); },
                        {"no such file or directory"});
}

}  // namespace
}  // namespace forge::train
