// The benchmark programs' one option parser (bench/bench_args.h): every target
// kind, flags, and the errors for an unknown option, a missing value and a
// malformed number.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "tests/test_util.h"

namespace forge::bench {
namespace {

// The message of the error fn throws, without the "(file:line)" that follows.
template <typename F>
std::string message_of(F&& fn) {
  const std::string m = testing::error_of(fn);
  return m.substr(0, m.rfind(" ("));
}

// Parses `words` (argv[0] is the program) against the options.
void parse(std::vector<std::string> words, const std::vector<BenchOption>& options) {
  words.insert(words.begin(), "bench_test");
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  parse_bench_args(static_cast<int>(argv.size()), argv.data(), options);
}

TEST(BenchArgs, EveryTargetKind) {
  int runs = 3;
  int64_t n = 1;
  double lr = 0;
  bool csv = false, quiet = false;
  std::string loss = "mse";
  std::vector<std::string> kinds = {"favor"}, sets;
  parse({"--n", "4096", "--csv", "--kind", "linear,,favor", "--lr", "2.5e-3", "--runs", "7",
         "--loss", "sum", "--set", "a=1", "--set", "b=2"},
        {{"--runs", &runs},
         {"--n", &n},
         {"--lr", &lr},
         {"--csv", &csv},
         {"--quiet", &quiet},
         {"--loss", &loss},
         {"--kind", &kinds},
         {"--set", [&](const std::string& v) { sets.push_back(v); }}});
  EXPECT_EQ(runs, 7);
  EXPECT_EQ(n, 4096);
  EXPECT_DOUBLE_EQ(lr, 2.5e-3);
  EXPECT_TRUE(csv);
  EXPECT_FALSE(quiet);  // a flag not given keeps its default
  EXPECT_EQ(loss, "sum");
  EXPECT_EQ(kinds, (std::vector<std::string>{"linear", "favor"}));
  EXPECT_EQ(sets, (std::vector<std::string>{"a=1", "b=2"}));
}

TEST(BenchArgs, ErrorsNameTheOption) {
  int64_t n = 1;
  bool csv = false;
  const std::vector<BenchOption> options = {{"--n", &n}, {"--csv", &csv}};
  EXPECT_EQ(message_of([&] {
              parse({"--m", "3"}, options);
            }),
            "unknown argument --m (options: --n, --csv)");
  EXPECT_EQ(message_of([&] { parse({"--csv", "--n"}, options); }), "--n needs a value");
  EXPECT_EQ(message_of([&] { parse({"--n", "many"}, options); }), "--n takes a number, got 'many'");
  EXPECT_EQ(message_of([&] { parse({"--n", "12x"}, options); }), "--n takes a number, got '12x'");
  EXPECT_EQ(message_of([&] {
              parse({"--n", "99999999999999999999"}, options);
            }),
            "--n takes a number, got '99999999999999999999'");
  // An error from a function target passes through as it is.
  EXPECT_EQ(message_of([&] {
              parse({"--device", "tpu"},
                    {{"--device", [](const std::string& v) { FORGE_FAIL("no device {}", v); }}});
            }),
            "no device tpu");
}

TEST(BenchArgs, MainTurnsAnErrorIntoExitStatusOne) {
  char name[] = "bench_test";
  char* argv[] = {name};
  EXPECT_EQ(bench_main("bench_test", 1, argv, [](int, char**) { return 0; }), 0);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(bench_main("bench_test", 1, argv, [](int, char**) -> int { FORGE_FAIL("broken"); }), 1);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("bench_test: error: broken"),
            std::string::npos);
}

}  // namespace
}  // namespace forge::bench
