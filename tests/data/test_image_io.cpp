// PNG/JPEG decoding and encoding: exact PNG round trips, JPEG within a
// tolerance, the libpng conversions (16-bit, palette, low bit depths, alpha,
// tRNS, interlacing) on files made here with libpng's low-level writer, and
// the errors for missing, empty, foreign, corrupt and truncated files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

// clang-format off
#include <png.h>
#include <jpeglib.h>
// clang-format on

#include "core/error.h"
#include "data/image_io.h"
#include "data/random.h"
#include "tests/data/data_test_util.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

namespace fs = std::filesystem;
using namespace forge::testing;

// A fresh directory per test, removed afterwards.
class ImageIoTest : public testing::TempDirTest {};

// A smooth image (JPEG keeps it within a few levels).
Image smooth_image(int64_t h, int64_t w, int64_t c) {
  Image im{h, w, c, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t k = 0; k < c; ++k)
        im.pixels[static_cast<size_t>((y * w + x) * c + k)] =
            static_cast<uint8_t>(40 + 2 * x + 3 * y + 30 * k);
  return im;
}

// ---- a low-level libpng writer for the formats the encoder does not make ----

struct RawPng {
  uint32_t width = 0, height = 0;
  int bit_depth = 8, color_type = PNG_COLOR_TYPE_GRAY;
  bool interlaced = false;
  std::vector<uint8_t> rows{};  // height rows of packed samples (16-bit big-endian)
  std::vector<png_color> palette{};
  std::vector<uint8_t> trns_alpha{};  // palette tRNS
  bool gray_trns = false;           // gray tRNS of value 0
};

void append_bytes(png_structp png, png_bytep src, size_t n) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), src, src + n);
}

void no_flush(png_structp) {}

// The setjmp frame holds no C++ objects (libpng longjmps on error).
bool write_raw_png(png_structp png, png_infop info, const RawPng* p, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_IHDR(png, info, p->width, p->height, p->bit_depth, p->color_type,
               p->interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!p->palette.empty())
    png_set_PLTE(png, info, p->palette.data(), static_cast<int>(p->palette.size()));
  if (!p->trns_alpha.empty())
    png_set_tRNS(png, info, p->trns_alpha.data(), static_cast<int>(p->trns_alpha.size()), nullptr);
  png_color_16 gray_key{};
  if (p->gray_trns) png_set_tRNS(png, info, nullptr, 0, &gray_key);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  return true;
}

std::vector<uint8_t> encode_raw_png(const RawPng& p) {
  std::vector<uint8_t> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_set_write_fn(png, &out, append_bytes, no_flush);
  const size_t row_bytes = p.rows.size() / p.height;
  std::vector<png_bytep> rows(p.height);
  for (size_t y = 0; y < p.height; ++y)
    rows[y] = const_cast<uint8_t*>(p.rows.data()) + y * row_bytes;
  const bool ok = write_raw_png(png, info, &p, rows.data());
  png_destroy_write_struct(&png, &info);
  EXPECT_TRUE(ok) << "the test's own PNG writer failed";
  return out;
}

void expect_pixels(const Image& im, int64_t h, int64_t w, int64_t c,
                   const std::vector<uint8_t>& expected) {
  EXPECT_EQ(im.height, h);
  EXPECT_EQ(im.width, w);
  ASSERT_EQ(im.channels, c);
  EXPECT_EQ(im.pixels, expected);
}

// ---- round trips ----

TEST_F(ImageIoTest, PngRoundTripIsExact) {
  for (int64_t c : {1, 3}) {
    const Image im = pattern_image(5, 7, c);
    const std::string p = path("im" + std::to_string(c) + ".png");
    write_png(p, im);
    expect_pixels(read_image(p), 5, 7, c, im.pixels);
    expect_pixels(decode_image(encode_png(im), "memory"), 5, 7, c, im.pixels);
  }
}

