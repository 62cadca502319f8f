// IDX files: the array format of MNIST and Fashion-MNIST (a 4-byte magic
// 00 00 <type> <ndims>, ndims big-endian u32 dimensions, then the elements
// row-major). Read plain or gzip-compressed (zlib reads both).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace forge::data {

// An IDX array of unsigned bytes (type 0x08, the only type MNIST uses).
struct IdxArray {
  std::vector<int64_t> dims;  // e.g. [N, 28, 28] images, [N] labels
  std::vector<uint8_t> data;  // prod(dims) bytes, row-major
};

// Reads `path` (gzip, by its magic 1f 8b, or plain). Errors name the file and
// say what was wrong: a missing file, a bad magic, an element type other than
// u8, dims whose product overflows, or a file shorter or longer than its header
// says (declared dims, expected vs found byte counts). Memory follows the bytes
// that are there, not the header: a plain file's size is checked before the
// data is allocated, and a gzip stream is allocated piece by piece as it arrives.
IdxArray read_idx(const std::string& path);

}  // namespace forge::data
