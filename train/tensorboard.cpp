// EventWriter: TensorBoard scalar event files (TFRecords of Event messages).
#include "train/tensorboard.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "core/json.h"
#include "tensorboard_event.pb.h"

namespace forge::train {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// simple_value is a float; a finite double beyond float's range becomes an
// infinity of its sign (the conversion itself would be undefined).
float to_float(double v) {
  constexpr double max = std::numeric_limits<float>::max();
  if (v > max) return std::numeric_limits<float>::infinity();
  if (v < -max) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(v);
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  // ISA-L's crc32_iscsi neither inverts its seed nor its result: starting
  // from ~0 and inverting at the end gives the standard CRC-32C. Its length
  // is an int, hence the chunks.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t crc = 0xFFFFFFFFu;
  while (n > 0) {
    const size_t chunk = std::min<size_t>(n, size_t{1} << 30);
    crc = crc32_iscsi(p, static_cast<int>(chunk), crc);
    p += chunk;
    n -= chunk;
  }
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string event_file_name(double wall_time) {
  FORGE_CHECK(wall_time >= 0 && wall_time < 1e12,  // false for NaN
              "event_file_name: expected a wall time >= 0 (seconds since the epoch), found {}",
              wall_time);
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof(host), "localhost");
  }
  return fmt::format("events.out.tfevents.{:010d}.{}.{}.attnforge", static_cast<int64_t>(wall_time),
                     host, ::getpid());
}

EventWriter::EventWriter(std::string path) : path_(std::move(path)) {
  fd_.fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  FORGE_CHECK(fd_.fd >= 0, "{}: cannot open for writing: {}", path_, io::errno_message());
  tb::Event event;
  event.set_wall_time(now_seconds());
  event.set_file_version("brain.Event:2");
  write_record(event.SerializeAsString());
}

EventWriter::~EventWriter() = default;

void EventWriter::add_scalar(const std::string& tag, int64_t step, double value, double wall_time) {
  add_scalars({{tag, value}}, step, wall_time);
}

void EventWriter::add_scalars(const std::vector<std::pair<std::string, double>>& values,
                              int64_t step, double wall_time) {
  FORGE_CHECK(step >= 0, "{}: expected a step >= 0, found {}", path_, step);
  FORGE_CHECK(std::isfinite(wall_time), "{}: expected a finite wall time, found {}", path_,
              wall_time);
  FORGE_CHECK(!values.empty(), "{}: no scalars to add at step {}", path_, step);
  tb::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tb::Summary* summary = event.mutable_summary();
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& [tag, value] = values[i];
    FORGE_CHECK(!tag.empty(), "{}: expected a non-empty tag (at step {})", path_, step);
    // protobuf strings must be UTF-8 (TensorBoard fails on the event
    // otherwise); json::dump checks exactly that.
    try {
      json::dump(json::Value(tag));
    } catch (const Error&) {
      FORGE_FAIL("{}: tag \"{}\" is not valid UTF-8", path_, escaped(tag));
    }
    for (size_t j = 0; j < i; ++j) {
      FORGE_CHECK(values[j].first != tag, "{}: tag \"{}\" given twice at step {}", path_, tag,
                  step);
    }
    tb::Summary::Value* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(to_float(value));
  }
  write_record(event.SerializeAsString());
}

void EventWriter::write_record(const std::string& event) {
  std::string record;
  record.reserve(event.size() + 16);
  put_le(record, event.size(), 8);
  put_le(record, masked_crc32c(record.data(), 8), 4);
  record += event;
  put_le(record, masked_crc32c(event.data(), event.size()), 4);
  io::write_all(fd_.fd, record.data(), record.size(), path_);
}

}  // namespace forge::train
