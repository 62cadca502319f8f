// Image files: decode PNG and JPEG into 8-bit gray or RGB pixels and write
// them back. The format is chosen by the magic bytes, not by the file name.
// libpng and libjpeg report errors by longjmp; every such jump is caught in a
// C-style frame that owns no C++ objects and turned into a forge::Error that
// names the file and what is wrong with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace forge::data {

// 8-bit image, rows top to bottom, pixels interleaved (HWC):
// pixels[(y * width + x) * channels + c], channels 1 (gray) or 3 (RGB).
struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

// Images whose header declares more than this many pixels (width * height)
// are refused by default: a damaged or hostile header must not make the
// decoder allocate gigabytes (64 megapixels: 8192x8192, 192 MB as RGB).
constexpr int64_t kDefaultMaxImagePixels = int64_t{64} * 1024 * 1024;

// PNG or JPEG, by the file's magic bytes. The result has 1 (gray) or 3 (RGB)
// channels: palette PNGs become RGB, 1/2/4-bit gray is scaled to 0..255,
// 16-bit samples are scaled to 8 bits (v * 255 / 65535, rounded), an alpha
// channel or tRNS transparency is dropped (not composited), and gamma chunks
// are ignored. Gray JPEGs stay gray, YCbCr JPEGs become RGB; CMYK/YCCK JPEGs
// and JPEGs that end early are errors. An image of more than `max_pixels`
// pixels is refused right after its header is read, before its pixels (or
// libjpeg's whole-image buffers) are allocated; the error names the file, the
// declared size and the recipe key data.max_image_pixels.
Image read_image(const std::string& path, int64_t max_pixels = kDefaultMaxImagePixels);
// The same from memory; `what` names the source in error messages.
Image decode_image(const std::vector<uint8_t>& bytes, const std::string& what,
                   int64_t max_pixels = kDefaultMaxImagePixels);

// Encoders for 1- or 3-channel images; the file variants write the encoded
// bytes to `path` (replacing it).
std::vector<uint8_t> encode_png(const Image& image);
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 95);  // quality 1..100
void write_png(const std::string& path, const Image& image);
void write_jpeg(const std::string& path, const Image& image, int quality = 95);

}  // namespace forge::data
