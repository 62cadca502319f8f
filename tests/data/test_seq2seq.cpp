// Sequence-to-sequence sources: the copy task's layout (tgt = 1, src, src;
// input2 / target the shifted halves), its seeding (per rng in training, per
// index in evaluation), TSV pairs (byte tokens, start / end tokens,
// truncation, gzip), their errors with file:line, and batches of both.
#include <gtest/gtest.h>

#include <set>

#include "data/loader.h"
#include "data/seq2seq.h"
#include "tests/data/data_test_util.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

using namespace forge::testing;

std::vector<int64_t> values(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::i64);
  EXPECT_EQ(t.dim(), 1);
  return t.to_vector<int64_t>();
}

// Tokens of a TSV text: byte + 3.
std::vector<int64_t> bytes_of(std::string_view s) {
  std::vector<int64_t> out;
  for (char c : s) out.push_back(static_cast<uint8_t>(c) + 3);
  return out;
}

std::vector<int64_t> cat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// enc_dec_copy.py: src of 32 tokens in [2, 18), tgt = [1] + src + src (65),
// the decoder reads tgt[:-1] and predicts tgt[1:].
TEST(CopyTask, MatchesTheReferenceLayout) {
  const CopyTask task;
  EXPECT_EQ(task.size(), 1024);
  EXPECT_EQ(task.vocab_size(), 18);
  EXPECT_EQ(task.num_classes(), 18);
  Rng rng(3);
  const Example e = task.get(5, &rng);
  const auto src = values(e.input), dec = values(e.input2), tgt = values(e.target);
  ASSERT_EQ(src.size(), 32u);
  ASSERT_EQ(dec.size(), 64u);
  ASSERT_EQ(tgt.size(), 64u);
  std::vector<int64_t> full = cat(cat({kSeq2SeqStart}, src), src);  // 65 tokens
  EXPECT_EQ(dec, std::vector<int64_t>(full.begin(), full.end() - 1));
  EXPECT_EQ(tgt, std::vector<int64_t>(full.begin() + 1, full.end()));
  EXPECT_EQ(e.label, 0);
  EXPECT_EQ(task.describe(),
            "copy task: 1024 examples, sources of 32 tokens in [2, 18), tgt = 1 + src + src");

  const CopyTask small({.length = 3, .vocab_size = 5, .size = 10});
  Rng r(11);
  const Example s = small.get(0, &r);
  const auto x = values(s.input);
  EXPECT_EQ(values(s.input2), (std::vector<int64_t>{1, x[0], x[1], x[2], x[0], x[1]}));
  EXPECT_EQ(values(s.target), (std::vector<int64_t>{x[0], x[1], x[2], x[0], x[1], x[2]}));
}

TEST(CopyTask, SourceTokensAreUniformOverTwoToV) {
  const CopyTask task({.length = 64, .vocab_size = 7});
  std::vector<int64_t> counts(7, 0);
  for (int64_t i = 0; i < 200; ++i)
    for (int64_t v : values(task.get(i, nullptr).input)) {
      ASSERT_GE(v, 2);
      ASSERT_LT(v, 7);
      ++counts[static_cast<size_t>(v)];
    }
  for (int64_t v = 2; v < 7; ++v) EXPECT_NEAR(counts[static_cast<size_t>(v)], 200 * 64 / 5, 300);
}

TEST(CopyTask, TrainingDrawsFromTheRngAndEvaluationIsFixedPerIndex) {
  const CopyTask task({.length = 16});
  Rng a(42), b(42), c(43);
  EXPECT_EQ(values(task.get(0, &a).input), values(task.get(7, &b).input));  // the rng decides
  Rng a2(42);
  EXPECT_NE(values(task.get(0, &a2).input), values(task.get(0, &c).input));

  const auto e3 = values(task.get(3, nullptr).input);
  EXPECT_EQ(values(task.get(3, nullptr).input), e3);
  EXPECT_NE(values(task.get(4, nullptr).input), e3);
  Rng fixed(Rng::mix({0, 3}));
  EXPECT_EQ(values(task.get(3, &fixed).input), e3);
  const CopyTask other({.length = 16, .eval_seed = 9});
  EXPECT_NE(values(other.get(3, nullptr).input), e3);

  EXPECT_THROW(task.get(1024, nullptr), Error);
  expect_error([] { CopyTask({.vocab_size = 2}); }, {"vocab_size", "at least 3", "got 2"});
  expect_error([] { CopyTask({.length = 0}); }, {"length", "got 0"});
  expect_error([] { CopyTask({.size = 0}); }, {"size", "got 0"});
}

