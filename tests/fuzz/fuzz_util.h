// What the libFuzzer harnesses share. A harness feeds hostile bytes to one
// parser: a forge::Error (or another std::exception) is a clean rejection; a
// crash, a sanitizer report, a leak, a timeout or too much memory is a bug.
// Properties that an accepted input must have are checked with FUZZ_REQUIRE,
// which aborts (a crash, to libFuzzer) naming the property.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

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

}  // namespace forge::fuzz