TEST_F(ImageIoTest, JpegRoundTripWithinTolerance) {
  for (int64_t c : {1, 3}) {
    const Image im = smooth_image(24, 32, c);
    const std::string p = path("im" + std::to_string(c) + ".jpg");
    write_jpeg(p, im, 95);
    const Image back = read_image(p);
    ASSERT_EQ(back.height, 24);
    ASSERT_EQ(back.width, 32);
    ASSERT_EQ(back.channels, c);
    double total = 0;
    int max_diff = 0;
    for (size_t i = 0; i < im.pixels.size(); ++i) {
      const int d = std::abs(int(back.pixels[i]) - int(im.pixels[i]));
      max_diff = std::max(max_diff, d);
      total += d;
    }
    EXPECT_LE(max_diff, 8) << "channels " << c;
    EXPECT_LE(total / static_cast<double>(im.pixels.size()), 2.0) << "channels " << c;
  }
}

TEST_F(ImageIoTest, JpegQualityChangesTheSize) {
  const Image im = pattern_image(32, 32, 3);
  EXPECT_LT(encode_jpeg(im, 10).size(), encode_jpeg(im, 95).size());
}

TEST_F(ImageIoTest, FormatComesFromTheBytesNotTheName) {
  const Image im = pattern_image(3, 4, 3);
  write_png(path("really_png.jpg"), im);
  expect_pixels(read_image(path("really_png.jpg")), 3, 4, 3, im.pixels);
  write_jpeg(path("really_jpeg.png"), smooth_image(8, 8, 1));
  EXPECT_EQ(read_image(path("really_jpeg.png")).channels, 1);
}

// ---- PNG conversions ----

TEST_F(ImageIoTest, Png16BitIsScaledTo8Bits) {
  // v -> round(v * 255 / 65535)
  const std::vector<uint16_t> values = {0, 65535, 257 * 100, 1000, 40000, 128};
  const std::vector<uint8_t> expected = {0, 255, 100, 4, 156, 0};
  RawPng p{.width = 3, .height = 2, .bit_depth = 16, .color_type = PNG_COLOR_TYPE_GRAY};
  for (uint16_t v : values) p.rows.insert(p.rows.end(), {uint8_t(v >> 8), uint8_t(v & 0xff)});
  expect_pixels(decode_image(encode_raw_png(p), "gray16"), 2, 3, 1, expected);

  p.width = 2;
  p.height = 1;
  p.color_type = PNG_COLOR_TYPE_RGB;
  expect_pixels(decode_image(encode_raw_png(p), "rgb16"), 1, 2, 3, expected);
}

TEST_F(ImageIoTest, PalettePngBecomesRgb) {
  RawPng p;
  p.width = 4;
  p.height = 2;
  p.color_type = PNG_COLOR_TYPE_PALETTE;
  p.palette = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {10, 20, 30}};
  p.trns_alpha = {0, 128};  // transparency is dropped, the colours stay
  const std::vector<uint8_t> index = {0, 1, 2, 3, 3, 2, 1, 0};
  std::vector<uint8_t> expected;
  for (uint8_t i : index)
    expected.insert(expected.end(), {p.palette[i].red, p.palette[i].green, p.palette[i].blue});

  p.bit_depth = 8;
  p.rows = index;
  expect_pixels(decode_image(encode_raw_png(p), "palette8"), 2, 4, 3, expected);

  p.bit_depth = 2;  // four 2-bit indices per byte, first pixel in the high bits
  p.rows = {0b00011011, 0b11100100};
  expect_pixels(decode_image(encode_raw_png(p), "palette2"), 2, 4, 3, expected);
}

TEST_F(ImageIoTest, LowBitDepthGrayIsScaled) {
  RawPng p{.width = 8, .height = 1, .bit_depth = 1, .rows = {0b10110001}};
  expect_pixels(decode_image(encode_raw_png(p), "gray1"), 1, 8, 1,
                {255, 0, 255, 255, 0, 0, 0, 255});
  p.width = 4;
  p.bit_depth = 4;
  p.rows = {0x0f, 0x58};
  expect_pixels(decode_image(encode_raw_png(p), "gray4"), 1, 4, 1, {0, 255, 85, 136});
}

