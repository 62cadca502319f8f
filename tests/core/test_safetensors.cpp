// safetensors: round trips of every dtype, the exact bytes of the standard
// layout, atomic replacement, and rejection of every kind of corrupt file
// with a message naming the file and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

#include "core/json.h"
#include "core/safetensors.h"
#include "tests/test_util.h"

namespace forge::safetensors {
namespace {

namespace fs = std::filesystem;
using namespace testing;

// A fresh directory per test, removed afterwards.
class SafetensorsFiles : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return tmp_.file(name); }

  testing::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
};

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file with `header` (unpadded) and `data` bytes.
std::string make_file(std::string_view header, std::string_view data) {
  return le64(header.size()) + std::string(header) + std::string(data);
}

// The forge::Error message of deserializing `bytes` ("" if it loaded).
std::string load_error(std::string_view bytes) {
  return testing::error_of([&] { deserialize(bytes, "bad.safetensors"); },
                           testing::IfNoError::allow);
}

#define EXPECT_REJECTED(bytes, ...)                                                          \
  do {                                                                                       \
    const std::string msg_ = load_error(bytes);                                              \
    ASSERT_FALSE(msg_.empty()) << "accepted";                                                \
    EXPECT_NE(msg_.find("bad.safetensors"), std::string::npos) << msg_;                      \
    for (const char* part_ : {__VA_ARGS__}) {                                                \
      EXPECT_NE(msg_.find(part_), std::string::npos) << "no '" << part_ << "' in: " << msg_; \
    }                                                                                        \
  } while (0)

std::map<std::string, Tensor> every_dtype() {
  std::map<std::string, Tensor> m;
  m["f32"] = Tensor::from_vector<float>({1.5f, -2.25f, 0.0f, 3.0e38f, -1e-38f, 7.0f}, {2, 3});
  m["f64"] = Tensor::from_vector<double>({1.0 / 3.0, -0.0, 1e300, 5e-324});
  m["i32"] = Tensor::from_vector<int32_t>({std::numeric_limits<int32_t>::min(), -1, 0, 2147483647},
                                          {2, 2});
  m["i64"] = Tensor::from_vector<int64_t>({std::numeric_limits<int64_t>::min(), 9007199254740993LL},
                                          {2, 1});
  m["u8"] = Tensor::from_vector<uint8_t>({0, 1, 127, 128, 255});
  m["mask"] = Tensor::from_vector<bool>({true, false, false, true}, {1, 4});
  // bf16/f16 have no CPU kernels: raw 2-byte elements through raw_data.
  m["bf16"] = Tensor::empty({3}, DType::bf16);
  const uint16_t bf[] = {0x3f80, 0xc000, 0x7f80};  // 1.0, -2.0, +inf
  std::memcpy(m["bf16"].raw_data(), bf, sizeof(bf));
  m["f16"] = Tensor::empty({2, 2}, DType::f16);
  const uint16_t hf[] = {0x3c00, 0xbc00, 0x7bff, 0x0001};  // 1, -1, 65504, smallest subnormal
  std::memcpy(m["f16"].raw_data(), hf, sizeof(hf));
  m["scalar"] = Tensor::scalar(4.5, DType::f64);
  m["empty"] = Tensor::empty({0, 3}, DType::f32);
  // A view into the middle of a storage (non-zero offset) writes its own rows.
  m["rows"] = Tensor::arange(0, 12, 1, DType::i64).view({4, 3}).slice0(1, 3);
  return m;
}

void expect_same_tensors(const std::map<std::string, Tensor>& got,
                         const std::map<std::string, Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const Tensor& g = got.at(name);
    EXPECT_EQ(g.dtype(), w.dtype()) << name;
    EXPECT_EQ(g.shape(), w.shape()) << name;
    EXPECT_EQ(bytes_of(g), bytes_of(w)) << name;
  }
}

const std::map<std::string, std::string> kMeta = {{"format", "pt"},
                                                  {"note", "gr\xc3\xbc\xc3\x9f \"quoted\"\n"}};

