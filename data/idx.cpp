#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "data/file_bytes.h"

namespace forge::data {

namespace {

// A gzip stream is read in pieces of this size, each allocated only once the
// one before it is full: a header that declares more than the stream holds
// costs at most what it holds plus one piece.
constexpr size_t kPieceBytes = size_t{1} << 20;

// Reads the `count` data bytes of a gzip stream into `out`; returns how many
// there were (out is filled only when all `count` arrived).
uint64_t read_gzip_data(gzFile f, uint64_t count, const std::string& path,
                        std::vector<uint8_t>* out) {
  std::vector<std::vector<uint8_t>> pieces;
  uint64_t got = 0;
  while (got < count) {
    std::vector<uint8_t>& piece = pieces.emplace_back(std::min<uint64_t>(kPieceBytes, count - got));
    const size_t n = gz_read(f, piece.data(), piece.size(), path);
    got += n;
    if (n < piece.size()) return got;
  }
  out->reserve(static_cast<size_t>(count));
  for (std::vector<uint8_t>& piece : pieces) {
    out->insert(out->end(), piece.begin(), piece.end());
    piece = {};
  }
  return got;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  FORGE_CHECK(std::filesystem::is_regular_file(path), "read_idx: file '{}' does not exist", path);
  GzFile file = open_gz(path);
  const bool gzip = !gzdirect(file.get());  // zlib looks for the gzip magic 1f 8b

  uint8_t magic[4];
  const size_t got_magic = gz_read(file.get(), magic, 4, path);
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
  const size_t got_header = gz_read(file.get(), header.data(), header.size(), path);
  FORGE_CHECK(got_header == header.size(),
              "read_idx: '{}' is truncated: expected {} header bytes for {} dimensions, found {}",
              path, header.size(), ndims, got_header);

  IdxArray out;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* b = header.data() + 4 * d;
    out.dims.push_back((int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) |
                       int64_t{b[3]});
  }
  // Checked before anything is allocated: dims such as 2^20 x 2^20 x 2^24
  // would wrap the product to 0 and pass for an empty array.
  uint64_t count = 1;
  for (int64_t dim : out.dims)
    FORGE_CHECK(!__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &count),
                "read_idx: '{}' is not a valid IDX file: its header declares dims {}, whose "
                "product overflows 64 bits",
                path, out.dims);

  const size_t header_bytes = 4 + header.size();
  auto truncated = [&](uint64_t found) {
    int code = 0;
    const char* msg = gzerror(file.get(), &code);
    FORGE_FAIL(
        "read_idx: '{}' is truncated: its header (dims {}) calls for {} data bytes after the "
        "{}-byte header, found {}{}{}; the file is damaged or cut short (fetch it again)",
        path, out.dims, count, header_bytes, found,
        code == Z_OK ? "" : "; zlib: ", code == Z_OK ? "" : msg);
  };
  if (!gzip) {
    // The file's size says whether the data is all there, before any allocation.
    const uint64_t found = std::filesystem::file_size(path) - header_bytes;
    if (found < count) truncated(found);
    FORGE_CHECK(found == count,
                "read_idx: '{}' is longer than its header says: dims {} call for {} data bytes "
                "after the {}-byte header, found more: {}",
                path, out.dims, count, header_bytes, found);
    out.data.resize(static_cast<size_t>(count));
    const size_t got = gz_read(file.get(), out.data.data(), out.data.size(), path);
    if (got < count) truncated(got);  // the file shrank meanwhile
    return out;
  }
  const uint64_t found = read_gzip_data(file.get(), count, path, &out.data);
  if (found < count) truncated(found);
  uint8_t extra;
  const size_t trailing = gz_read(file.get(), &extra, 1, path);
  FORGE_CHECK(trailing == 0,
              "read_idx: '{}' is longer than its header says: dims {} call for {} data bytes after "
              "the {}-byte header, found more",
              path, out.dims, count, header_bytes);
  return out;
}

}  // namespace forge::data
