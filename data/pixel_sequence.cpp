#include "data/pixel_sequence.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace forge::data {

PixelSequence::PixelSequence(DatasetPtr images) : images_(std::move(images)) {
  FORGE_CHECK(images_ != nullptr, "PixelSequence: the wrapped image dataset is null");
}

Tensor PixelSequence::tokens(const Tensor& x) {
  FORGE_CHECK(
      x.defined() && x.dtype() == DType::f32 && x.dim() == 3 && (x.size(0) == 1 || x.size(0) == 3),
      "PixelSequence: an image should be a f32 [C, H, W] image with C = 1 or 3, got {} {}",
      x.defined() ? dtype_name(x.dtype()) : "undefined", x.defined() ? shape_str(x.shape()) : "");
  const int64_t C = x.size(0), HW = x.size(1) * x.size(2);
  const float* p = x.data<float>();
  for (int64_t k = 0; k < C * HW; ++k) {
    FORGE_CHECK(p[k] >= 0.0f && p[k] <= 1.0f,
                "PixelSequence: value {} at flat index {} is outside [0, 1]; the images must be "
                "unnormalised (turn normalisation off, e.g. data.normalize: false)",
                p[k], k);
  }
  Tensor out = Tensor::empty({HW}, DType::i64);
  int64_t* tok = out.data<int64_t>();
  for (int64_t k = 0; k < HW; ++k) {
    const double v =
        C == 1 ? double{p[k]} : 0.299 * p[k] + 0.587 * p[HW + k] + 0.114 * p[2 * HW + k];
    tok[k] = std::min<int64_t>(255, std::llround(v * 255.0));
  }
  return out;
}

Example PixelSequence::get(int64_t i, Rng* rng) const {
  Example image = images_->get(i, rng);
  Example out;
  out.label = image.label;
  try {
    out.input = tokens(image.input);
  } catch (const Error& e) {
    FORGE_FAIL("{}: example {}: {}", images_->describe(), i, message_of(e));
  }
  return out;
}

std::string PixelSequence::describe() const {
  return "pixel sequences (vocabulary 256) of " + images_->describe();
}

}  // namespace forge::data