TEST(SafetensorsRoundTrip, EveryDtypeInMemory) {
  const auto tensors = every_dtype();
  const File f = deserialize(serialize(tensors, kMeta), "mem");
  expect_same_tensors(f.tensors, tensors);
  EXPECT_EQ(f.metadata, kMeta);
  EXPECT_EQ(f.tensors.at("scalar").dim(), 0);
  EXPECT_EQ(f.tensors.at("scalar").item(), 4.5);
  EXPECT_EQ(f.tensors.at("rows").to_vector<int64_t>(), (std::vector<int64_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(f.tensors.at("mask").to_vector<bool>(), (std::vector<bool>{true, false, false, true}));
}

TEST_F(SafetensorsFiles, EveryDtypeThroughAFile) {
  const auto tensors = every_dtype();
  save(path("all.safetensors"), tensors, kMeta);
  const File f = load(path("all.safetensors"));
  expect_same_tensors(f.tensors, tensors);
  EXPECT_EQ(f.metadata, kMeta);
  EXPECT_EQ(read_file(path("all.safetensors")), serialize(tensors, kMeta));
  EXPECT_FALSE(fs::exists(path("all.safetensors.tmp")));
}

TEST(SafetensorsRoundTrip, NoTensorsNoMetadata) {
  const std::string bytes = serialize({});
  EXPECT_EQ(bytes, le64(8) + "{}      ");
  const File f = deserialize(bytes, "mem");
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_TRUE(f.metadata.empty());
}

// The layout the Python package writes: compact JSON (metadata first, then the
// tensors with dtype, shape, data_offsets), spaces up to a multiple of 8. The
// metadata holds each tensor's XXH3-64 (here of the bytes of 1.0f, 2.0f).
TEST(SafetensorsFormat, ExactBytesOfATinyFile) {
  const std::string bytes = serialize({{"a", Tensor::from_vector<float>({1.0f, 2.0f})}});
  const std::string json = R"({"__metadata__":{"xxh3_64:a":"4de8d78f7134f4b7"},)"
                           R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(json.size(), 102u);
  const std::string expected = std::string("\x68\0\0\0\0\0\0\0", 8) + json + "  " +
                               std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);  // 1.0f, 2.0f
  EXPECT_EQ(bytes, expected);
}

// The caller's metadata first, then the checksums in tensor name order.
TEST(SafetensorsFormat, NameOrderContiguousWithMetadataFirst) {
  std::map<std::string, Tensor> t;
  t["w"] = Tensor::from_vector<uint8_t>({7, 8, 9}, {1, 3});
  t["b"] = Tensor::scalar(-2, DType::i64);
  const std::string bytes = serialize(t, {{"format", "pt"}});
  const std::string json =
      R"({"__metadata__":{"format":"pt","xxh3_64:b":"77f9923217301859",)"
      R"("xxh3_64:w":"39372d8b3daea467"},"b":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
      R"("w":{"dtype":"U8","shape":[1,3],"data_offsets":[8,11]}})";
  ASSERT_EQ(json.size(), 201u);
  const std::string expected = std::string("\xd0\0\0\0\0\0\0\0", 8) + json + "       " +
                               std::string("\xfe\xff\xff\xff\xff\xff\xff\xff\x07\x08\x09", 11);
  EXPECT_EQ(bytes, expected);
  EXPECT_EQ((bytes.size() - 8 - 11) % 8, 0u);
}

// Files as other writers make them: tensors in any order, no padding, a
// reader must accept.
TEST(SafetensorsFormat, AcceptsUnpaddedHeadersAndAnyOrder) {
  const std::string header =
      R"({"z":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}})";
  const std::string data("\x01\x00\x00\x00\x02\x00\x00\x00", 8);
  const File f = deserialize(make_file(header, data), "mem");
  EXPECT_EQ(f.tensors.at("z").item(), 1);
  EXPECT_EQ(f.tensors.at("a").item(), 2);
  EXPECT_FALSE(f.checksummed);  // written without checksums: loaded unverified
}

// ---- checksums ----

// The JSON header of serialized `bytes`.
json::Value header_of(std::string_view bytes) {
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  return json::parse(bytes.substr(8, n), "header");
}

// The offset of the data section in serialized `bytes`.
size_t data_start(std::string_view bytes) {
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  return 8 + n;
}

TEST(SafetensorsChecksum, EveryTensorCarriesTheXxh3OfItsBytes) {
  const auto tensors = every_dtype();
  const std::string bytes = serialize(tensors, kMeta);
  const json::Value meta = header_of(bytes).at("__metadata__");
  EXPECT_EQ(meta.size(), kMeta.size() + tensors.size());
  for (const auto& [name, t] : tensors) {
    EXPECT_EQ(meta.at("xxh3_64:" + name).as_string(), checksum_hex(bytes_of(t))) << name;
  }
  // The published XXH3-64 of no bytes: the hash is XXH3 with seed 0.
  EXPECT_EQ(meta.at("xxh3_64:empty").as_string(), "2d06800538d394c2");
  const File f = deserialize(bytes, "mem");
  EXPECT_TRUE(f.checksummed);
  EXPECT_EQ(f.metadata, kMeta);  // the checksums are not the caller's metadata
  EXPECT_FALSE(deserialize(serialize({}), "mem").checksummed);
}

// One flipped bit in any tensor's data is caught, naming the tensor and both hashes.
TEST(SafetensorsChecksum, FlippedDataByteIsRejected) {
  const auto tensors = every_dtype();
  const std::string good = serialize(tensors, kMeta);
  const json::Value header = header_of(good);
  for (const auto& [name, t] : tensors) {
    if (t.nbytes() == 0) continue;
    SCOPED_TRACE(name);
    const uint64_t begin = header.at(name).at("data_offsets").at(0).as_uint();
    std::string bad = good;
    const size_t at = data_start(good) + begin + t.nbytes() / 2;
    bad[at] = static_cast<char>(bad[at] ^ 0x01);
    // Named: EXPECT_REJECTED's list of parts would outlive temporaries.
    const std::string tensor = "tensor \"" + name + "\"";
    const std::string recorded = header.at("__metadata__").at("xxh3_64:" + name).as_string();
    const std::string found = checksum_hex(bad.substr(data_start(good) + begin, t.nbytes()));
    EXPECT_REJECTED(bad, tensor.c_str(), "checksum mismatch", recorded.c_str(), found.c_str(),
                    "corrupt");
  }
}

TEST_F(SafetensorsFiles, FlippedDataByteIsRejectedByLoad) {
  const auto tensors = every_dtype();
  save(path("m.safetensors"), tensors, kMeta);
  EXPECT_TRUE(load(path("m.safetensors")).checksummed);
  std::string bytes = read_file(path("m.safetensors"));
  const size_t at = bytes.size() - 1;  // the last byte of the last tensor, "u8"
  bytes[at] = static_cast<char>(bytes[at] ^ 0x80);
  write_file(path("m.safetensors"), bytes);
  try {
    load(path("m.safetensors"));
    ADD_FAILURE() << "a flipped byte loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& part :
         {path("m.safetensors"), std::string("tensor \"u8\""), std::string("checksum mismatch"),
          checksum_hex(bytes_of(tensors.at("u8")))}) {
      EXPECT_NE(msg.find(part), std::string::npos) << "no '" << part << "' in: " << msg;
    }
  }
}