TEST(CopyTask, BatchesAreUnpaddedWithTargetsBesideTheDecoderInput) {
  auto task = std::make_shared<CopyTask>(CopyTaskOptions{.size = 128});
  DataLoader loader(task, {.batch_size = 32, .seed = 1});
  const Batch b = loader.build(0, 0);
  EXPECT_EQ(b.input.shape(), (Shape{32, 32}));
  EXPECT_EQ(b.input2.shape(), (Shape{32, 64}));
  EXPECT_EQ(b.target.shape(), (Shape{32, 64}));
  const auto m = b.mask.to_vector<uint8_t>(), m2 = b.mask2.to_vector<uint8_t>();
  EXPECT_EQ(std::count(m.begin(), m.end(), 1), 32 * 32);
  EXPECT_EQ(std::count(m2.begin(), m2.end(), 1), 32 * 64);
  const auto dec = b.input2.to_vector<int64_t>(), tgt = b.target.to_vector<int64_t>();
  for (int64_t r = 0; r < 32; ++r) {
    EXPECT_EQ(dec[r * 64], kSeq2SeqStart);
    for (int64_t t = 1; t < 64; ++t) EXPECT_EQ(dec[r * 64 + t], tgt[r * 64 + t - 1]);
  }
}

TEST(Seq2SeqTsv, ParsesPairsIntoShiftedByteTokens) {
  TempDir dir;
  const std::string path = dir.file("pairs.tsv");
  write_file(path,
             "hello\tbonjour\r\n"
             "\n"
             "a\tb\tc\n"
             "\xC3\xA9t\xC3\xA9\t\n"
             "x\ty");  // no final newline
  const Seq2SeqTsv ds(path);
  ASSERT_EQ(ds.size(), 4);
  EXPECT_EQ(ds.vocab_size(), 259);
  EXPECT_EQ(ds.num_classes(), 259);
  Example e = ds.get(0, nullptr);
  EXPECT_EQ(values(e.input), bytes_of("hello"));
  EXPECT_EQ(values(e.input2), cat({kSeq2SeqStart}, bytes_of("bonjour")));
  EXPECT_EQ(values(e.target), cat(bytes_of("bonjour"), {kSeq2SeqEnd}));
  EXPECT_EQ(values(e.input)[0], 'h' + 3);
  // Everything after the first tab is the target.
  EXPECT_EQ(values(ds.get(1, nullptr).target), cat(bytes_of("b\tc"), {kSeq2SeqEnd}));
  // UTF-8 bytes; an empty target is start -> end.
  e = ds.get(2, nullptr);
  EXPECT_EQ(values(e.input),
            (std::vector<int64_t>{0xC3 + 3, 0xA9 + 3, 't' + 3, 0xC3 + 3, 0xA9 + 3}));
  EXPECT_EQ(values(e.input2), (std::vector<int64_t>{kSeq2SeqStart}));
  EXPECT_EQ(values(e.target), (std::vector<int64_t>{kSeq2SeqEnd}));
  EXPECT_EQ(values(ds.get(3, nullptr).target), cat(bytes_of("y"), {kSeq2SeqEnd}));
  EXPECT_THROW(ds.get(4, nullptr), Error);
}

