#include "data/file_bytes.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>

#include "core/error.h"

namespace forge::data {

namespace {

constexpr size_t kPieceBytes = size_t{1} << 20;

[[noreturn]] void too_large(const std::string& path, int64_t max_total) {
  FORGE_FAIL(
      "'{}' brings the data past the limit of {} bytes (max_bytes); raise max_bytes or select "
      "fewer files",
      path, max_total);
}

}  // namespace

GzFile open_gz(const std::string& path) {
  GzFile file(gzopen(path.c_str(), "rb"));
  FORGE_CHECK(file != nullptr, "cannot open '{}'", path);
  gzbuffer(file.get(), 1 << 17);
  return file;
}

size_t gz_read(gzFile f, void* dst, size_t n, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const auto chunk = static_cast<unsigned>(std::min<size_t>(n - done, size_t{1} << 30));
    const int got = gzread(f, static_cast<char*>(dst) + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      FORGE_FAIL("'{}' is not a valid gzip stream: zlib: {} (after {} bytes)", path, msg, done);
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

int64_t append_file_bytes(const std::string& path, int64_t max_total, std::string& out) {
  namespace fs = std::filesystem;
  FORGE_CHECK(fs::is_regular_file(path), "'{}' does not exist or is not a regular file", path);
  const auto limit = static_cast<size_t>(std::max<int64_t>(max_total, 0));
  FORGE_CHECK(out.size() <= limit, "append_file_bytes: already {} bytes, over the limit {}",
              out.size(), limit);
  const size_t start = out.size();
  const uint64_t file_bytes = fs::file_size(path);
  const bool gzip = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  if (file_bytes == 0) return 0;

  if (!gzip) {
    if (file_bytes > limit - start) too_large(path, max_total);
    std::ifstream in(path, std::ios::binary);
    FORGE_CHECK(in, "cannot open '{}'", path);
    out.resize(start + file_bytes);
    in.read(out.data() + start, static_cast<std::streamsize>(file_bytes));
    const auto got = static_cast<size_t>(in.gcount());
    out.resize(start + got);
    FORGE_CHECK(got == file_bytes, "reading '{}' failed after {} of its {} bytes", path, got,
                file_bytes);
    return static_cast<int64_t>(got);
  }

  GzFile file = open_gz(path);
  FORGE_CHECK(!gzdirect(file.get()),
              "'{}' ends in .gz but is not a gzip stream (its first bytes are not 1f 8b); "
              "decompress it or rename it",
              path);
  for (;;) {
    // At most one byte past the limit, to tell a stream that ends there from a longer one.
    const size_t old = out.size();
    const size_t piece = std::min(kPieceBytes, limit - old + 1);
    out.resize(old + piece);
    const size_t got = gz_read(file.get(), out.data() + old, piece, path);
    out.resize(old + got);
    if (out.size() > limit) too_large(path, max_total);
    if (got < piece) break;
  }
  // A stream cut short ends like a complete one, with zlib's note "unexpected end of file".
  int code = 0;
  const char* msg = gzerror(file.get(), &code);
  FORGE_CHECK(code == Z_OK,
              "'{}' is a truncated gzip stream: zlib: {} (after {} decompressed bytes)", path, msg,
              out.size() - start);
  return static_cast<int64_t>(out.size() - start);
}

}  // namespace forge::data