TEST_F(ImageIoTest, AlphaIsDropped) {
  RawPng p{.width = 2,
           .height = 1,
           .color_type = PNG_COLOR_TYPE_RGBA,
           .rows = {1, 2, 3, 0, 200, 100, 50, 255}};
  expect_pixels(decode_image(encode_raw_png(p), "rgba"), 1, 2, 3, {1, 2, 3, 200, 100, 50});

  p.color_type = PNG_COLOR_TYPE_GRAY_ALPHA;
  p.rows = {7, 0, 250, 30};
  expect_pixels(decode_image(encode_raw_png(p), "gray_alpha"), 1, 2, 1, {7, 250});

  p.color_type = PNG_COLOR_TYPE_GRAY;  // a transparent gray key is dropped too
  p.gray_trns = true;
  p.rows = {0, 9};
  expect_pixels(decode_image(encode_raw_png(p), "gray_trns"), 1, 2, 1, {0, 9});
}

TEST_F(ImageIoTest, InterlacedPngMatchesPlain) {
  const Image im = pattern_image(9, 11, 3);
  RawPng p{.width = 11,
           .height = 9,
           .color_type = PNG_COLOR_TYPE_RGB,
           .interlaced = true,
           .rows = im.pixels};
  expect_pixels(decode_image(encode_raw_png(p), "adam7"), 9, 11, 3, im.pixels);
}

// ---- errors ----

TEST_F(ImageIoTest, MissingFileNamesThePath) {
  const std::string p = path("does_not_exist.png");
  expect_error([&] { read_image(p); }, {"cannot open", p});
}

TEST_F(ImageIoTest, ForeignOrEmptyFilesAreNotImages) {
  const std::string text = path("notes.png");
  write_file(text, {'G', 'I', 'F', '8', '9', 'a', 0, 0});
  expect_error([&] { read_image(text); }, {text, "not a PNG or JPEG", "47 49 46 38 39 61"});
  const std::string empty = path("empty.jpg");
  write_file(empty, "");
  expect_error([&] { read_image(empty); }, {empty, "empty"});
}

TEST_F(ImageIoTest, TruncatedFilesAreErrors) {
  const std::vector<uint8_t> png = encode_png(pattern_image(16, 16, 3));
  const std::vector<uint8_t> jpeg = encode_jpeg(pattern_image(16, 16, 3));
  for (double fraction : {0.1, 0.5, 0.95}) {
    const std::string p = path("cut.png");
    write_file(p, std::vector<uint8_t>(png.begin(), png.begin() + long(fraction * png.size())));
    expect_error([&] { read_image(p); }, {p, "truncated"});
    const std::string j = path("cut.jpg");
    write_file(j, std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + long(fraction * jpeg.size())));
    expect_error([&] { read_image(j); }, {j, "truncated"});
  }
}

