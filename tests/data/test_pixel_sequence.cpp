// PixelSequence: known pixels to known tokens for gray and RGB images, the
// [0, 1] check that catches normalised input, the rng passed through, and
// Fashion-MNIST's raw bytes coming back as tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "data/fashion_mnist.h"
#include "data/pixel_sequence.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

using forge::testing::expect_error;

// Returns the given image for every index; adds rng->uniform() / 4 to pixel 0
// when given an rng.
class FixedImages : public Dataset {
 public:
  explicit FixedImages(Tensor image) : image_(std::move(image)) {}
  int64_t size() const override { return 3; }
  Example get(int64_t i, Rng* rng) const override {
    Example ex{image_.clone(), Tensor(), i + 4};
    if (rng) ex.input.data<float>()[0] += static_cast<float>(rng->uniform() / 4);
    return ex;
  }
  int64_t num_classes() const override { return 7; }
  std::string describe() const override { return "fixed images"; }

 private:
  Tensor image_;
};

TEST(PixelSequence, GrayPixelsBecomeTokensTimes255Rounded) {
  const std::vector<float> px = {0.0f, 1.0f, 0.5f, 0.2f, 1.0f / 255, 254.6f / 255};
  PixelSequence seq(std::make_shared<FixedImages>(Tensor::from_vector(px, {1, 2, 3})));
  EXPECT_EQ(seq.size(), 3);
  EXPECT_EQ(seq.num_classes(), 7);
  EXPECT_EQ(PixelSequence::kVocabSize, 256);
  EXPECT_EQ(seq.describe(), "pixel sequences (vocabulary 256) of fixed images");
  const Example ex = seq.get(1, nullptr);
  EXPECT_EQ(ex.label, 5);
  EXPECT_EQ(ex.input.dtype(), DType::i64);
  EXPECT_EQ(ex.input.shape(), (Shape{6}));
  EXPECT_EQ(ex.input.to_vector<int64_t>(), (std::vector<int64_t>{0, 255, 128, 51, 1, 255}));
}

TEST(PixelSequence, RgbPixelsUseRec601Luma) {
  // Pixels (row-major, 2x2): red, green, blue, white. Channel-major storage.
  const std::vector<float> px = {1, 0, 0, 1,  //
                                 0, 1, 0, 1,  //
                                 0, 0, 1, 1};
  PixelSequence seq(std::make_shared<FixedImages>(Tensor::from_vector(px, {3, 2, 2})));
  // 0.299 * 255 = 76.2, 0.587 * 255 = 149.7, 0.114 * 255 = 29.1.
  EXPECT_EQ(seq.get(0, nullptr).input.to_vector<int64_t>(),
            (std::vector<int64_t>{76, 150, 29, 255}));
}

TEST(PixelSequence, ValuesOutsideUnitRangeAskToTurnNormalisationOff) {
  PixelSequence neg(
      std::make_shared<FixedImages>(Tensor::from_vector<float>({0.1f, -0.4f}, {1, 1, 2})));
  expect_error([&] { neg.get(2, nullptr); },
               {"example 2", "-0.4", "outside [0, 1]", "unnormalised", "normalize: false"});
  PixelSequence big(std::make_shared<FixedImages>(Tensor::from_vector<float>({1.5f}, {1, 1, 1})));
  expect_error([&] { big.get(0, nullptr); }, {"1.5", "outside [0, 1]"});
  PixelSequence two(std::make_shared<FixedImages>(Tensor::zeros({2, 2, 2})));
  expect_error([&] { two.get(0, nullptr); }, {"C = 1 or 3", "[2, 2, 2]"});
  expect_error([] { PixelSequence(nullptr); }, {"null"});
}

TEST(PixelSequence, PassesTheRngToTheWrappedDataset) {
  auto images = std::make_shared<FixedImages>(Tensor::zeros({1, 1, 2}));
  PixelSequence seq(images);
  Rng a(9), b(9);
  const int64_t expected = std::llround(255 * static_cast<float>(b.uniform() / 4));
  EXPECT_EQ(seq.get(0, &a).input.to_vector<int64_t>(), (std::vector<int64_t>{expected, 0}));
  EXPECT_GT(expected, 0);
  EXPECT_EQ(a.counter(), b.counter());
}

TEST(PixelSequence, FashionMnistBytesComeBackAsTokens) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "/usr/share/datasets/fashion-mnist not found (dataset-fashion-mnist)";
  FashionMnistOptions o;
  o.split = "test";
  o.normalize = false;
  auto images = std::make_shared<FashionMnist>(o);
  PixelSequence seq(images);
  for (int64_t i : {0, 1234, 9999}) {
    const auto tokens = seq.get(i, nullptr).input.to_vector<int64_t>();
    ASSERT_EQ(tokens.size(), 784u);
    for (size_t k = 0; k < 784; ++k) ASSERT_EQ(tokens[k], images->pixels(i)[k]) << i << " " << k;
  }
  o.normalize = true;
  PixelSequence normalised(std::make_shared<FashionMnist>(o));
  expect_error([&] { normalised.get(0, nullptr); }, {"outside [0, 1]"});
}

}  // namespace
}  // namespace forge::data