TEST(SafetensorsChecksum, DamagedChecksumsAreRejected) {
  const std::string two =
      R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  const std::string ha = checksum_hex("x"), hb = checksum_hex("y");
  const auto file = [&](const std::string& meta) {
    return make_file(R"({"__metadata__":{)" + meta + "}," + two, "xy");
  };
  // As written: accepted.
  EXPECT_TRUE(deserialize(file(fmt::format(R"("xxh3_64:a":"{}","xxh3_64:b":"{}")", ha, hb)), "mem")
                  .checksummed);
  // Swapped between the tensors: both are still well formed, neither matches.
  EXPECT_REJECTED(file(fmt::format(R"("xxh3_64:a":"{}","xxh3_64:b":"{}")", hb, ha)), "tensor \"a\"",
                  "checksum mismatch");
  // Only some tensors have one.
  EXPECT_REJECTED(file(fmt::format(R"("xxh3_64:a":"{}")", ha)), "tensor \"b\" has no checksum",
                  "damaged");
  // One names a tensor the file does not hold.
  EXPECT_REJECTED(
      file(fmt::format(R"("xxh3_64:a":"{}","xxh3_64:b":"{}","xxh3_64:c":"{}")", ha, hb, ha)),
      "\"xxh3_64:c\"", "tensor \"c\" the file does not hold");
  // Malformed values.
  for (const std::string& v : {std::string(""), ha.substr(1), ha + "0", std::string(16, 'g'),
                               std::string("4DE8D78F7134F4B7"), "-" + ha.substr(1)}) {
    SCOPED_TRACE(v);
    const std::string quoted = "\"" + v + "\"";
    EXPECT_REJECTED(file(fmt::format(R"("xxh3_64:a":"{}","xxh3_64:b":"{}")", v, hb)),
                    "\"xxh3_64:a\"", "16 lowercase hex digits", quoted.c_str());
  }
}

