#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace forge::data {

namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

// Reads up to `n` bytes; returns how many were read. A damaged compressed
// stream throws; a stream that ends early returns less (the caller reports it).
size_t read_some(gzFile f, uint8_t* dst, size_t n, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, size_t{1} << 30));
    const int got = gzread(f, dst + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      FORGE_FAIL("read_idx: '{}' could not be read after {} bytes: {}", path, done, msg);
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  FORGE_CHECK(std::filesystem::is_regular_file(path), "read_idx: file '{}' does not exist", path);
  GzPtr file(gzopen(path.c_str(), "rb"));
  FORGE_CHECK(file != nullptr, "read_idx: cannot open '{}'", path);
  gzbuffer(file.get(), 1 << 17);

  uint8_t magic[4];
  const size_t got_magic = read_some(file.get(), magic, 4, path);
  FORGE_CHECK(got_magic == 4,
              "read_idx: '{}' is truncated: expected a 4-byte magic, found {} bytes", path,
              got_magic);
  FORGE_CHECK(magic[0] == 0 && magic[1] == 0 && magic[3] >= 1,
              "read_idx: '{}' is not an IDX file: magic bytes {:02x} {:02x} {:02x} {:02x}, "
              "expected 00 00 <type> <ndims >= 1>",
              path, magic[0], magic[1], magic[2], magic[3]);
  FORGE_CHECK(
      magic[2] == 0x08,
      "read_idx: '{}' holds element type 0x{:02x}; only unsigned bytes (0x08) are supported", path,
      magic[2]);

  const int ndims = magic[3];
  std::vector<uint8_t> header(4 * static_cast<size_t>(ndims));
  const size_t got_header = read_some(file.get(), header.data(), header.size(), path);
  FORGE_CHECK(got_header == header.size(),
              "read_idx: '{}' is truncated: expected {} header bytes for {} dimensions, found {}",
              path, header.size(), ndims, got_header);

  IdxArray out;
  uint64_t count = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* b = header.data() + 4 * d;
    const uint64_t dim =
        (uint64_t{b[0]} << 24) | (uint64_t{b[1]} << 16) | (uint64_t{b[2]} << 8) | uint64_t{b[3]};
    out.dims.push_back(static_cast<int64_t>(dim));
    count *= dim;
    FORGE_CHECK(count <= (uint64_t{1} << 40),
                "read_idx: '{}' declares an implausible size (dimension {} = {})", path, d, dim);
  }

  const size_t header_bytes = 4 + header.size();
  out.data.resize(static_cast<size_t>(count));
  const size_t got = read_some(file.get(), out.data.data(), out.data.size(), path);
  if (got < out.data.size()) {
    int code = 0;
    const char* msg = gzerror(file.get(), &code);
    FORGE_FAIL(
        "read_idx: '{}' is truncated: its header (dims {}) calls for {} data bytes after the "
        "{}-byte header, found {}{}{}",
        path, out.dims, count, header_bytes, got,
        code == Z_OK ? "" : "; zlib: ", code == Z_OK ? "" : msg);
  }
  uint8_t extra;
  const size_t trailing = read_some(file.get(), &extra, 1, path);
  FORGE_CHECK(trailing == 0,
              "read_idx: '{}' is longer than its header says: dims {} call for {} data bytes after "
              "the {}-byte header, found more",
              path, out.dims, count, header_bytes);
  return out;
}

}  // namespace forge::data
