// Attention rollout against a hand computation, and the files a ViT's maps
// make (matrix per head, picture beside the class token's row, rollout).
#include <gtest/gtest.h>

#include <filesystem>

#include "core/rng.h"
#include "tests/test_util.h"
#include "train/attention_maps.h"
#include "train/model.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;

// Two layers, two heads, N = 2. Layer 1: head means [[0.6, 0.4], [0.2, 0.8]];
// with the identity: [[0.8, 0.2], [0.1, 0.9]]. Layer 2: means [[1, 0], [0.5,
// 0.5]] -> [[1, 0], [0.25, 0.75]]. Rollout = layer 2's x layer 1's:
// [[0.8, 0.2], [0.25 * 0.8 + 0.75 * 0.1, 0.25 * 0.2 + 0.75 * 0.9]].
TEST(AttentionMaps, RolloutIsTheProductOfTheMixedLayers) {
  const Tensor l1 = Tensor::from_vector(std::vector<float>{0.7f, 0.3f, 0.2f, 0.8f,   // head 0
                                                           0.5f, 0.5f, 0.2f, 0.8f},  // head 1
                                        {1, 2, 2, 2});
  const Tensor l2 =
      Tensor::from_vector(std::vector<float>{1, 0, 0.5f, 0.5f, 1, 0, 0.5f, 0.5f}, {1, 2, 2, 2});
  const std::vector<double> r = attention_rollout({l1, l2});
  const std::vector<double> want = {0.8, 0.2, 0.25 * 0.8 + 0.75 * 0.1, 0.25 * 0.2 + 0.75 * 0.9};
  ASSERT_EQ(r.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(r[i], want[i], 1e-6) << i;
}

TEST(AttentionMaps, AVitDrawsEveryHeadItsPictureAndTheRollout) {
  Recipe rec;
  for (const char* s : {"model.type=vit", "model.image_size=28", "model.patch_size=7",
                        "model.dim=16", "model.depth=2", "model.heads=2"})
    rec.set(s);
  DataShape shape;
  shape.classes = 10;
  shape.channels = 1;
  shape.image_size = 28;
  Generator gen(1);
  auto task = build_model(rec, shape, DType::f32, &gen);
  task->module().eval();
  data::Batch b;
  b.input = Tensor::zeros({2, 1, 28, 28});
  b.size = 2;
  testing::TempDir dir;
  const VitLayout layout = vit_layout(rec);
  EXPECT_TRUE(layout.vit && layout.cls);
  EXPECT_EQ(layout.grid, 4);
  const AttentionMapsResult r = draw_attention_maps(*task, b, layout, dir.str());
  EXPECT_EQ(r.layers, 2);
  EXPECT_EQ(r.layers_with_maps, 2);
  EXPECT_TRUE(r.rollout);
  EXPECT_EQ(r.files.size(), 2u * 2u * 2u + 1u);  // per layer and head: matrix and picture; rollout
  for (const std::string& f : r.files) EXPECT_GT(fs::file_size(f), 100u) << f;
  // A mechanism without explicit maps draws none, and no rollout.
  rec.set("model.attention.kind=linear");
  auto linear = build_model(rec, shape, DType::f32, &gen);
  const AttentionMapsResult none = draw_attention_maps(*linear, b, layout, dir.file("linear"));
  EXPECT_EQ(none.layers_with_maps, 0);
  EXPECT_FALSE(none.rollout);
  EXPECT_TRUE(none.files.empty());
  EXPECT_FALSE(fs::exists(dir.file("linear"))) << "a folder was made for no maps";
}

}  // namespace
}  // namespace forge::train
