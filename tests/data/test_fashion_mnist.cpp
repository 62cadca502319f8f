// Fashion-MNIST and the IDX reader: small IDX files written here (gzip and
// plain) read back exactly, every kind of broken file named in its error,
// augmentation, and the real dataset when Debian's dataset-fashion-mnist is
// installed (sizes, class histogram, first labels).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include "data/fashion_mnist.h"
#include "data/idx.h"
#include "data/loader.h"
#include "tests/data/data_test_util.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

namespace fs = std::filesystem;
using namespace forge::testing;

const char* kRealRoot = "/usr/share/datasets/fashion-mnist";

// The bytes of an IDX u8 file: magic 00 00 08 ndims, big-endian dims, data.
std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims,
                               const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(d >> shift));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Pixel k of image i in the small test set.
uint8_t pixel(int64_t i, int64_t k) {
  return static_cast<uint8_t>((37 * i + 11 * k) % 256);
}

// IDX files written to a fresh directory per test, removed afterwards.
class FashionMnistFiles : public testing::TempDirTest {
 protected:
  static constexpr int64_t kImages = 5;
  const std::vector<uint8_t> labels_ = {9, 0, 3, 7, 0};

  std::vector<uint8_t> images(int64_t n) const {
    std::vector<uint8_t> px;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < 784; ++k) px.push_back(pixel(i, k));
    return idx_bytes({static_cast<uint32_t>(n), 28, 28}, px);
  }
  std::vector<uint8_t> labels() const {
    return idx_bytes({static_cast<uint32_t>(labels_.size())}, labels_);
  }
  // The four files, gzip-compressed.
  void write_split(const std::string& prefix) {
    write_gz(path(prefix + "-images-idx3-ubyte.gz"), images(kImages));
    write_gz(path(prefix + "-labels-idx1-ubyte.gz"), labels());
  }
  FashionMnistOptions opts(const std::string& split = "train", bool normalize = false) const {
    FashionMnistOptions o;
    o.root = dir_.string();
    o.split = split;
    o.normalize = normalize;
    return o;
  }
};

TEST_F(FashionMnistFiles, ReadsGzipFilesExactly) {
  write_split("train");
  const FashionMnist data(opts());
  ASSERT_EQ(data.size(), kImages);
  EXPECT_EQ(data.num_classes(), 10);
  EXPECT_EQ(data.height(), 28);
  EXPECT_EQ(data.width(), 28);
  for (int64_t i = 0; i < kImages; ++i) {
    const Example ex = data.get(i, nullptr);
    EXPECT_EQ(ex.label, labels_[static_cast<size_t>(i)]);
    EXPECT_EQ(data.label(i), ex.label);
    ASSERT_EQ(ex.input.shape(), (Shape{1, 28, 28}));
    ASSERT_EQ(ex.input.dtype(), DType::f32);
    const float* p = ex.input.data<float>();
    for (int64_t k = 0; k < 784; ++k) {
      ASSERT_EQ(data.pixels(i)[k], pixel(i, k));
      ASSERT_FLOAT_EQ(p[k], static_cast<float>(pixel(i, k) / 255.0)) << i << " " << k;
    }
  }
  EXPECT_NE(data.describe().find("Fashion-MNIST train: 5 images 1x28x28"), std::string::npos)
      << data.describe();
  EXPECT_EQ(std::string(FashionMnist::label_names()[9]), "Ankle boot");
}

TEST_F(FashionMnistFiles, NormalisesWithTheGivenMeanAndStd) {
  write_split("t10k");
  FashionMnistOptions o = opts("test", true);
  o.mean = 0.25;
  o.std = 0.5;
  const FashionMnist data(o);
  const Example ex = data.get(3, nullptr);
  for (int64_t k : {0, 100, 783})
    EXPECT_NEAR(ex.input.data<float>()[k], (pixel(3, k) / 255.0 - 0.25) / 0.5, 1e-6);
  EXPECT_NE(data.describe().find("normalised (mean 0.25, std 0.5)"), std::string::npos);
}

TEST_F(FashionMnistFiles, AcceptsUncompressedFiles) {
  write_file(path("train-images-idx3-ubyte"), images(kImages));
  write_file(path("train-labels-idx1-ubyte"), labels());
  const FashionMnist data(opts());
  EXPECT_EQ(data.size(), kImages);
  EXPECT_EQ(data.get(4, nullptr).input.data<float>()[5], static_cast<float>(pixel(4, 5) / 255.0));
}

