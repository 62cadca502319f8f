// Mixup / CutMix: the mixing formula against the mirror row, lambda's Beta
// statistics, the cutmix box (a rectangle pasted from the partner, lambda
// corrected to its area), the mixup/cutmix switch, prob 0, and determinism
// inside a DataLoader.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "data/mixup.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

using forge::testing::expect_error;

// B images [C, H, W]; element k of row i is 1000 i + k + 1 (all distinct), labels 10 + i.
Batch image_batch(int64_t B, int64_t C, int64_t H, int64_t W) {
  Batch b;
  b.size = B;
  b.input = Tensor::empty({B, C, H, W}, DType::f32);
  float* p = b.input.data<float>();
  for (int64_t i = 0; i < B; ++i)
    for (int64_t k = 0; k < C * H * W; ++k)
      p[i * C * H * W + k] = static_cast<float>(1000 * i + k + 1);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < B; ++i) labels.push_back(10 + i);
  b.label = Tensor::from_vector(labels);
  return b;
}

// Every row is a constant i: a cutmix pixel is i or B-1-i, a mixup pixel in between.
Batch constant_batch(int64_t B, int64_t H, int64_t W) {
  Batch b = image_batch(B, 1, H, W);
  float* p = b.input.data<float>();
  for (int64_t i = 0; i < B; ++i)
    std::fill(p + i * H * W, p + (i + 1) * H * W, static_cast<float>(i));
  return b;
}

TEST(Mixup, MixesEachRowWithItsMirrorRow) {
  Batch b = image_batch(5, 2, 3, 4);
  const Batch original = image_batch(5, 2, 3, 4);
  MixupOptions o;
  o.mixup_alpha = 1.0;
  Rng rng(3);
  make_mixup(o)(b, rng);
  const double lam = b.mix_lambda;
  ASSERT_GT(lam, 0.0);
  ASSERT_LT(lam, 1.0);
  // The draws: prob, then lam.
  Rng replay(3);
  replay.uniform();
  EXPECT_EQ(lam, replay.beta(1.0, 1.0));
  const float* x = b.input.data<float>();
  const float* x0 = original.input.data<float>();
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t k = 0; k < 24; ++k)
      ASSERT_NEAR(x[i * 24 + k], lam * x0[i * 24 + k] + (1 - lam) * x0[(4 - i) * 24 + k], 1e-3)
          << "row " << i << " element " << k;
  // The middle row mixes with itself.
  EXPECT_EQ(std::memcmp(x + 2 * 24, x0 + 2 * 24, 24 * sizeof(float)), 0);
  ASSERT_TRUE(b.label_mix.defined());
  EXPECT_EQ(b.label_mix.to_vector<int64_t>(), (std::vector<int64_t>{14, 13, 12, 11, 10}));
  EXPECT_EQ(b.label.to_vector<int64_t>(), (std::vector<int64_t>{10, 11, 12, 13, 14}));
}

