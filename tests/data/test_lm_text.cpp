// Byte-level language modelling: windows and targets against the file's
// bytes, random training windows seeded per (seed, epoch, index) and in range,
// a sequential evaluation pass that covers its split once, split points from
// byte offsets and fractions, directories (name order, include / exclude),
// gzip, and the errors (empty file, a split too short for seq_len, a missing
// path, damaged gzip, the size limit).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "data/lm_text.h"
#include "data/loader.h"
#include "tests/data/data_test_util.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

using namespace forge::testing;
namespace fs = std::filesystem;

// `n` bytes covering all 256 values in a scrambled order.
std::string some_bytes(int64_t n, uint64_t seed = 1) {
  Rng rng(seed);
  std::string s(static_cast<size_t>(n), '\0');
  for (char& c : s) c = static_cast<char>(rng.next_u32() & 0xff);
  return s;
}

// The bytes [begin, end) of `s` as tokens.
std::vector<int64_t> tokens(std::string_view s, int64_t begin, int64_t end) {
  std::vector<int64_t> out;
  for (int64_t k = begin; k < end; ++k)
    out.push_back(static_cast<uint8_t>(s[static_cast<size_t>(k)]));
  return out;
}

LmSplitPoints points(int64_t train_end, int64_t valid_end, int64_t test_end) {
  return {.train_end = train_end, .valid_end = valid_end, .test_end = test_end};
}

// A corpus file of `n` bytes in `dir`.
struct Corpus {
  TempDir dir;
  std::string path;
  std::string bytes;
  explicit Corpus(int64_t n) : path(dir.file("corpus.txt")), bytes(some_bytes(n)) {
    write_file(path, bytes);
  }
};

TEST(LmText, TrainingWindowsAreTheFileBytesAndTheirNextBytes) {
  Corpus c(1000);
  const auto corpus = read_lm_corpus(c.path);
  EXPECT_EQ(corpus->bytes, c.bytes);
  const LmText train(corpus, LmSplit::train, {.seq_len = 16, .splits = points(600, 800, 1000)});
  EXPECT_EQ(train.size(), 600 / 16);
  EXPECT_EQ(train.vocab_size(), 256);
  EXPECT_EQ(train.num_classes(), 256);
  std::set<int64_t> starts;
  for (uint64_t seed = 0; seed < 10000; ++seed) {
    Rng rng(seed), copy(seed);
    const Example e = train.get(seed % train.size(), &rng);
    const int64_t start = copy.randint(0, 600 - 16 - 1);  // the draw the window should use
    ASSERT_EQ(e.input.shape(), (Shape{16}));
    ASSERT_EQ(e.target.dtype(), DType::i64);
    ASSERT_EQ(e.input.to_vector<int64_t>(), tokens(c.bytes, start, start + 16));
    ASSERT_EQ(e.target.to_vector<int64_t>(), tokens(c.bytes, start + 1, start + 17));
    EXPECT_FALSE(e.input2.defined());
    starts.insert(start);
  }
  // Within [0, 583] and reaching both ends.
  EXPECT_EQ(*starts.begin(), 0);
  EXPECT_EQ(*starts.rbegin(), 583);
}

TEST(LmText, TrainingBatchesDependOnlyOnSeedEpochAndIndex) {
  Corpus c(5000);
  auto train =
      std::make_shared<LmText>(read_lm_corpus(c.path), LmSplit::train,
                               LmTextOptions{.seq_len = 32, .splits = points(4000, 4500, 5000)});
  LoaderOptions o;
  o.batch_size = 8;
  o.seed = 17;
  DataLoader a(train, o);
  o.workers = 2;
  DataLoader b(train, o);
  Batch x, y;
  ASSERT_TRUE(a.next(x));
  ASSERT_TRUE(b.next(y));
  ASSERT_EQ(x.input.shape(), (Shape{8, 32}));
  ASSERT_EQ(x.target.shape(), (Shape{8, 32}));
  EXPECT_EQ(x.input.to_vector<int64_t>(), y.input.to_vector<int64_t>());
  EXPECT_EQ(x.target.to_vector<int64_t>(), y.target.to_vector<int64_t>());
  EXPECT_EQ(x.tokens, 8 * 32);
  const auto input = x.input.to_vector<int64_t>();
  for (int64_t r = 0; r < 8; ++r) {
    const auto i = static_cast<uint64_t>(x.indices[static_cast<size_t>(r)]);
    Rng rng(Rng::mix({17, 0, i, 1}));
    const Example e = train->get(static_cast<int64_t>(i), &rng);
    EXPECT_EQ(std::vector<int64_t>(input.begin() + r * 32, input.begin() + (r + 1) * 32),
              e.input.to_vector<int64_t>());
  }
  // Another epoch draws other windows for the same indices.
  const Batch e1 = a.build(1, 0);
  std::vector<int64_t> first_of_epoch0, first_of_epoch1;
  for (int64_t i = 0; i < train->size(); ++i) {
    Rng r0(Rng::mix({17, 0, static_cast<uint64_t>(i), 1}));
    Rng r1(Rng::mix({17, 1, static_cast<uint64_t>(i), 1}));
    first_of_epoch0.push_back(train->get(i, &r0).input.to_vector<int64_t>()[0]);
    first_of_epoch1.push_back(train->get(i, &r1).input.to_vector<int64_t>()[0]);
  }
  EXPECT_NE(first_of_epoch0, first_of_epoch1);
  EXPECT_EQ(e1.input.shape(), (Shape{8, 32}));
}