TEST_F(SafetensorsFiles, ChecksumKeysAreReservedForTheWriter) {
  const std::map<std::string, Tensor> t = {{"a", Tensor::ones({2})}};
  try {
    serialize(t, {{"xxh3_64:a", "0000000000000000"}});
    ADD_FAILURE() << "a caller's checksum key was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"xxh3_64:a\" is reserved"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(save(path("r.safetensors"), t, {{"xxh3_64:", "x"}}), Error);
  EXPECT_FALSE(fs::exists(path("r.safetensors")));
  EXPECT_FALSE(fs::exists(path("r.safetensors.tmp")));
  // Keys that merely contain it are the caller's.
  EXPECT_EQ(deserialize(serialize(t, {{"my_xxh3_64:a", "v"}}), "mem").metadata.at("my_xxh3_64:a"),
            "v");
}

TEST(SafetensorsReject, TruncatedAtEveryPart) {
  const std::string good =
      serialize({{"a", Tensor::ones({4})}, {"b", Tensor::zeros({2}, DType::i64)}});
  uint64_t n;
  std::memcpy(&n, good.data(), 8);
  struct Cut {
    size_t at;
    const char* says;
  };
  const Cut cuts[] = {
      {0, "too short for the 8-byte header length"},
      {3, "too short for the 8-byte header length"},
      {7, "too short for the 8-byte header length"},
      {8, "runs past the end of the file"},
      {8 + 5, "runs past the end of the file"},
      {8 + n - 1, "runs past the end of the file"},
      {8 + n + 1, "run past the end"},
      {good.size() - 1, "run past the end"},
  };
  for (const Cut& c : cuts) {
    SCOPED_TRACE(c.at);
    EXPECT_REJECTED(std::string_view(good).substr(0, c.at), c.says);
  }
  // Cut exactly at the end of the first tensor: the second one is missing.
  EXPECT_REJECTED(std::string_view(good).substr(0, 8 + n + 16), "tensor \"b\"", "run past the end");
}

TEST_F(SafetensorsFiles, TruncatedFilesAreRejectedByLoad) {
  const std::string good = serialize({{"a", Tensor::ones({4})}});
  for (size_t at : {size_t{0}, size_t{5}, size_t{20}, good.size() - 3}) {
    write_file(path("t.safetensors"), std::string_view(good).substr(0, at));
    try {
      load(path("t.safetensors"));
      ADD_FAILURE() << "a file cut at " << at << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path("t.safetensors")), std::string::npos) << e.what();
    }
  }
}

TEST(SafetensorsReject, HeaderLengthLargerThanTheFile) {
  EXPECT_REJECTED(le64(1000) + "{}" + std::string(40, ' '), "header length 1000",
                  "runs past the end of the file");
}