TEST(Seq2SeqTsv, TruncatesBytesAndKeepsTheEndToken) {
  TempDir dir;
  const std::string path = dir.file("pairs.tsv");
  write_file(path, "abcdef\tuvwxyz\nab\tuv\n");
  const Seq2SeqTsv ds(path, {.max_source_length = 4, .max_target_length = 3});
  Example e = ds.get(0, nullptr);
  EXPECT_EQ(values(e.input), bytes_of("abcd"));
  EXPECT_EQ(values(e.input2), cat({kSeq2SeqStart}, bytes_of("uv")));
  EXPECT_EQ(values(e.target), cat(bytes_of("uv"), {kSeq2SeqEnd}));
  e = ds.get(1, nullptr);
  EXPECT_EQ(values(e.input), bytes_of("ab"));
  EXPECT_EQ(values(e.target), cat(bytes_of("uv"), {kSeq2SeqEnd}));
  EXPECT_NE(ds.describe().find("1 sources truncated to 4 tokens, 1 targets truncated to 3 tokens"),
            std::string::npos)
      << ds.describe();
  expect_error([&] { Seq2SeqTsv(path, {.max_target_length = 0}); }, {"max_target_length", "got 0"});
  expect_error([&] { Seq2SeqTsv(path, {.max_source_length = 0}); }, {"max_source_length"});
}

TEST(Seq2SeqTsv, ReadsGzip) {
  TempDir dir;
  write_gz(dir.file("pairs.tsv.gz"), "one\tun\ntwo\tdeux\n");
  const Seq2SeqTsv ds(dir.file("pairs.tsv.gz"));
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(values(ds.get(1, nullptr).input), bytes_of("two"));
  EXPECT_EQ(values(ds.get(1, nullptr).target), cat(bytes_of("deux"), {kSeq2SeqEnd}));
}

TEST(Seq2SeqTsv, ErrorsNameFileAndLine) {
  TempDir dir;
  const std::string path = dir.file("pairs.tsv");
  write_file(path, "a\tb\n\r\nno tab here\n");
  expect_error([&] { Seq2SeqTsv ds(path); },
               {path + ":3:", "expected 'source<TAB>target'", "no tab", "no tab here"});
  write_file(path, "a\tb\n\tonly a target\n");
  expect_error([&] { Seq2SeqTsv ds(path); }, {path + ":2:", "source", "empty"});
  write_file(path, "");
  expect_error([&] { Seq2SeqTsv ds(path); }, {path, "no 'source<TAB>target' pair"});
  write_file(path, "\n\r\n\n");
  expect_error([&] { Seq2SeqTsv ds(path); }, {path, "no 'source<TAB>target' pair"});
  expect_error([&] { Seq2SeqTsv ds(dir.file("missing.tsv")); },
               {dir.file("missing.tsv"), "does not exist"});
  write_file(dir.file("bad.tsv.gz"), "a\tb\n");
  expect_error([&] { Seq2SeqTsv ds(dir.file("bad.tsv.gz")); },
               {dir.file("bad.tsv.gz"), "not a gzip stream"});
  write_file(path, "abc\tdef\n");
  expect_error([&] { Seq2SeqTsv ds(path, {.max_bytes = 4}); }, {path, "limit of 4 bytes"});
}

TEST(Seq2SeqTsv, BatchesPadTargetsWhereTheDecoderMaskIsFalse) {
  TempDir dir;
  const std::string path = dir.file("pairs.tsv");
  write_file(path, "abc\tx\nd\twxyz\n");
  DataLoader loader(std::make_shared<Seq2SeqTsv>(path),
                    {.batch_size = 2, .shuffle = false, .augment = false});
  const Batch b = loader.build(0, 0);
  ASSERT_EQ(b.input.shape(), (Shape{2, 3}));
  ASSERT_EQ(b.input2.shape(), (Shape{2, 5}));
  ASSERT_EQ(b.target.shape(), (Shape{2, 5}));
  const int64_t x = 'x' + 3, w = 'w' + 3, y = 'y' + 3, z = 'z' + 3;
  EXPECT_EQ(b.input2.to_vector<int64_t>(), (std::vector<int64_t>{1, x, 0, 0, 0, 1, w, x, y, z}));
  EXPECT_EQ(b.target.to_vector<int64_t>(), (std::vector<int64_t>{x, 2, 0, 0, 0, w, x, y, z, 2}));
  EXPECT_EQ(b.mask2.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 1, 0, 0, 0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(b.mask.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 1, 1, 1, 0, 0}));
}

}  // namespace
}  // namespace forge::data
