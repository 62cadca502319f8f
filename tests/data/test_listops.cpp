// ListOps: the token table, LRA's printing, the evaluator, the TSV reader and
// its errors, the generator's statistics and determinism, and the round trip
// generator -> TSV -> reader -> Dataset.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include "data/listops.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

using namespace forge::testing;
namespace fs = std::filesystem;

std::vector<uint8_t> ids(std::initializer_list<int> v) {
  return {v.begin(), v.end()};
}

TEST(ListOps, TokenTable) {
  const std::vector<std::string> names = {"[MIN", "[MAX", "[MED", "[SM", "]", "0", "1", "2",
                                          "3",    "4",    "5",    "6",   "7", "8", "9"};
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(listops_token_id(names[i]), static_cast<int64_t>(i) + 1) << names[i];
    EXPECT_EQ(listops_token_name(static_cast<int64_t>(i) + 1), names[i]);
  }
  EXPECT_EQ(listops_token_id("("), -1);
  EXPECT_EQ(listops_token_id("MIN"), -1);
  EXPECT_EQ(listops_token_id("10"), -1);
  EXPECT_EQ(kListOpsDigit0 + 7, listops_token_id("7"));
  EXPECT_THROW(listops_token_name(0), Error);
  EXPECT_THROW(listops_token_name(kListOpsVocabSize), Error);
}

TEST(ListOps, TokenizeDropsParentheses) {
  EXPECT_EQ(listops_tokenize("( ( [MAX 2 9 ( [MIN 4 7 ] ) 0 ] ) )"),
            ids({kListOpsMax, 8, 15, kListOpsMin, 10, 13, kListOpsClose, 6, kListOpsClose}));
  EXPECT_EQ(listops_tokenize("( ( ( [SM 2 ) 9 ) ] )"), ids({kListOpsSumMod, 8, 15, kListOpsClose}));
  expect_error([] { listops_tokenize("( [MAX 2 [FOO 3 ] )", "here.tsv:7"); },
               {"here.tsv:7", "[FOO"});
}

TEST(ListOps, PrintsLikeLra) {
  // LRA's to_string over ((op, a1), a2) ... , END) pairs.
  const auto t = ids({kListOpsMin, kListOpsMax, 7, 8, kListOpsClose, 9, kListOpsClose});
  EXPECT_EQ(listops_to_string(t), "( ( ( [MIN ( ( ( [MAX 1 ) 2 ) ] ) ) 3 ) ] )");
  // Found by fuzzing: tokens side by side outside any operator kept their space
  // (a row the reader accepts, "5 6", printed as the unknown token "56").
  EXPECT_EQ(listops_to_string(ids({11, 12})), "5 6");
  EXPECT_EQ(listops_tokenize(listops_to_string(ids({11, 12}))), ids({11, 12}));
  EXPECT_EQ(listops_to_string(ids({kListOpsMed, 6, 7, 8, kListOpsClose})),
            "( ( ( ( [MED 0 ) 1 ) 2 ) ] )");
  EXPECT_EQ(listops_to_string(ids({9})), "3");
  EXPECT_EQ(listops_tokenize(listops_to_string(t)), t);
  EXPECT_THROW(listops_to_string(ids({kListOpsMax, 6, 7})), Error);
  EXPECT_THROW(listops_to_string(ids({6, kListOpsClose})), Error);
}

TEST(ListOps, Eval) {
  EXPECT_EQ(listops_eval("( ( [MAX 2 9 ( [MIN 4 7 ] ) 0 ] ) )"), 9);
  EXPECT_EQ(listops_eval("[MIN 4 7 ]"), 4);
  EXPECT_EQ(listops_eval("[SM 9 9 5 ]"), 3);
  EXPECT_EQ(listops_eval("[MED 1 2 3 4 ]"), 2);  // int(np.median) = int(2.5)
  EXPECT_EQ(listops_eval("[MED 3 4 ]"), 3);
  EXPECT_EQ(listops_eval("[MED 9 1 5 ]"), 5);
  EXPECT_EQ(listops_eval("[MED 0 9 ]"), 4);
  EXPECT_EQ(listops_eval("[SM [MAX 1 8 ] [MIN 6 3 ] ]"), 1);
  EXPECT_EQ(listops_eval("7"), 7);
  EXPECT_THROW(listops_eval("[MAX 1 2"), Error);
  EXPECT_THROW(listops_eval("[MAX 1 2 ] ]"), Error);
  EXPECT_THROW(listops_eval("[MAX 1 2 ] 3"), Error);
  EXPECT_THROW(listops_eval("[MAX ]"), Error);
  EXPECT_THROW(listops_eval(""), Error);
}

