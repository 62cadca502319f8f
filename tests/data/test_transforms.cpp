// Image transforms: hand-computed values for crop, flip, resize (bilinear up,
// antialiased down) and normalisation; RandomResizedCrop's bounds, fallback
// and determinism; and transform_image against the composition of the steps.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/transforms.h"
#include "tests/data/data_test_util.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

using namespace forge::testing;

// f32 [1, H, W] with value 10 * y + x.
Tensor grid(int64_t h, int64_t w) {
  std::vector<float> v;
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) v.push_back(static_cast<float>(10 * y + x));
  return Tensor::from_vector(v, {1, h, w});
}

ImageTransformOptions plain_options(int64_t size) {
  ImageTransformOptions o;
  o.size = size;
  o.mean = {0};
  o.std = {1};
  return o;
}

TEST(Transforms, ToTensorIsChwOver255) {
  Image im{1, 2, 3, {0, 51, 102, 153, 204, 255}};
  const Tensor t = to_tensor(im);
  EXPECT_EQ(t.shape(), (Shape{3, 1, 2}));
  expect_values(t, {0.0, 0.6, 0.2, 0.8, 0.4, 1.0}, 1e-6);
}

TEST(Transforms, ToGrayscaleUsesLuma) {
  Image im{1, 3, 3, {255, 0, 0, 0, 255, 0, 10, 20, 30}};
  const Image g = to_grayscale(im);
  ASSERT_EQ(g.channels, 1);
  // 0.299 * 255 = 76.2; 0.587 * 255 = 149.7; 2.99 + 11.74 + 3.42 = 18.15
  EXPECT_EQ(g.pixels, (std::vector<uint8_t>{76, 150, 18}));
}

TEST(Transforms, CenterCropTakesTheMiddle) {
  // 5x6, crop 3: top = round(1) = 1, left = round(1.5) = 2 (half to even).
  const Tensor c = center_crop(grid(5, 6), 3);
  EXPECT_EQ(c.shape(), (Shape{1, 3, 3}));
  expect_values(c, {12, 13, 14, 22, 23, 24, 32, 33, 34});
  // 7x7, crop 2: offset round(2.5) = 2.
  expect_values(center_crop(grid(7, 7), 2), {22, 23, 32, 33});
}

TEST(Transforms, CenterCropPadsWithZeros) {
  // 2x3 into 4: rows start at -1, columns at -0 (half the shortfall, rounded down).
  expect_values(center_crop(grid(2, 3), 4), {0, 0, 0, 0, 0, 1, 2, 0, 10, 11, 12, 0, 0, 0, 0, 0});
}

TEST(Transforms, HflipMirrorsTheWidth) {
  expect_values(hflip(grid(2, 3)), {2, 1, 0, 12, 11, 10});
  Rng rng(5);
  expect_values(random_horizontal_flip(grid(1, 2), 1.0, rng), {1, 0});
  expect_values(random_horizontal_flip(grid(1, 2), 0.0, rng), {0, 1});
  EXPECT_EQ(rng.counter(), 4u);  // one uniform (two Philox words) per call
}

TEST(Transforms, NormalizePerChannel) {
  Tensor t = Tensor::from_vector(std::vector<float>{0.5f, 1.0f, 0.0f, 0.25f}, {2, 1, 2});
  normalize_(t, {0.5, 0.25}, {0.5, 0.25});
  expect_values(t, {0, 1, -1, 0});
  Tensor u = Tensor::from_vector(std::vector<float>{0.5f, 1.0f}, {2, 1, 1});
  normalize_(u, {0.5}, {2});
  expect_values(u, {0, 0.25});
  expect_error([&] { normalize_(u, {0.1, 0.2, 0.3}, {1}); }, {"2-channel", "got 3"});
  expect_error([&] { normalize_(u, {0.1}, {0}); }, {"std[0] must be positive"});
}

TEST(Transforms, ResizeToTheSameSizeIsExact) {
  const Tensor g = grid(4, 5);
  expect_close(resize(g, 4, 5), g, 0);
}

TEST(Transforms, UpsamplingIsHalfPixelBilinear) {
  const Tensor row = Tensor::from_vector(std::vector<float>{0, 1}, {1, 1, 2});
  expect_values(resize(row, 1, 4), {0, 0.25, 0.75, 1}, 1e-6);
}

