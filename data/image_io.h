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
//
// scale_denom (1, 2, 4 or 8; anything else is an error) decodes a JPEG at
// 1/scale_denom of its size with libjpeg's scaled inverse DCT (scale_num 1):
// each side becomes ceil(side / scale_denom), and the pixels are close to an
// area (box) average of the full-size decode (tests/data/test_image_io.cpp
// measures how close), at a fraction of the cost, since most of the IDCT and
// the colour conversion work on fewer pixels. A PNG ignores scale_denom and
// is decoded at full size: callers must take the size from the result (or
// from read_image_header), not assume the division. max_pixels applies to the
// file's own size, whatever the scale.
Image read_image(const std::string& path, int64_t max_pixels = kDefaultMaxImagePixels,
                 int scale_denom = 1);
// The same from memory; `what` names the source in error messages.
Image decode_image(const std::vector<uint8_t>& bytes, const std::string& what,
                   int64_t max_pixels = kDefaultMaxImagePixels, int scale_denom = 1);

// A rectangle of the picture decode_image gives (at its scale): rows
// [top, top + height), columns [left, left + width).
struct ImageRegion {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

// At least `want` of the picture decode_image(bytes, what, max_pixels,
// scale_denom) gives, with the same pixels there: a JPEG decodes only the
// block rows and columns around `want` (libjpeg-turbo's
// jpeg_skip_scanlines and jpeg_crop_scanline: no inverse DCT, upsampling or
// colour conversion elsewhere; the rest of the file is still read, so a
// truncated file fails as decode_image fails); a PNG decodes whole. `got` is
// where the returned image lies in the whole picture. `want` must lie inside it.
Image decode_image_region(const std::vector<uint8_t>& bytes, const std::string& what,
                          int64_t max_pixels, int scale_denom, const ImageRegion& want,
                          ImageRegion& got);

// Throws, starting with `what`, unless `image` is a non-empty 1- or
// 3-channel picture with exactly height * width * channels pixel bytes.
void check_image(const Image& image, const char* what);

// The bytes of an image file, for read_image_header followed by decode_image
// without reading the file twice. Errors name the path.
std::vector<uint8_t> read_image_bytes(const std::string& path);

// What the header of a PNG or JPEG says, without decoding its pixels: the
// full size (height x width), the channels decode_image gives (1 or 3) and
// whether the file is a JPEG (so that scale_denom applies). The same errors
// as decode_image for what the header shows (foreign or empty data, a damaged
// or truncated header, CMYK JPEGs, more than max_pixels pixels); damage after
// the header is found only by decoding.
struct ImageHeader {
  int64_t height = 0, width = 0, channels = 0;
  bool jpeg = false;
};
ImageHeader read_image_header(const std::vector<uint8_t>& bytes, const std::string& what,
                              int64_t max_pixels = kDefaultMaxImagePixels);

// The scale_denom to decode a JPEG with when a height x width region of it
// (the whole image, or the crop box a transform takes from it) will be
// resized to need_height x need_width: the largest d in {8, 4, 2} with
//   height / d >= need_height * min_ratio / 2  and  width / d >= need_width * min_ratio / 2
// (exact quotients, not rounded), else 1. With the default min_ratio = 2 the
// region keeps at least need pixels a side after libjpeg's reduction, so the
// resize that follows still shrinks (or keeps) and never enlarges: libjpeg
// halves only where the resize would shrink by at least 2x anyway, quarters
// where it would shrink by 4x, and so on. A larger min_ratio leaves more of
// the reduction to the transform's own antialiased resampling (min_ratio 4:
// the decode keeps at least twice the needed pixels). Sides and needs must be
// at least 1, min_ratio at least 2.
int jpeg_scale_denom(int64_t height, int64_t width, int64_t need_height, int64_t need_width,
                     double min_ratio = 2.0);

// Encoders for 1- or 3-channel images; the file variants write the encoded
// bytes to `path` (replacing it).
std::vector<uint8_t> encode_png(const Image& image);
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 95);  // quality 1..100
void write_png(const std::string& path, const Image& image);
void write_jpeg(const std::string& path, const Image& image, int quality = 95);

}  // namespace forge::data
