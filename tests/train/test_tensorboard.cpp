// EventWriter: CRC-32C against published vectors, the Event bytes field by
// field, and files read back by an independent reader (read_tfevents.py,
// standard-library Python written from the format's documentation) and by
// Google's protobuf parser, which must both reject damaged files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/json.h"
#include "tests/test_util.h"
#include "train/tensorboard.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using namespace forge::testing;

// Debian's Python: the one on PATH may be a pyenv build without python3-protobuf.
constexpr const char* kPython = "/usr/bin/python3";

uint32_t crc_of(std::string_view s) {
  return crc32c(s.data(), s.size());
}

// ---- CRC-32C ----

TEST(Crc32c, MatchesTheIscsiTestVectors) {
  // RFC 3720 (iSCSI), appendix B.4.
  EXPECT_EQ(crc_of(std::string(32, '\x00')), 0x8A9136AAu);
  EXPECT_EQ(crc_of(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(static_cast<char>(i));
    down.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc_of(up), 0x46DD794Eu);
  EXPECT_EQ(crc_of(down), 0x113FDB5Cu);
  // The CRC catalogue's check value.
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);
  EXPECT_EQ(crc_of(""), 0u);
}

TEST(Crc32c, MaskedIsRotatedPlusTheDelta) {
  for (const std::string s : {"", "a", "123456789", "brain.Event:2"}) {
    const uint32_t c = crc_of(s);
    EXPECT_EQ(masked_crc32c(s.data(), s.size()), ((c >> 15) | (c << 17)) + 0xa282ead8u) << s;
  }
  // The data of a record of a real TensorFlow event file (an Event with
  // file_version "CRC test, one two") and its stored CRC, as quoted by
  // TensorBoard's data server (tensorboard/data/server/masked_crc.rs).
  const std::string data =
      "\x1a\x11"
      "CRC test, one two";
  EXPECT_EQ(masked_crc32c(data.data(), data.size()), 0x5794d08au);
}

// ---- file name ----

TEST(EventFileName, IsTheNameTensorBoardsWriterGives) {
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(event_file_name(1700000000.75),
            fmt::format("events.out.tfevents.1700000000.{}.{}.attnforge", host, ::getpid()));
  // Ten digits, as TensorBoard's "%010d": the names sort by time.
  EXPECT_EQ(event_file_name(42.0).substr(0, 31), "events.out.tfevents.0000000042.");
  expect_error([] { event_file_name(-1.0); }, {"event_file_name", "wall time >= 0", "-1"});
  expect_error([] { event_file_name(std::nan("")); }, {"event_file_name", "nan"});
  expect_error([] { event_file_name(1e300); }, {"event_file_name", "1e+300"});
}

// ---- the bytes ----

// The records of a file: their data, checking the framing and both CRCs.
std::vector<std::string> record_data(const std::string& bytes) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    EXPECT_GE(bytes.size() - pos, 16u) << "torn record at byte " << pos;
    if (bytes.size() - pos < 16) break;
    uint64_t length = 0;
    uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length, bytes.data() + pos, 8);  // little-endian hosts only
    std::memcpy(&length_crc, bytes.data() + pos + 8, 4);
    EXPECT_EQ(length_crc, masked_crc32c(bytes.data() + pos, 8)) << "at byte " << pos;
    EXPECT_LE(pos + 16 + length, bytes.size()) << "torn record at byte " << pos;
    if (pos + 16 + length > bytes.size()) break;
    out.push_back(bytes.substr(pos + 12, length));
    std::memcpy(&data_crc, bytes.data() + pos + 12 + length, 4);
    EXPECT_EQ(data_crc, masked_crc32c(out.back().data(), length)) << "at byte " << pos;
    pos += 16 + length;
  }
  return out;
}

template <typename T>
std::string le_bytes(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}

