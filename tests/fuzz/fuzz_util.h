// What the libFuzzer harnesses share. A harness feeds hostile bytes to one
// parser: a forge::Error (or another std::exception) is a clean rejection; a
// crash, a sanitizer report, a leak, a timeout or too much memory is a bug.
// Properties that an accepted input must have are checked with FUZZ_REQUIRE,
// which aborts (a crash, to libFuzzer) naming the property.
#pragma once

#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace forge::fuzz {

[[noreturn]] inline void property_failed(const char* file, int line, const char* property) {
  std::fprintf(stderr, "%s:%d: property failed: %s\n", file, line, property);
  std::abort();
}

#define FUZZ_REQUIRE(cond)                                                  \
  do {                                                                      \
    if (!(cond)) ::forge::fuzz::property_failed(__FILE__, __LINE__, #cond); \
  } while (0)

// Runs fn(); returns false when it threw a std::exception (forge::Error
// included): the input was rejected cleanly.
template <typename F>
bool accepts(F&& fn) {
  try {
    fn();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The bytes as a file, for readers that take a path: a memfd, named
// "/proc/self/fd/N" (a regular file; each open reads it from the start).
class MemFile {
 public:
  MemFile(const void* data, size_t size) {
    fd_ = memfd_create("forge-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) fatal("memfd_create");
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = write(fd_, p, size);
      if (n <= 0) fatal("write to a memfd");
      p += n;
      size -= static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  [[noreturn]] static void fatal(const char* what) {
    std::perror(what);
    std::abort();
  }

  int fd_ = -1;
  std::string path_;
};

// The bytes as a file whose name ends in `suffix` (readers that decide by
// the name, e.g. ".gz"): a symbolic link in the temporary directory to a
// MemFile, removed with it.
class NamedFile {
 public:
  NamedFile(const void* data, size_t size, const std::string& suffix) : mem_(data, size) {
    const char* tmp = std::getenv("TMPDIR");
    path_ = std::string(tmp && *tmp ? tmp : "/tmp") + "/forge-fuzz-" + std::to_string(getpid()) +
            "-" + std::to_string(counter_++) + suffix;
    unlink(path_.c_str());
    if (symlink(mem_.path().c_str(), path_.c_str()) != 0) {
      std::perror("symlink");
      std::abort();
    }
  }
  ~NamedFile() { unlink(path_.c_str()); }
  NamedFile(const NamedFile&) = delete;
  NamedFile& operator=(const NamedFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  MemFile mem_;
  std::string path_;
  static inline int counter_ = 0;
};

// `data` gzip-compressed (as `gzip` writes files).
inline std::vector<uint8_t> gzip(const uint8_t* data, size_t size) {
  z_stream z{};
  // windowBits 15 + 16: a gzip wrapper.
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

inline bool is_gzip(const uint8_t* data, size_t size) {
  return size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
}

}  // namespace forge::fuzz
