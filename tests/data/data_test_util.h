// Helpers shared by the data tests (they link forge_data, and with it zlib):
// gzip files, a test image, a fixture with a temporary directory, and the
// loader tests' datasets' examples.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "data/dataset.h"
#include "data/image_io.h"
#include "tests/test_util.h"

namespace forge::testing {

// Writes `bytes` to `path` as a gzip file (the folder must exist).
inline void write_gz(const std::filesystem::path& path, std::string_view bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// write_gz for bytes held as uint8_t.
inline void write_gz(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  write_gz(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

// A deterministic h x w x c image with varied values (exact round trips).
inline data::Image pattern_image(int64_t h, int64_t w, int64_t c) {
  data::Image im{h, w, c, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
  for (int64_t i = 0; i < h * w * c; ++i) im.pixels[static_cast<size_t>(i)] = (i * 37 + 11) % 256;
  return im;
}

// A fixture with a fresh directory per test, removed afterwards: dir_, and
// path(name) for a file in it.
class TempDirTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return tmp_.file(name); }

  TempDir tmp_;
  const std::filesystem::path dir_ = tmp_.path();
};

// i64 tokens [len] of sequence i: 100 i + 1, 100 i + 2, ..., 100 i + len.
inline Tensor counting_tokens(int64_t i, int64_t len) {
  std::vector<int64_t> t(static_cast<size_t>(len));
  for (int64_t k = 0; k < len; ++k) t[static_cast<size_t>(k)] = 100 * i + k + 1;
  return Tensor::from_vector(t);
}

// f32 image i of `shape` ([C, H, W]): element k is 1000 i + k.
inline Tensor counting_image(int64_t i, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t k = 0; k < t.numel(); ++k) p[k] = static_cast<float>(1000 * i + k);
  return t;
}

// A Dataset of n examples that counts its get() calls (from any thread):
// subclasses call count_get() at the start of get(), tests read gets().
class CountingDataset : public data::Dataset {
 public:
  explicit CountingDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  int64_t gets() const { return gets_.load(); }

 protected:
  void count_get() const { gets_.fetch_add(1); }

 private:
  int64_t n_;
  mutable std::atomic<int64_t> gets_{0};
};

}  // namespace forge::testing