TEST(EventWriterBytes, AreTheEventFieldsOfTensorFlow) {
  TempDir dir;
  const std::string path = dir.file("events.out.tfevents.test");
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EventWriter w(path);
  EXPECT_EQ(w.path(), path);
  w.add_scalar("a", 3, 0.5, 1.5);
  w.add_scalars({{"x", -2.0}, {"yz", 0.0}}, 300, 2.25);

  const std::vector<std::string> records = record_data(read_file(path));
  ASSERT_EQ(records.size(), 3u);
  // Event: wall_time = 1 (fixed64, key 0x09), step = 2 (varint, 0x10),
  // file_version = 3 (length-delimited, 0x1a), summary = 5 (0x2a); step 0
  // is proto3's default and not written.
  ASSERT_EQ(records[0].size(), 9u + 15u);
  EXPECT_EQ(records[0][0], '\x09');
  double stamp = 0;
  std::memcpy(&stamp, records[0].data() + 1, 8);
  EXPECT_GE(stamp, before);
  EXPECT_LE(stamp, before + 60);
  EXPECT_EQ(records[0].substr(9),
            "\x1a\x0d"
            "brain.Event:2");
  // Summary: value = 1 (0x0a); Value: tag = 1 (0x0a), simple_value = 2
  // (fixed32, 0x15).
  const std::string a = std::string(
                            "\x0a\x01"
                            "a\x15",
                            4) +
                        le_bytes(0.5f);
  EXPECT_EQ(records[1], "\x09" + le_bytes(1.5) + "\x10\x03" + "\x2a\x0a" + "\x0a\x08" + a);
  const std::string x = std::string(
                            "\x0a\x01"
                            "x\x15",
                            4) +
                        le_bytes(-2.0f);
  const std::string yz = std::string(
                             "\x0a\x02"
                             "yz\x15",
                             5) +
                         le_bytes(0.0f);
  EXPECT_EQ(records[2], "\x09" + le_bytes(2.25) + "\x10\xac\x02" + "\x2a\x15" + "\x0a\x08" + x +
                            "\x0a\x09" + yz);
}

TEST(EventWriterBytes, EachRecordIsWrittenAtOnce) {
  TempDir dir;
  const std::string path = dir.file("events");
  write_file(path, "an older file's bytes, replaced");
  EventWriter w(path);
  EXPECT_EQ(record_data(read_file(path)).size(), 1u);
  w.add_scalar("loss", 1, 2.0, 10.0);
  EXPECT_EQ(record_data(read_file(path)).size(), 2u);  // while the writer is open
  w.add_scalars({{"loss", 1.0}, {"lr", 1e-3}}, 2, 11.0);
  EXPECT_EQ(record_data(read_file(path)).size(), 3u);
}

TEST(EventWriterBytes, RejectsWhatTensorBoardCannotShow) {
  TempDir dir;
  expect_error([&] { EventWriter(dir.file("missing/events")); },
               {dir.file("missing/events"), "cannot open for writing"});
  const std::string path = dir.file("events");
  EventWriter w(path);
  const std::string written = read_file(path);
  expect_error([&] { w.add_scalar("loss", -1, 1.0, 1.0); }, {path, "step >= 0", "-1"});
  expect_error([&] { w.add_scalar("", 1, 1.0, 1.0); }, {path, "non-empty tag"});
  expect_error([&] { w.add_scalar("bad\xff", 1, 1.0, 1.0); }, {path, "not valid UTF-8", "\\xff"});
  expect_error([&] { w.add_scalar("loss", 1, 1.0, std::nan("")); }, {path, "finite wall time"});
  expect_error(
      [&] {
        w.add_scalars({{"a", 1.0}, {"b", 2.0}, {"a", 3.0}}, 7, 1.0);
      },
      {path, "\"a\" given twice", "step 7"});
  expect_error([&] { w.add_scalars({}, 7, 1.0); }, {path, "no scalars"});
  EXPECT_EQ(read_file(path), written);  // nothing of a rejected call was written
}

// ---- read back by other readers ----

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Output {
  int status = -1;  // the exit status; -1 when it did not exit
  std::string out, err;
};

// `kPython script file`, its stdout and stderr.
Output run_python(const std::string& script, const std::string& file, const TempDir& dir) {
  const std::string err = dir.file("stderr.txt");
  const std::string cmd =
      fmt::format("{} {} {} 2>{}", kPython, quoted(script), quoted(file), quoted(err));
  Output o;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return o;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) o.out.append(buf, n);
  const int status = ::pclose(pipe);
  if (status != -1 && WIFEXITED(status)) o.status = WEXITSTATUS(status);
  o.err = read_file(err);
  return o;
}