TEST(ListOps, ReaderTokensLabelsAndTruncation) {
  TempDir dir;
  const std::string path = dir.file("basic_train.tsv");
  write_file(path,
             "Source\tTarget\r\n"
             "( ( ( [MAX 2 ) 9 ) ] )\t9\r\n"
             "( ( ( [SM ( ( ( [MIN 4 ) 7 ) ] ) ) 8 ) ] )\t2\r\n"
             "\r\n"
             "5\t5\n");
  const auto examples = read_listops_tsv(path);
  ASSERT_EQ(examples.size(), 3u);
  EXPECT_EQ(examples[0].tokens, ids({kListOpsMax, 8, 15, kListOpsClose}));
  EXPECT_EQ(examples[0].label, 9);
  EXPECT_EQ(examples[1].tokens,
            ids({kListOpsSumMod, kListOpsMin, 10, 13, kListOpsClose, 14, kListOpsClose}));
  EXPECT_EQ(examples[1].label, 2);
  EXPECT_EQ(examples[2].tokens, ids({11}));

  ListOps full(path);
  EXPECT_EQ(full.size(), 3);
  EXPECT_EQ(full.num_classes(), 10);
  EXPECT_EQ(full.vocab_size(), 16);
  EXPECT_EQ(full.num_truncated(), 0);
  const Example e = full.get(1, nullptr);
  EXPECT_EQ(e.input.dtype(), DType::i64);
  EXPECT_EQ(e.input.to_vector<int64_t>(), (std::vector<int64_t>{4, 1, 10, 13, 5, 14, 5}));
  EXPECT_EQ(e.label, 2);
  EXPECT_FALSE(e.input2.defined());
  EXPECT_NE(full.describe().find("3 examples"), std::string::npos) << full.describe();

  ListOps cut(path, {.max_length = 3});
  EXPECT_EQ(cut.num_truncated(), 2);
  EXPECT_EQ(cut.get(0, nullptr).input.to_vector<int64_t>(), (std::vector<int64_t>{2, 8, 15}));
  EXPECT_EQ(cut.get(2, nullptr).input.to_vector<int64_t>(), (std::vector<int64_t>{11}));
  EXPECT_THROW(cut.get(3, nullptr), Error);
}

TEST(ListOps, ReaderErrorsNameFileAndLine) {
  TempDir dir;
  const std::string path = dir.file("bad.tsv");
  auto expect_read_error = [&](const std::string& text, const std::vector<std::string>& parts) {
    write_file(path, text);
    std::vector<std::string> all = parts;
    all.push_back("bad.tsv");
    expect_error([&] { read_listops_tsv(path); }, all);
  };
  expect_read_error("Input\tOutput\n[MAX 1 2 ]\t2\n", {":1:", "Source<TAB>Target", "Input"});
  expect_read_error("", {"empty file"});
  expect_read_error("Source\tTarget\n[MAX 1 2 ]\t2\n[MIN 1 2 ] 1\n", {":3:", "no tab"});
  expect_read_error("Source\tTarget\n[MAX 1 2 ]\t2\n\n[MAX 1 [FOO 3 ] ]\t3\n", {":4:", "[FOO"});
  expect_read_error("Source\tTarget\n[MAX 1 2 ]\t12\n", {":2:", "0..9", "12"});
  expect_read_error("Source\tTarget\n[MAX 1 2 ]\tx\n", {":2:", "'x'"});
  expect_read_error("Source\tTarget\n\t1\n", {":2:", "empty expression"});
  expect_error([&] { read_listops_tsv(dir.file("missing.tsv")); }, {"cannot open", "missing.tsv"});
}

ListOpsGenConfig small_splits(int64_t train, int64_t val, int64_t test) {
  return {.num_train = train, .num_val = val, .num_test = test};
}

TEST(ListOps, GeneratorStatisticsDefaultConfig) {
  const ListOpsGenConfig c = small_splits(300, 50, 50);
  const ListOpsSplits s = generate_listops(c, 1234);
  ASSERT_EQ(s.train.size(), 300u);
  ASSERT_EQ(s.val.size(), 50u);
  ASSERT_EQ(s.test.size(), 50u);

  std::set<std::string> distinct;  // token bytes
  std::map<int64_t, int64_t> labels;
  std::set<uint8_t> operators;
  int64_t total = 0, shortest = 1 << 30, longest = 0;
  for (const auto* split : {&s.train, &s.val, &s.test}) {
    for (const ListOpsExample& e : *split) {
      const auto n = static_cast<int64_t>(e.tokens.size());
      shortest = std::min(shortest, n);
      longest = std::max(longest, n);
      EXPECT_GT(n, 500);
      EXPECT_LT(n, 2000);
      EXPECT_LE(listops_depth(e.tokens), 10);
      EXPECT_EQ(e.label, listops_eval(listops_to_string(e.tokens)));
      for (uint8_t t : e.tokens)
        if (t >= kListOpsMin && t <= kListOpsSumMod) operators.insert(t);
      EXPECT_TRUE(distinct.emplace(e.tokens.begin(), e.tokens.end()).second) << "duplicate example";
      ++labels[e.label];
      ++total;
    }
  }
  EXPECT_EQ(operators.size(), 4u);
  EXPECT_GE(labels.size(), 5u);
  for (const auto& [label, count] : labels)
    EXPECT_LE(count, total / 2) << "label " << label << " is " << count << " of " << total;
  // The lengths spread over the allowed range rather than piling up at one end.
  EXPECT_LT(shortest, 700);
  EXPECT_GT(longest, 1200);
}

