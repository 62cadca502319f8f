// LRA's public releases into the recipes' layouts (data/lra_release.h), on
// small files in the releases' own formats and folder layouts.
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "core/error.h"
#include "data/image_folder.h"
#include "data/image_io.h"
#include "data/listops.h"
#include "data/lra_release.h"
#include "data/pathfinder.h"
#include "data/text.h"

namespace forge::data {
namespace {

namespace fs = std::filesystem;
using namespace testing;

// lra_release.gz unpacks to lra_release/lra_release/listops-1000/basic_*.tsv.
TEST(LraRelease, ListOpsIsFoundInTheUnpackedArchiveAndCopiedAsItIs) {
  TempDir dir;
  const fs::path release = dir.path() / "lra_release" / "lra_release" / "listops-1000";
  fs::create_directories(release);
  const std::string header = "Source\tTarget\n";
  write_file(release / "basic_train.tsv",
             header + "( ( ( [MAX 2 9 ) 1 ) ] )\t9\n( ( [MIN 4 7 ) ] )\t4\n( [SM 1 2 ] )\t3\n");
  write_file(release / "basic_val.tsv", header + "( ( [MED 3 5 8 ) ] )\t5\n");
  write_file(release / "basic_test.tsv", header + "( ( [MAX 0 ) ] )\t0\n( ( [MIN 1 ) ] )\t1\n");
  const PreparedLra p = prepare_lra(LraTask::listops, dir.str(), dir.file("out"));
  EXPECT_EQ(p.from, release.string());
  ASSERT_EQ(p.examples.size(), 3u);
  EXPECT_EQ(p.examples[0], (std::pair<std::string, int64_t>{"train", 3}));
  EXPECT_EQ(p.examples[1], (std::pair<std::string, int64_t>{"val", 1}));
  EXPECT_EQ(p.examples[2], (std::pair<std::string, int64_t>{"test", 2}));
  for (const char* f : {"basic_train.tsv", "basic_val.tsv", "basic_test.tsv"})
    EXPECT_EQ(read_file(dir.path() / "out" / f), read_file(release / f)) << f;
  EXPECT_EQ(read_listops_tsv(dir.file("out/basic_train.tsv"))[2].label, 3);
}

// aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt; unsup/ and the other files
// of the release are not read.
TEST(LraRelease, TextWritesImdbReviewsAsLabelledLinesInIdOrder) {
  TempDir dir;
  const fs::path imdb = dir.path() / "aclImdb";
  write_file(imdb / "train" / "pos" / "10_7.txt", "Ten.<br /><br />Seven\tstars.");
  write_file(imdb / "train" / "pos" / "2_8.txt", "Two, eight.");
  write_file(imdb / "train" / "neg" / "1_2.txt", "One\ntwo.");  // a line break
  write_file(imdb / "train" / "unsup" / "5_0.txt", "not labelled");
  write_file(imdb / "train" / "urls_pos.txt", "http://example.org\n");
  write_file(imdb / "test" / "pos" / "0_10.txt", "Zero, ten.");
  write_file(imdb / "test" / "neg" / "3_1.txt", "Three, one.");
  write_file(imdb / "imdb.vocab", "the\n");
  const PreparedLra p = prepare_lra(LraTask::text, dir.str(), dir.file("out"));
  EXPECT_EQ(p.from, imdb.string());
  EXPECT_EQ(read_file(dir.path() / "out" / "train.tsv"),
            "0\tOne two.\n1\tTwo, eight.\n1\tTen.<br /><br />Seven\tstars.\n");
  EXPECT_EQ(read_file(dir.path() / "out" / "test.tsv"), "0\tThree, one.\n1\tZero, ten.\n");
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_NE(p.notes[0].find("1 line breaks"), std::string::npos) << p.notes[0];
  const TextClassification train(dir.file("out/train.tsv"));
  ASSERT_EQ(train.size(), 3);
  EXPECT_EQ(train.get(2, nullptr).label, 1);
  EXPECT_EQ(train.get(2, nullptr).input.size(0), 28);  // the review's bytes, the tab included
}

// tsv_data/new_aan_pairs.{train,eval,test}.tsv: label, two paper ids, two texts
// (bytes literals, read as they are written, as LRA does).
TEST(LraRelease, RetrievalTakesTheAanPairsAndNamesEvalVal) {
  TempDir dir;
  const fs::path tsv = dir.path() / "lra_release" / "lra_release" / "tsv_data";
  const std::string rows =
      "1.0\tP01-1001\tP02-2002\tb'Paper one.'\tb'Paper two.'\n"
      "0.0\tP03-3003\tP04-4004\tb'Three.'\tb'Four.'\n";
  write_file(tsv / "new_aan_pairs.train.tsv", rows + rows);
  write_file(tsv / "new_aan_pairs.eval.tsv", rows);
  write_file(tsv / "new_aan_pairs.test.tsv", rows.substr(0, rows.find('\n') + 1));
  const PreparedLra p = prepare_lra(LraTask::retrieval, dir.str(), dir.file("out"));
  EXPECT_EQ(p.from, tsv.string());
  EXPECT_EQ(p.examples[0], (std::pair<std::string, int64_t>{"train", 4}));
  EXPECT_EQ(p.examples[1], (std::pair<std::string, int64_t>{"val", 2}));
  EXPECT_EQ(p.examples[2], (std::pair<std::string, int64_t>{"test", 1}));
  EXPECT_EQ(read_file(dir.path() / "out" / "val.tsv"), rows);
  const TextPairs val(dir.file("out/val.tsv"));
  const Example e = val.get(0, nullptr);
  EXPECT_EQ(e.label, 1);
  EXPECT_EQ(e.input.size(0), 13);  // the 13 bytes of b'Paper one.'
}

// cifar-10-batches-bin: records of a label byte and the red, green and blue
// 32 x 32 planes; batches.meta.txt names the classes.
TEST(LraRelease, ImageWritesCifarBatchesAsAnImageFolderSplit90To10) {
  TempDir dir;
  const fs::path bin = dir.path() / "cifar-10-batches-bin";
  const char* names[] = {"airplane", "automobile", "bird",  "cat",  "deer",
                         "dog",      "frog",       "horse", "ship", "truck"};
  std::string meta;
  for (const char* n : names) meta += std::string(n) + "\n";
  write_file(bin / "batches.meta.txt", meta + "\n");
  const auto record = [](int label, int seed) {
    std::string r(1 + 3 * 1024, '\0');
    r[0] = static_cast<char>(label);
    for (int i = 0; i < 3 * 1024; ++i) r[1 + i] = static_cast<char>((i * 7 + seed * 13) % 251);
    return r;
  };
  // Batches of 20 records (the release's hold 10000), every class in each
  // half, so the last 10% (batch 5's last 10) holds every class too.
  for (int b = 1; b <= 5; ++b) {
    std::string batch;
    for (int k = 0; k < 20; ++k) batch += record(k % 10, b * 20 + k);
    write_file(bin / fmt::format("data_batch_{}.bin", b), batch);
  }
  std::string test;
  for (int k = 0; k < 10; ++k) test += record(9 - k, 200 + k);
  write_file(bin / "test_batch.bin", test);
  const PreparedLra p = prepare_lra(LraTask::image, dir.str(), dir.file("out"));
  EXPECT_EQ(p.examples[0], (std::pair<std::string, int64_t>{"train", 90}));
  EXPECT_EQ(p.examples[1], (std::pair<std::string, int64_t>{"val", 10}));
  EXPECT_EQ(p.examples[2], (std::pair<std::string, int64_t>{"test", 10}));
  // The first test record (label 9, truck): pixel (y, x) channel c is plane c's byte y * 32 + x.
  const Image img = read_image(dir.file("out/test/truck/00000.png"));
  ASSERT_EQ(img.channels, 3);
  const std::string r = record(9, 200);
  for (const auto& [y, x, c] : {std::array<int, 3>{0, 0, 0}, {5, 17, 1}, {31, 31, 2}})
    EXPECT_EQ(img.pixels[static_cast<size_t>((y * 32 + x) * 3 + c)],
              static_cast<uint8_t>(r[static_cast<size_t>(1 + c * 1024 + y * 32 + x)]));
  // The last ten training records (batch 5's) are val, numbered from 0.
  EXPECT_TRUE(fs::exists(dir.path() / "out" / "val" / "airplane" / "00000.png"));
  EXPECT_TRUE(fs::exists(dir.path() / "out" / "val" / "truck" / "00009.png"));
  const Image last = read_image(dir.file("out/val/truck/00009.png"));
  EXPECT_EQ(last.pixels[0], static_cast<uint8_t>(record(9, 5 * 20 + 19)[1]));
  ImageFolderOptions o;
  o.root = dir.file("out/train");
  EXPECT_EQ(ImageFolder(o).num_classes(), 10);
}

// pathfinder32/curv_contour_length_14 in Linsley's layout: the lines of its
// metadata files in reading order, split 80 / 10 / 10, the images linked.
TEST(LraRelease, PathfinderSplitsTheMetadataLinesInOrder) {
  TempDir dir;
  const fs::path release =
      dir.path() / "lra_release" / "lra_release" / "pathfinder32" / "curv_contour_length_14";
  const auto samples = generate_pathfinder(PathfinderGenConfig{}, 20, 5);
  write_pathfinder(release.string(), samples, 6);  // metadata/0..3.npy
  const PreparedLra p = prepare_lra(LraTask::pathfinder, dir.str(), dir.file("out"));
  EXPECT_EQ(p.from, release.string());
  EXPECT_EQ(p.examples[0], (std::pair<std::string, int64_t>{"train", 16}));
  EXPECT_EQ(p.examples[1], (std::pair<std::string, int64_t>{"val", 2}));
  EXPECT_EQ(p.examples[2], (std::pair<std::string, int64_t>{"test", 2}));
  EXPECT_TRUE(fs::is_symlink(dir.path() / "out" / "train" / "imgs"));
  const auto test = read_pathfinder(dir.file("out/test"));
  ASSERT_EQ(test.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(test[i].label, samples[18 + i].label);
    EXPECT_EQ(test[i].image.pixels, samples[18 + i].image.pixels);
  }
}

TEST(LraRelease, RefusalsWriteNothing) {
  TempDir dir;
  // Not the release: the error says what was looked for, and where.
  fs::create_directories(dir.path() / "empty");
  expect_error([&] { prepare_lra(LraTask::listops, dir.file("empty"), dir.file("o")); },
               {"LRA's ListOps files", "listops-1000/basic_train.tsv"});
  expect_error([&] { prepare_lra(LraTask::text, dir.file("nowhere"), dir.file("o")); },
               {"--from " + dir.str() + "/nowhere: no such folder"});
  // A bad row: the reader's error, and no output or temporary folder left.
  const fs::path tsv = dir.path() / "tsv_data";
  write_file(tsv / "new_aan_pairs.train.tsv", "1\ta\tb\n");
  write_file(tsv / "new_aan_pairs.eval.tsv", "yes\ta\tb\n");
  write_file(tsv / "new_aan_pairs.test.tsv", "1\ta\tb\n");
  expect_error([&] { prepare_lra(LraTask::retrieval, tsv.string(), dir.file("o")); },
               {"new_aan_pairs.eval.tsv:1"});
  EXPECT_FALSE(fs::exists(dir.path() / "o"));
  for (const auto& entry : fs::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  // An output that holds files is never written into.
  write_file(dir.path() / "full" / "keep.txt", "mine");
  write_file(tsv / "new_aan_pairs.eval.tsv", "1\ta\tb\n");
  expect_error([&] { prepare_lra(LraTask::retrieval, tsv.string(), dir.file("full")); },
               {"already exists and is not an empty folder"});
  EXPECT_EQ(testing::snapshot(dir.path() / "full").size(), 1u);
  // An empty folder is taken.
  fs::create_directories(dir.path() / "ready");
  EXPECT_EQ(prepare_lra(LraTask::retrieval, tsv.string(), dir.file("ready")).examples.size(), 3u);
  EXPECT_EQ(lra_task_from_name("pathfinder"), LraTask::pathfinder);
  expect_error([] { lra_task_from_name("imdb"); }, {"listops, text, retrieval, image, pathfinder"});
  EXPECT_EQ(lra_default_dir(LraTask::text), "data/lra/text");
}

}  // namespace
}  // namespace forge::data
