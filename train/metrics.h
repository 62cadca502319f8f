// Metrics: RUN/metrics.jsonl, one JSON object per line, e.g.
//   {"step": 1200, "split": "train", "loss": 0.412, "accuracy": 0.87, "lr": 0.0003}
// and the same records as RUN/metrics.csv (one column per key, in order of
// first appearance; a record without a key leaves its cell empty) and as
// TensorBoard scalars (RUN/events.out.tfevents.*, train/tensorboard.h; tags
// "<split>/<key>", e.g. "train/loss").
// Each record is written with one write() as soon as it is logged, so a crash
// loses at most a torn last line. Resuming at step S keeps the records with
// step <= S (and drops a torn last line), so a resumed run's file equals an
// uninterrupted run's as long as the trainer logs a step's records before it
// saves that step's checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/json.h"
#include "train/metrics_file.h"

namespace forge::train {

class EventWriter;

class MetricsLog {
 public:
  // A fresh run (no `resume_step`) starts an empty run_dir/metrics.jsonl,
  // replacing any; a resumed one keeps the records up to `resume_step` (the
  // file is replaced atomically when anything is dropped) and appends.
  explicit MetricsLog(const std::string& run_dir, std::optional<int64_t> resume_step = {});
  // What opening a MetricsLog on run_dir would read or need, checked without
  // writing anything: a resumed run's metrics.jsonl parses, and every file it
  // would append to or replace (metrics.jsonl, metrics.csv, the event files)
  // can be written. A failure names the file. The trainer calls it before it
  // writes anything of a run.
  static void check_can_open(const std::string& run_dir, std::optional<int64_t> resume_step = {});
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // `record` must be an object with an integer "step" >= 0 and a string
  // "split" ("train" or "eval"). Non-finite numbers, which JSON cannot hold,
  // are written as null (a NaN loss shows as a gap in the plot).
  void append(const json::Value& record);
  // {"step": step, "split": split, name: value, ...} in the given order.
  void log(int64_t step, const std::string& split,
           const std::vector<std::pair<std::string, double>>& values);

  const std::string& path() const { return path_; }

 private:
  class Csv;
  void write_event(const json::Value& record, double wall_time);
  std::string path_;
  int fd_ = -1;
  std::unique_ptr<Csv> csv_;
  std::unique_ptr<EventWriter> events_;
};


}  // namespace forge::train
