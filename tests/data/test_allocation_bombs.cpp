// Allocation bombs: tiny files whose headers declare huge arrays or images
// (IDX dims, PNG IHDR, JPEG SOF0 / SOF2) must fail with an error that names the
// file and the declared size, having allocated about what the file holds.
//
// Each bomb runs in a forked child, so that the peak RSS of earlier tests
// cannot hide it; the child's address space is capped 1 GiB above its start,
// so a bomb that does allocate fails fast instead of taking the machine.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/idx.h"
#include "data/image_io.h"
#include "tests/data/data_test_util.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

using namespace forge::testing;

constexpr long kMaxGrowthKb = 100 * 1024;  // 100 MB

struct Outcome {
  std::string message;      // the forge::Error's message, or what happened instead
  long peak_growth_kb = 0;  // peak RSS during f minus the RSS at its start
};

// Caps the address space 1 GiB above its current size (/proc/self/statm).
void cap_address_space() {
  long pages = 0;
  if (std::FILE* statm = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(statm, "%ld", &pages) != 1) pages = 0;
    std::fclose(statm);
  }
  if (pages <= 0) return;
  const rlim_t cap = static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (rlim_t{1} << 30);
  const rlimit limit{cap, cap};
  setrlimit(RLIMIT_AS, &limit);
}

// Runs `f` in a forked child and reports how it ended.
Outcome run_in_child(const std::function<void()>& f) {
  int fds[2];
  if (pipe(fds) != 0) return {"pipe failed", 0};
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return {"fork failed", 0};
  }
  if (pid == 0) {
    close(fds[0]);
    cap_address_space();
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);  // a fresh child's peak is the RSS it starts with
    std::string message = "no error";
    try {
      f();
    } catch (const Error& e) {
      message = e.what();
    } catch (const std::exception& e) {
      message = std::string("not a forge::Error: ") + e.what();
    }
    getrusage(RUSAGE_SELF, &after);
    const std::string out = std::to_string(after.ru_maxrss - before.ru_maxrss) + "\n" + message;
    const ssize_t written = write(fds[1], out.data(), out.size());
    _exit(written == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const size_t newline = out.find('\n');
  if (newline == std::string::npos)
    return {"the child died (status " + std::to_string(status) + ")", 0};
  return {out.substr(newline + 1), std::stol(out.substr(0, newline))};
}

void expect_refused(const std::function<void()>& f, const std::vector<std::string>& parts) {
  const Outcome o = run_in_child(f);
  for (const std::string& p : parts)
    EXPECT_NE(o.message.find(p), std::string::npos) << "'" << p << "' not in: " << o.message;
  EXPECT_LT(o.peak_growth_kb, kMaxGrowthKb)
      << "peak RSS grew by " << o.peak_growth_kb / 1024 << " MB: " << o.message;
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(v >> shift));
}

// An IDX u8 header declaring `dims`, followed by `data_bytes` bytes of data.
std::vector<uint8_t> idx_header(const std::vector<uint32_t>& dims, size_t data_bytes = 0) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) put_u32(out, d);
  out.resize(out.size() + data_bytes, 7);
  return out;
}

// ---- IDX ----

TEST(AllocationBombs, IdxPlainLabelsFileDeclaringFourBillionItems) {
  TempDir dir;
  const std::string path = dir.file("train-labels-idx1-ubyte");
  write_file(path, idx_header({0xffffffffu}));  // 8 bytes
  expect_refused([&] { read_idx(path); },
                 {path, "truncated", "[4294967295]", "4294967295 data bytes", "found 0"});
}

TEST(AllocationBombs, IdxGzipDeclaringOneTebibyte) {
  TempDir dir;
  const std::string path = dir.file("images.gz");
  write_gz(path, idx_header({1u << 20, 1u << 20}));
  expect_refused([&] { read_idx(path); },
                 {path, "truncated", "[1048576, 1048576]", "1099511627776 data bytes", "found 0"});
}