TEST_F(FashionMnistFiles, MissingDirectoryOrFileNamesThePathAndThePackage) {
  FashionMnistOptions o = opts();
  o.root = path("nowhere");
  expect_error([&] { FashionMnist{o}; },
               {path("nowhere"), "dataset-fashion-mnist", "data.root", "does not exist"});
  write_gz(path("train-images-idx3-ubyte.gz"), images(kImages));
  expect_error([&] { FashionMnist{opts()}; },
               {path("train-labels-idx1-ubyte.gz"), path("train-labels-idx1-ubyte"),
                "dataset-fashion-mnist"});
  expect_error([&] { FashionMnist{opts("validation")}; }, {"'train' or 'test'", "validation"});
}

TEST_F(FashionMnistFiles, TruncatedFilesNameTheExpectedAndFoundByteCounts) {
  auto bytes = images(kImages);  // 16 header bytes, 5 * 784 = 3920 data bytes
  write_gz(path("train-images-idx3-ubyte.gz"),
           std::vector<uint8_t>(bytes.begin(), bytes.begin() + 16 + 3620));
  write_gz(path("train-labels-idx1-ubyte.gz"), labels());
  expect_error([&] { FashionMnist{opts()}; },
               {"train-images-idx3-ubyte.gz", "truncated", "3920 data bytes", "found 3620"});

  // A gzip stream cut short: zlib's complaint is passed on.
  write_gz(path("whole.gz"), images(kImages));
  std::ifstream in(path("whole.gz"), std::ios::binary);
  std::vector<char> gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(path("cut.gz"), std::ios::binary)
      .write(gz.data(), static_cast<std::streamsize>(gz.size() / 2));
  expect_error([&] { read_idx(path("cut.gz")); }, {"cut.gz", "truncated"});

  bytes = images(kImages);
  bytes.push_back(1);
  write_file(path("long"), bytes);
  expect_error([&] { read_idx(path("long")); }, {"'" + path("long") + "'", "found more"});
}

TEST_F(FashionMnistFiles, BadMagicAndWrongKindsOfFileAreErrors) {
  auto bytes = images(kImages);
  bytes[0] = 0x1f;
  write_gz(path("train-images-idx3-ubyte.gz"), bytes);
  write_gz(path("train-labels-idx1-ubyte.gz"), labels());
  expect_error([&] { FashionMnist{opts()}; },
               {"train-images-idx3-ubyte.gz", "not an IDX file", "1f 00 08 03"});

  bytes = images(kImages);
  bytes[2] = 0x0d;  // f32 elements
  write_gz(path("train-images-idx3-ubyte.gz"), bytes);
  expect_error([&] { FashionMnist{opts()}; }, {"element type 0x0d"});

  // Labels where images belong.
  write_gz(path("train-images-idx3-ubyte.gz"), labels());
  expect_error([&] { FashionMnist{opts()}; },
               {"train-images-idx3-ubyte.gz", "[N, H, W]", "found 1 dimensions"});
}

TEST_F(FashionMnistFiles, CountMismatchAndBadLabelsAreErrors) {
  write_gz(path("train-images-idx3-ubyte.gz"), images(4));
  write_gz(path("train-labels-idx1-ubyte.gz"), labels());
  expect_error([&] { FashionMnist{opts()}; }, {"holds 4 images", "holds 5 labels"});

  write_gz(path("train-images-idx3-ubyte.gz"), images(3));
  write_gz(path("train-labels-idx1-ubyte.gz"), idx_bytes({3}, {1, 12, 2}));
  expect_error([&] { FashionMnist{opts()}; }, {"label 12 at index 1", "0..9"});
}

TEST_F(FashionMnistFiles, ReadIdxReadsAnyU8Array) {
  std::vector<uint8_t> data(2 * 3 * 4);
  for (size_t k = 0; k < data.size(); ++k) data[k] = static_cast<uint8_t>(k * 7);
  write_gz(path("a.idx.gz"), idx_bytes({2, 3, 4}, data));
  const IdxArray a = read_idx(path("a.idx.gz"));
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(a.data, data);
  expect_error([&] { read_idx(path("none.gz")); }, {path("none.gz"), "does not exist"});
}

