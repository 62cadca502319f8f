// A run's directory (see run_dir.h).
#include "train/run_dir.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "dist/group.h"
#include "train/checkpoint.h"
#include "train/outputs.h"

namespace forge::train {

namespace fs = std::filesystem;

namespace {

// The entries a run writes at the top of its directory. A directory holding
// only these (and what a killed atomic write of one leaves) and no checkpoint
// is a start that stopped before its first checkpoint: a new start may take it over.
constexpr const char* kRunEntries[] = {"recipe.yaml", "train.log",     "metrics.jsonl",
                                       "metrics.csv", "curves.svg",    "checkpoints",
                                       "data",        "attention_maps"};

// What a killed atomic write of a run entry leaves (recipe.yaml.tmp-PID, ...).
bool is_run_entry_temp(const std::string& name) {
  for (const char* e : kRunEntries)
    if (io::is_atomic_write_temp(name, e)) return true;
  return false;
}

bool is_run_entry(const std::string& name) {
  for (const char* e : kRunEntries)
    if (name == e) return true;
  if (name.rfind("events.out.tfevents.", 0) == 0) return true;  // TensorBoard
  return is_run_entry_temp(name);
}

}  // namespace

std::string next_run_dir(const Recipe& r, dist::Group& group) {
  const std::string prefix = r.string("name") + "-";
  int64_t n = 1;
  if (group.root()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("runs", ec)) {
      const std::string f = e.path().filename().string();
      if (f.size() <= prefix.size() || f.size() > prefix.size() + 9 ||
          f.compare(0, prefix.size(), prefix) != 0)
        continue;
      const std::string digits = f.substr(prefix.size());
      if (digits.find_first_not_of("0123456789") == std::string::npos)
        n = std::max<int64_t>(n, std::stoll(digits) + 1);
    }
  }
  group.broadcast(&n, sizeof n, 0, "the number of the new run directory");
  return (fs::path("runs") / fmt::format("{}{}", prefix, n)).string();
}

void check_new_run_dir(const std::string& run_dir) {
  std::error_code ec;
  if (const auto area = checkpoint_area_of(run_dir))
    FORGE_FAIL("run directory {}: inside the checkpoint directory {}; a run never goes into a "
               "checkpoint (train into another directory: --out DIR)",
               run_dir, *area);
  if (!fs::exists(run_dir, ec)) return;
  FORGE_CHECK(fs::is_directory(run_dir, ec), "run directory {} exists and is not a directory",
              run_dir);
  FORGE_CHECK(!CheckpointManager::holds_checkpoint(run_dir),
              "run directory {} already holds a run; continue it with --resume {} or train into "
              "another directory (--out DIR or --set output.dir=DIR)",
              run_dir, run_dir);
  std::vector<std::string> history;  // what a new start would truncate or delete
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string name = e.path().filename().string();
    FORGE_CHECK(is_run_entry(name),
                "run directory {} is not empty and holds no run (found '{}'); train into another "
                "directory (--out DIR) or empty it",
                run_dir, name);
    const bool events = name.rfind("events.out.tfevents.", 0) == 0;
    if ((name == "metrics.jsonl" || name == "metrics.csv" || name == "train.log" || events) &&
        e.is_regular_file(ec) && e.file_size(ec) > 0)
      history.push_back(fmt::format("{} ({} bytes)", name, e.file_size(ec)));
  }
  std::sort(history.begin(), history.end());
  FORGE_CHECK(history.empty(),
              "run directory {} holds the history of an earlier start but no checkpoint: {}. A new "
              "start would replace it. Continue that run with --resume {} (it starts again from "
              "its recipe.yaml, its metrics kept up to where it resumes), train into another "
              "directory (--out DIR), or move those files away",
              run_dir, fmt::join(history, ", "), run_dir);
}

void remove_leftover_temps(const std::string& run_dir) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (const auto& f : fs::directory_iterator(run_dir, ec))
    if (is_run_entry_temp(f.path().filename().string())) doomed.push_back(f.path());
  for (const fs::path& p : doomed) fs::remove(p, ec);
}

CreatedDirGuard::CreatedDirGuard(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  armed_ = !fs::exists(dir_, ec);
}

CreatedDirGuard::~CreatedDirGuard() {
  std::error_code ec;
  if (armed_) fs::remove_all(dir_, ec);
}

RunLog::RunLog(bool console)
    : pending_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096)) {
  std::vector<spdlog::sink_ptr> sinks;
  if (console) sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  sinks.push_back(pending_);
  logger_ = std::make_shared<spdlog::logger>("attnforge", sinks.begin(), sinks.end());
  logger_->set_pattern("[%H:%M:%S] %^%l%$ %v");
  logger_->flush_on(spdlog::level::info);
}

void RunLog::commit(const std::string& run_dir) {
  const std::string path = (fs::path(run_dir) / "train.log").string();
  {
    std::ofstream out(path, std::ios::app | std::ios::binary);
    FORGE_CHECK(out.good(), "{}: cannot open for writing", path);
    for (const std::string& line : pending_->last_formatted()) out << line;
    FORGE_CHECK(out.good(), "{}: write failed", path);
  }
  auto& sinks = logger_->sinks();
  std::erase(sinks, spdlog::sink_ptr(pending_));
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, false);
  file->set_pattern("[%H:%M:%S] %^%l%$ %v");
  sinks.push_back(std::move(file));
}

}  // namespace forge::train
