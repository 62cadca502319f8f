// Helpers shared by the data tests (they link forge_data, and with it zlib):
// gzip files and a test image.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

#include "data/image_io.h"

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

}  // namespace forge::testing
