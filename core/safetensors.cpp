#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "core/file_io.h"
#include "core/json.h"

namespace forge::safetensors {

// The data section is little-endian and copied byte for byte.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O copies raw bytes and needs a little-endian host");

namespace {

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::f32, "F32"}, {DType::f64, "F64"},      {DType::i32, "I32"},   {DType::i64, "I64"},
    {DType::u8, "U8"},   {DType::boolean, "BOOL"}, {DType::bf16, "BF16"}, {DType::f16, "F16"}};

const char* format_name(DType t) {
  for (const auto& d : kDTypeNames) {
    if (d.dtype == t) return d.name;
  }
  FORGE_FAIL("safetensors: dtype {} has no safetensors name", dtype_name(t));
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& d : kDTypeNames) {
    if (name == d.name) return d.dtype;
  }
  return std::nullopt;
}

uint64_t xxh3_64(const void* data, size_t n) {
  return XXH3_64bits(n ? data : "", n);
}

// ---- writing ----

// What serialize and save both write: the length-prefixed padded header, then
// `tensors` (on the CPU, in name order) back to back.
struct Layout {
  std::string header;
  std::vector<Tensor> tensors;
};

// The caller's metadata comes first, then a checksum per tensor in name order.
Layout make_layout(const std::map<std::string, Tensor>& tensors,
                   const std::map<std::string, std::string>& metadata) {
  json::Object meta;
  for (const auto& [k, v] : metadata) {
    FORGE_CHECK(!k.starts_with(kChecksumPrefix),
                "safetensors: __metadata__ key \"{}\" is reserved: keys starting with \"{}\" "
                "hold the tensor checksums the writer adds; store it under another name",
                k, kChecksumPrefix);
    meta.emplace_back(k, json::Value(v));
  }
  json::Object entries;
  Layout out;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    FORGE_CHECK(name != "__metadata__",
                "safetensors: \"__metadata__\" is reserved and cannot name a tensor");
    FORGE_CHECK(t.defined(), "safetensors: tensor \"{}\" is undefined", name);
    Tensor cpu = t.device().is_cpu() ? t : t.to(Device::cpu());
    json::Array shape;
    for (int64_t s : cpu.shape()) shape.emplace_back(s);
    const uint64_t end = offset + cpu.nbytes();
    json::Object info;
    info.emplace_back("dtype", json::Value(format_name(cpu.dtype())));
    info.emplace_back("shape", json::Value(std::move(shape)));
    info.emplace_back("data_offsets",
                      json::Value(json::Array{json::Value(offset), json::Value(end)}));
    entries.emplace_back(name, json::Value(std::move(info)));
    meta.emplace_back(std::string(kChecksumPrefix) + name,
                      json::Value(checksum_hex(std::string_view(
                          static_cast<const char*>(cpu.raw_data()), cpu.nbytes()))));
    out.tensors.push_back(std::move(cpu));
    offset = end;
  }
  json::Object root;
  if (!meta.empty()) root.emplace_back("__metadata__", json::Value(std::move(meta)));
  for (auto& e : entries) root.push_back(std::move(e));
  std::string text = json::dump(json::Value(std::move(root)));
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  out.header.resize(8);
  std::memcpy(out.header.data(), &n, 8);
  out.header += text;
  return out;
}

// ---- reading ----

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;  // relative to the data section
  std::optional<uint64_t> checksum;
};

struct Header {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;  // without the checksums
  bool checksummed = false;
};

// Checks the header length N read from the first 8 bytes of a `total`-byte file.
void check_header_length(uint64_t n, uint64_t total, std::string_view what) {
  FORGE_CHECK(
      n <= kMaxHeaderBytes,
      "{}: header length {} exceeds the limit of {} bytes: the file is corrupt or not safetensors",
      what, n, kMaxHeaderBytes);
  FORGE_CHECK(n <= total - 8,
              "{}: header length {} runs past the end of the file ({} bytes after the length): "
              "truncated or not "
              "safetensors",
              what, n, total - 8);
}

