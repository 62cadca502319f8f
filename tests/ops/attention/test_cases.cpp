// The one list of attention cases (ops/attention/cases.h) and its consumers:
// every mechanism is listed, names are unique, every case passes gradcheck,
// runs at other sizes than its own, and is timed by the benchmark (the GPU
// comparison, tests/cuda/test_cuda_attention_cases.cpp, walks the same list).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/attention.h"
#include "ops/attention/cases.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using ops::attention::attention_cases;

std::string mechanism_of(const std::string& name) {
  return name.substr(0, name.find('/'));
}

TEST(AttentionCases, ListEveryMechanismOnceByName) {
  std::set<std::string> names, mechanisms, benchmarked;
  for (const auto& c : attention_cases()) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate case " << c.name;
    // Names are CSV fields and --mechanisms lists.
    EXPECT_EQ(c.name.find_first_of(", "), std::string::npos) << c.name;
    mechanisms.insert(mechanism_of(c.name));
    if (c.bench) benchmarked.insert(mechanism_of(c.name));
    EXPECT_EQ(ops::attention::find_attention_case(c.name), &c);
  }
  const std::set<std::string> expected = {"softmax",       "local",     "efficient", "linear",
                                          "taylor_linear", "linformer", "favor",     "taylorshift"};
  EXPECT_EQ(mechanisms, expected);
  // Each mechanism has a row in the benchmark's default table.
  EXPECT_EQ(benchmarked, expected);
  EXPECT_EQ(ops::attention::find_attention_case("softmax/none"), nullptr);
}

TEST(AttentionCases, EveryCasePassesGradcheck) {
  for (const auto& c : attention_cases()) {
    SCOPED_TRACE(c.name);
    EXPECT_GRADCHECK(c.fn, c.make_inputs(c.dims), c.gradcheck);
  }
}

// make_inputs honours the dims it is given (what the benchmark relies on):
// the output is [B, H, N, dv] and finite at a size of its own.
TEST(AttentionCases, EveryCaseRunsAtOtherDims) {
  for (const auto& c : attention_cases()) {
    SCOPED_TRACE(c.name);
    const int64_t N = c.length_for(19);
    const Tensor o = c.fn(c.make_inputs({.B = 1, .H = 3, .N = N, .M = N, .d = 5, .dv = 7}));
    ASSERT_EQ(o.shape(), (Shape{1, 3, N, 7}));
    for (double x : o.to_vector<double>()) ASSERT_TRUE(std::isfinite(x));
  }
}

// The benchmark times every case by name (--mechanisms all): each gets a
// row with its times and peak memory (at the length it takes nearest 16),
// none fails.
TEST(AttentionCases, TheBenchmarkTimesEveryCase) {
  std::vector<std::string> args = {
      "bench_attention", "--mechanisms", "all", "--ns", "16", "--dim", "8", "--heads", "2",
      "--csv",           "--budget",     "0"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  const int status = bench_attention_main(static_cast<int>(argv.size()), argv.data());
  std::fflush(stdout);
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(status, 0);
  std::map<std::string, std::string> rows;  // case -> the rest of its CSV line
  std::istringstream lines(out);
  std::string line;
  std::getline(lines, line);
  EXPECT_EQ(line, "mechanism,B,N,fwd_ms,fwdbwd_ms,peak_MiB,floor_ms");
  while (std::getline(lines, line)) rows[line.substr(0, line.find(','))] = line;
  EXPECT_EQ(rows.size(), attention_cases().size());
  for (const auto& c : attention_cases()) {
    ASSERT_TRUE(rows.count(c.name)) << c.name << " has no row in:\n" << out;
    EXPECT_EQ(rows[c.name].find("failed"), std::string::npos) << rows[c.name];
    const std::string N = std::to_string(c.length_for(16));
    EXPECT_EQ(rows[c.name].rfind(c.name + ",1," + N + ",", 0), 0u) << rows[c.name];
  }
}

}  // namespace
}  // namespace forge
