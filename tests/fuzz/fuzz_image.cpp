// decode_image (data/image_io.h) on any bytes: PNG or JPEG by the magic. An
// image that decodes is 1 or 3 channels of height * width pixels, and a small
// one survives a PNG round trip exactly (PNG is lossless).
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
  const Image back = decode_image(encode_png(image), "encoded");
  FUZZ_REQUIRE(back.height == image.height && back.width == image.width &&
               back.channels == image.channels && back.pixels == image.pixels);
  return 0;
}
