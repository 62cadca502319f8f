// read_idx (data/idx.h) on any bytes, as a file: read as given (zlib reads
// plain and gzip streams alike) and, when the bytes are not gzip already, once
// more gzip-compressed, so that every plain input also reaches the reader
// through the compressed path. An array that reads holds prod(dims) bytes.
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  read_and_check(data, size);
  if (!forge::fuzz::is_gzip(data, size)) {
    const std::vector<uint8_t> gz = forge::fuzz::gzip(data, size);
    read_and_check(gz.data(), gz.size());
  }
  return 0;
}
