// build_data's checks on what the recipe's data gives the model: the training
// and evaluation splits must give examples of one shape (the model is built
// for the evaluation split's), an empty split or a batch larger than the data
// is refused before training, and model.image_size names where the images
// come from. Each error names the datasets (their descriptions carry the paths).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "data/image_io.h"
#include "data/pathfinder.h"
#include "tests/test_util.h"
#include "train/data.h"
#include "train/model.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using namespace forge::testing;

// An uncompressed IDX u8 file: magic 00 00 08 ndims, big-endian dims, data.
void write_idx(const fs::path& path, const std::vector<uint32_t>& dims) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  size_t count = 1;
  for (uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(d >> shift));
    count *= d;
  }
  out.resize(out.size() + count, 3);  // label 3, pixel value 3
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
}

// Fashion-MNIST's two splits: n_train images of side train_side ("train")
// and n_test of side test_side ("t10k").
void write_fashion_mnist(const fs::path& root, uint32_t n_train, uint32_t train_side,
                         uint32_t n_test, uint32_t test_side) {
  for (const auto& [prefix, n, side] :
       {std::tuple{"train", n_train, train_side}, std::tuple{"t10k", n_test, test_side}}) {
    write_idx(root / (std::string(prefix) + "-images-idx3-ubyte"), {n, side, side});
    write_idx(root / (std::string(prefix) + "-labels-idx1-ubyte"), {n});
  }
}

Recipe recipe(const std::string& dataset, const std::string& root) {
  Recipe r;
  r.set("data.dataset=" + dataset);
  r.set("data.root=" + root);
  return r;
}

TaskData build(const Recipe& r, const TempDir&) {
  return build_data(r, "", true, [](const std::string&) {});
}

// Training images 32x32, evaluation images 28x28: the ViT's forward found it
// first, naming no file.
TEST(DataChecks, TrainAndEvalImagesOfDifferentSizesAreRefused) {
  TempDir dir;
  write_fashion_mnist(dir.path(), 3, 32, 3, 28);
  expect_error([&] { build(recipe("fashion_mnist", dir.str()), dir); },
               {"training split's examples are f32 [1, 32, 32]",
                "Fashion-MNIST train: 3 images 1x32x32 from " + dir.str(),
                "evaluation split's are f32 [1, 28, 28]",
                "Fashion-MNIST test: 3 images 1x28x28 from " + dir.str()});
}

// Pathfinder splits of 32x32 and 16x16 images give pixel sequences of 1024 and 256.
TEST(DataChecks, PathfinderSplitsOfDifferentSizesAreRefused) {
  TempDir dir;
  data::PathfinderGenConfig small;
  small.height = small.width = 16;
  small.path_dashes = 3;
  small.num_distractors = 0;
  data::write_pathfinder(dir.file("train"), data::generate_pathfinder({}, 2, 1));
  data::write_pathfinder(dir.file("test"), data::generate_pathfinder(small, 2, 1));
  expect_error([&] { build(recipe("pathfinder", dir.str()), dir); },
               {"i64 [1024]", "Pathfinder " + dir.file("train") + ": 2 images 1x32x32", "i64 [256]",
                "Pathfinder " + dir.file("test") + ": 2 images 1x16x16"});
}

TEST(DataChecks, AnEmptySplitIsRefused) {
  TempDir dir;
  write_fashion_mnist(dir.path(), 0, 28, 3, 28);
  expect_error([&] { build(recipe("fashion_mnist", dir.str()), dir); },
               {"training split", "Fashion-MNIST train: 0 images", "no examples"});
}

// data.limit_train=2 with loop.batch_size=5 made "0 batches per epoch" and a
// trainer that spun forever; the training loader now refuses it.
TEST(DataChecks, ABatchLargerThanTheTrainingDataIsRefused) {
  TempDir dir;
  write_fashion_mnist(dir.path(), 4, 28, 3, 28);
  Recipe r = recipe("fashion_mnist", dir.str());
  r.set("data.limit_train=2");
  r.set("loop.batch_size=5");
  const TaskData t = build(r, dir);
  EXPECT_EQ(t.shape.image_size, 28);
  expect_error([&] { data::DataLoader(t.train, loader_options(r, t, true)); },
               {"the first 2 of Fashion-MNIST train", "2 examples", "batch size 5",
                "drop_last true", "loop.batch_size", "data.limit_train"});
}

TEST(DataChecks, MaxImagePixelsDefaultsToTheDecodersLimit) {
  EXPECT_EQ(Recipe().integer("data.max_image_pixels"), data::kDefaultMaxImagePixels);
}

TEST(DataChecks, ModelImageSizeMismatchNamesTheData) {
  TempDir dir;
  write_fashion_mnist(dir.path(), 2, 28, 2, 28);
  Recipe r = recipe("fashion_mnist", dir.str());
  r.set("model.type=vit");
  r.set("model.image_size=32");
  const TaskData t = build(r, dir);
  expect_error([&] { build_model(r, t.shape, DType::f32, nullptr); },
               {"model.image_size = 32", "data.dataset fashion_mnist",
                "data.root '" + dir.str() + "'", "28x28", "set model.image_size: 28"});
}