TEST(Transforms, DownsamplingAveragesWithAWideTriangle) {
  // Halving: output o is centred at 2o + 1, the triangle has radius 2 input
  // pixels, so inputs 2o-1 .. 2o+2 weigh 1, 3, 3, 1 (renormalised at the edges).
  const Tensor row = Tensor::from_vector(std::vector<float>{0, 8, 16, 24, 32, 40}, {1, 1, 6});
  expect_values(resize(row, 1, 3),
                {(0 * 3 + 8 * 3 + 16 * 1) / 7.0, (8 * 1 + 16 * 3 + 24 * 3 + 32 * 1) / 8.0,
                 (24 * 1 + 32 * 3 + 40 * 3) / 7.0},
                1e-5);
}

TEST(Transforms, ResizedCropOfAConstantIsConstant) {
  const Tensor c = Tensor::full({3, 9, 13}, 0.7);
  const Tensor r = resized_crop(c, CropBox{2, 3, 5, 7}, 11, 4);
  EXPECT_EQ(r.shape(), (Shape{3, 11, 4}));
  expect_close(r, Tensor::full({3, 11, 4}, 0.7), 1e-6);
  expect_error([&] { resized_crop(c, CropBox{5, 0, 5, 13}, 4, 4); }, {"not inside the 9x13"});
}

TEST(Transforms, ResizedCropOfAnAlignedBoxIsACrop) {
  // A box resized to its own size is the crop itself.
  const Tensor r = resized_crop(grid(5, 6), CropBox{1, 2, 2, 3}, 2, 3);
  expect_values(r, {12, 13, 14, 22, 23, 24});
}

TEST(Transforms, ShorterSideSize) {
  EXPECT_EQ(shorter_side_size(375, 500, 256), (std::pair<int64_t, int64_t>{256, 341}));
  EXPECT_EQ(shorter_side_size(500, 375, 256), (std::pair<int64_t, int64_t>{341, 256}));
  EXPECT_EQ(shorter_side_size(10, 10, 7), (std::pair<int64_t, int64_t>{7, 7}));
  EXPECT_EQ(resize_shorter_side(grid(4, 6), 2).shape(), (Shape{1, 2, 3}));
}

TEST(Transforms, RandomResizedCropStaysInItsBounds) {
  const double s_lo = 0.08, s_hi = 1, r_lo = 3.0 / 4, r_hi = 4.0 / 3;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const int64_t h = 40 + static_cast<int64_t>(seed % 7) * 13,
                  w = 50 + static_cast<int64_t>(seed % 5) * 17;
    Rng rng(seed);
    const CropBox b = random_resized_crop_box(h, w, s_lo, s_hi, r_lo, r_hi, rng);
    ASSERT_GT(b.height, 0);
    ASSERT_GT(b.width, 0);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, h);
    ASSERT_LE(b.left + b.width, w);
    // Before rounding w * h = area * scale and w / h = ratio; each side moved
    // by at most 0.5.
    const double area = static_cast<double>(h * w);
    EXPECT_GE((b.width + 0.5) * (b.height + 0.5), s_lo * area) << "seed " << seed;
    EXPECT_LE((b.width - 0.5) * (b.height - 0.5), s_hi * area) << "seed " << seed;
    EXPECT_GE((b.width + 0.5) / (b.height - 0.5), r_lo) << "seed " << seed;
    EXPECT_LE((b.width - 0.5) / (b.height + 0.5), r_hi) << "seed " << seed;
  }
}

TEST(Transforms, RandomResizedCropIsDeterministicPerSeed) {
  int differing = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Rng a(seed), b(seed), c(seed + 1000);
    const CropBox x = random_resized_crop_box(100, 120, 0.08, 1, 0.75, 4.0 / 3, a);
    const CropBox y = random_resized_crop_box(100, 120, 0.08, 1, 0.75, 4.0 / 3, b);
    const CropBox z = random_resized_crop_box(100, 120, 0.08, 1, 0.75, 4.0 / 3, c);
    EXPECT_TRUE(x.top == y.top && x.left == y.left && x.height == y.height && x.width == y.width);
    EXPECT_EQ(a.counter(), b.counter());
    differing += (x.top != z.top || x.left != z.left || x.height != z.height);
  }
  EXPECT_GE(differing, 15);
}

TEST(Transforms, RandomResizedCropFallsBackToACentredCrop) {
  // The whole area of a 100x10 image cannot fit any ratio in [3/4, 4/3]: after
  // ten attempts the crop is the full width, height round(10 / 0.75) = 13.
  Rng rng(1);
  CropBox b = random_resized_crop_box(100, 10, 1, 1, 0.75, 4.0 / 3, rng);
  EXPECT_EQ(rng.counter(), 40u);  // ten attempts, two uniforms each
  EXPECT_TRUE(b.top == 43 && b.left == 0 && b.height == 13 && b.width == 10);
  b = random_resized_crop_box(10, 100, 1, 1, 0.75, 4.0 / 3, rng);
  EXPECT_TRUE(b.top == 0 && b.left == 43 && b.height == 10 && b.width == 13);
  b = random_resized_crop_box(10, 12, 2, 3, 0.75, 4.0 / 3, rng);  // ratio in range: everything
  EXPECT_TRUE(b.top == 0 && b.left == 0 && b.height == 10 && b.width == 12);
}

