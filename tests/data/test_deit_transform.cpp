// The DeiT train and eval transforms (data/transforms.h) as a whole:
// - bicubic (and bilinear) resizes against PIL's Image.resize, through
//   tests/data/check_resize_pil.py (PIL rounds to 8 bits after each pass, we
//   keep f32: at most about 1/255 apart);
// - the train transform with RandAugment, colour jitter and random erasing is
//   exactly its steps composed in timm's order, drawing in the documented order;
// - a file's transform plans the crop on the full size and decodes a JPEG at a
//   reduced scale only where the crop is resized down enough, with the same
//   draws, close to the full decode;
// - the loader's batches of an image folder with every augmentation on are the
//   same for any number of workers, and differ between seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "data/image_folder.h"
#include "data/loader.h"
#include "data/synthetic_images.h"
#include "data/transforms.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

// A deterministic RGB picture with gradients, edges and noise.
Image picture(int64_t h, int64_t w, uint64_t seed) {
  Image im{h, w, 3, std::vector<uint8_t>(static_cast<size_t>(h * w * 3))};
  Rng rng(seed);
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      uint8_t* p = im.pixels.data() + (y * w + x) * 3;
      p[0] = static_cast<uint8_t>((255 * x) / std::max<int64_t>(w - 1, 1));
      p[1] = static_cast<uint8_t>(((x / 5 + y / 7) % 2) ? 230 : 20);
      p[2] = static_cast<uint8_t>(rng.randint(256));
    }
  return im;
}

ImageTransformOptions unnormalised(int64_t size, Interpolation interp) {
  ImageTransformOptions o;
  o.size = size;
  o.interpolation = interp;
  o.mean = {0.0};
  o.std = {1.0};
  return o;
}