std::vector<json::Value> json_lines(const std::string& text) {
  std::vector<json::Value> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(json::parse(std::string_view(text).substr(pos, nl - pos), "reader output"));
    pos = nl + 1;
  }
  return out;
}

// What the reader prints for a value: the float widened to a double, or the
// name of a non-finite one.
json::Value as_read(double v) {
  const float f = v > std::numeric_limits<float>::max()    ? INFINITY
                  : v < -std::numeric_limits<float>::max() ? -INFINITY
                                                           : static_cast<float>(v);
  if (std::isnan(f)) return json::Value("NaN");
  if (std::isinf(f)) return json::Value(f > 0 ? "Infinity" : "-Infinity");
  return json::Value(static_cast<double>(f));
}

struct Scalar {
  std::string tag;
  int64_t step;
  double value, wall_time;
};

class EventFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kPython)) GTEST_SKIP() << kPython << " not found: the readers need it";
    reader_ = std::string(FORGE_SOURCE_DIR) + "/tests/train/read_tfevents.py";
    ASSERT_TRUE(fs::exists(reader_)) << reader_;
    path_ = dir_.file(event_file_name(1700000000.0));
  }

  // Writes `scalars` (consecutive ones of a step as one add_scalars) and
  // returns the time before the writer started.
  double write(const std::vector<Scalar>& scalars) {
    const double before =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    EventWriter w(path_);
    for (size_t i = 0; i < scalars.size();) {
      std::vector<std::pair<std::string, double>> step;
      size_t j = i;
      for (; j < scalars.size() && scalars[j].step == scalars[i].step; ++j)
        step.emplace_back(scalars[j].tag, scalars[j].value);
      if (step.size() == 1) {
        w.add_scalar(scalars[i].tag, scalars[i].step, scalars[i].value, scalars[i].wall_time);
      } else {
        w.add_scalars(step, scalars[i].step, scalars[i].wall_time);
      }
      i = j;
    }
    return before;
  }

  // The reader's output must be the file_version line and then `scalars`.
  void expect_read(const Output& o, const std::vector<Scalar>& scalars, double before) {
    ASSERT_EQ(o.status, 0) << o.err;
    const std::vector<json::Value> lines = json_lines(o.out);
    ASSERT_EQ(lines.size(), 1 + scalars.size()) << o.out;
    EXPECT_EQ(lines[0].at("file_version").as_string(), "brain.Event:2");
    EXPECT_GE(lines[0].at("wall_time").as_double(), before);
    EXPECT_LE(lines[0].at("wall_time").as_double(), before + 60);
    for (size_t i = 0; i < scalars.size(); ++i) {
      const json::Value& l = lines[1 + i];
      const Scalar& s = scalars[i];
      EXPECT_EQ(l.at("tag").as_string(), s.tag) << "line " << i + 1;
      EXPECT_EQ(l.at("step").as_int(), s.step) << "line " << i + 1;
      EXPECT_EQ(l.at("value"), as_read(s.value)) << "line " << i + 1 << ": " << json::dump(l);
      EXPECT_EQ(l.at("wall_time").as_double(), s.wall_time) << "line " << i + 1;
    }
  }

  TempDir dir_;
  std::string reader_, path_;
};

// Tags of several steps, several tags per step, the float rounding, and the
// values JSON and floats have no room for.
const std::vector<Scalar> kScalars = {
    {"train/loss", 0, 2.5, 1700000000.125},
    {"train/loss", 10, 0.1, 1700000001.5},
    {"train/lr", 10, 3e-4, 1700000001.5},
    {"train/accuracy", 10, 0.875, 1700000001.5},
    {"eval/loss", 20, std::nan(""), 1700000002.0},
    {"eval/τ", 20, INFINITY, 1700000002.0},
    {"grad_norm", 30, -INFINITY, 1700000003.0},
    {"tokens", int64_t{1} << 40, 1e39, 1700000004.0},  // beyond float: inf
    {"tiny", (int64_t{1} << 40) + 1, -1e-30, 1700000005.0},
};