TEST(Transforms, EvalCenterCropGivesTheKnownPixels) {
  // 6x8 RGB, size 6, crop_pct 1: the shorter side is already 6, so the result
  // is columns 1..6 (left = round(1.0)), in [0, 1].
  const Image im = pattern_image(6, 8, 3);
  ImageTransformOptions o = plain_options(6);
  o.crop_pct = 1;
  const Tensor t = transform_image(im, o, nullptr);
  ASSERT_EQ(t.shape(), (Shape{3, 6, 6}));
  std::vector<double> expected;
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < 6; ++y)
      for (int64_t x = 1; x < 7; ++x) expected.push_back(im.pixels[(y * 8 + x) * 3 + c] / 255.0);
  expect_values(t, expected, 1e-6);
}

TEST(Transforms, TrainFlipFlips) {
  // A full-image crop (scale 1, ratio 1 on a square) resized to its own size:
  // the output is the image, mirrored when the flip probability is 1.
  const Image im = pattern_image(8, 8, 3);
  ImageTransformOptions o = plain_options(8);
  o.scale_min = o.scale_max = 1;
  o.ratio_min = o.ratio_max = 1;
  Rng rng(3);
  o.hflip = 0;
  expect_close(transform_image(im, o, &rng), to_tensor(im), 1e-6);
  o.hflip = 1;
  expect_close(transform_image(im, o, &rng), hflip(to_tensor(im)), 1e-6);
}

TEST(Transforms, EvalPathIsResizeThenCenterCrop) {
  const Image im = pattern_image(30, 41, 3);
  ImageTransformOptions o;
  o.size = 16;  // resize the shorter side to floor(16 / 0.875) = 18, crop 16
  const Tensor t = transform_image(im, o, nullptr);
  Tensor expected = center_crop(resize_shorter_side(to_tensor(im), 18), 16);
  normalize_(expected, {0.485, 0.456, 0.406}, {0.229, 0.224, 0.225});
  expect_close(t, expected, 1e-5);
  // An rng with train = false changes nothing and draws nothing.
  o.train = false;
  Rng rng(9);
  expect_close(transform_image(im, o, &rng), t, 0);
  EXPECT_EQ(rng.counter(), 0u);
}