TEST_F(SafetensorsFiles, HugeHeaderLengthIsNotAllocated) {
  // 2^62 bytes could never be allocated: a forge::Error (not bad_alloc) proves
  // the length was checked first; both in memory and through load().
  const std::string bytes = le64(1ull << 62) + "{}";
  EXPECT_REJECTED(bytes, "exceeds the limit of 100000000 bytes");
  EXPECT_REJECTED(le64(std::numeric_limits<uint64_t>::max()) + "{}", "exceeds the limit");
  write_file(path("huge.safetensors"), bytes);
  EXPECT_THROW(load(path("huge.safetensors")), Error);
  // Under the limit but past the file's end.
  write_file(path("long.safetensors"), le64(99'000'000) + "{}");
  try {
    load(path("long.safetensors"));
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runs past the end of the file"), std::string::npos)
        << e.what();
  }
}

TEST(SafetensorsReject, OverlappingOffsets) {
  const std::string h =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  EXPECT_REJECTED(make_file(h, std::string(12, '\0')), "tensor \"b\"", "overlap tensor \"a\"");
  // Two tensors on the same bytes.
  const std::string same =
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  EXPECT_REJECTED(make_file(same, std::string(4, '\0')), "overlap");
  // An empty tensor placed inside another one.
  const std::string inside =
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})";
  EXPECT_REJECTED(make_file(inside, std::string(4, '\0')), "tensor \"e\"", "overlap");
}

TEST(SafetensorsReject, SizeDoesNotMatchShapeAndDtype) {
  EXPECT_REJECTED(
      make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
      "tensor \"a\"", "hold 8 bytes", "needs 12 bytes");
  EXPECT_REJECTED(make_file(R"({"a":{"dtype":"F64","shape":[2,2],"data_offsets":[0,16]}})",
                            std::string(16, '\0')),
                  "tensor \"a\"", "needs 32 bytes");
}

TEST(SafetensorsReject, OffsetsPastTheEnd) {
  EXPECT_REJECTED(
      make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(4, '\0')),
      "tensor \"a\"", "run past the end of the 4-byte data section");
  EXPECT_REJECTED(
      make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[9,9]}})", std::string(4, '\0')),
      "tensor \"a\"", "run past the end");
  EXPECT_REJECTED(
      make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}})", "x"),
      "tensor \"a\"", "end before they begin");
}

TEST(SafetensorsReject, Holes) {
  const std::string middle =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})";
  EXPECT_REJECTED(make_file(middle, std::string(20, '\0')), "tensor \"b\"",
                  "hole of 4 bytes at [8, 12)");
  EXPECT_REJECTED(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            std::string(12, '\0')),
                  "tensor \"a\"", "hole of 4 bytes at [0, 4)");
  EXPECT_REJECTED(
      make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(12, '\0')),
      "leaving 4 bytes");
}

TEST(SafetensorsReject, UnknownDtype) {
  for (const char* dt : {"F8_E4M3", "I8", "float32", "f32", ""}) {
    EXPECT_REJECTED(
        make_file(fmt::format(R"({{"a":{{"dtype":"{}","shape":[1],"data_offsets":[0,1]}}}})", dt),
                  "x"),
        "tensor \"a\"", "unknown or unsupported dtype");
  }
  EXPECT_REJECTED(make_file(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "xxxx"),
                  "dtype must be a string");
}

TEST(SafetensorsReject, BadShapes) {
  EXPECT_REJECTED(make_file(R"({"a":{"dtype":"U8","shape":[-1,2],"data_offsets":[0,0]}})", ""),
                  "tensor \"a\"", "negative dimension");
  EXPECT_REJECTED(make_file(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", "x"),
                  "tensor \"a\"", "non-integer dimension");
  EXPECT_REJECTED(make_file(R"({"a":{"dtype":"U8","shape":"2","data_offsets":[0,2]}})", "xx"),
                  "tensor \"a\"", "shape must be an array");
  // Products that overflow 64 bits must not wrap around to a small size.
  EXPECT_REJECTED(
      make_file(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})",
                ""),
      "tensor \"a\"", "more elements than fit in 64 bits");
  EXPECT_REJECTED(
      make_file(R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})", ""),
      "tensor \"a\"", "more bytes than fit in 64 bits");
  EXPECT_REJECTED(
      make_file(R"({"a":{"dtype":"U8","shape":[9223372036854775808,0],"data_offsets":[0,0]}})", ""),
      "tensor \"a\"", "dimension above 2^63 - 1");
}

