// MetricsLog: JSON lines appended and readable at once, NaN as null, resume
// truncation that reproduces an uninterrupted run's file byte for byte, and
// read errors naming the file and line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "tests/test_util.h"
#include "train/metrics.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using namespace forge::testing;

class MetricsLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ =
        fs::temp_directory_path() / fmt::format("forge_metrics_{}_{}", ::getpid(), info->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

// The run directory's TensorBoard event file (the one, or empty).
fs::path event_file_of(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) return e.path();
  return {};
}

// The steps of `tag`'s scalars in an event file, read back by the independent
// reader tests/train/read_tfevents.py (Debian's python3).
std::vector<int64_t> scalar_steps(const fs::path& file, const std::string& tag) {
  const std::string cmd = fmt::format("/usr/bin/python3 {}/tests/train/read_tfevents.py '{}'",
                                      FORGE_SOURCE_DIR, file.string());
  FILE* pipe = ::popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << cmd;
  std::vector<int64_t> steps;
  if (!pipe) return steps;
  char line[4096];
  while (std::fgets(line, sizeof line, pipe)) {
    const json::Value r = json::parse(line, "read_tfevents.py");
    if (const json::Value* t = r.find("tag"); t && t->as_string() == tag)
      steps.push_back(r.at("step").as_int());
  }
  EXPECT_EQ(::pclose(pipe), 0) << cmd;
  return steps;
}

// The records of a short run: train every 10 steps, eval every 20.
void log_steps(MetricsLog& log, int64_t from, int64_t to) {
  for (int64_t s = from; s <= to; s += 10) {
    log.log(s, "train", {{"loss", 2.0 / static_cast<double>(s)}, {"lr", 1e-3}});
    if (s % 20 == 0)
      log.log(s, "eval", {{"loss", 1.0 / static_cast<double>(s)}, {"accuracy", 0.5}});
  }
}

// metrics.csv and the TensorBoard scalars hold what metrics.jsonl holds.
TEST_F(MetricsLogTest, CsvAndTensorBoardCarryEveryRecord) {
  {
    MetricsLog log(root_.string());
    log_steps(log, 10, 40);
  }
  const std::string csv = read_file(root_ / "metrics.csv");
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "step,split,loss,lr,accuracy");
  EXPECT_NE(csv.find("\n20,eval,0.05,,0.5\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\n10,train,0.2,0.001,\n"), std::string::npos) << csv;
  const fs::path events = event_file_of(root_);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(scalar_steps(events, "train/loss"), (std::vector<int64_t>{10, 20, 30, 40}));
  EXPECT_EQ(scalar_steps(events, "eval/accuracy"), (std::vector<int64_t>{20, 40}));
}

TEST_F(MetricsLogTest, AppendsReadableLines) {
  MetricsLog log(root_.string());
  EXPECT_EQ(log.path(), (root_ / "metrics.jsonl").string());
  log.log(10, "train", {{"loss", 0.25}, {"accuracy", 0.875}});
  // Written through at once: readable while the log is open.
  EXPECT_EQ(read_file(log.path()),
            "{\"step\":10,\"split\":\"train\",\"loss\":0.25,\"accuracy\":0.875}\n");
  log.log(20, "eval", {{"loss", std::nan("")}, {"tokens", 1e6}});
  json::Object r;
  r.emplace_back("step", json::Value(30));
  r.emplace_back("split", json::Value("train"));
  r.emplace_back("lr", json::Value(INFINITY));
  r.emplace_back("note", json::Value("warmup done"));
  log.append(json::Value(std::move(r)));

  const auto records = read_metrics(log.path());
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].at("step").as_int(), 10);
  EXPECT_EQ(records[0].at("accuracy").as_double(), 0.875);
  EXPECT_EQ(records[1].at("split").as_string(), "eval");
  EXPECT_TRUE(records[1].at("loss").is_null());  // NaN has no JSON form
  EXPECT_EQ(records[1].at("tokens").as_double(), 1e6);
  EXPECT_TRUE(records[2].at("lr").is_null());
  EXPECT_EQ(records[2].at("note").as_string(), "warmup done");
}

TEST_F(MetricsLogTest, AFreshRunStartsEmpty) {
  fs::create_directories(root_);
  write_file(root_ / "metrics.jsonl", "{\"step\":5,\"split\":\"train\"}\n");
  MetricsLog log(root_.string());
  EXPECT_EQ(read_file(log.path()), "");
}