// Over split lengths with every remainder mod seq_len: the inputs tile the
// split's bytes but the last, the targets all but the first, each once.
TEST(LmText, EvaluationPassCoversTheSplitExactlyOnce) {
  Corpus c(400);
  const auto corpus = read_lm_corpus(c.path);
  const int64_t n = 16;
  for (int64_t len = n + 1; len <= 3 * n + 3; ++len) {
    SCOPED_TRACE(len);
    const LmText valid(
        corpus, LmSplit::valid,
        {.seq_len = n, .splits = points(100, 100 + len, 400), .random_windows = false});
    EXPECT_EQ(valid.range().begin, 100);
    EXPECT_EQ(valid.split_bytes(), len);
    EXPECT_EQ(valid.target_bytes(), len - 1);
    std::vector<int64_t> inputs, targets;
    for (int64_t i = 0; i < valid.size(); ++i) {
      Rng unused(5);
      const Example e = valid.get(i, i % 2 ? &unused : nullptr);  // rng is not used
      const auto in = e.input.to_vector<int64_t>(), out = e.target.to_vector<int64_t>();
      ASSERT_GE(in.size(), 1u);
      ASSERT_EQ(in.size(), out.size());
      if (i + 1 < valid.size()) {
        ASSERT_EQ(in.size(), static_cast<size_t>(n));
      }
      inputs.insert(inputs.end(), in.begin(), in.end());
      targets.insert(targets.end(), out.begin(), out.end());
    }
    EXPECT_EQ(inputs, tokens(c.bytes, 100, 100 + len - 1));
    EXPECT_EQ(targets, tokens(c.bytes, 101, 100 + len));
    EXPECT_THROW(valid.get(valid.size(), nullptr), Error);
  }
}

TEST(LmText, EvaluationBatchesPadTheShortLastWindow) {
  Corpus c(300);
  auto valid = std::make_shared<LmText>(
      read_lm_corpus(c.path), LmSplit::valid,
      LmTextOptions{.seq_len = 8, .splits = points(200, 220, 300), .random_windows = false});
  ASSERT_EQ(valid->size(), 3);  // [200, 209), [208, 217), [216, 220)
  DataLoader loader(valid, {.batch_size = 3, .shuffle = false, .pad_id = 0, .augment = false});
  const Batch b = loader.build(0, 0);
  ASSERT_EQ(b.target.shape(), (Shape{3, 8}));
  const auto mask = b.mask.to_vector<uint8_t>();
  const auto target = b.target.to_vector<int64_t>();
  EXPECT_EQ(std::count(mask.begin(), mask.end(), 1), 19);
  std::vector<int64_t> real;
  for (size_t k = 0; k < mask.size(); ++k)
    if (mask[k]) {
      real.push_back(target[k]);
    } else {
      EXPECT_EQ(target[k], 0);
    }
  EXPECT_EQ(real, tokens(c.bytes, 201, 220));
  EXPECT_NE(valid->describe().find("text (bytes) valid: 20 bytes of " + c.path +
                                   ", sequential windows of 8 + 1"),
            std::string::npos)
      << valid->describe();
}