// A region decode gives the whole decode's pixels there, bit for bit: colour
// (4:2:0, fancy upsampling) and gray JPEGs, progressive too, at every scale,
// over random regions (one block column, the corners, the whole picture);
// the rows and columns returned are whole block rows and columns around the
// ones asked for (a progressive file: all of them). A truncated file fails
// even when the region lies before the cut; the fuzzer's progressive file
// whose cropped decode differed decodes whole.
TEST_F(ImageIoTest, RegionDecodeGivesTheWholeDecodesPixels) {
  Rng rng(5);
  for (int64_t c : {3, 1, 0}) {  // 0: a progressive colour JPEG of the fuzz seeds
    Image im{83, 121, c, std::vector<uint8_t>(static_cast<size_t>(83 * 121 * c))};
    for (size_t i = 0; i < im.pixels.size(); ++i)
      im.pixels[i] = static_cast<uint8_t>((i * 7 + i / 97 * 13) % 251);
    const std::vector<uint8_t> bytes =
        c > 0 ? encode_jpeg(im, 90)
              : read_image_bytes(std::string(FORGE_SOURCE_DIR) +
                                 "/tests/fuzz/corpus/image/rgb_16x16_progressive.jpg");
    if (c == 0) c = 3;
    for (int denom : {1, 2, 4, 8}) {
      const Image whole = decode_image(bytes, "x.jpg", kDefaultMaxImagePixels, denom);
      for (int k = 0; k < 40; ++k) {
        ImageRegion want;
        want.top = rng.randint(0, whole.height - 1);
        want.left = rng.randint(0, whole.width - 1);
        want.height = rng.randint(1, whole.height - want.top);
        want.width = rng.randint(1, whole.width - want.left);
        if (k == 0) want = {0, 0, whole.height, whole.width};
        if (k == 1) want = {whole.height - 1, whole.width - 1, 1, 1};
        ImageRegion got;
        const Image part =
            decode_image_region(bytes, "x.jpg", kDefaultMaxImagePixels, denom, want, got);
        const std::string what = fmt::format("c {} denom {} region [{}, +{}) x [{}, +{})", c, denom,
                                             want.top, want.height, want.left, want.width);
        ASSERT_LE(got.top, want.top) << what;
        ASSERT_GE(got.top + got.height, want.top + want.height) << what;
        ASSERT_LE(got.left, want.left) << what;
        ASSERT_GE(got.left + got.width, want.left + want.width) << what;
        ASSERT_EQ(part.height, got.height) << what;
        ASSERT_EQ(part.width, got.width) << what;
        for (int64_t y = want.top - got.top; y < want.top - got.top + want.height; ++y)
          for (int64_t x = want.left - got.left; x < want.left - got.left + want.width; ++x)
            for (int64_t ch = 0; ch < c; ++ch)
              ASSERT_EQ(part.pixels[static_cast<size_t>((y * part.width + x) * c + ch)],
                        whole.pixels[static_cast<size_t>(
                            ((got.top + y) * whole.width + got.left + x) * c + ch)])
                  << what << " at (" << y << ", " << x << ")";
      }
    }
    const std::string cut = path("cut_region.jpg");
    write_file(cut, std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(0.8 * bytes.size())));
    ImageRegion got;
    expect_error(
        [&] {
          decode_image_region(read_image_bytes(cut), cut, kDefaultMaxImagePixels, 1, {0, 0, 2, 2},
                              got);
        },
        {cut, "truncated"});
  }
}

TEST_F(ImageIoTest, CorruptFilesAreErrors) {
  // A flipped byte inside a PNG chunk fails its CRC.
  std::vector<uint8_t> png = encode_png(pattern_image(16, 16, 3));
  png[png.size() / 2] ^= 0x55;
  const std::string p = path("corrupt.png");
  write_file(p, png);
  expect_error([&] { read_image(p); }, {p, "invalid PNG"});

  // A JPEG whose body after the start marker is noise.
  std::vector<uint8_t> jpeg = {0xff, 0xd8, 0xff};
  for (int i = 0; i < 200; ++i) jpeg.push_back(static_cast<uint8_t>(i * 73 + 5));
  const std::string j = path("corrupt.jpg");
  write_file(j, jpeg);
  expect_error([&] { read_image(j); }, {j, "invalid JPEG"});
}

// A 4-component (CMYK) JPEG made with libjpeg directly.
std::vector<uint8_t> cmyk_jpeg() {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &out, &size);
  cinfo.image_width = 4;
  cinfo.image_height = 2;
  cinfo.input_components = 4;
  cinfo.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  std::vector<uint8_t> row(16, 100);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&cinfo, &r, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> bytes(out, out + size);
  jpeg_destroy_compress(&cinfo);
  std::free(out);
  return bytes;
}

// The limit is on width * height, checked from the header: one pixel more
// than it allows is refused, naming the size and the recipe key.
TEST_F(ImageIoTest, PixelLimitRefusesLargerImages) {
  const std::vector<uint8_t> png = encode_png(pattern_image(30, 40, 1));
  const std::vector<uint8_t> jpeg = encode_jpeg(smooth_image(30, 40, 3));
  EXPECT_EQ(decode_image(png, "small.png", 1200).width, 40);
  EXPECT_EQ(decode_image(jpeg, "small.jpg", 1200).height, 30);
  expect_error(
      [&] { decode_image(png, "small.png", 1199); },
      {"small.png", "PNG", "40x30", "1200 in all", "limit of 1199", "data.max_image_pixels"});
  expect_error([&] { decode_image(jpeg, "small.jpg", 1199); },
               {"small.jpg", "JPEG", "40x30", "limit of 1199", "data.max_image_pixels"});
  const std::string p = path("small.png");
  write_file(p, png);
  expect_error([&] { read_image(p, 100); }, {p, "40x30", "limit of 100"});
  expect_error([&] { read_image(p, 0); }, {p, "at least 1", "got 0"});
  EXPECT_EQ(kDefaultMaxImagePixels, 64 * 1024 * 1024);
}