Entry parse_entry(const std::string& name, const json::Value& info, uint64_t data_size,
                  std::string_view what) {
  FORGE_CHECK(info.is_object(),
              "{}: tensor \"{}\": expected an object with dtype, shape and data_offsets, found {}",
              what, name, json::type_name(info.type()));
  const json::Value *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
  for (const auto& [key, v] : info.as_object()) {
    if (key == "dtype") {
      dtype = &v;
    } else if (key == "shape") {
      shape = &v;
    } else if (key == "data_offsets") {
      offsets = &v;
    } else {
      FORGE_FAIL("{}: tensor \"{}\": unknown field \"{}\" (expected dtype, shape and data_offsets)",
                 what, name, key);
    }
  }
  FORGE_CHECK(dtype && shape && offsets, "{}: tensor \"{}\": missing field \"{}\"", what, name,
              !dtype   ? "dtype"
              : !shape ? "shape"
                       : "data_offsets");

  Entry e;
  e.name = name;
  FORGE_CHECK(dtype->is_string(), "{}: tensor \"{}\": dtype must be a string, found {}", what, name,
              json::dump(*dtype));
  const auto dt = parse_dtype(dtype->as_string());
  FORGE_CHECK(
      dt.has_value(),
      "{}: tensor \"{}\": unknown or unsupported dtype \"{}\" (expected F32, F64, I32, I64, "
      "U8, BOOL, BF16 or F16)",
      what, name, dtype->as_string());
  e.dtype = *dt;

  FORGE_CHECK(shape->is_array(), "{}: tensor \"{}\": shape must be an array, found {}", what, name,
              json::dump(*shape));
  uint64_t numel = 1;
  for (const json::Value& d : shape->as_array()) {
    FORGE_CHECK(d.is_int(), "{}: tensor \"{}\": shape {} has a non-integer dimension", what, name,
                json::dump(*shape));
    FORGE_CHECK(d.as_double() >= 0, "{}: tensor \"{}\": shape {} has a negative dimension", what,
                name, json::dump(*shape));
    const uint64_t s = d.as_uint();
    FORGE_CHECK(s <= static_cast<uint64_t>(INT64_MAX),
                "{}: tensor \"{}\": shape {} has a dimension above 2^63 - 1", what, name,
                json::dump(*shape));
    FORGE_CHECK(!__builtin_mul_overflow(numel, s, &numel),
                "{}: tensor \"{}\": shape {} has more elements than fit in 64 bits", what, name,
                json::dump(*shape));
    e.shape.push_back(static_cast<int64_t>(s));
  }
  uint64_t nbytes;
  FORGE_CHECK(!__builtin_mul_overflow(numel, dtype_size(e.dtype), &nbytes),
              "{}: tensor \"{}\": shape {} of {} is more bytes than fit in 64 bits", what, name,
              json::dump(*shape), dtype->as_string());

  FORGE_CHECK(
      offsets->is_array() && offsets->size() == 2 && offsets->at(0).is_int() &&
          offsets->at(1).is_int() && offsets->at(0).as_double() >= 0 &&
          offsets->at(1).as_double() >= 0,
      "{}: tensor \"{}\": data_offsets must be [begin, end] with non-negative integers, found {}",
      what, name, json::dump(*offsets));
  e.begin = offsets->at(0).as_uint();
  e.end = offsets->at(1).as_uint();
  FORGE_CHECK(e.begin <= e.end, "{}: tensor \"{}\": data_offsets [{}, {}] end before they begin",
              what, name, e.begin, e.end);
  FORGE_CHECK(e.end <= data_size,
              "{}: tensor \"{}\": data_offsets [{}, {}] run past the end of the {}-byte data "
              "section (truncated "
              "file?)",
              what, name, e.begin, e.end, data_size);
  FORGE_CHECK(
      e.end - e.begin == nbytes,
      "{}: tensor \"{}\": data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {} bytes",
      what, name, e.begin, e.end, e.end - e.begin, json::dump(*shape), dtype->as_string(), nbytes);
  return e;
}

