// The one list of attention cases (ops/attention/cases.h) and its consumers:
// every mechanism is listed, names are unique, every case passes gradcheck,
// runs at other sizes than its own, and is timed by the benchmark (the GPU
// comparison, tests/cuda/test_cuda_attention_cases.cpp, walks the same list).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
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

// docs/ARCHITECTURE.md's "Where each mechanism lives": a row per mechanism
// of the list (and one for the files they all share) naming its CPU files,
// GPU files and tests; every file named exists, and every file of
// ops/attention/, tests/ops/attention/ and tests/cuda/'s attention tests is
// named.
TEST(AttentionFiles, TheMapNamesEveryFileAndEveryMechanism) {
  namespace fs = std::filesystem;
  const fs::path root = FORGE_SOURCE_DIR;
  const std::string doc = testing::read_file(root / "docs" / "ARCHITECTURE.md");
  const size_t at = doc.find("### Where each mechanism lives");
  ASSERT_NE(at, std::string::npos);
  const size_t table = doc.find("\n| mechanism | CPU | GPU | tests |", at);
  ASSERT_NE(table, std::string::npos);
  const std::vector<fs::path> folders = {root / "ops/attention", root / "tests/ops/attention",
                                         root / "tests/cuda"};
  std::set<std::string> rows, named;
  std::istringstream lines(doc.substr(table + 1));
  std::string line;
  std::getline(lines, line);  // the header
  std::getline(lines, line);  // |---|
  // A backticked file name of those folders: `name.cpp`, `.h`, `.cu` or `.cuh`.
  const auto file_names = [](const std::string& row) {
    std::vector<std::string> names;
    for (size_t open = row.find('`'); open != std::string::npos; open = row.find('`', open + 1)) {
      const size_t close = row.find('`', open + 1);
      if (close == std::string::npos) break;
      const std::string name = row.substr(open + 1, close - open - 1);
      open = close;
      const size_t dot = name.rfind('.');
      const std::string ext = dot == std::string::npos ? "" : name.substr(dot);
      if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
      if (name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != dot) continue;
      names.push_back(name);
    }
    return names;
  };
  while (std::getline(lines, line) && line.rfind("| ", 0) == 0) {
    const std::string mechanism = line.substr(2, line.find(" |", 2) - 2);
    rows.insert(mechanism);
    std::set<std::string> in_row;
    for (const std::string& name : file_names(line)) {
      bool exists = false;
      for (const fs::path& f : folders) exists = exists || fs::exists(f / name);
      EXPECT_TRUE(exists) << mechanism << "'s row names " << name << ", which is not in "
                          << "ops/attention/, tests/ops/attention/ or tests/cuda/";
      in_row.insert(name);
      named.insert(name);
    }
    if (mechanism != "(all)") {
      EXPECT_TRUE(in_row.count(mechanism + ".cpp")) << mechanism << "'s row lacks its CPU file";
      EXPECT_TRUE(in_row.count("test_" + mechanism + ".cpp"))
          << mechanism << "'s row lacks its test";
    }
  }
  std::set<std::string> mechanisms = {"(all)"};
  for (const auto& c : attention_cases()) mechanisms.insert(mechanism_of(c.name));
  EXPECT_EQ(rows, mechanisms);
  for (const fs::path& folder : folders) {
    for (const auto& e : fs::directory_iterator(folder)) {
      const std::string name = e.path().filename().string();
      if (folder.filename() == "cuda" && name.find("attention") == std::string::npos) continue;
      if (e.path().extension() == ".txt") continue;
      EXPECT_TRUE(named.count(name)) << e.path().string() << " is in no row of the map";
    }
  }
}

}  // namespace
}  // namespace forge
