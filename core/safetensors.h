// safetensors: the checkpoint tensor format, the same layout as the Python
// `safetensors` package reads and writes:
//
//   bytes [0, 8)        N, the header length, u64 little-endian
//   bytes [8, 8 + N)    JSON header, padded with spaces to a multiple of 8:
//                         {"__metadata__": {str: str},
//                          NAME: {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//                          ...}
//   bytes [8 + N, EOF)  the data section: raw little-endian elements; offsets
//                       are relative to its start and the tensors tile it exactly
//
// The reader treats every file as hostile: the whole header is validated
// (dtypes, shapes, offsets, overlaps, holes, sizes) before any tensor is
// allocated, and every problem is a forge::Error naming the file and tensor.
//
// Checksums: the writer adds, for every tensor NAME, the __metadata__ entry
// "xxh3_64:NAME" -> XXH3-64 (seed 0) of the tensor's bytes in the data
// section, as 16 lowercase hex digits. Other readers see plain string
// metadata. The reader verifies every tensor against its checksum and hides
// these keys from File::metadata; files without them (other writers, older
// attnforge) load unverified, and a file that has them for only some tensors,
// or for a tensor it does not hold, or with a malformed value, is rejected.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "core/tensor.h"

namespace forge::safetensors {

struct File {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;  // without the checksum keys
  // Whether the file carried checksums (then every tensor matched its own).
  // False for files written without them, and for a file without tensors.
  bool checksummed = false;
};

// The header lengths the reader accepts, as the reference implementation does.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// The __metadata__ key prefix of the checksums; callers cannot use it.
inline constexpr std::string_view kChecksumPrefix = "xxh3_64:";

// XXH3-64 (seed 0) of `bytes` as 16 lowercase hex digits, the form the
// checksums take in __metadata__ (callers use it for their own files too).
std::string checksum_hex(std::string_view bytes);

// The file format in memory. Tensors are written in name order, contiguously;
// CUDA tensors are copied to the CPU first. A `metadata` key starting with
// kChecksumPrefix is an error.
std::string serialize(const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// `what` names the source in errors (a file name, "checkpoint", ...).
File deserialize(std::string_view bytes, std::string_view what);

// Writes `path + ".tmp"`, fsyncs it and renames it over `path`, so an existing
// file is replaced whole or not at all.
void save(const std::string& path, const std::map<std::string, Tensor>& tensors,
          const std::map<std::string, std::string>& metadata = {});
// Reads the header, validates it against the file size, then reads each
// tensor's bytes straight into its storage and checks them against their
// checksum there.
File load(const std::string& path);

}  // namespace forge::safetensors
