// A run's checkpoints: CheckpointManager's saves, its latest / best pointers
// and its retention (keep_last, keep_best), on the atomic commit of
// checkpoint_commit.h.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "core/file_io.h"
#include "core/safetensors.h"
#include "core/version.h"
#include "train/checkpoint_commit.h"

namespace forge::train {

namespace fs = std::filesystem;
using namespace checkpoint_detail;


CheckpointManager::CheckpointManager(std::string run_dir, int keep_last, int keep_best,
                                     std::string metric_name, std::string mode, Warn on_warning)
    : dir_((fs::path(run_dir) / "checkpoints").string()),
      keep_last_(keep_last),
      keep_best_(keep_best),
      metric_name_(std::move(metric_name)),
      maximize_(mode == "max"),
      warn_(std::move(on_warning)) {
  FORGE_CHECK(keep_last >= 1,
              "CheckpointManager: keep_last must be at least 1 (the latest checkpoint is always "
              "kept), found {}",
              keep_last);
  FORGE_CHECK(keep_best >= 0, "CheckpointManager: keep_best must be 0 or more, found {}",
              keep_best);
  FORGE_CHECK(mode == "max" || mode == "min",
              "CheckpointManager: mode must be \"max\" or \"min\", found \"{}\"", mode);

  std::error_code ec;
  std::vector<int64_t> steps;
  if (fs::is_directory(dir_, ec)) {
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      if (!e.is_directory(ec)) continue;
      if (const auto s = parse_name(e.path().filename().string())) steps.push_back(*s);
    }
  }
  std::sort(steps.begin(), steps.end());

  const auto readable = [&](int64_t s, std::string& why) {
    try {
      for (const std::string& w : read_checkpoint(path_of(s)).warnings) warn(w);
      return true;
    } catch (const Error& e) {
      why = message_of(e);
      return false;
    }
  };
  const auto read_pointer = [&](const char* file) -> std::optional<int64_t> {
    const fs::path p = fs::path(dir_) / file;
    if (!exists_no_follow(p)) return std::nullopt;
    try {
      const std::string text = trim(io::read_file(p.string(), kMaxPointerBytes));
      if (const auto s = parse_name(text)) return s;
      warn(fmt::format("{}: holds \"{}\", not a checkpoint name like step-00001234", p.string(),
                       escaped(text)));
    } catch (const Error& e) {
      warn(message_of(e));
    }
    return std::nullopt;
  };

  const fs::path latest_file = fs::path(dir_) / "latest";
  const std::optional<int64_t> named = read_pointer("latest");
  std::string why;
  if (named) {
    if (!std::binary_search(steps.begin(), steps.end(), *named)) {
      latest_problem_ = fmt::format("{} names {}, which does not exist", latest_file.string(),
                                    name_of(*named));
    } else if (readable(*named, why)) {
      latest_ = named;
    } else {
      damaged_latest_ = fmt::format("{} ({})", path_of(*named), why);
      latest_problem_ = fmt::format("{} names {}, which is damaged: {}", latest_file.string(),
                                    name_of(*named), why);
    }
  } else if (!steps.empty()) {
    latest_problem_ = fmt::format("{} is missing or unreadable", latest_file.string());
  }
  if (latest_problem_)
    warn(fmt::format("{}; falling back to the newest readable checkpoint", *latest_problem_));
  if (!latest_) {
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      if (named && *it == *named) continue;
      if (readable(*it, why)) {
        latest_ = *it;
        warn(fmt::format("using {} as the latest checkpoint", path_of(*it)));
        break;
      }
      warn(fmt::format("skipping {}: {}", path_of(*it), why));
    }
  }

  for (int64_t s : steps) {
    if (latest_ && s > *latest_) {
      abandoned_.push_back(s);
      continue;
    }
    Entry e{s, std::nullopt};
    if (!metric_name_.empty()) {
      try {
        const fs::path state = fs::path(path_of(s)) / kFiles[2];
        const json::Value v =
            json::parse(io::read_file(state.string(), kMaxStateBytes), state.string());
        const json::Value* m = v.is_object() ? v.find("checkpoint_metric") : nullptr;
        if (m && m->is_object()) {
          const json::Value* n = m->find("name");
          const json::Value* x = m->find("value");
          if (n && n->is_string() && n->as_string() == metric_name_ && x && x->is_number())
            e.metric = x->as_double();
        }
      } catch (const Error&) {
        // Unreadable: it has no metric and is never the best.
      }
    }
    entries_.push_back(e);
  }
  if (!abandoned_.empty()) {
    warn(
        fmt::format("{} checkpoint(s) newer than {} belong to an interrupted run and will be "
                    "deleted by the next save",
                    abandoned_.size(), path_of(*latest_)));
  }
  // The best one must be readable too.
  while (const auto b = best_index()) {
    if (latest_ && entries_[*b].step == *latest_) break;
    if (readable(entries_[*b].step, why)) break;
    warn(fmt::format("best checkpoint candidate {} cannot be read ({}); ignoring it",
                     path_of(entries_[*b].step), why));
    entries_[*b].metric.reset();
  }
  best_on_disk_ = read_pointer("best");
}