// Generated LRA data is made once into the shared cache, keyed by the
// generator's settings: a second run of the same settings reads it (and says
// so), other settings get their own copy, and no run directory holds data.
TEST(DataCache, GeneratedDataIsMadeOnceAndKeyedByItsSettings) {
  TempDir cache;
  const char* before = std::getenv("ATTNFORGE_CACHE");
  const std::string saved = before ? before : "";
  ::setenv("ATTNFORGE_CACHE", cache.str().c_str(), 1);
  for (const char* kind : {"listops", "pathfinder"}) {
    SCOPED_TRACE(kind);
    Recipe r;
    r.set(std::string("data.dataset=") + kind);
    r.set("data.synthetic=true");
    r.set("data.generate_train=6");
    r.set("data.generate_eval=4");
    r.set("data.generate_min_length=5");
    r.set("data.generate_max_length=40");
    std::vector<std::string> said;
    const auto log = [&](const std::string& s) { said.push_back(s); };
    const TaskData first = build_data(r, "", true, log);
    EXPECT_EQ(first.train->size(), 6);
    const size_t dirs =
        static_cast<size_t>(std::distance(fs::directory_iterator(cache.path()), {}));
    said.clear();
    const TaskData again = build_data(r, "", true, log);
    EXPECT_EQ(again.eval->size(), 4);
    ASSERT_FALSE(said.empty());
    EXPECT_NE(said.front().find("from the cache " + cache.str()), std::string::npos)
        << said.front();
    EXPECT_EQ(static_cast<size_t>(std::distance(fs::directory_iterator(cache.path()), {})), dirs);
    r.set("seed=7");
    build_data(r, "", true, log);
    EXPECT_EQ(static_cast<size_t>(std::distance(fs::directory_iterator(cache.path()), {})),
              dirs + 1)
        << "another seed must generate its own copy";
  }
  for (const auto& e : fs::directory_iterator(cache.path())) {
    EXPECT_TRUE(fs::exists(e.path() / "settings.txt")) << e.path();
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << "leftover " << e.path();
  }
  if (before)
    ::setenv("ATTNFORGE_CACHE", saved.c_str(), 1);
  else
    ::unsetenv("ATTNFORGE_CACHE");
}

// A source that needs real data refuses to start without it, naming the key,
// the layout and how to get it, and generates nothing; data.synthetic is the
// only way to generated stand-ins, and only where there are some.
TEST(DataChecks, RealDataOrAClearRefusal) {
  TempDir cache;
  const char* before = std::getenv("ATTNFORGE_CACHE");
  const std::string saved = before ? before : "";
  ::setenv("ATTNFORGE_CACHE", cache.str().c_str(), 1);
  struct Case {
    std::string dataset, layout, get;
    bool can_generate;
  };
  const std::vector<Case> cases = {
      {"image_folder", "one folder of pictures per class",
       "docs/USER_GUIDE.md, 'ImageNet-style training'", true},
      {"listops", "basic_train.tsv, basic_val.tsv and basic_test.tsv",
       "attnforge data listops --from lra_release/lra_release/listops-1000", true},
      {"pathfinder", "each in the layout of Linsley's generator",
       "attnforge data pathfinder --from", true},
      {"text", "train.tsv and test.tsv", "attnforge data text --from aclImdb", false},
      {"retrieval", "train.tsv, val.tsv and test.tsv", "attnforge data retrieval --from", false},
      {"pixels", "LRA Image", "attnforge data image --from cifar-10-batches-bin", true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dataset);
    Recipe r;
    r.set("data.dataset=" + c.dataset);
    if (c.dataset == "pixels") r.set("data.pixel_source=image_folder");
    std::vector<std::string> parts = {"data.dataset " + c.dataset + " needs data.root: ", c.layout,
                                      "To get it: " + c.get};
    if (c.can_generate) parts.push_back("--set data.synthetic=true");
    expect_error([&] { build_data(r, "", true, [](const std::string&) {}); }, parts);
    r.set("data.root=/nonexistent/lra");
    parts[0] = "data.root '/nonexistent/lra' does not exist";
    expect_error([&] { build_data(r, "", true, [](const std::string&) {}); }, parts);
    if (!c.can_generate) {
      r.set("data.synthetic=true");
      expect_error([&] { build_data(r, "", true, [](const std::string&) {}); },
                   {"data.dataset " + c.dataset + " has no generated stand-in"});
    }
  }
  EXPECT_TRUE(fs::is_empty(cache.path())) << "a refused source generated data";
  if (before)
    ::setenv("ATTNFORGE_CACHE", saved.c_str(), 1);
  else
    ::unsetenv("ATTNFORGE_CACHE");
}

}  // namespace
}  // namespace forge::train