TEST(Mixup, LambdaFollowsBetaAlphaAlpha) {
  MixupOptions o;
  o.mixup_alpha = 0.4;
  const auto mix = make_mixup(o);
  const int n = 4000;
  double sum = 0, sq = 0;
  for (int t = 0; t < n; ++t) {
    Batch b = image_batch(2, 1, 1, 1);
    Rng rng(Rng::mix({17, static_cast<uint64_t>(t)}));
    mix(b, rng);
    ASSERT_GT(b.mix_lambda, 0.0);
    ASSERT_LT(b.mix_lambda, 1.0);
    sum += b.mix_lambda;
    sq += b.mix_lambda * b.mix_lambda;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  // Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)) = 0.1389 for a = 0.4.
  EXPECT_NEAR(mean, 0.5, 0.02);
  EXPECT_NEAR(var, 1.0 / (4 * (2 * 0.4 + 1)), 0.01);
}

TEST(Mixup, ProbZeroAndNoAlphaLeaveTheBatchAlone) {
  MixupOptions o;
  o.mixup_alpha = 1.0;
  o.cutmix_alpha = 1.0;
  o.prob = 0;
  for (const MixupOptions& opts : {o, MixupOptions{}}) {
    for (uint64_t s = 0; s < 20; ++s) {
      Batch b = image_batch(4, 1, 5, 5);
      Rng rng(s);
      make_mixup(opts)(b, rng);
      EXPECT_EQ(b.mix_lambda, 1.0);
      EXPECT_FALSE(b.label_mix.defined());
      EXPECT_EQ(forge::testing::max_abs_diff(b.input, image_batch(4, 1, 5, 5).input), 0.0);
    }
  }
}

TEST(Mixup, ProbMixesThatShareOfBatches) {
  MixupOptions o;
  o.mixup_alpha = 1.0;
  o.prob = 0.3;
  int mixed = 0;
  for (uint64_t s = 0; s < 1000; ++s) {
    Batch b = image_batch(2, 1, 1, 1);
    Rng rng(s);
    make_mixup(o)(b, rng);
    mixed += b.label_mix.defined();
  }
  EXPECT_NEAR(mixed / 1000.0, 0.3, 0.05);
}

TEST(CutMix, PastesARectangleFromThePartnerAndCorrectsLambda) {
  MixupOptions o;
  o.cutmix_alpha = 1.0;
  const int64_t B = 4, C = 2, H = 12, W = 10;
  const Batch original = image_batch(B, C, H, W);
  const float* x0 = original.input.data<float>();
  int boxes = 0;
  for (uint64_t s = 0; s < 200; ++s) {
    Batch b = image_batch(B, C, H, W);
    Rng rng(s);
    make_mixup(o)(b, rng);
    const float* x = b.input.data<float>();
    // The changed pixels of row 0, channel 0, and their bounding box.
    int64_t changed = 0, y0 = H, y1 = 0, x0b = W, x1b = 0;
    for (int64_t y = 0; y < H; ++y)
      for (int64_t xx = 0; xx < W; ++xx)
        if (x[y * W + xx] != x0[y * W + xx]) {
          ++changed;
          y0 = std::min(y0, y);
          y1 = std::max(y1, y + 1);
          x0b = std::min(x0b, xx);
          x1b = std::max(x1b, xx + 1);
        }
    if (changed == 0) {
      EXPECT_EQ(b.mix_lambda, 1.0);
      EXPECT_FALSE(b.label_mix.defined());
      continue;
    }
    ++boxes;
    EXPECT_EQ(changed, (y1 - y0) * (x1b - x0b)) << "not a rectangle, seed " << s;
    EXPECT_DOUBLE_EQ(b.mix_lambda, 1.0 - static_cast<double>(changed) / (H * W));
    // Inside the box every row and channel holds its partner's pixel, outside its own.
    for (int64_t i = 0; i < B; ++i)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t y = 0; y < H; ++y)
          for (int64_t xx = 0; xx < W; ++xx) {
            const bool in = y >= y0 && y < y1 && xx >= x0b && xx < x1b;
            const int64_t at = ((c * H) + y) * W + xx;
            ASSERT_EQ(x[i * C * H * W + at], x0[(in ? B - 1 - i : i) * C * H * W + at]);
          }
    EXPECT_EQ(b.label_mix.to_vector<int64_t>(), (std::vector<int64_t>{13, 12, 11, 10}));
  }
  EXPECT_GT(boxes, 150);
}

TEST(CutMix, BoxSidesFollowTimmsRandBbox) {
  Rng rng(5);
  double area_sum = 0;
  for (int t = 0; t < 2000; ++t) {
    const double lam = rng.uniform();
    const CutBox box = cutmix_box(32, 24, lam, rng);
    const auto cut_h = static_cast<int64_t>(32 * std::sqrt(1 - lam));
    const auto cut_w = static_cast<int64_t>(24 * std::sqrt(1 - lam));
    ASSERT_GE(box.y0, 0);
    ASSERT_LE(box.y1, 32);
    ASSERT_GE(box.x0, 0);
    ASSERT_LE(box.x1, 24);
    ASSERT_LE(box.y1 - box.y0, cut_h);
    ASSERT_LE(box.x1 - box.x0, cut_w);
    ASSERT_GE(box.y1 - box.y0, 0);
    ASSERT_GE(box.x1 - box.x0, 0);
    if (box.y0 > 0 && box.y1 < 32) {
      EXPECT_EQ(box.y1 - box.y0, cut_h / 2 * 2);
    }
    area_sum += static_cast<double>(box.area()) / (32 * 24);
  }
  // Clipping at the borders makes the mean area less than E[1 - lam] = 1/2.
  EXPECT_LT(area_sum / 2000, 0.5);
  EXPECT_GT(area_sum / 2000, 0.2);
}

