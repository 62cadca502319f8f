// TensorBoard scalars: RUN/events.out.tfevents.<seconds>.<host>.<pid>.attnforge,
// a TFRecord file of serialized Event messages (train/tensorboard_event.proto,
// field numbers as TensorFlow's event.proto and summary.proto). Each record is
//   uint64  length of data (little-endian)
//   uint32  masked_crc32c(the 8 length bytes)
//   byte    data[length]      (one Event)
//   uint32  masked_crc32c(data)
// The first Event holds file_version "brain.Event:2"; each later one a step's
// Summary of {tag, simple_value} pairs. A record is written with one write()
// as soon as it is added, so a crash loses at most a torn last record (which
// TensorBoard skips). tests/train/read_tfevents.py reads the files back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/file_io.h"

namespace forge::train {

class EventWriter {
 public:
  // Creates (truncating) `path` and writes the file_version event stamped
  // with the current time. The directory must exist. Errors name the path.
  explicit EventWriter(std::string path);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One Event {wall_time, step, summary {value {tag, simple_value}}}.
  // `wall_time` is seconds since the Unix epoch; `step` must be >= 0; a tag
  // is non-empty UTF-8 (TensorBoard groups tags by their "/"-separated
  // prefix, e.g. "train/loss"). simple_value is a float: the value is rounded
  // to float, beyond +-3.4e38 to +-inf. NaN and inf are written as they are
  // (TensorBoard shows them).
  void add_scalar(const std::string& tag, int64_t step, double value, double wall_time);
  // Several scalars of one step in one Event (one Summary holding a value per
  // tag, in the given order), one record. The tags must differ; an empty list
  // is an error.
  void add_scalars(const std::vector<std::pair<std::string, double>>& values, int64_t step,
                   double wall_time);

  const std::string& path() const { return path_; }

 private:
  // Appends `event` (a serialized Event) as one record.
  void write_record(const std::string& event);

  std::string path_;
  io::Fd fd_;
};

// "events.out.tfevents.<seconds, 10 digits>.<hostname>.<pid>.attnforge": the
// name TensorBoard's own writer gives (its last part, a per-process counter
// there, is our ".attnforge"); TensorBoard reads any file whose name holds
// "tfevents". Two writers of one process started in the same second get the
// same name: give each its own directory (TensorBoard's "run").
std::string event_file_name(double wall_time);

// CRC-32C (Castagnoli, as iSCSI and TFRecord use), and TFRecord's masked form
// ((crc >> 15 | crc << 17) + 0xa282ead8, so that a CRC of bytes holding CRCs
// is not trivially related to them).
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace forge::train