// 16 lowercase hex digits, exactly as the writer formats them.
std::optional<uint64_t> parse_checksum(std::string_view hex) {
  if (hex.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (const char c : hex) {
    if (c >= '0' && c <= '9') {
      v = v << 4 | static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      v = v << 4 | static_cast<uint64_t>(c - 'a' + 10);
    } else {
      return std::nullopt;
    }
  }
  return v;
}

// Gives each entry its checksum from the "xxh3_64:NAME" metadata `sums`: every
// tensor has one or none does; anything else is a damaged header.
void attach_checksums(Header& h, const std::vector<std::pair<std::string, std::string>>& sums,
                      std::string_view what) {
  std::map<std::string_view, Entry*> by_name;
  for (Entry& e : h.entries) by_name.emplace(e.name, &e);
  for (const auto& [key, value] : sums) {
    const std::string_view name = std::string_view(key).substr(kChecksumPrefix.size());
    const auto it = by_name.find(name);
    FORGE_CHECK(it != by_name.end(),
                "{}: __metadata__ \"{}\" is the checksum of a tensor \"{}\" the file does not "
                "hold: the header is damaged; restore the file from a copy",
                what, key, name);
    const auto sum = parse_checksum(value);
    FORGE_CHECK(sum.has_value(),
                "{}: __metadata__ \"{}\": expected an XXH3-64 checksum of 16 lowercase hex "
                "digits, found \"{}\": the header is damaged; restore the file from a copy",
                what, key, value);
    it->second->checksum = sum;
  }
  if (sums.empty()) return;
  for (const Entry& e : h.entries) {
    FORGE_CHECK(e.checksum.has_value(),
                "{}: tensor \"{}\" has no checksum (__metadata__ \"{}{}\") although {} other "
                "tensor(s) have one: the header is damaged; restore the file from a copy",
                what, e.name, kChecksumPrefix, e.name, sums.size());
  }
  h.checksummed = true;
}

// Validates the whole header against a data section of `data_size` bytes.
Header parse_header(std::string_view text, uint64_t data_size, std::string_view what) {
  const json::Value root = json::parse(text, fmt::format("{}: header", what));
  FORGE_CHECK(root.is_object(), "{}: the header must be a JSON object, found {}", what,
              json::type_name(root.type()));
  Header h;
  std::vector<std::pair<std::string, std::string>> sums;
  for (const auto& [key, v] : root.as_object()) {
    if (key == "__metadata__") {
      FORGE_CHECK(v.is_object(), "{}: __metadata__ must be an object of strings, found {}", what,
                  json::type_name(v.type()));
      for (const auto& [mk, mv] : v.as_object()) {
        FORGE_CHECK(mv.is_string(), "{}: __metadata__ \"{}\" must be a string, found {}", what, mk,
                    json::dump(mv));
        if (mk.starts_with(kChecksumPrefix)) {
          sums.emplace_back(mk, mv.as_string());
        } else {
          h.metadata.emplace(mk, mv.as_string());
        }
      }
      continue;
    }
    h.entries.push_back(parse_entry(key, v, data_size, what));
  }
  attach_checksums(h, sums, what);

  // The tensors must tile the data section: sorted by offset, each begins where
  // the previous one ended, and the last ends at the end of the section.
  std::vector<const Entry*> order;
  for (const Entry& e : h.entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : order) {
    FORGE_CHECK(e->begin >= cursor,
                "{}: tensor \"{}\": data_offsets [{}, {}] overlap tensor \"{}\" at [{}, {}]", what,
                e->name, e->begin, e->end, prev ? prev->name : "", prev ? prev->begin : 0,
                prev ? prev->end : 0);
    FORGE_CHECK(e->begin == cursor,
                "{}: tensor \"{}\": data_offsets [{}, {}] leave a hole of {} bytes at [{}, {}) "
                "before it",
                what, e->name, e->begin, e->end, e->begin - cursor, cursor, e->begin);
    cursor = e->end;
    prev = e;
  }
  FORGE_CHECK(cursor == data_size,
              "{}: the data section has {} bytes but the tensors end at byte {}, leaving {} bytes "
              "that no tensor "
              "covers",
              what, data_size, cursor, data_size - cursor);
  return h;
}

// Checks a tensor's bytes, as read from the file, against its checksum (if any).
void check_checksum(const Entry& e, const Tensor& t, std::string_view what) {
  if (!e.checksum) return;
  const uint64_t got = xxh3_64(t.raw_data(), t.nbytes());
  FORGE_CHECK(got == *e.checksum,
              "{}: tensor \"{}\": checksum mismatch: __metadata__ records xxh3_64 {:016x}, its {} "
              "bytes hash to {:016x}: the file is corrupt (damaged on disk or in a copy); restore "
              "it from a copy or use another checkpoint",
              what, e.name, *e.checksum, t.nbytes(), got);
}

// A BOOL byte other than 0 or 1 is not a C++ bool; reading one would be undefined.
void check_bools(const Tensor& t, const std::string& name, std::string_view what) {
  if (t.dtype() != DType::boolean) return;
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    FORGE_CHECK(p[i] <= 1, "{}: tensor \"{}\": BOOL element {} is the byte {}, expected 0 or 1",
                what, name, i, p[i]);
  }
}