TEST(LmText, TrainingDatasetWithoutRngGivesFullSequentialWindows) {
  Corpus c(100);
  const LmText train(read_lm_corpus(c.path), LmSplit::train,
                     {.seq_len = 10, .splits = points(50, 75, 100)});
  ASSERT_EQ(train.size(), 5);
  for (int64_t i = 0; i < 5; ++i) {
    const int64_t start = std::min<int64_t>(i * 10, 50 - 11);
    EXPECT_EQ(train.get(i, nullptr).input.to_vector<int64_t>(), tokens(c.bytes, start, start + 10));
    EXPECT_EQ(train.get(i, nullptr).target.to_vector<int64_t>(),
              tokens(c.bytes, start + 1, start + 11));
  }
  EXPECT_NE(train.describe().find("text (bytes) train: 50 bytes of " + c.path +
                                  ", random windows of 10 + 1"),
            std::string::npos)
      << train.describe();
}

TEST(LmText, SplitsFromByteOffsets) {
  const LmSplitPoints enwik8;  // 90e6 / 95e6 / 100e6
  EXPECT_EQ(lm_split_range(enwik8, LmSplit::train, 100'000'000).end, 90'000'000);
  const LmRange valid = lm_split_range(enwik8, LmSplit::valid, 100'000'000);
  EXPECT_EQ(valid.begin, 90'000'000);
  EXPECT_EQ(valid.end, 95'000'000);
  const LmRange test = lm_split_range(enwik8, LmSplit::test, 100'000'000);
  EXPECT_EQ(test.begin, 95'000'000);
  EXPECT_EQ(test.end, 100'000'000);
  // A shorter corpus ends the last split early; one shorter still empties it.
  EXPECT_EQ(lm_split_range(enwik8, LmSplit::test, 97'000'000).end, 97'000'000);
  EXPECT_EQ(lm_split_range(enwik8, LmSplit::test, 93'000'000).size(), 0);
  EXPECT_EQ(lm_split_range(enwik8, LmSplit::valid, 93'000'000).end, 93'000'000);
  // A longer one leaves its tail out.
  EXPECT_EQ(lm_split_range(enwik8, LmSplit::test, 200'000'000).end, 100'000'000);

  Corpus c(1000);
  const auto corpus = read_lm_corpus(c.path);
  const LmTextOptions o{.seq_len = 4, .splits = points(500, 700, 900), .random_windows = false};
  EXPECT_EQ(LmText(corpus, LmSplit::train, o).range().end, 500);
  EXPECT_EQ(LmText(corpus, LmSplit::valid, o).range().begin, 500);
  EXPECT_EQ(LmText(corpus, LmSplit::test, o).range().end, 900);
  EXPECT_EQ(LmText(corpus, LmSplit::test, o).get(0, nullptr).input.to_vector<int64_t>(),
            tokens(c.bytes, 700, 704));

  expect_error([] { lm_split_range(points(0, 5, 10), LmSplit::train, 10); },
               {"0 < train_end 0 <= valid_end 5 <= test_end 10"});
  expect_error([] { lm_split_range(points(6, 5, 10), LmSplit::test, 10); }, {"train_end 6"});
  expect_error([] { lm_split_range(points(1, 5, 4), LmSplit::test, 10); }, {"test_end 4"});
}

TEST(LmText, SplitsFromFractions) {
  LmSplitPoints p = points(1, 2, 3);  // ignored once fractions are given
  p.train_end_fraction = 0.8;
  p.valid_end_fraction = 0.9;
  p.test_end_fraction = 1.0;
  EXPECT_EQ(lm_split_range(p, LmSplit::train, 1000).end, 800);
  EXPECT_EQ(lm_split_range(p, LmSplit::valid, 1000).begin, 800);
  EXPECT_EQ(lm_split_range(p, LmSplit::valid, 1000).end, 900);
  EXPECT_EQ(lm_split_range(p, LmSplit::test, 1000).end, 1000);
  EXPECT_EQ(lm_split_range(p, LmSplit::train, 1007).end, 805);  // floor(0.8 * 1007 = 805.6)
  EXPECT_EQ(lm_split_range(p, LmSplit::test, 1007).begin, 906);
  EXPECT_EQ(lm_split_range(p, LmSplit::test, 1007).end, 1007);
  p.test_end_fraction = 0.95;
  EXPECT_EQ(lm_split_range(p, LmSplit::test, 1000).end, 950);

  Corpus c(1000);
  const LmText test(read_lm_corpus(c.path), LmSplit::test,
                    {.seq_len = 8, .splits = p, .random_windows = false});
  EXPECT_EQ(test.range().begin, 900);
  EXPECT_EQ(test.range().end, 950);

  LmSplitPoints mixed;
  mixed.train_end_fraction = 0.5;
  expect_error([&] { lm_split_range(mixed, LmSplit::train, 100); },
               {"all three end fractions", "train 0.5, valid 0, test 0"});
  for (const auto& [a, b, t] : {std::tuple{0.5, 0.4, 1.0}, {0.5, 0.6, 1.5}, {-0.1, 0.5, 1.0}}) {
    LmSplitPoints bad;
    bad.train_end_fraction = a;
    bad.valid_end_fraction = b;
    bad.test_end_fraction = t;
    expect_error([&] { lm_split_range(bad, LmSplit::valid, 100); }, {"0 < train", "<= 1"});
  }
}

