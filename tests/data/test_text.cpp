// Byte-level text datasets: bytes -> tokens, truncation, label parsing,
// num_classes, document pairs (ours and LRA's AAN rows), errors with file:line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "data/text.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

using forge::testing::expect_error;
namespace fs = std::filesystem;

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = (fs::path(::testing::TempDir()) /
             fmt::format("forge_text_{}_{}_{}.tsv", info->name(), ::getpid(), counter_++))
                .string();
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~TempFile() { fs::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  static inline int counter_ = 0;
};

std::vector<int64_t> tokens_of(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::i64);
  EXPECT_EQ(t.dim(), 1);
  return t.to_vector<int64_t>();
}

TEST(Text, BytesToTokens) {
  EXPECT_EQ(tokens_of(byte_tokens("Ab ", 10)), (std::vector<int64_t>{66, 99, 33}));
  // UTF-8 "é" is two bytes, 0xC3 0xA9; 0x00 and 0xFF are the extremes.
  EXPECT_EQ(tokens_of(byte_tokens("\xC3\xA9", 10)), (std::vector<int64_t>{0xC3 + 1, 0xA9 + 1}));
  EXPECT_EQ(tokens_of(byte_tokens(std::string("\x00\xFF", 2), 10)), (std::vector<int64_t>{1, 256}));
  EXPECT_EQ(tokens_of(byte_tokens("abcdef", 4)), (std::vector<int64_t>{98, 99, 100, 101}));
  EXPECT_EQ(byte_tokens("", 4).numel(), 0);
  EXPECT_EQ(kByteVocabSize, 257);
}

TEST(Text, ClassificationFile) {
  TempFile f(
      "1\tgreat film\r\n"
      "0\tdull\tand long\n"
      "\n"
      "2.0\t\xC3\xA9t\xC3\xA9\n");
  TextClassification ds(f.path());
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.num_classes(), 3);
  EXPECT_EQ(ds.vocab_size(), 257);
  Example e = ds.get(0, nullptr);
  EXPECT_EQ(e.label, 1);
  EXPECT_EQ(tokens_of(e.input), tokens_of(byte_tokens("great film", 100)));
  EXPECT_FALSE(e.input2.defined());
  // Everything after the first tab is text, tabs included.
  EXPECT_EQ(tokens_of(ds.get(1, nullptr).input), tokens_of(byte_tokens("dull\tand long", 100)));
  EXPECT_EQ(ds.get(2, nullptr).label, 2);
  EXPECT_EQ(ds.get(2, nullptr).input.numel(), 5);
  EXPECT_THROW(ds.get(3, nullptr), Error);

  TextClassification cut(f.path(), {.max_length = 4, .num_classes = 5});
  EXPECT_EQ(cut.num_classes(), 5);
  EXPECT_EQ(tokens_of(cut.get(0, nullptr).input), tokens_of(byte_tokens("grea", 100)));
  EXPECT_EQ(tokens_of(cut.get(2, nullptr).input), tokens_of(byte_tokens("\xC3\xA9t\xC3", 100)));
  EXPECT_NE(cut.describe().find("3 truncated"), std::string::npos) << cut.describe();
}

TEST(Text, ClassificationInMemory) {
  TextClassification ds({{0, "a"}, {4, "bc"}}, "inline", {.max_length = 1});
  EXPECT_EQ(ds.num_classes(), 5);
  EXPECT_EQ(tokens_of(ds.get(1, nullptr).input), (std::vector<int64_t>{'b' + 1}));
  expect_error([] { TextClassification({{-1, "a"}}, "inline"); }, {"inline", "negative"});
  expect_error([] { TextClassification({}, "none"); }, {"none", "no examples"});
}

TEST(Text, Pairs) {
  TempFile f(
      "1\tfirst doc\tsecond doc\n"
      "0.0\tid-a\tid-b\tleft\tright\r\n");
  TextPairs ds(f.path(), {.max_length = 6});
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.num_classes(), 2);
  Example e = ds.get(0, nullptr);
  EXPECT_EQ(e.label, 1);
  EXPECT_EQ(tokens_of(e.input), tokens_of(byte_tokens("first ", 100)));
  EXPECT_EQ(tokens_of(e.input2), tokens_of(byte_tokens("second", 100)));
  e = ds.get(1, nullptr);
  EXPECT_EQ(e.label, 0);
  EXPECT_EQ(tokens_of(e.input), tokens_of(byte_tokens("left", 100)));
  EXPECT_EQ(tokens_of(e.input2), tokens_of(byte_tokens("right", 100)));
  EXPECT_NE(ds.describe().find("2 documents truncated"), std::string::npos) << ds.describe();
}

TEST(Text, ErrorsNameFileAndLine) {
  {
    TempFile f("1\tok\n\nnolabel here\n");
    expect_error([&] { TextClassification ds(f.path()); }, {f.path() + ":3:", "no tab"});
  }
  for (const std::string label : {"-1", "x", "1.5", "", "1e3"}) {
    TempFile f("0\tok\n" + label + "\ttext\n");
    expect_error([&] { TextClassification ds(f.path()); },
                 {f.path() + ":2:", "non-negative integer label", "'" + label + "'"});
  }
  {
    TempFile f("0\ta\n3\tb\n");
    expect_error([&] { TextClassification ds(f.path(), {.num_classes = 2}); },
                 {f.path() + ":2:", "label 3", "num_classes 2"});
  }
  {
    TempFile f("1\ta\tb\n1\ta\tb\tc\n");
    expect_error([&] { TextPairs ds(f.path()); }, {f.path() + ":2:", "found 4 field(s)"});
  }
  {
    TempFile f("1\tonly one\n");
    expect_error([&] { TextPairs ds(f.path()); }, {f.path() + ":1:", "found 2 field(s)"});
  }
  {
    TempFile f("\n\r\n");
    expect_error([&] { TextClassification ds(f.path()); }, {f.path(), "no examples"});
  }
  expect_error([] { TextClassification ds("/nonexistent/forge/text.tsv"); },
               {"cannot open", "/nonexistent/forge/text.tsv"});
  {
    TempFile f("0\ta\n");
    expect_error([&] { TextClassification ds(f.path(), {.max_length = 0}); }, {"max_length"});
  }
}

}  // namespace
}  // namespace forge::data
