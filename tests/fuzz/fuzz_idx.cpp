// read_idx (data/idx.h) on any bytes, as a file: read as given (zlib reads
// plain and gzip streams alike) and, when the bytes are not gzip already, once
// more gzip-compressed, so that every plain input also reaches the reader
// through the compressed path. An array that reads holds prod(dims) bytes.
#include <zlib.h>

#include <cstdlib>

#include "data/idx.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void read_and_check(const uint8_t* data, size_t size) {
  using namespace forge;
  fuzz::MemFile file(data, size);
  data::IdxArray a;
  if (!fuzz::accepts([&] { a = data::read_idx(file.path()); })) return;
  uint64_t count = 1;
  for (int64_t d : a.dims) {
    FUZZ_REQUIRE(d >= 0);
    FUZZ_REQUIRE(!__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count));
  }
  FUZZ_REQUIRE(count == a.data.size());
}

std::vector<uint8_t> gzip(const uint8_t* data, size_t size) {
  z_stream z{};
  // windowBits 15 + 16: a gzip wrapper, as `gzip` writes the MNIST files.
  if (deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    std::abort();
  std::vector<uint8_t> out(deflateBound(&z, size) + 32);
  z.next_in = const_cast<Bytef*>(data);  // zlib does not write through it
  z.avail_in = static_cast<uInt>(size);
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  read_and_check(data, size);
  const bool is_gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  if (!is_gzip) {
    const std::vector<uint8_t> gz = gzip(data, size);
    read_and_check(gz.data(), gz.size());
  }
  return 0;
}