TEST(DeitTransform, EvalResizesAgreeWithPil) {
  const testing::TempDir dir;
  std::ofstream cases(dir.file("cases.txt"));
  int k = 0;
  // (height, width, size, crop_pct): upsampling, mild and 6x downsampling.
  const std::vector<std::tuple<int64_t, int64_t, int64_t, double>> shapes = {
      {37, 53, 24, 0.875}, {53, 37, 48, 0.875}, {150, 200, 24, 0.875}, {61, 61, 32, 1.0}};
  for (const auto& [h, w, size, crop_pct] : shapes)
    for (Interpolation interp : {Interpolation::bilinear, Interpolation::bicubic}) {
      const Image im = picture(h, w, static_cast<uint64_t>(k));
      ImageTransformOptions o = unnormalised(size, interp);
      o.crop_pct = crop_pct;
      const Tensor t = transform_image(im, o, nullptr);
      write_png(dir.file(fmt::format("in{}.png", k)), im);
      std::ofstream(dir.file(fmt::format("out{}.f32", k)), std::ios::binary)
          .write(static_cast<const char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
      cases << k << " " << size << " " << crop_pct << " "
            << (interp == Interpolation::bicubic ? "bicubic" : "bilinear") << "\n";
      ++k;
    }
  cases.close();
  if (std::system("/usr/bin/python3 -c 'import PIL, numpy' 2>/dev/null") != 0)
    GTEST_SKIP() << "/usr/bin/python3 lacks PIL or numpy (scripts/install-deps.sh installs them)";
  const std::string cmd = fmt::format("/usr/bin/python3 {}/tests/data/check_resize_pil.py {}",
                                      FORGE_SOURCE_DIR, dir.str());
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(DeitTransform, TrainTransformIsItsStepsInTimmsOrder) {
  ImageTransformOptions o;
  o.size = 20;
  o.interpolation = Interpolation::bicubic;
  o.rand_augment = true;
  o.rand_augment_options = parse_rand_augment("rand-m9-mstd0.5-inc1");
  o.color_jitter = {0.4, 0.4, 0.4, 0.1};
  o.erasing.prob = 0.5;
  // The u8 crop alone: no augmentation op applies (prob 0), no normalisation.
  ImageTransformOptions crop_only = o;
  crop_only.rand_augment_options.prob = 0;
  crop_only.color_jitter = {};
  crop_only.erasing.prob = 0;
  crop_only.mean = {0.0};
  crop_only.std = {1.0};
  const Image im = picture(41, 57, 7);
  for (uint64_t seed = 0; seed < 30; ++seed) {
    Rng a(seed), b(seed);
    const Tensor got = transform_image(im, o, &a);
    const Tensor crop_t = transform_image(im, crop_only, &b);
    // The steps by hand: the crop's draws, then RandAugment, jitter, erasing.
    Rng r(seed);
    random_resized_crop_box(im.height, im.width, o.scale_min, o.scale_max, o.ratio_min, o.ratio_max,
                            r);
    r.bernoulli(o.hflip);
    Image crop{o.size, o.size, 3, std::vector<uint8_t>(static_cast<size_t>(3 * o.size * o.size))};
    const float* c = crop_t.data<float>();
    for (int64_t ch = 0; ch < 3; ++ch)
      for (int64_t i = 0; i < o.size * o.size; ++i)
        crop.pixels[static_cast<size_t>(i * 3 + ch)] =
            static_cast<uint8_t>(std::lround(c[ch * o.size * o.size + i] * 255.0f));
    rand_augment(crop, o.rand_augment_options, r);
    color_jitter(crop, o.color_jitter, r);
    Tensor want = to_tensor(crop);
    normalize_(want, effective_mean(o), effective_std(o));
    random_erasing(want, o.erasing, r);
    EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>()) << "seed " << seed;
    EXPECT_EQ(a.counter(), r.counter()) << "seed " << seed;
  }
}

TEST(DeitTransform, AFileIsPlannedOnItsFullSizeAndDecodedSmallerOnlyWhenThatIsSafe) {
  const Image big = picture(480, 640, 3);
  const std::vector<uint8_t> jpeg = encode_jpeg(big, 92);
  const Image full = decode_image(jpeg, "big.jpg");
  ImageTransformOptions o;
  o.size = 32;
  o.interpolation = Interpolation::bicubic;
  ImageTransformOptions no_scale = o;
  no_scale.scaled_jpeg_decode = false;
  // Eval: 480 -> 36 is a 13x reduction, decoded at 1/8; close to the full decode.
  const Tensor eval_scaled = transform_image_file(jpeg, "big.jpg", o, nullptr);
  const Tensor eval_full = transform_image_file(jpeg, "big.jpg", no_scale, nullptr);
  EXPECT_EQ(eval_full.to_vector<float>(), transform_image(full, o, nullptr).to_vector<float>());
  double diff = 0;
  const auto s = eval_scaled.to_vector<float>(), f = eval_full.to_vector<float>();
  for (size_t i = 0; i < s.size(); ++i) diff += std::abs(s[i] - f[i]);
  EXPECT_LT(diff / static_cast<double>(s.size()), 0.05);  // normalised units (std ~0.22)
  EXPECT_GT(diff, 0);                                     // it did decode at another scale
  // Train: the draws are the full-size plan's whatever the scale.
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Rng a(seed), b(seed), c(seed);
    const Tensor scaled = transform_image_file(jpeg, "big.jpg", o, &a);
    const Tensor plain = transform_image_file(jpeg, "big.jpg", no_scale, &b);
    EXPECT_EQ(plain.to_vector<float>(), transform_image(full, o, &c).to_vector<float>());
    EXPECT_EQ(a.counter(), b.counter());
    EXPECT_EQ(scaled.shape(), plain.shape());
  }
  // A PNG is always decoded whole.
  const std::vector<uint8_t> png = encode_png(big);
  EXPECT_EQ(transform_image_file(png, "big.png", o, nullptr).to_vector<float>(),
            transform_image(big, o, nullptr).to_vector<float>());
}

TEST(DeitTransform, ImageFolderBatchesAreTheSameForAnyWorkerCountAndDifferBySeed) {
  const testing::TempDir dir;
  SyntheticImagesOptions g;
  g.classes = 3;
  g.train_per_class = 6;
  g.eval_per_class = 1;
  write_synthetic_image_folder(dir.str(), g);
  ImageFolderOptions f;
  f.root = dir.file("train");
  f.transform.size = 24;
  f.transform.interpolation = Interpolation::bicubic;
  f.transform.rand_augment = true;
  f.transform.rand_augment_options = parse_rand_augment("rand-m9-mstd0.5-inc1");
  f.transform.erasing.prob = 0.25;
  auto data = std::make_shared<ImageFolder>(f);
  const auto batches = [&](int workers, uint64_t seed) {
    DataLoader loader(data, {.batch_size = 4, .seed = seed, .workers = workers, .repeats = 3});
    std::vector<std::vector<float>> out;
    for (int epoch = 0; epoch < 2; ++epoch)
      for (Batch b; loader.next(b);) out.push_back(b.input.to_vector<float>());
    return out;
  };
  const auto serial = batches(0, 5);
  EXPECT_EQ(serial.size(), 10u);  // 18 images in batches of 4: 5 an epoch
  EXPECT_EQ(batches(3, 5), serial);
  EXPECT_EQ(batches(1, 5), serial);
  EXPECT_NE(batches(2, 6), serial);
}

}  // namespace
}  // namespace forge::data