TEST_F(FashionMnistFiles, AugmentationCropsAndFlipsOnlyWithAnRng) {
  write_split("train");
  FashionMnistOptions o = opts();
  o.random_crop_padding = 2;
  o.hflip = true;
  const FashionMnist data(o);
  const Example plain = data.get(1, nullptr);
  for (int64_t k = 0; k < 784; ++k)
    ASSERT_EQ(plain.input.data<float>()[k], static_cast<float>(pixel(1, k) / 255.0));

  // Each augmented view is the image shifted by (dy, dx) in [-2, 2], zero
  // filled, maybe mirrored; over 200 draws every shift and both flips occur.
  std::set<std::tuple<int64_t, int64_t, bool>> seen;
  for (uint64_t s = 0; s < 200; ++s) {
    Rng rng(s);
    const Example ex = data.get(1, &rng);
    const float* p = ex.input.data<float>();
    bool found = false;
    for (int64_t dy = -2; dy <= 2 && !found; ++dy)
      for (int64_t dx = -2; dx <= 2 && !found; ++dx)
        for (bool flip : {false, true}) {
          bool match = true;
          for (int64_t y = 0; y < 28 && match; ++y)
            for (int64_t x = 0; x < 28 && match; ++x) {
              const int64_t sy = y + dy, sx = (flip ? 27 - x : x) + dx;
              const float v = sy >= 0 && sy < 28 && sx >= 0 && sx < 28
                                  ? static_cast<float>(pixel(1, sy * 28 + sx) / 255.0)
                                  : 0.0f;
              match = p[y * 28 + x] == v;
            }
          if (match) {
            seen.insert({dy, dx, flip});
            found = true;
            break;
          }
        }
    ASSERT_TRUE(found) << "seed " << s;
    Rng again(s);
    EXPECT_EQ(std::memcmp(p, data.get(1, &again).input.data<float>(), 784 * sizeof(float)), 0);
  }
  EXPECT_EQ(seen.size(), 50u);
}

// ---- the real dataset (Debian package dataset-fashion-mnist) ----

bool real_data_present() {
  return fs::exists(fs::path(kRealRoot) / "train-images-idx3-ubyte.gz") &&
         fs::exists(fs::path(kRealRoot) / "t10k-labels-idx1-ubyte.gz");
}

TEST(FashionMnistReal, SizesHistogramAndFirstLabels) {
  if (!real_data_present())
    GTEST_SKIP() << kRealRoot << " not found (Debian package dataset-fashion-mnist)";
  FashionMnistOptions o;
  o.normalize = false;
  const FashionMnist train(o);
  o.split = "test";
  const FashionMnist test(o);
  ASSERT_EQ(train.size(), 60000);
  ASSERT_EQ(test.size(), 10000);
  std::vector<int64_t> train_hist(10), test_hist(10);
  for (int64_t i = 0; i < train.size(); ++i) ++train_hist[static_cast<size_t>(train.label(i))];
  for (int64_t i = 0; i < test.size(); ++i) ++test_hist[static_cast<size_t>(test.label(i))];
  EXPECT_EQ(train_hist, std::vector<int64_t>(10, 6000));
  EXPECT_EQ(test_hist, std::vector<int64_t>(10, 1000));
  // Checked against the files with Python's gzip module.
  EXPECT_EQ(train.label(0), 9);
  EXPECT_EQ(train.label(1), 0);
  EXPECT_EQ(test.label(0), 9);
  EXPECT_EQ(test.label(1), 2);
  int64_t sum = 0;
  for (int64_t k = 0; k < 784; ++k) sum += train.pixels(0)[k];
  EXPECT_EQ(sum, 76247);
  const Example ex = train.get(0, nullptr);
  EXPECT_EQ(ex.input.shape(), (Shape{1, 28, 28}));
  EXPECT_FLOAT_EQ(ex.input.data<float>()[400], static_cast<float>(train.pixels(0)[400] / 255.0));
}

TEST(FashionMnistReal, LoaderBatchesAreNormalisedAndFast) {
  if (!real_data_present())
    GTEST_SKIP() << kRealRoot << " not found (Debian package dataset-fashion-mnist)";
  FashionMnistOptions fo;
  fo.split = "test";
  auto data = std::make_shared<FashionMnist>(fo);
  LoaderOptions lo;
  lo.batch_size = 256;
  lo.seed = 1;
  DataLoader loader(data, lo);
  Batch b;
  double sum = 0, sq = 0;
  int64_t n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (loader.next(b)) {
    const float* p = b.input.data<float>();
    for (int64_t k = 0; k < b.input.numel(); ++k) {
      sum += p[k];
      sq += double{p[k]} * p[k];
    }
    n += b.input.numel();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The test split's statistics are close to the training split's mean / std.
  const double mean = sum / static_cast<double>(n);
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(n) - mean * mean), 1.0, 0.02);
  EXPECT_EQ(n, 10000 * 784);
  RecordProperty("epoch_of_test_split_ms", static_cast<int>(seconds * 1e3));
  EXPECT_LT(seconds, 2.0);  // 40 batches of 256
}

}  // namespace
}  // namespace forge::data
