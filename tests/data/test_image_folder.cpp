// ImageFolder on a small temporary tree (three classes, PNG and JPEG, gray and
// RGB, plus files and folders it must skip): order, labels, class names,
// examples, thread safety, and the errors for bad trees and files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/image_folder.h"
#include "data/image_io.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

namespace fs = std::filesystem;
using namespace forge::testing;

Image solid(int64_t h, int64_t w, int64_t c, uint8_t value) {
  Image im{h, w, c, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>(value + i % 7);
  return im;
}

void touch(const fs::path& p, const std::string& text = "x") {
  std::ofstream(p) << text;
}

// A fresh root folder per test, removed afterwards.
class ImageFolderTest : public ::testing::Test {
 protected:
  // root/bird: B2.JPG b1.png; root/cat: a.jpeg b.jpg c.png (gray);
  // root/dog: x.PNG, plus a text file, a hidden image and a subfolder that
  // are skipped; a hidden folder and a loose file at the top are skipped too.
  void make_tree() {
    for (const char* c : {"bird", "cat", "dog", ".cache"}) fs::create_directories(root_ / c);
    write_jpeg((root_ / "bird/B2.JPG").string(), solid(20, 24, 3, 10));
    write_png((root_ / "bird/b1.png").string(), solid(18, 30, 3, 20));
    write_jpeg((root_ / "cat/a.jpeg").string(), solid(22, 22, 3, 30));
    write_jpeg((root_ / "cat/b.jpg").string(), solid(16, 20, 1, 40));
    write_png((root_ / "cat/c.png").string(), solid(25, 17, 1, 50));
    write_png((root_ / "dog/x.PNG").string(), solid(19, 21, 3, 60));
    write_png((root_ / "dog/.hidden.png").string(), solid(4, 4, 3, 0));
    write_png((root_ / ".cache/y.png").string(), solid(4, 4, 3, 0));
    touch(root_ / "dog/notes.txt");
    touch(root_ / "readme.md");
    fs::create_directories(root_ / "dog/sub");
    write_png((root_ / "dog/sub/z.png").string(), solid(4, 4, 3, 0));
  }

  ImageFolderOptions options(int64_t size = 16) const {
    ImageFolderOptions o;
    o.root = root_.string();
    o.transform.size = size;
    return o;
  }

  testing::TempDir tmp_;
  const fs::path root_ = tmp_.path();
};

TEST_F(ImageFolderTest, ScansClassesAndFilesInOrder) {
  make_tree();
  const ImageFolder ds(options());
  EXPECT_EQ(ds.size(), 6);
  EXPECT_EQ(ds.num_classes(), 3);
  EXPECT_EQ(ds.class_names(), (std::vector<std::string>{"bird", "cat", "dog"}));
  const std::vector<std::string> files = {"bird/B2.JPG", "bird/b1.png", "cat/a.jpeg",
                                          "cat/b.jpg",   "cat/c.png",   "dog/x.PNG"};
  const std::vector<int64_t> labels = {0, 0, 1, 1, 1, 2};
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(ds.path(i), (root_ / files[static_cast<size_t>(i)]).string());
    EXPECT_EQ(ds.label(i), labels[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(ds.class_counts(), (std::vector<int64_t>{2, 3, 1}));
}

TEST_F(ImageFolderTest, GetReturnsTransformedImagesAndLabels) {
  make_tree();
  const ImageFolder ds(options(16));
  Rng rng(7);
  for (int64_t i = 0; i < ds.size(); ++i) {
    for (Rng* r : {static_cast<Rng*>(nullptr), &rng}) {
      const Example ex = ds.get(i, r);
      EXPECT_EQ(ex.input.shape(), (Shape{3, 16, 16})) << ds.path(i);
      EXPECT_EQ(ex.input.dtype(), DType::f32);
      EXPECT_EQ(ex.label, ds.label(i));
      EXPECT_FALSE(ex.input2.defined());
    }
  }
  // The eval example is transform_image of the decoded file.
  const Tensor expected = transform_image(read_image(ds.path(1)), ds.options().transform, nullptr);
  expect_close(ds.get(1, nullptr).input, expected, 0);

  ImageFolderOptions gray = options(8);
  gray.transform.grayscale = true;
  EXPECT_EQ(ImageFolder(gray).get(0, nullptr).input.shape(), (Shape{1, 8, 8}));
}

TEST_F(ImageFolderTest, AugmentationIsDeterministicPerRng) {
  make_tree();
  const ImageFolder ds(options(12));
  Rng a(Rng::mix({1, 2, 3})), b(Rng::mix({1, 2, 3})), c(Rng::mix({1, 2, 4}));
  const Tensor x = ds.get(2, &a).input;
  expect_close(ds.get(2, &b).input, x, 0);
  EXPECT_GT(forge::testing::max_abs_diff(ds.get(2, &c).input, x), 1e-4);
  expect_close(ds.get(2, nullptr).input, ds.get(2, nullptr).input, 0);
}

TEST_F(ImageFolderTest, GetIsThreadSafe) {
  make_tree();
  const ImageFolder ds(options(12));
  std::vector<Tensor> serial;
  for (int64_t i = 0; i < ds.size(); ++i) {
    Rng rng(Rng::mix({5, static_cast<uint64_t>(i)}));
    serial.push_back(ds.get(i, &rng).input);
  }
  std::vector<std::vector<Tensor>> results(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (int64_t i = ds.size() - 1; i >= 0; --i) {
          Rng rng(Rng::mix({5, static_cast<uint64_t>(i)}));
          results[t].push_back(ds.get(i, &rng).input);
        }
    });
  for (auto& th : threads) th.join();
  for (const auto& r : results) {
    ASSERT_EQ(static_cast<int64_t>(r.size()), 3 * ds.size());
    for (size_t k = 0; k < r.size(); ++k)
      expect_close(r[k], serial[static_cast<size_t>(ds.size()) - 1 - k % serial.size()], 0);
  }
}

TEST_F(ImageFolderTest, DescribeNamesTheRootAndCounts) {
  make_tree();
  const std::string d = ImageFolder(options(16)).describe();
  for (const std::string& part :
       {root_.string(), std::string("6 images"), std::string("3 classes"), std::string("3x16x16"),
        std::string("resize 18 + center crop 16")})
    EXPECT_NE(d.find(part), std::string::npos) << "'" << part << "' not in: " << d;
}

TEST_F(ImageFolderTest, BadTreesAreErrors) {
  const std::string missing = (root_ / "missing").string();
  expect_error([&] { ImageFolder({missing, {}}); }, {missing, "not an existing folder"});
  touch(root_ / "file");
  expect_error([&] { ImageFolder({(root_ / "file").string(), {}}); }, {"not an existing folder"});
  fs::remove(root_ / "file");

  fs::create_directories(root_ / "empty_root");
  touch(root_ / "empty_root/loose.png");
  const std::string empty_root = (root_ / "empty_root").string();
  expect_error([&] { ImageFolder({empty_root, {}}); }, {empty_root, "no class folders"});

  make_tree();
  fs::create_directories(root_ / "eel");
  touch(root_ / "eel/eel.txt");
  expect_error([&] { ImageFolder{options()}; }, {(root_ / "eel").string(), "no .png/.jpg/.jpeg"});

  ImageFolderOptions bad = options();
  bad.transform.crop_pct = 2;
  expect_error([&] { ImageFolder{bad}; }, {"crop_pct"});
  fs::remove_all(root_ / "eel");

  // A link to nothing, as an image or as a class, is refused, not skipped;
  // one that is no image name (notes.txt) is left alone, as such files are.
  fs::create_symlink(root_ / "dog/gone.png", root_ / "dog/link.png");
  expect_error([&] { ImageFolder{options()}; },
               {(root_ / "dog/link.png").string(), "symbolic link", "gone.png", "does not exist"});
  fs::remove(root_ / "dog/link.png");
  fs::create_directory_symlink(root_ / "gone_class", root_ / "fish");
  expect_error([&] { ImageFolder{options()}; }, {(root_ / "fish").string(), "does not exist"});
  fs::remove(root_ / "fish");
  fs::create_symlink(root_ / "dog/gone.txt", root_ / "dog/link.txt");
  EXPECT_EQ(ImageFolder{options()}.size(), 7);  // make_tree's 6 and empty_root's loose.png
}

TEST_F(ImageFolderTest, BadFilesAndIndicesAreErrors) {
  make_tree();
  touch(root_ / "dog/y.jpg", "not really a jpeg");
  const ImageFolder ds(options());
  ASSERT_EQ(ds.size(), 7);
  const std::string bad = (root_ / "dog/y.jpg").string();
  EXPECT_EQ(ds.path(6), bad);
  expect_error([&] { ds.get(6, nullptr); }, {bad, "not a PNG or JPEG"});
  expect_error([&] { ds.get(7, nullptr); }, {"index 7 is out of range [0, 7)"});
  expect_error([&] { ds.label(-1); }, {"index -1"});
}

// options.max_image_pixels reaches the decoder: bird/B2.JPG is 24x20 (480
// pixels), bird/b1.png 30x18 (540).
TEST_F(ImageFolderTest, MaxImagePixelsRefusesLargerImages) {
  make_tree();
  ImageFolderOptions o = options();
  o.max_image_pixels = 500;
  const ImageFolder ds(o);
  EXPECT_EQ(ds.get(0, nullptr).input.size(1), 16);
  expect_error([&] { ds.get(1, nullptr); }, {(root_ / "bird/b1.png").string(), "30x18",
                                             "limit of 500", "data.max_image_pixels"});
  o.max_image_pixels = 0;
  expect_error([&] { ImageFolder{o}; }, {"max_image_pixels must be at least 1, got 0"});
}

}  // namespace
}  // namespace forge::data