TEST_F(ImageIoTest, CmykJpegIsRejected) {
  const std::string p = path("cmyk.jpg");
  write_file(p, cmyk_jpeg());
  expect_error([&] { read_image(p); }, {p, "CMYK"});
}

TEST_F(ImageIoTest, EncoderChecksTheImage) {
  Image two{2, 2, 2, std::vector<uint8_t>(8)};
  expect_error([&] { encode_png(two); }, {"1 (gray) or 3 (RGB)", "got 2"});
  Image short_pixels{2, 2, 3, std::vector<uint8_t>(5)};
  expect_error([&] { encode_jpeg(short_pixels); }, {"needs 12 pixel bytes, has 5"});
  expect_error([&] { encode_jpeg(pattern_image(2, 2, 3), 0); }, {"quality", "got 0"});
  expect_error([&] { write_png(path("no_dir/x.png"), pattern_image(2, 2, 1)); },
               {"cannot create", "no_dir/x.png"});
}

// ---- scaled JPEG decoding and headers ----

// A picture with smooth regions, hard edges and fine texture (what photos
// have), so that a scaled decode is compared where it matters.
Image textured_image(int64_t h, int64_t w, int64_t c) {
  Image im{h, w, c, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t k = 0; k < c; ++k) {
        double v = 60 + 1.2 * x + 0.8 * y + 25 * k;
        if ((x - w / 3) * (x - w / 3) + (y - h / 2) * (y - h / 2) < h * h / 9) v += 70;  // a disc
        v += 20 * std::sin(0.9 * x + 0.5 * k) * std::cos(0.7 * y);                       // texture
        im.pixels[static_cast<size_t>((y * w + x) * c + k)] =
            static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
  return im;
}

// The mean of each d x d block (the last row and column of blocks partial):
// what ceil(side / d) output pixels of an exact area reduction hold.
Image area_downscale(const Image& im, int64_t d) {
  const int64_t h = (im.height + d - 1) / d, w = (im.width + d - 1) / d, c = im.channels;
  Image out{h, w, c, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t k = 0; k < c; ++k) {
        double sum = 0;
        int64_t n = 0;
        for (int64_t yy = y * d; yy < std::min(im.height, (y + 1) * d); ++yy)
          for (int64_t xx = x * d; xx < std::min(im.width, (x + 1) * d); ++xx, ++n)
            sum += im.pixels[static_cast<size_t>((yy * im.width + xx) * c + k)];
        out.pixels[static_cast<size_t>((y * w + x) * c + k)] =
            static_cast<uint8_t>(std::lround(sum / static_cast<double>(n)));
      }
  return out;
}

TEST_F(ImageIoTest, ScaledJpegDecodeHasCeilSides) {
  for (int64_t c : {1, 3})
    for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{
             {64, 64}, {37, 50}, {17, 3}, {1, 9}, {333, 500}}) {
      const std::vector<uint8_t> jpeg = encode_jpeg(smooth_image(h, w, c), 90);
      for (int d : {1, 2, 4, 8}) {
        const Image im = decode_image(jpeg, "scaled", kDefaultMaxImagePixels, d);
        EXPECT_EQ(im.height, (h + d - 1) / d) << h << "x" << w << " c" << c << " 1/" << d;
        EXPECT_EQ(im.width, (w + d - 1) / d) << h << "x" << w << " c" << c << " 1/" << d;
        EXPECT_EQ(im.channels, c);
        EXPECT_EQ(im.pixels.size(), static_cast<size_t>(im.height * im.width * c));
      }
    }
  const std::string p = path("scaled.jpg");
  write_jpeg(p, smooth_image(40, 24, 3));
  const Image quarter = read_image(p, kDefaultMaxImagePixels, 4);
  EXPECT_EQ(quarter.height, 10);
  EXPECT_EQ(quarter.width, 6);
}