// The u8 path's resample (every channel of a pixel in one 4-lane step, the
// row widened with SSE4.1 where the build has it, taps unrolled for 5 to 9)
// against the f32 tensor path's scalar one, bicubic, in RGB and gray, from
// enlarging (5 taps) through shrinking by up to 2 (6 to 9) to shrinking by
// 4 (17): values in [64, 191] keep bicubic's overshoot inside [0, 255], so
// the u8 path's clipping never acts and the two agree to float rounding.
TEST(Transforms, U8ResampleEqualsTheScalarTensorResample) {
  for (int64_t c : {3, 1})
    for (const auto& [h, w] : {std::pair<int64_t, int64_t>{12, 15}, {21, 19}, {25, 33}, {30, 41},
                               {35, 36}, {72, 80}}) {
      Image im{h, w, c, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
      for (size_t i = 0; i < im.pixels.size(); ++i)
        im.pixels[i] = static_cast<uint8_t>(64 + (i * 7919 + i / 5 * 31) % 128);
      ImageTransformOptions o = plain_options(16);  // shorter side to 18, centre crop 16
      o.interpolation = Interpolation::bicubic;
      o.grayscale = c == 1;
      const Tensor expected = center_crop(
          resize_shorter_side(to_tensor(im), 18, Interpolation::bicubic), 16);
      expect_close(transform_image(im, o, nullptr), expected, 2e-6);
      if (c == 1) {  // a gray picture read as RGB: each channel the gray result
        o.grayscale = false;
        const std::vector<float> rgb = transform_image(im, o, nullptr).to_vector<float>();
        const std::vector<float> gray = expected.to_vector<float>();
        for (size_t i = 0; i < rgb.size(); ++i)
          EXPECT_NEAR(rgb[i], gray[i % gray.size()], 2e-6) << h << "x" << w << " at " << i;
      }
    }
}

TEST(Transforms, TrainPathIsCropResizeFlip) {
  const Image im = pattern_image(37, 29, 3);
  ImageTransformOptions o = plain_options(12);
  for (uint64_t seed = 0; seed < 10; ++seed) {
    Rng rng(seed), replay(seed);
    const Tensor t = transform_image(im, o, &rng);
    const CropBox box = random_resized_crop_box(37, 29, 0.08, 1, 0.75, 4.0 / 3, replay);
    Tensor expected = resized_crop(to_tensor(im), box, 12, 12);
    if (replay.bernoulli(0.5)) expected = hflip(expected);
    expect_close(t, expected, 1e-5);
    EXPECT_EQ(rng.counter(), replay.counter());
  }
}

TEST(Transforms, TrainPathIsDeterministicPerSeed) {
  const Image im = pattern_image(20, 24, 3);
  ImageTransformOptions o;
  o.size = 10;
  Rng a(42), b(42), c(43);
  const Tensor x = transform_image(im, o, &a);
  expect_close(transform_image(im, o, &b), x, 0);
  EXPECT_GT(forge::testing::max_abs_diff(transform_image(im, o, &c), x), 1e-3);
}

TEST(Transforms, OutputShapeIsAlwaysCxSizexSize) {
  ImageTransformOptions o;
  o.size = 9;
  Rng rng(0);
  for (const Image& im : {pattern_image(5, 40, 3), pattern_image(40, 5, 1), pattern_image(3, 3, 3),
                          pattern_image(1, 1, 1)}) {
    for (Rng* r : {&rng, static_cast<Rng*>(nullptr)}) {
      o.grayscale = false;
      EXPECT_EQ(transform_image(im, o, r).shape(), (Shape{3, 9, 9}));
      o.grayscale = true;
      EXPECT_EQ(transform_image(im, o, r).shape(), (Shape{1, 9, 9}));
    }
  }
}

TEST(Transforms, GrayInputIsReplicatedAndRgbCanBeConverted) {
  const Image gray = pattern_image(10, 12, 1);
  ImageTransformOptions o = plain_options(8);
  const Tensor t = transform_image(gray, o, nullptr);
  const Tensor one = transform_image(
      gray,
      [&] {
        ImageTransformOptions g = o;
        g.grayscale = true;
        return g;
      }(),
      nullptr);
  for (int64_t c = 0; c < 3; ++c) expect_close(t.slice0(c, c + 1), one, 0);

  const Image rgb = pattern_image(10, 12, 3);
  o.grayscale = true;
  expect_close(transform_image(rgb, o, nullptr), transform_image(to_grayscale(rgb), o, nullptr), 0);
}

TEST(Transforms, DefaultNormalisationIsImageNet) {
  const Image white{4, 4, 3, std::vector<uint8_t>(48, 255)};
  ImageTransformOptions o;
  o.size = 2;
  const Tensor t = transform_image(white, o, nullptr);
  std::vector<double> expected;
  const double mean[3] = {0.485, 0.456, 0.406}, std[3] = {0.229, 0.224, 0.225};
  for (int c = 0; c < 3; ++c)
    for (int k = 0; k < 4; ++k) expected.push_back((1 - mean[c]) / std[c]);
  expect_values(t, expected, 1e-5);
  o.grayscale = true;
  expect_values(transform_image(white, o, nullptr), std::vector<double>(4, (1 - 0.449) / 0.226),
                1e-5);
}

TEST(Transforms, OptionsAreChecked) {
  const Image im = pattern_image(4, 4, 3);
  auto with = [](auto change) {
    ImageTransformOptions o;
    change(o);
    return o;
  };
  expect_error([&] { transform_image(im, with([](auto& o) { o.size = 0; }), nullptr); },
               {"size must be positive"});
  expect_error([&] { transform_image(im, with([](auto& o) { o.scale_min = 2; }), nullptr); },
               {"scale_min <= scale_max", "[2, 1]"});
  expect_error([&] { transform_image(im, with([](auto& o) { o.ratio_min = 0; }), nullptr); },
               {"ratio"});
  expect_error([&] { transform_image(im, with([](auto& o) { o.hflip = 1.5; }), nullptr); },
               {"hflip"});
  expect_error([&] { transform_image(im, with([](auto& o) { o.crop_pct = 0; }), nullptr); },
               {"crop_pct"});
  expect_error(
      [&] {
        transform_image(im, with([](auto& o) { o.mean = {0, 0}; }), nullptr);
      },
      {"mean needs 3 values", "got 2"});
  expect_error(
      [&] {
        transform_image(im, with([](auto& o) { o.std = {1, 1, -1}; }), nullptr);
      },
      {"std values must be positive"});
  expect_error(
      [&] {
        transform_image(Image{2, 2, 4, std::vector<uint8_t>(16)}, {}, nullptr);
      },
      {"1 or 3 channels, got 4"});
}

}  // namespace
}  // namespace forge::data