std::string CheckpointManager::name_of(int64_t step) {
  return fmt::format("step-{:08d}", step);
}

bool CheckpointManager::holds_checkpoint(const std::string& run_dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "checkpoints", ec)) {
    std::string name = e.path().filename().string();
    std::string base;
    std::string_view mark;
    if (split_leftover(name, base, mark)) {
      if (mark != kOldMark) continue;
      name = base;
    }
    if (parse_name(name)) return true;
  }
  return false;
}

std::string CheckpointManager::path_of(int64_t step) const {
  return (fs::path(dir_) / name_of(step)).string();
}

void CheckpointManager::warn(const std::string& message) {
  warnings_.push_back(message);
  if (warn_) {
    warn_(message);
  } else {
    spdlog::warn("{}", message);
  }
}

bool CheckpointManager::better(double a, double b) const {
  return maximize_ ? a > b : a < b;
}

std::optional<size_t> CheckpointManager::best_index() const {
  std::optional<size_t> best;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!entries_[i].metric) continue;
    if (!best || better(*entries_[i].metric, *entries_[*best].metric)) best = i;
  }
  return best;
}

std::optional<std::string> CheckpointManager::latest() const {
  if (!latest_) return std::nullopt;
  return path_of(*latest_);
}

std::optional<std::string> CheckpointManager::best() const {
  const auto b = best_index();
  if (!b) return std::nullopt;
  return path_of(entries_[*b].step);
}

std::vector<std::string> CheckpointManager::list() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(path_of(e.step));
  return out;
}