TEST_F(MetricsLogTest, ResumeReproducesTheUninterruptedFile) {
  const fs::path whole = root_ / "whole", resumed = root_ / "resumed";
  {
    MetricsLog log(whole.string());
    log_steps(log, 10, 100);
  }
  {
    // The run got to step 70, saved its last checkpoint at 40, and was killed
    // in the middle of a line.
    MetricsLog log(resumed.string());
    log_steps(log, 10, 70);
  }
  {
    std::ofstream out(resumed / "metrics.jsonl", std::ios::binary | std::ios::app);
    out << "{\"step\":80,\"split\":\"tr";
  }
  {
    MetricsLog log(resumed.string(), 40);
    const auto kept = read_metrics(log.path());
    ASSERT_EQ(kept.size(), 6u);  // train 10..40, eval 20 and 40
    EXPECT_EQ(kept.back().at("step").as_int(), 40);
    log_steps(log, 50, 100);
  }
  EXPECT_EQ(read_file(resumed / "metrics.jsonl"), read_file(whole / "metrics.jsonl"));
  EXPECT_EQ(read_file(resumed / "metrics.csv"), read_file(whole / "metrics.csv"));
  EXPECT_EQ(read_metrics((whole / "metrics.jsonl").string()).size(), 15u);
  // TensorBoard: one event file, holding every kept and new record's scalars
  // (the resumed file's replay of steps up to 40, then 50..100).
  std::vector<fs::path> events;
  for (const auto& e : fs::directory_iterator(resumed)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("events.out.tfevents.", 0) == 0)
      events.push_back(e.path());
    else
      EXPECT_TRUE(name == "metrics.jsonl" || name == "metrics.csv") << "leftover " << e.path();
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(scalar_steps(events[0], "train/loss"),
            scalar_steps(event_file_of(whole), "train/loss"));
}

TEST_F(MetricsLogTest, ResumeWithoutAFileStartsOne) {
  MetricsLog log(root_.string(), 100);
  log.log(110, "train", {{"loss", 1.0}});
  EXPECT_EQ(read_metrics(log.path()).size(), 1u);
}

TEST_F(MetricsLogTest, ResumeRejectsACorruptRecord) {
  fs::create_directories(root_);
  write_file(
      root_ / "metrics.jsonl",
      "{\"step\":10,\"split\":\"train\"}\n{\"step\":oops}\n{\"step\":30,\"split\":\"train\"}\n");
  const std::string before = read_file(root_ / "metrics.jsonl");
  expect_error([&] { MetricsLog log(root_.string(), 20); }, {"metrics.jsonl:2"});
  EXPECT_EQ(read_file(root_ / "metrics.jsonl"), before);
}

TEST_F(MetricsLogTest, ReadErrorsNameTheLine) {
  fs::create_directories(root_);
  const fs::path p = root_ / "metrics.jsonl";
  const std::string good = "{\"step\":1,\"split\":\"train\",\"loss\":1}\n";
  write_file(p, good + "\n" + good + "{\"step\":2,\"split\":\"train\",\"loss\":}\n");
  expect_error([&] { read_metrics(p.string()); }, {p.string() + ":4", "invalid JSON"});
  write_file(p, good + "[1, 2]\n");
  expect_error([&] { read_metrics(p.string()); }, {p.string() + ":2", "JSON object"});
  write_file(p, good + "{\"split\":\"train\"}\n");
  expect_error([&] { read_metrics(p.string()); }, {p.string() + ":2", "\"step\""});
  write_file(p, "{\"step\":-3,\"split\":\"train\"}\n");
  expect_error([&] { read_metrics(p.string()); }, {p.string() + ":1", "-3"});
  write_file(p, "{\"step\":3,\"split\":7}\n");
  expect_error([&] { read_metrics(p.string()); }, {p.string() + ":1", "\"split\""});
  expect_error([&] { read_metrics((root_ / "none.jsonl").string()); }, {"none.jsonl"});
  // Blank lines are allowed; a last line without its newline is read.
  write_file(p, good + "\n  \n" + "{\"step\":2,\"split\":\"eval\"}");
  EXPECT_EQ(read_metrics(p.string()).size(), 2u);
}

TEST_F(MetricsLogTest, AppendChecksTheRecord) {
  MetricsLog log(root_.string());
  expect_error(
      [&] {
        log.append(json::Value(json::Object{{"step", json::Value(1)}}));
      },
      {"\"split\""});
  expect_error([&] { log.append(json::Value(json::Array{})); }, {"JSON object"});
  expect_error([&] { log.log(1, "train", {{"loss", 1.0}, {"loss", 2.0}}); }, {"\"loss\" twice"});
  expect_error([&] { log.log(1, "train", {{"step", 2.0}}); }, {"\"step\" twice"});
  EXPECT_EQ(read_file(log.path()), "");
}

}  // namespace
}  // namespace forge::train
