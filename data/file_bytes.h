// Whole files as bytes, for the text sources (language-model corpora, seq2seq
// pairs): plain files read as they are, names ending in ".gz" decompressed
// with zlib; both bounded in size before memory is spent on them.
#pragma once

#include <cstdint>
#include <string>

namespace forge::data {

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