TEST(LmText, DirectoryConcatenatesMatchingFilesInNameOrder) {
  TempDir dir;
  write_file(dir.file("b.txt"), "BBBB");
  write_file(dir.file("a.txt"), "AAA");
  write_gz(dir.file("c.txt.gz"), "CC");
  write_file(dir.file("notes.log"), "LOG");
  write_file(dir.file("skip.txt"), "SKIP");
  fs::create_directory(dir.path() / "d.txt");  // a directory: never read
  write_file(dir.path() / "d.txt" / "inner.txt", "INNER");

  const auto all = read_lm_corpus(dir.str());
  EXPECT_EQ(all->bytes, "AAABBBBCCLOGSKIP");
  EXPECT_EQ(all->files.size(), 5u);
  EXPECT_EQ(all->name(), dir.str() + " (5 files)");

  LmFilesOptions o;
  o.include = {"*.txt", "*.gz"};
  o.exclude = {"skip*"};
  const auto some = read_lm_corpus(dir.str(), o);
  EXPECT_EQ(some->bytes, "AAABBBBCC");
  EXPECT_EQ(some->files,
            (std::vector<std::string>{dir.file("a.txt"), dir.file("b.txt"), dir.file("c.txt.gz")}));
  EXPECT_EQ(some->offsets, (std::vector<int64_t>{0, 3, 7, 9}));
  EXPECT_EQ(some->files_in({2, 4}), dir.file("a.txt") + ", " + dir.file("b.txt"));

  // Windows run across file boundaries: [0, 5) and [4, 9).
  const LmText train(some, LmSplit::train,
                     {.seq_len = 4, .splits = points(9, 9, 9), .random_windows = false});
  ASSERT_EQ(train.size(), 2);
  EXPECT_EQ(train.get(1, nullptr).input.to_vector<int64_t>(),
            (std::vector<int64_t>{'B', 'B', 'B', 'C'}));
  EXPECT_EQ(train.get(1, nullptr).target.to_vector<int64_t>(),
            (std::vector<int64_t>{'B', 'B', 'C', 'C'}));

  o.include = {"*.md"};
  expect_error([&] { read_lm_corpus(dir.str(), o); },
               {dir.str(), "no regular file matching include [*.md]", "exclude [skip*]"});
}

TEST(LmText, GzipFilesAreDecompressed) {
  TempDir dir;
  const std::string bytes = some_bytes(3'000'000, 7);  // several 1 MiB pieces
  write_gz(dir.file("corpus.gz"), bytes);
  EXPECT_EQ(read_lm_corpus(dir.file("corpus.gz"))->bytes, bytes);
  // Concatenated gzip members read as one stream.
  write_gz(dir.file("one.gz"), "first ");
  write_gz(dir.file("two.gz"), "second");
  write_file(dir.file("both.gz"), read_file(dir.file("one.gz")) + read_file(dir.file("two.gz")));
  EXPECT_EQ(read_lm_corpus(dir.file("both.gz"))->bytes, "first second");
  // Without the suffix a gzip file is taken as it is.
  write_file(dir.file("raw"), read_file(dir.file("one.gz")));
  EXPECT_EQ(read_lm_corpus(dir.file("raw"))->bytes, read_file(dir.file("one.gz")));
}

TEST(LmText, AnEmptyFileIsAnError) {
  TempDir dir;
  write_file(dir.file("empty.txt"), "");
  expect_error([&] { read_lm_corpus(dir.file("empty.txt")); },
               {"'" + dir.file("empty.txt") + "' is empty"});
  write_gz(dir.file("empty.gz"), "");
  expect_error([&] { read_lm_corpus(dir.file("empty.gz")); }, {dir.file("empty.gz"), "is empty"});
  write_file(dir.file("full.txt"), "abc");
  expect_error([&] { read_lm_corpus(dir.str()); },
               {dir.file("empty.gz"), "is empty", "exclude it"});
}