void pread_full(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min<uint64_t>(n, 1u << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    FORGE_CHECK(r >= 0, "{}: read failed at byte {}: {}", path, offset, io::errno_message());
    FORGE_CHECK(r > 0,
                "{}: the file ended at byte {} while reading (was it truncated while being read?)",
                path, offset);
    p += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

}  // namespace

std::string checksum_hex(std::string_view bytes) {
  return fmt::format("{:016x}", xxh3_64(bytes.data(), bytes.size()));
}

std::string serialize(const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const Layout l = make_layout(tensors, metadata);
  std::string out = l.header;
  for (const Tensor& t : l.tensors) {
    if (t.nbytes()) out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  }
  return out;
}

File deserialize(std::string_view bytes, std::string_view what) {
  FORGE_CHECK(
      bytes.size() >= 8,
      "{}: {} bytes are too short for the 8-byte header length: truncated or not safetensors", what,
      bytes.size());
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  check_header_length(n, bytes.size(), what);
  const std::string_view data = bytes.substr(8 + n);
  const Header h = parse_header(bytes.substr(8, n), data.size(), what);
  File f;
  f.metadata = h.metadata;
  f.checksummed = h.checksummed;
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (t.nbytes()) std::memcpy(t.raw_data(), data.data() + e.begin, t.nbytes());
    check_checksum(e, t, what);
    check_bools(t, e.name, what);
    f.tensors.emplace(e.name, std::move(t));
  }
  return f;
}

void save(const std::string& path, const std::map<std::string, Tensor>& tensors,
          const std::map<std::string, std::string>& metadata) {
  const Layout l = make_layout(tensors, metadata);
  const std::string tmp = path + ".tmp";
  io::Fd out{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  FORGE_CHECK(out.fd >= 0, "safetensors: cannot create {}: {}", tmp, io::errno_message());
  try {
    io::write_all(out.fd, l.header.data(), l.header.size(), tmp);
    for (const Tensor& t : l.tensors) {
      if (t.nbytes()) io::write_all(out.fd, t.raw_data(), t.nbytes(), tmp);
    }
    FORGE_CHECK(::fsync(out.fd) == 0, "{}: fsync failed: {}", tmp, io::errno_message());
    out.close(tmp);
    FORGE_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "safetensors: cannot rename {} to {}: {}",
                tmp, path, io::errno_message());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  io::fsync_directory(std::filesystem::path(path).parent_path().string());
}

File load(const std::string& path) {
  io::Fd in{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  FORGE_CHECK(in.fd >= 0, "safetensors: cannot open {}: {}", path, io::errno_message());
  struct stat st {};
  FORGE_CHECK(::fstat(in.fd, &st) == 0, "{}: stat failed: {}", path, io::errno_message());
  FORGE_CHECK(S_ISREG(st.st_mode), "{}: not a regular file", path);
  const auto size = static_cast<uint64_t>(st.st_size);
  FORGE_CHECK(
      size >= 8,
      "{}: {} bytes are too short for the 8-byte header length: truncated or not safetensors", path,
      size);
  uint64_t n;
  pread_full(in.fd, &n, 8, 0, path);
  check_header_length(n, size, path);
  std::string text(n, '\0');
  pread_full(in.fd, text.data(), n, 8, path);
  const uint64_t data_start = 8 + n;
  const Header h = parse_header(text, size - data_start, path);
  File f;
  f.metadata = h.metadata;
  f.checksummed = h.checksummed;
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (t.nbytes()) pread_full(in.fd, t.raw_data(), t.nbytes(), data_start + e.begin, path);
    check_checksum(e, t, path);
    check_bools(t, e.name, path);
    f.tensors.emplace(e.name, std::move(t));
  }
  return f;
}

}  // namespace forge::safetensors