// A gzip stream that holds less than its header declares costs what it holds
// (plus one read piece), not what it declares.
TEST(AllocationBombs, IdxGzipStreamShorterThanDeclared) {
  TempDir dir;
  const std::string path = dir.file("short.gz");
  write_gz(path, idx_header({1u << 30}, 5000));  // declares 1 GiB, holds 5000 bytes
  expect_refused([&] { read_idx(path); },
                 {path, "truncated", "[1073741824]", "1073741824 data bytes", "found 5000"});
}

// 2^20 * 2^20 * 2^24 = 2^64 wrapped to 0 elements: the file passed as empty.
TEST(AllocationBombs, IdxDimsWhoseProductOverflows) {
  TempDir dir;
  const std::string path = dir.file("wrap");
  write_file(path, idx_header({1u << 20, 1u << 20, 1u << 24}));
  expect_refused([&] { read_idx(path); },
                 {path, "[1048576, 1048576, 16777216]", "overflows 64 bits"});
  write_gz(path + ".gz", idx_header({1u << 20, 1u << 20, 1u << 24}));
  expect_refused([&] { read_idx(path + ".gz"); }, {path + ".gz", "overflows 64 bits"});
}

// ---- images ----

// A PNG chunk: length, type, data, CRC of type + data.
void put_png_chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& data,
                   uint32_t declared_length) {
  put_u32(out, declared_length);
  const size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  put_u32(out, static_cast<uint32_t>(
                   crc32(0, out.data() + start, static_cast<uInt>(out.size() - start))));
}

// 37000x37000 RGB (4.1 GB decoded) in 74 bytes: a valid signature and IHDR
// and the start of an IDAT chunk that declares 1000 bytes.
std::vector<uint8_t> png_bomb() {
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  put_u32(ihdr, 37000);                      // width
  put_u32(ihdr, 37000);                      // height
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit RGB, deflate, no filter, no interlace
  put_png_chunk(out, "IHDR", ihdr, 13);
  put_u32(out, 1000);
  out.insert(out.end(), {'I', 'D', 'A', 'T', 0x78, 0x9c});
  out.resize(74, 0);
  return out;
}

// A JPEG of 37000 x 36000 YCbCr pixels (4 GB as RGB): SOI, a frame header
// (SOF0 baseline or SOF2 progressive) and a scan header, no tables or data.
std::vector<uint8_t> jpeg_bomb(uint8_t sof) {
  std::vector<uint8_t> out = {0xff, 0xd8, 0xff, sof, 0, 17, 8};
  out.insert(out.end(), {0x8c, 0xa0, 0x90, 0x88});  // height 36000, width 37000
  out.insert(out.end(), {3, 1, 0x11, 0, 2, 0x11, 0, 3, 0x11, 0});
  const uint8_t se = sof == 0xc2 ? 0 : 63;  // a progressive scan starts with the DC coefficients
  out.insert(out.end(), {0xff, 0xda, 0, 12, 3, 1, 0, 2, 0, 3, 0, 0, se, 0});
  out.resize(56, 0);
  return out;
}

TEST(AllocationBombs, PngDeclaringGigapixels) {
  TempDir dir;
  const std::string path = dir.file("bomb.png");
  write_file(path, png_bomb());
  expect_refused([&] { read_image(path); },
                 {path, "37000x37000", "data.max_image_pixels", "67108864"});
}

TEST(AllocationBombs, BaselineAndProgressiveJpegDeclaringGigapixels) {
  TempDir dir;
  for (uint8_t sof : {uint8_t{0xc0}, uint8_t{0xc2}}) {
    SCOPED_TRACE(sof == 0xc0 ? "SOF0" : "SOF2");
    const std::string path = dir.file("bomb.jpg");
    write_file(path, jpeg_bomb(sof));
    expect_refused([&] { read_image(path); }, {path, "37000x36000", "data.max_image_pixels"});
  }
}

}  // namespace
}  // namespace forge::data
