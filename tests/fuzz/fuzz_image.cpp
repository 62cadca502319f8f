// decode_image (data/image_io.h) on any bytes: PNG or JPEG by the magic. An
// image that decodes is 1 or 3 channels of height * width pixels, and a small
// one survives a PNG round trip exactly (PNG is lossless). A region of it
// (drawn from the input's size) decoded alone, when that decode accepts the
// file, holds the whole decode's pixels.
#include "data/image_io.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge;
  using namespace forge::data;
  const std::vector<uint8_t> bytes(data, data + size);
  Image image;
  if (!fuzz::accepts([&] { image = decode_image(bytes, "fuzz input"); })) return 0;
  FUZZ_REQUIRE(image.channels == 1 || image.channels == 3);
  FUZZ_REQUIRE(image.height >= 1 && image.width >= 1);
  FUZZ_REQUIRE(image.pixels.size() ==
               static_cast<size_t>(image.height * image.width * image.channels));
  if (image.pixels.size() > (size_t{1} << 16)) return 0;
  ImageRegion want;
  want.top = static_cast<int64_t>(size % static_cast<size_t>(image.height));
  want.left = static_cast<int64_t>(size / 7 % static_cast<size_t>(image.width));
  want.height = 1 + static_cast<int64_t>(size / 3 % static_cast<size_t>(image.height - want.top));
  want.width = 1 + static_cast<int64_t>(size / 5 % static_cast<size_t>(image.width - want.left));
  ImageRegion got;
  Image part;
  if (fuzz::accepts([&] {
        part = decode_image_region(bytes, "fuzz input", kDefaultMaxImagePixels, 1, want, got);
      })) {
    FUZZ_REQUIRE(got.top <= want.top && got.left <= want.left);
    FUZZ_REQUIRE(got.top + got.height >= want.top + want.height);
    FUZZ_REQUIRE(got.left + got.width >= want.left + want.width);
    FUZZ_REQUIRE(part.height == got.height && part.width == got.width);
    const int64_t c = image.channels;
    for (int64_t y = want.top; y < want.top + want.height; ++y)
      for (int64_t x = want.left; x < want.left + want.width; ++x)
        for (int64_t ch = 0; ch < c; ++ch)
          FUZZ_REQUIRE(part.pixels[static_cast<size_t>(
                           ((y - got.top) * part.width + x - got.left) * c + ch)] ==
                       image.pixels[static_cast<size_t>((y * image.width + x) * c + ch)]);
  }
  const Image back = decode_image(encode_png(image), "encoded");
  FUZZ_REQUIRE(back.height == image.height && back.width == image.width &&
               back.channels == image.channels && back.pixels == image.pixels);
  return 0;
}
