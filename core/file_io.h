// Durable POSIX file I/O shared by safetensors, checkpoints and run files:
// whole writes that survive EINTR and short writes, fsync of a file and of the
// directory that holds it, and the write-to-a-temporary-then-rename pattern
// that leaves either the old or the new file after a crash at any instant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace forge::io {

// strerror(errno), for messages.
std::string errno_message();

// Closes a file descriptor on every path out of a scope.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  // Closes now and reports a failed close (where a delayed write error shows).
  void close(const std::string& path);
};

// Writes all `n` bytes to `fd`; errors name `path`.
void write_all(int fd, const void* data, size_t n, const std::string& path);

// Creates or truncates `path`, writes `bytes`, fsyncs and closes it.
void write_file_durable(const std::string& path, std::string_view bytes);

// Makes renames and creations inside `dir` durable. Some filesystems cannot
// fsync a directory (EINVAL); only real I/O errors count.
void fsync_directory(const std::string& dir);

// `path` + ".tmp-<pid>" written durably, renamed over `path`, the directory
// fsynced; the temporary is removed when anything fails.
void write_file_atomic(const std::string& path, std::string_view bytes);
// Whether file name `name` is what a write_file_atomic of the file named
// `target` leaves when the process is killed before its rename.
bool is_atomic_write_temp(std::string_view name, std::string_view target);

// When `path` exists, checks that it can be written (appended to or replaced
// by write_file_atomic): a regular file that opens for writing (not read-only,
// not immutable). Writes nothing; an error names the file and why.
void check_writable(const std::string& path);

// The whole file; errors name `path`. A file longer than `max_bytes` is an
// error found while reading, before more than that is held in memory.
std::string read_file(const std::string& path, size_t max_bytes = SIZE_MAX);

}  // namespace forge::io
