// Files as bytes through zlib, bounded before memory is spent on them: whole
// files for the text sources (language-model corpora, seq2seq pairs; names
// ending in ".gz" decompressed), and the open-and-read pieces that the IDX
// reader streams its header and data through.
#pragma once

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace forge::data {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
// A file opened by zlib (gzip streams decompressed, other files as they are).
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Opens `path` for reading with a 128 KiB buffer; throws naming it when it cannot.
GzFile open_gz(const std::string& path);

// Reads up to `n` bytes into `dst`; returns how many were read (fewer only at
// the end of the stream). A damaged compressed stream throws, naming `path`
// and zlib's message.
size_t gz_read(gzFile f, void* dst, size_t n, const std::string& path);

// Appends the bytes of the regular file `path` to `out`; returns how many.
// A name ending in ".gz" is read as a gzip stream (concatenated members
// included) in 1 MiB pieces; any other file as is. `out` stays within
// `max_total` bytes (a plain file's size is checked before it is read, a gzip
// stream is refused at its first byte past the limit). Errors name the file:
// missing or not a regular file, ".gz" without the gzip magic, a damaged or
// truncated gzip stream (with zlib's message), more than `max_total` bytes
// (the max_bytes option of the callers).
int64_t append_file_bytes(const std::string& path, int64_t max_total, std::string& out);

}  // namespace forge::data