TEST(LmText, ASplitShorterThanAWindowIsAnErrorNamingItsRangeAndSeqLen) {
  Corpus c(1000);
  const auto corpus = read_lm_corpus(c.path);
  expect_error(
      [&] { LmText(corpus, LmSplit::valid, {.seq_len = 64, .splits = points(900, 950, 1000)}); },
      {"valid split of " + c.path, "bytes [900, 950) of its 1000: 50 bytes", "seq_len 64",
       "needs 65 bytes"});
  // The enwik8 defaults on a small file: train takes it all, valid is empty.
  expect_error([&] { LmText(corpus, LmSplit::valid, {.seq_len = 8}); },
               {"valid split", "bytes [1000, 1000)", "0 bytes", "seq_len 8"});
  // seq_len + 1 bytes exactly is enough: one window each way.
  const LmText exact(corpus, LmSplit::test,
                     {.seq_len = 49, .splits = points(900, 950, 1000), .random_windows = false});
  EXPECT_EQ(exact.size(), 1);  // [950, 1000); the 1-byte rest after it predicts nothing
  EXPECT_EQ(LmText(corpus, LmSplit::test, {.seq_len = 49, .splits = points(900, 950, 1000)}).size(),
            1);
  expect_error([&] { LmText(corpus, LmSplit::train, {.seq_len = 0}); }, {"seq_len", "0"});
}

TEST(LmText, MissingPathsAndDamagedGzipAreErrorsNamingTheFile) {
  TempDir dir;
  expect_error([&] { read_lm_corpus(dir.file("nope")); }, {dir.file("nope"), "does not exist"});

  const std::string bytes = some_bytes(200'000, 3);
  write_gz(dir.file("good.gz"), bytes);
  const std::string gz = read_file(dir.file("good.gz"));
  std::string damaged = gz;
  for (size_t k = gz.size() / 2; k < gz.size() / 2 + 16; ++k)
    damaged[k] = static_cast<char>(~damaged[k]);
  write_file(dir.file("damaged.gz"), damaged);
  expect_error([&] { read_lm_corpus(dir.file("damaged.gz")); },
               {"'" + dir.file("damaged.gz") + "' is not a valid gzip stream", "zlib"});
  write_file(dir.file("cut.gz"), gz.substr(0, gz.size() / 2));
  expect_error([&] { read_lm_corpus(dir.file("cut.gz")); },
               {"'" + dir.file("cut.gz") + "' is a truncated gzip stream", "zlib"});
  std::string bad_crc = gz;
  bad_crc[gz.size() - 6] = static_cast<char>(~bad_crc[gz.size() - 6]);  // the CRC-32 trailer
  write_file(dir.file("crc.gz"), bad_crc);
  expect_error([&] { read_lm_corpus(dir.file("crc.gz")); }, {dir.file("crc.gz"), "zlib"});
  write_file(dir.file("plain.gz"), "not compressed at all");
  expect_error([&] { read_lm_corpus(dir.file("plain.gz")); },
               {dir.file("plain.gz"), "not a gzip stream"});
}

TEST(LmText, RefusesMoreBytesThanMaxBytes) {
  TempDir dir;
  write_file(dir.file("a.txt"), std::string(600, 'a'));
  write_file(dir.file("b.txt"), std::string(600, 'b'));
  write_gz(dir.file("c.gz"), std::string(5000, 'c'));
  LmFilesOptions o;
  o.max_bytes = 1000;
  o.include = {"*.txt"};
  expect_error([&] { read_lm_corpus(dir.str(), o); },
               {dir.file("b.txt"), "limit of 1000 bytes", "max_bytes"});
  expect_error([&] { read_lm_corpus(dir.file("c.gz"), o); },
               {dir.file("c.gz"), "limit of 1000 bytes"});
  o.max_bytes = 5000;  // exactly the stream's size
  EXPECT_EQ(read_lm_corpus(dir.file("c.gz"), o)->size(), 5000);
  o.max_bytes = 1200;
  EXPECT_EQ(read_lm_corpus(dir.str(), o)->size(), 1200);
}

TEST(LmText, BitsPerByteIsNatsOverLn2) {
  EXPECT_DOUBLE_EQ(bits_per_byte(std::log(2.0)), 1.0);
  EXPECT_DOUBLE_EQ(bits_per_byte(std::log(256.0)), 8.0);  // a uniform guess over the bytes
}

}  // namespace
}  // namespace forge::data