// libjpeg's reduced IDCT keeps the block's low frequencies, which is close to
// averaging the block: measured on this picture at quality 95 (libjpeg-turbo
// 2.1.5), the scaled decode differs from the area reduction of the full
// decode by 0.08 / 0.06 / 0.09 levels on average at 1/2, 1/4, 1/8 and at most
// 1 level in gray; in RGB (chroma subsampled 4:2:0, upsampled at the reduced
// scale) by 0.47 / 0.33 / 0.31 on average and at most 10 / 6 / 4 levels, at
// the disc's coloured edge. The bounds leave room over those.
TEST_F(ImageIoTest, ScaledJpegDecodeIsCloseToAreaDownscale) {
  for (int64_t c : {1, 3}) {
    const std::vector<uint8_t> jpeg = encode_jpeg(textured_image(150, 203, c), 95);
    const Image full = decode_image(jpeg, "full");
    for (int d : {2, 4, 8}) {
      const Image scaled = decode_image(jpeg, "scaled", kDefaultMaxImagePixels, d);
      const Image area = area_downscale(full, d);
      ASSERT_EQ(scaled.height, area.height);
      ASSERT_EQ(scaled.width, area.width);
      double total = 0;
      int max_diff = 0;
      for (size_t i = 0; i < area.pixels.size(); ++i) {
        const int diff = std::abs(int(scaled.pixels[i]) - int(area.pixels[i]));
        max_diff = std::max(max_diff, diff);
        total += diff;
      }
      const double mean = total / static_cast<double>(area.pixels.size());
      EXPECT_LE(mean, c == 1 ? 0.25 : 1.0) << "channels " << c << " 1/" << d;
      EXPECT_LE(max_diff, c == 1 ? 2 : 16) << "channels " << c << " 1/" << d;
    }
  }
}

TEST_F(ImageIoTest, PngIgnoresTheScaleDenominator) {
  const Image im = pattern_image(9, 13, 3);
  expect_pixels(decode_image(encode_png(im), "png", kDefaultMaxImagePixels, 4), 9, 13, 3,
                im.pixels);
}

TEST_F(ImageIoTest, BadScaleDenominatorsAreRejected) {
  const std::vector<uint8_t> jpeg = encode_jpeg(smooth_image(16, 16, 3));
  const std::vector<uint8_t> png = encode_png(pattern_image(4, 4, 1));
  for (int d : {0, -2, 3, 16})
    for (const auto* bytes : {&jpeg, &png})
      expect_error([&] { decode_image(*bytes, "odd", kDefaultMaxImagePixels, d); },
                   {"odd", "scale denominator", "1, 2, 4 or 8", "got " + std::to_string(d)});
  const std::string p = path("x.jpg");
  write_file(p, jpeg);
  expect_error([&] { read_image(p, kDefaultMaxImagePixels, 5); }, {p, "got 5"});
}

TEST_F(ImageIoTest, ScaledDecodeOfATruncatedJpegIsAnError) {
  const std::vector<uint8_t> jpeg = encode_jpeg(pattern_image(64, 48, 3));
  for (double fraction : {0.5, 0.95})
    for (int d : {2, 4, 8}) {
      const std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + long(fraction * jpeg.size()));
      expect_error([&] { decode_image(cut, "cut.jpg", kDefaultMaxImagePixels, d); },
                   {"cut.jpg", "truncated"});
    }
}

TEST_F(ImageIoTest, HeaderMatchesTheDecode) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> files = {
      {"rgb.png", encode_png(pattern_image(7, 11, 3))},
      {"gray.png", encode_png(pattern_image(12, 5, 1))},
      {"rgb.jpg", encode_jpeg(smooth_image(33, 21, 3))},
      {"gray.jpg", encode_jpeg(smooth_image(9, 40, 1))},
  };
  RawPng palette{.width = 4,
                 .height = 2,
                 .color_type = PNG_COLOR_TYPE_PALETTE,
                 .rows = {0, 1, 0, 1, 1, 0, 1, 0},
                 .palette = {{255, 0, 0}, {0, 255, 0}}};
  files.emplace_back("palette.png", encode_raw_png(palette));
  RawPng gray_alpha{
      .width = 2, .height = 1, .color_type = PNG_COLOR_TYPE_GRAY_ALPHA, .rows = {7, 0, 250, 30}};
  files.emplace_back("gray_alpha.png", encode_raw_png(gray_alpha));
  for (const auto& [name, bytes] : files) {
    const ImageHeader header = read_image_header(bytes, name);
    const Image im = decode_image(bytes, name);
    EXPECT_EQ(header.height, im.height) << name;
    EXPECT_EQ(header.width, im.width) << name;
    EXPECT_EQ(header.channels, im.channels) << name;
    EXPECT_EQ(header.jpeg, name.ends_with(".jpg")) << name;
  }
  const std::string p = path("on_disk.jpg");
  write_jpeg(p, smooth_image(30, 20, 3));
  EXPECT_EQ(read_image_header(read_image_bytes(p), p).height, 30);
}

