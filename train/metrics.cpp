// MetricsLog: the run's metrics (JSON lines, CSV, TensorBoard) as it trains;
// reading metrics.jsonl is metrics_file.cpp's.
#include "train/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/file_io.h"
#include "train/checkpoint.h"
#include "train/metrics_file.h"
#include "train/tensorboard.h"

namespace forge::train {

namespace fs = std::filesystem;

namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One CSV field: numbers in their shortest exact form, null (a non-finite
// number) empty, text quoted when it holds a comma, a quote or a line break.
std::string csv_field(const json::Value* v) {
  if (!v || v->is_null()) return "";
  if (v->is_string()) {
    const std::string& t = v->as_string();
    if (t.find_first_of(",\"\r\n") == std::string::npos) return t;
    std::string q = "\"";
    for (const char c : t) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }
  return json::dump(*v);
}

std::string csv_row(const std::vector<std::string>& columns, const json::Value& record) {
  std::string row;
  for (size_t i = 0; i < columns.size(); ++i) {
    if (i) row += ',';
    row += csv_field(record.find(columns[i]));
  }
  return row + "\n";
}

}  // namespace

// metrics.csv: every record of metrics.jsonl as a row. Its columns are the
// keys seen so far in order of first appearance; a record with a new key
// rewrites the file (atomically, from metrics.jsonl) with the wider header,
// which happens a few times per run (the first train and eval records). A
// resumed run's CSV is rebuilt from the records it keeps.
class MetricsLog::Csv {
 public:
  // `jsonl`: the metrics file, read back when the header widens.
  Csv(std::string path, std::string jsonl) : path_(std::move(path)), jsonl_(std::move(jsonl)) {
    rewrite();
  }
  ~Csv() {
    if (fd_ >= 0) ::close(fd_);
  }
  // After the record was appended to metrics.jsonl.
  void append(const json::Value& record) {
    if (widen(record)) return rewrite();
    const std::string row = csv_row(columns_, record);
    io::write_all(fd_, row.data(), row.size(), path_);
  }

 private:
  bool widen(const json::Value& r) {
    bool wider = false;
    for (const auto& [key, unused] : r.as_object())
      if (std::find(columns_.begin(), columns_.end(), key) == columns_.end()) {
        columns_.push_back(key);
        wider = true;
      }
    return wider;
  }
  void rewrite() {
    std::error_code ec;
    const std::vector<json::Value> records =
        fs::exists(jsonl_, ec) ? read_metrics(jsonl_) : std::vector<json::Value>{};
    for (const json::Value& r : records) widen(r);
    std::string text = fmt::format("{}\n", fmt::join(columns_, ","));
    for (const json::Value& r : records) text += csv_row(columns_, r);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    io::write_file_atomic(path_, text);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    FORGE_CHECK(fd_ >= 0, "{}: cannot open for writing: {}", path_, std::strerror(errno));
  }

  std::string path_, jsonl_;
  std::vector<std::string> columns_;
  int fd_ = -1;
};

void MetricsLog::check_can_open(const std::string& run_dir, std::optional<int64_t> resume_step) {
  std::error_code ec;
  if (!fs::exists(run_dir, ec)) return;
  const fs::path jsonl = fs::path(run_dir) / "metrics.jsonl";
  std::vector<fs::path> written = {jsonl, fs::path(run_dir) / "metrics.csv"};
  for (const auto& e : fs::directory_iterator(run_dir, ec))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      written.push_back(e.path());
  for (const fs::path& p : written) io::check_writable(p.string());
  if (resume_step && fs::exists(jsonl, ec))  // the lines the constructor keeps, parsed as it parses them
    metrics_kept(read_metrics_text(jsonl.string()), jsonl.string(), *resume_step);
}

MetricsLog::MetricsLog(const std::string& run_dir, std::optional<int64_t> resume_step)
    : path_((fs::path(run_dir) / "metrics.jsonl").string()) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  FORGE_CHECK(!ec, "MetricsLog: cannot create {}: {}", run_dir, ec.message());
  int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC;
  if (!resume_step) {
    flags |= O_TRUNC;
  } else if (fs::exists(path_, ec)) {
    const std::string text = read_metrics_text(path_);
    const std::string kept = metrics_kept(text, path_, *resume_step);
    if (kept != text) io::write_file_atomic(path_, kept);
  }
  fd_ = ::open(path_.c_str(), flags, 0644);
  FORGE_CHECK(fd_ >= 0, "{}: cannot open for writing: {}", path_, std::strerror(errno));
  csv_ = std::make_unique<Csv>((fs::path(run_dir) / "metrics.csv").string(), path_);
  // TensorBoard: one event file, made afresh (a resumed run's from the records it keeps).
  std::vector<fs::path> old_events;
  for (const auto& e : fs::directory_iterator(run_dir, ec))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      old_events.push_back(e.path());
  const double now = wall_seconds();
  events_ = std::make_unique<EventWriter>((fs::path(run_dir) / event_file_name(now)).string());
  for (const fs::path& p : old_events)
    if (p != fs::path(events_->path())) fs::remove(p, ec);
  if (resume_step && fs::exists(path_, ec))
    for (const json::Value& r : read_metrics(path_)) write_event(r, now);
}

void MetricsLog::write_event(const json::Value& record, double wall_time) {
  // Every number but the step, tagged "<split>/<key>" (e.g. "train/loss").
  const std::string& split = record.at("split").as_string();
  std::vector<std::pair<std::string, double>> values;
  for (const auto& [key, v] : record.as_object())
    if (key != "step" && v.is_number()) values.emplace_back(split + "/" + key, v.as_double());
  if (!values.empty()) events_->add_scalars(values, record.at("step").as_int(), wall_time);
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::append(const json::Value& record) {
  check_metrics_record(record, "MetricsLog " + path_);
  json::Object out;
  for (const auto& [key, v] : record.as_object()) {
    for (const auto& [seen, unused] : out) {
      FORGE_CHECK(seen != key, "MetricsLog {}: the record has \"{}\" twice", path_, key);
    }
    const bool non_finite = v.is_number() && !std::isfinite(v.as_double());
    out.emplace_back(key, non_finite ? json::Value() : v);
  }
  const json::Value written(std::move(out));
  const std::string line = json::dump(written) + "\n";
  io::write_all(fd_, line.data(), line.size(), path_);
  csv_->append(written);
  write_event(written, wall_seconds());
}

void MetricsLog::log(int64_t step, const std::string& split,
                     const std::vector<std::pair<std::string, double>>& values) {
  json::Object r;
  r.emplace_back("step", json::Value(step));
  r.emplace_back("split", json::Value(split));
  for (const auto& [name, value] : values) r.emplace_back(name, json::Value(value));
  append(json::Value(std::move(r)));
}

}  // namespace forge::train
