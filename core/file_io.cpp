#include "core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace forge::io {

std::string errno_message() {
  return std::strerror(errno);
}

Fd::~Fd() {
  if (fd >= 0) ::close(fd);
}

void Fd::close(const std::string& path) {
  const int f = fd;
  fd = -1;
  FORGE_CHECK(::close(f) == 0, "{}: close failed: {}", path, errno_message());
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    FORGE_CHECK(w > 0, "{}: write failed: {}", path, errno_message());
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void write_file_durable(const std::string& path, std::string_view bytes) {
  Fd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  FORGE_CHECK(out.fd >= 0, "{}: cannot create: {}", path, errno_message());
  write_all(out.fd, bytes.data(), bytes.size(), path);
  FORGE_CHECK(::fsync(out.fd) == 0, "{}: fsync failed: {}", path, errno_message());
  out.close(path);
}

void fsync_directory(const std::string& dir_arg) {
  const std::string dir = dir_arg.empty() ? "." : dir_arg;
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  FORGE_CHECK(d.fd >= 0, "{}: cannot open the directory to fsync it: {}", dir, errno_message());
  FORGE_CHECK(::fsync(d.fd) == 0 || errno == EINVAL, "{}: fsync of the directory failed: {}", dir,
              errno_message());
}

namespace {
constexpr std::string_view kAtomicTempMark = ".tmp-";  // then the writer's pid
}  // namespace

bool is_atomic_write_temp(std::string_view name, std::string_view target) {
  if (!name.starts_with(target) || !name.substr(target.size()).starts_with(kAtomicTempMark))
    return false;
  const std::string_view pid = name.substr(target.size() + kAtomicTempMark.size());
  return !pid.empty() && pid.find_first_not_of("0123456789") == std::string_view::npos;
}

void check_writable(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::symlink_status(path, ec);
  if (!std::filesystem::exists(st)) return;
  FORGE_CHECK(std::filesystem::is_regular_file(std::filesystem::status(path, ec)),
              "{}: cannot be written: it is not a regular file", path);
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  FORGE_CHECK(fd >= 0, "{}: cannot be written: {}", path, std::strerror(errno));
  ::close(fd);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + std::string(kAtomicTempMark) + std::to_string(::getpid());
  try {
    write_file_durable(tmp, bytes);
    FORGE_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename {} to {}: {}", tmp, path,
                errno_message());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(std::filesystem::path(path).parent_path().string());
}

std::string read_file(const std::string& path, size_t max_bytes) {
  Fd in(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  FORGE_CHECK(in.fd >= 0, "{}: cannot open: {}", path, errno_message());
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(in.fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    FORGE_CHECK(r >= 0, "{}: read failed: {}", path, errno_message());
    if (r == 0) break;
    // Counted as it is read: a FIFO or /dev/zero has no size to check first.
    FORGE_CHECK(out.size() + static_cast<size_t>(r) <= max_bytes,
                "{}: more than {} bytes, more than such a file ever holds: not the file expected "
                "here (or damaged)",
                path, max_bytes);
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

}  // namespace forge::io
