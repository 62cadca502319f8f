// What augment_color.cpp and augment_geometry.cpp share (internal): a blank
// image of another's size. Not for use outside data/augment*.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "data/image_io.h"

namespace forge::data::augment_detail {

inline Image blank_like(const Image& image) {
  return Image{image.height, image.width, image.channels,
               std::vector<uint8_t>(image.pixels.size())};
}

}  // namespace forge::data::augment_detail
