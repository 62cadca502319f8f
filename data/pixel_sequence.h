// Pixel sequences: an image dataset read as a sequence of grayscale pixel
// intensities, the Long Range Arena "Image" task (CIFAR-10 as 1024 tokens).
//
// Example i is i64 [H*W] tokens in 0..255 (vocabulary 256), row-major: the
// image's luma (ITU-R 601: 0.299 R + 0.587 G + 0.114 B for 3 channels, the
// channel itself for 1) times 255, rounded.
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace forge::data {

class PixelSequence : public Dataset {
 public:
  static constexpr int64_t kVocabSize = 256;

  // `images`' get(i, nullptr) must return f32 [C, H, W] (C = 1 or 3) with
  // values in [0, 1], i.e. unnormalised.
  explicit PixelSequence(DatasetPtr images);

  int64_t size() const override { return images_->size(); }
  // Augmentation: `rng` goes to the wrapped dataset unchanged.
  Example get(int64_t i, Rng* rng) const override;
  int64_t num_classes() const override { return images_->num_classes(); }
  std::vector<std::string> class_names() const override { return images_->class_names(); }
  // The tokens of an unnormalised f32 [C, H, W] image (C = 1 or 3, values in
  // [0, 1]): i64 [H * W], round(255 * gray) with gray = ITU-R 601 luma for RGB.
  static Tensor tokens(const Tensor& image);
  std::string describe() const override;

  const Dataset& images() const { return *images_; }

 private:
  DatasetPtr images_;
};

}  // namespace forge::data
