// Fashion-MNIST (Zalando's 70000 28x28 grayscale clothing images, 10 classes)
// from its IDX files, held in memory as bytes and converted per example.
//
// Debian's dataset-fashion-mnist package installs the four files in
// /usr/share/datasets/fashion-mnist: {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
// (the uncompressed names are accepted too).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace forge::data {

struct FashionMnistOptions {
  std::string root = "/usr/share/datasets/fashion-mnist";
  std::string split = "train";         // "train" (60000) or "test" (10000, the t10k files)
  bool normalize = true;               // (v - mean) / std after scaling to [0, 1]
  double mean = 0.2860, std = 0.3530;  // of the training pixels
  // Augmentation, applied only when get() is given an rng:
  int64_t random_crop_padding = 0;  // > 0: zero-pad by this much, crop back at a random offset
  bool hflip = false;               // mirror left-right with probability 1/2
};

class FashionMnist : public Dataset {
 public:
  // Reads both files of the split; throws naming the path when a file is
  // missing or damaged.
  explicit FashionMnist(FashionMnistOptions options = {});

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  // f32 [1, H, W] (28x28): pixels / 255, normalised when options.normalize.
  Example get(int64_t i, Rng* rng) const override;
  int64_t num_classes() const override { return 10; }
  std::string describe() const override;

  const FashionMnistOptions& options() const { return options_; }
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }
  int64_t label(int64_t i) const;
  const uint8_t* pixels(int64_t i) const;                   // the raw H*W bytes of image i
  static const std::array<const char*, 10>& label_names();  // "T-shirt/top", ...
  std::vector<std::string> class_names() const override {
    return {label_names().begin(), label_names().end()};
  }

 private:
  FashionMnistOptions options_;
  std::string images_path_, labels_path_;
  int64_t height_ = 0, width_ = 0;
  std::vector<uint8_t> images_;   // [N, H, W]
  std::vector<uint8_t> labels_;   // [N]
  std::array<float, 256> lut_{};  // byte -> output value (scaled, normalised)
};

}  // namespace forge::data