TEST(ListOps, GeneratorHonoursConfiguredBounds) {
  ListOpsGenConfig c = small_splits(200, 0, 0);
  c.min_length = 20;
  c.max_length = 60;
  c.max_depth = 4;
  c.max_args = 4;
  const ListOpsSplits s = generate_listops(c, 7);
  ASSERT_EQ(s.train.size(), 200u);
  int64_t deepest = 0;
  for (const ListOpsExample& e : s.train) {
    EXPECT_GT(e.tokens.size(), 20u);
    EXPECT_LT(e.tokens.size(), 60u);
    deepest = std::max(deepest, listops_depth(e.tokens));
    EXPECT_EQ(e.label, listops_eval(listops_to_string(e.tokens)));
    std::vector<int64_t> open;  // argument counts of the open operators
    for (uint8_t t : e.tokens) {
      if (t == kListOpsClose) {
        EXPECT_GE(open.back(), 2);
        EXPECT_LE(open.back(), 4);
        open.pop_back();
      } else {
        if (!open.empty()) ++open.back();
        if (t < kListOpsClose) open.push_back(0);
      }
    }
  }
  EXPECT_EQ(deepest, 4);
}

TEST(ListOps, GeneratorIsDeterministicPerSeed) {
  TempDir dir;
  const ListOpsGenConfig c = small_splits(40, 5, 5);
  const ListOpsSplits a = generate_listops(c, 99), b = generate_listops(c, 99),
                      other = generate_listops(c, 100);
  write_listops_tsv(dir.file("a.tsv"), a.train);
  write_listops_tsv(dir.file("b.tsv"), b.train);
  write_listops_tsv(dir.file("c.tsv"), other.train);
  const std::string ta = read_file(dir.file("a.tsv"));
  EXPECT_GT(ta.size(), 40u * 1000u);
  EXPECT_EQ(ta, read_file(dir.file("b.tsv")));
  EXPECT_NE(ta, read_file(dir.file("c.tsv")));
  EXPECT_FALSE(fs::exists(dir.file("a.tsv.tmp")));
}

TEST(ListOps, GeneratorTsvRoundTrip) {
  TempDir dir;
  const ListOpsSplits s = generate_listops(small_splits(30, 10, 10), 5);
  write_listops_splits(dir.file("lra"), s);
  EXPECT_EQ(read_listops_tsv(dir.file("lra/basic_train.tsv")).size(), 30u);
  EXPECT_EQ(read_listops_tsv(dir.file("lra/basic_test.tsv")).size(), 10u);
  const std::string path = dir.file("lra/basic_val.tsv");
  const std::string text = read_file(path);
  EXPECT_EQ(text.rfind("Source\tTarget\n", 0), 0u);
  EXPECT_EQ(text.substr(0, 40).find("( ( "), 14u) << text.substr(0, 40);

  const auto back = read_listops_tsv(path);
  ASSERT_EQ(back.size(), s.val.size());
  for (size_t i = 0; i < back.size(); ++i) {
    EXPECT_EQ(back[i].tokens, s.val[i].tokens) << i;
    EXPECT_EQ(back[i].label, s.val[i].label) << i;
  }
  const ListOps from_file(path), in_memory(s.val, "generated");
  ASSERT_EQ(from_file.size(), in_memory.size());
  for (int64_t i = 0; i < from_file.size(); ++i) {
    const Example x = from_file.get(i, nullptr), y = in_memory.get(i, nullptr);
    EXPECT_EQ(x.input.to_vector<int64_t>(), y.input.to_vector<int64_t>()) << i;
    EXPECT_EQ(x.label, y.label);
  }
}

TEST(ListOps, GeneratorRejectsImpossibleConfigs) {
  ListOpsGenConfig c = small_splits(1, 0, 0);
  c.max_length = 501;
  expect_error([&] { generate_listops(c, 0); }, {"min_length", "max_length"});
  c = small_splits(1, 0, 0);
  c.max_args = 1;
  expect_error([&] { generate_listops(c, 0); }, {"max_args"});
  c = small_splits(1, 0, 0);
  c.max_depth = 1;  // every tree is a lone digit, never longer than 500 tokens
  expect_error([&] { generate_listops(c, 0); }, {"draws in a row", "0 of 1"});
}

}  // namespace
}  // namespace forge::data