TEST_F(ImageIoTest, HeaderErrorsAreTheDecodersErrors) {
  const std::vector<uint8_t> png = encode_png(pattern_image(30, 40, 1));
  const std::vector<uint8_t> jpeg = encode_jpeg(smooth_image(30, 40, 3));
  expect_error([&] { read_image_header(png, "big.png", 1199); },
               {"big.png", "PNG", "40x30", "limit of 1199", "data.max_image_pixels"});
  expect_error([&] { read_image_header(jpeg, "big.jpg", 1199); },
               {"big.jpg", "JPEG", "40x30", "limit of 1199", "data.max_image_pixels"});
  EXPECT_EQ(read_image_header(jpeg, "ok.jpg", 1200).width, 40);
  const std::vector<uint8_t> gif = {'G', 'I', 'F', '8'};
  expect_error([&] { read_image_header(gif, "x.gif"); },
               {"x.gif", "not a PNG or JPEG", "47 49 46 38"});
  expect_error([&] { read_image_header({}, "empty.png"); }, {"empty.png", "empty"});
  expect_error([&] { read_image_header(cmyk_jpeg(), "cmyk.jpg"); }, {"cmyk.jpg", "CMYK"});
  // Cut inside the header: the header reader reports what the decoder would.
  const std::vector<uint8_t> png_cut(png.begin(), png.begin() + 20);
  expect_error([&] { read_image_header(png_cut, "cut.png"); }, {"cut.png", "truncated"});
  const std::vector<uint8_t> jpeg_cut(jpeg.begin(), jpeg.begin() + 100);
  expect_error([&] { read_image_header(jpeg_cut, "cut.jpg"); }, {"cut.jpg", "invalid JPEG"});
  expect_error([&] { read_image_bytes(path("missing.jpg")); }, {"cannot open", "missing.jpg"});
}

// The largest of 8, 4, 2 that leaves need * min_ratio / 2 pixels a side.
TEST_F(ImageIoTest, JpegScaleDenominatorRule) {
  EXPECT_EQ(jpeg_scale_denom(224, 224, 224, 224), 1);
  EXPECT_EQ(jpeg_scale_denom(447, 500, 224, 224), 1);  // 223.5 < 224: not halved
  EXPECT_EQ(jpeg_scale_denom(448, 500, 224, 224), 2);
  EXPECT_EQ(jpeg_scale_denom(896, 1000, 224, 224), 4);
  EXPECT_EQ(jpeg_scale_denom(1792, 1792, 224, 224), 8);
  EXPECT_EQ(jpeg_scale_denom(5000, 5000, 224, 224), 8);     // never more than 1/8
  EXPECT_EQ(jpeg_scale_denom(3000, 500, 224, 224), 2);      // the shorter reduction decides
  EXPECT_EQ(jpeg_scale_denom(100, 3000, 40, 100), 2);       // each side against its own need
  EXPECT_EQ(jpeg_scale_denom(448, 448, 224, 224, 4.0), 1);  // keeps twice the need
  EXPECT_EQ(jpeg_scale_denom(896, 896, 224, 224, 4.0), 2);
  expect_error([&] { jpeg_scale_denom(0, 10, 5, 5); }, {"at least 1", "0x10"});
  expect_error([&] { jpeg_scale_denom(10, 10, 5, 0); }, {"at least 1"});
  expect_error([&] { jpeg_scale_denom(10, 10, 5, 5, 1.5); }, {"min_ratio", "at least 2", "1.5"});
}

}  // namespace
}  // namespace forge::data