TEST_F(EventFileTest, TheIndependentReaderReadsWhatWasWritten) {
  const double before = write(kScalars);
  expect_read(run_python(reader_, path_, dir_), kScalars, before);
}

TEST_F(EventFileTest, ProtobufParsesItAsTensorFlowsEvent) {
  if (run_python("-c", "import google.protobuf", dir_).status != 0)
    GTEST_SKIP() << "python3-protobuf is not installed";
  // Event and Summary built from scratch with TensorFlow's field numbers, and
  // the records' data parsed by Google's parser (the CRCs are the other
  // reader's business); the same output as read_tfevents.py.
  const std::string script = dir_.file("protobuf_reader.py");
  write_file(script, R"py(
import json, math, struct, sys
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto
fd = descriptor_pb2.FileDescriptorProto(name="tb_check.proto", package="tb_check", syntax="proto3")
event = fd.message_type.add(name="Event")
event.oneof_decl.add(name="what")
event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                type_name=".tb_check.Summary", oneof_index=0)
summary = fd.message_type.add(name="Summary")
value = summary.nested_type.add(name="Value")
value.oneof_decl.add(name="value")
value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL, oneof_index=0)
summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                  type_name=".tb_check.Summary.Value")
pool = descriptor_pool.DescriptorPool()
pool.Add(fd)
desc = pool.FindMessageTypeByName("tb_check.Event")
if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
    Event = message_factory.GetMessageClass(desc)
else:
    Event = message_factory.MessageFactory(pool).GetPrototype(desc)

buf = open(sys.argv[1], "rb").read()
pos = 0
while pos < len(buf):
    (n,) = struct.unpack("<Q", buf[pos:pos + 8])
    e = Event()
    e.ParseFromString(buf[pos + 12:pos + 12 + n])
    pos += 16 + n
    if e.WhichOneof("what") == "file_version":
        print(json.dumps({"file_version": e.file_version, "wall_time": e.wall_time}))
    for v in e.summary.value:
        x = v.simple_value
        if math.isnan(x): x = "NaN"
        elif math.isinf(x): x = "Infinity" if x > 0 else "-Infinity"
        print(json.dumps({"tag": v.tag, "step": e.step, "value": x, "wall_time": e.wall_time}))
)py");
  const double before = write(kScalars);
  const Output parsed = run_python(script, path_, dir_);
  expect_read(parsed, kScalars, before);
  EXPECT_EQ(parsed.out, run_python(reader_, path_, dir_).out);
}

TEST_F(EventFileTest, TheReaderRejectsACorruptedByte) {
  write(kScalars);
  const std::string good = read_file(path_);
  ASSERT_EQ(run_python(reader_, path_, dir_).status, 0);
  // The last scalar's value (the data's last 4 bytes before the CRC) and,
  // separately, the first record's length.
  std::string bad = good;
  bad[bad.size() - 5] ^= 0x01;
  write_file(path_, bad);
  Output o = run_python(reader_, path_, dir_);
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.err.find("data CRC mismatch"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find(path_), std::string::npos) << o.err;
  bad = good;
  bad[0] ^= 0x40;
  write_file(path_, bad);
  o = run_python(reader_, path_, dir_);
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.err.find("record at byte 0: length CRC mismatch"), std::string::npos) << o.err;
}

TEST_F(EventFileTest, TheReaderRejectsATornLastRecord) {
  write(kScalars);
  const std::string good = read_file(path_);
  const std::vector<std::string> records = record_data(good);
  const size_t last = good.size() - 16 - records.back().size();
  for (const size_t keep : {good.size() - 1, last + 14, last + 5}) {
    write_file(path_, good.substr(0, keep));
    const Output o = run_python(reader_, path_, dir_);
    EXPECT_EQ(o.status, 1) << "kept " << keep << " of " << good.size() << " bytes";
    EXPECT_NE(o.err.find(fmt::format("record at byte {}: torn", last)), std::string::npos) << o.err;
    // The records before it were read.
    EXPECT_EQ(json_lines(o.out).size(), kScalars.size()) << o.out;
  }
}

}  // namespace
}  // namespace forge::train