TEST(SafetensorsReject, BadEntries) {
  EXPECT_REJECTED(make_file(R"({"a":{"dtype":"U8","shape":[1]}})", "x"), "tensor \"a\"",
                  "missing field \"data_offsets\"");
  EXPECT_REJECTED(
      make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1}})", "x"),
      "tensor \"a\"", "unknown field \"extra\"");
  EXPECT_REJECTED(make_file(R"({"a":[1]})", "x"), "tensor \"a\"", "expected an object");
  for (const char* offs : {"[0]", "[0,1,2]", "[-1,0]", "[0.0,1]", "\"0,1\""}) {
    EXPECT_REJECTED(
        make_file(fmt::format(R"({{"a":{{"dtype":"U8","shape":[1],"data_offsets":{}}}}})", offs),
                  "x"),
        "tensor \"a\"", "data_offsets must be [begin, end]");
  }
  EXPECT_REJECTED(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                            R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                            "xy"),
                  "duplicate key \"a\"");
}

TEST(SafetensorsReject, BadHeaders) {
  const std::string not_json = "this is not json";
  EXPECT_REJECTED(make_file(not_json, ""), "header", "invalid JSON at byte 0");
  EXPECT_REJECTED(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})", "x"),
                  "invalid JSON at byte");
  EXPECT_REJECTED(make_file("[]", ""), "the header must be a JSON object, found array");
  EXPECT_REJECTED(make_file(R"({"__metadata__":{"k":1}})", ""),
                  "__metadata__ \"k\" must be a string");
  EXPECT_REJECTED(make_file(R"({"__metadata__":["k"]})", ""), "__metadata__ must be an object");
  EXPECT_REJECTED(make_file(std::string("{\"a\xff\":1}"), ""), "invalid JSON");
}

TEST(SafetensorsReject, BoolBytesMustBeZeroOrOne) {
  EXPECT_REJECTED(make_file(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})",
                            std::string("\x01\x00\x02", 3)),
                  "tensor \"m\"", "BOOL element 2 is the byte 2");
}

TEST_F(SafetensorsFiles, LoadErrorsNameThePath) {
  try {
    load(path("missing.safetensors"));
    ADD_FAILURE() << "loaded a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load(dir_.string()), Error);  // a directory
  EXPECT_THROW(save(path("no/such/dir/x.safetensors"), {{"a", Tensor::ones({1})}}), Error);
}

TEST_F(SafetensorsFiles, SaveReplacesAnExistingFileAtomically) {
  const std::string p = path("model.safetensors");
  save(p, {{"old", Tensor::full({8}, 1.0)}}, {{"v", "1"}});
  save(p, {{"new", Tensor::full({2}, 2.0, DType::f64)}}, {{"v", "2"}});
  File f = load(p);
  EXPECT_EQ(f.tensors.size(), 1u);
  EXPECT_TRUE(f.tensors.count("new"));
  EXPECT_EQ(f.metadata.at("v"), "2");
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  // A save that fails (here: the temporary name is taken by a directory) leaves
  // the previous file whole.
  const std::string before = read_file(p);
  fs::create_directory(p + ".tmp");
  EXPECT_THROW(save(p, {{"newer", Tensor::ones({3})}}), Error);
  EXPECT_EQ(read_file(p), before);
  fs::remove(p + ".tmp");
  // A save that fails while preparing writes nothing either.
  EXPECT_THROW(save(p, {{"u", Tensor()}}), Error);
  EXPECT_THROW(save(p, {{"__metadata__", Tensor::ones({1})}}), Error);
  EXPECT_EQ(read_file(p), before);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST_F(SafetensorsFiles, CudaTensorsAreSavedFromTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Tensor cpu = Tensor::arange(0, 10, 1, DType::f32);
  save(path("cuda.safetensors"), {{"x", cpu.to(Device::cuda(0))}});
  const File f = load(path("cuda.safetensors"));
  EXPECT_TRUE(f.tensors.at("x").device().is_cpu());
  EXPECT_EQ(bytes_of(f.tensors.at("x")), bytes_of(cpu));
}

}  // namespace
}  // namespace forge::safetensors