TEST(CutMix, SwitchProbChoosesBetweenCutmixAndMixup) {
  const int64_t B = 4, H = 16, W = 16;
  for (double switch_prob : {0.0, 0.5, 1.0}) {
    MixupOptions o;
    o.mixup_alpha = 1.0;
    o.cutmix_alpha = 1.0;
    o.switch_prob = switch_prob;
    int cutmix = 0, mixup = 0;
    for (uint64_t s = 0; s < 600; ++s) {
      Batch b = constant_batch(B, H, W);
      Rng rng(s);
      make_mixup(o)(b, rng);
      if (!b.label_mix.defined()) continue;
      bool pasted = true;  // every pixel of row 0 is 0 or 3
      const float* x = b.input.data<float>();
      for (int64_t k = 0; k < H * W; ++k) pasted = pasted && (x[k] == 0.0f || x[k] == 3.0f);
      (pasted ? cutmix : mixup) += 1;
    }
    const double share = static_cast<double>(cutmix) / (cutmix + mixup);
    EXPECT_NEAR(share, switch_prob, 0.06) << "switch_prob " << switch_prob;
  }
}

TEST(Mixup, IsDeterministicInsideALoaderWithWorkers) {
  class Images : public Dataset {
   public:
    int64_t size() const override { return 40; }
    Example get(int64_t i, Rng*) const override {
      return {Tensor::full({1, 4, 4}, static_cast<double>(i)), Tensor(), i % 3};
    }
    int64_t num_classes() const override { return 3; }
    std::string describe() const override { return "constant images"; }
  };
  auto data = std::make_shared<Images>();
  MixupOptions mo;
  mo.mixup_alpha = 0.8;
  mo.cutmix_alpha = 1.0;
  LoaderOptions lo;
  lo.batch_size = 8;
  lo.seed = 4;
  lo.transform = make_mixup(mo);
  DataLoader serial(data, lo);
  lo.workers = 2;
  DataLoader threaded(data, lo);
  Batch a, b;
  int mixed = 0;
  while (serial.next(a)) {
    ASSERT_TRUE(threaded.next(b));
    EXPECT_EQ(a.mix_lambda, b.mix_lambda);
    EXPECT_EQ(forge::testing::max_abs_diff(a.input, b.input), 0.0);
    ASSERT_EQ(a.label_mix.defined(), b.label_mix.defined());
    if (a.label_mix.defined()) {
      ++mixed;
      EXPECT_EQ(a.label_mix.to_vector<int64_t>(), b.label_mix.to_vector<int64_t>());
    }
  }
  EXPECT_EQ(mixed, 5);
}

TEST(Mixup, RejectsSequencesAndBadOptions) {
  Batch b;
  b.input = Tensor::zeros({2, 5}, DType::i64);
  b.label = Tensor::zeros({2}, DType::i64);
  MixupOptions o;
  o.mixup_alpha = 1;
  Rng rng(0);
  expect_error([&] { make_mixup(o)(b, rng); }, {"f32 [B, C, H, W] images", "i64 [2, 5]"});
  o.mixup_alpha = -1;
  expect_error([&] { make_mixup(o); }, {"alphas must be >= 0", "-1"});
  o.mixup_alpha = 1;
  o.prob = 1.5;
  expect_error([&] { make_mixup(o); }, {"prob must be in [0, 1]", "1.5"});
}

}  // namespace
}  // namespace forge::data