std::string CheckpointManager::save(int64_t step_number, const Checkpoint& ckpt,
                                    std::optional<double> metric) {
  FORGE_CHECK(step_number >= 0, "CheckpointManager::save: step must be non-negative, found {}",
              step_number);
  FORGE_CHECK(!metric || !metric_name_.empty(),
              "CheckpointManager::save: a metric value was given but this manager tracks no "
              "metric (its metric_name is empty)");
  FORGE_CHECK(ckpt.state.is_null() || ckpt.state.is_object(),
              "CheckpointManager::save: the state must be a JSON object, found {}",
              json::type_name(ckpt.state.type()));
  std::error_code ec;
  fs::create_directories(dir_, ec);
  FORGE_CHECK(!ec, "CheckpointManager: cannot create {}: {}", dir_, ec.message());
  clean_leftovers(dir_, "");

  json::Value state = ckpt.state.is_null() ? json::Value(json::Object{}) : ckpt.state;
  const bool finite = metric && std::isfinite(*metric);
  if (metric) {
    json::Object m;
    m.emplace_back("name", json::Value(metric_name_));
    m.emplace_back("value", finite ? json::Value(*metric) : json::Value());
    state["checkpoint_metric"] = json::Value(std::move(m));
  } else {
    // A state carried over from a loaded checkpoint must not lend this one its metric.
    std::erase_if(state.as_object(),
                  [](const auto& kv) { return kv.first == "checkpoint_metric"; });
  }
  const std::string path = path_of(step_number);
  write_checkpoint_impl(path, ckpt.model, ckpt.optimizer, ckpt.recipe_yaml, ckpt.card, state);

  // Whole on disk: record it, then commit it through `latest`.
  std::erase(abandoned_, step_number);
  auto it = std::lower_bound(entries_.begin(), entries_.end(), step_number,
                             [](const Entry& e, int64_t s) { return e.step < s; });
  const Entry entry{step_number, finite ? metric : std::nullopt};
  if (it != entries_.end() && it->step == step_number) {
    *it = entry;
  } else {
    entries_.insert(it, entry);
  }
  write_atomic(fs::path(dir_) / "latest", name_of(step_number) + "\n", true);
  latest_ = step_number;

  prune();
  return path;
}

void CheckpointManager::tidy() {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return;
  clean_leftovers(dir_, "");
  prune();
}

void CheckpointManager::point_best() {
  const auto b = best_index();
  const std::optional<int64_t> best_step =
      b ? std::optional<int64_t>(entries_[*b].step) : std::nullopt;
  if (best_step == best_on_disk_) return;
  const fs::path best_file = fs::path(dir_) / "best";
  if (best_step) {
    write_atomic(best_file, name_of(*best_step) + "\n", true);
  } else {
    step("remove best");
    std::error_code ec;
    fs::remove(best_file, ec);
  }
  best_on_disk_ = best_step;
}

void CheckpointManager::prune() {
  // `best` first: a kill anywhere below leaves it naming a checkpoint that exists.
  point_best();
  std::vector<int64_t> keep;
  if (latest_) keep.push_back(*latest_);
  for (size_t i = entries_.size() > static_cast<size_t>(keep_last_)
                      ? entries_.size() - static_cast<size_t>(keep_last_)
                      : 0;
       i < entries_.size(); ++i) {
    keep.push_back(entries_[i].step);
  }
  std::vector<const Entry*> ranked;
  for (const Entry& e : entries_) {
    if (e.metric) ranked.push_back(&e);
  }
  // Best first; among equals the earlier one, which reached the value first.
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](const Entry* a, const Entry* b) { return better(*a->metric, *b->metric); });
  if (!ranked.empty()) keep.push_back(ranked.front()->step);
  for (size_t i = 0; i < ranked.size() && i < static_cast<size_t>(keep_best_); ++i)
    keep.push_back(ranked[i]->step);

  std::vector<int64_t> victims = abandoned_;
  for (const Entry& e : entries_) {
    if (std::find(keep.begin(), keep.end(), e.step) == keep.end()) victims.push_back(e.step);
  }
  for (int64_t s : victims) {
    // Renamed first, so a crash mid-delete leaves a leftover, never a half checkpoint.
    const std::string path = path_of(s);
    const std::string doomed = path + std::string(kDelMark) + pid_suffix();
    step("rename " + name_of(s) + " for deletion");
    if (::rename(path.c_str(), doomed.c_str()) != 0) {
      warn(fmt::format("cannot delete old checkpoint {}: rename to {} failed: {}", path, doomed,
                       io::errno_message()));
      continue;
    }
    std::erase_if(entries_, [s](const Entry& e) { return e.step == s; });
    std::erase(abandoned_, s);
    step("remove " + name_of(s));
    std::error_code ec;
    fs::remove_all(doomed, ec);
    if (ec) warn(fmt::format("cannot delete old checkpoint {}: {}", doomed, ec.message()));
  }
}


}  // namespace forge::train
