// ImageFolder: an image classification set laid out as root/<class>/<file>,
// as torchvision's ImageFolder reads it (ImageNet's train/ and val/ after the
// usual val reorganisation). Class folders sorted by name get ids 0..C-1; the
// files of a class are sorted by name. Only files directly inside a class
// folder count, with extension .png, .jpg or .jpeg in any case (the format
// itself is taken from the magic bytes); names starting with '.' are skipped.
// The tree is scanned once, at construction; images are read and decoded in
// get(), so memory holds only the file names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image_io.h"
#include "data/transforms.h"

namespace forge::data {

struct ImageFolderOptions {
  std::string root;
  ImageTransformOptions transform;  // train augmentation when get() has an rng, eval otherwise
  int64_t max_image_pixels = kDefaultMaxImagePixels;  // larger images are refused (image_io.h)
};

class ImageFolder : public Dataset {
 public:
  // Scans root; throws naming the folder when root is missing or not a
  // folder, has no class folders, or a class folder has no images.
  explicit ImageFolder(ImageFolderOptions options);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  // f32 [C, size, size] (C = 1 when transform.grayscale, else 3); the train
  // transform when rng is given and transform.train, the eval one otherwise.
  // Thread-safe: reads only immutable state. Throws naming the file when it
  // cannot be decoded.
  Example get(int64_t i, Rng* rng) const override;
  int64_t num_classes() const override { return static_cast<int64_t>(class_names_.size()); }
  // "ImageFolder /data/train: 1281167 images, 1000 classes -> 3x224x224 (train: ...)"
  std::string describe() const override;

  const ImageFolderOptions& options() const { return options_; }
  std::vector<std::string> class_names() const override { return class_names_; }
  std::string path(int64_t i) const;  // root/<class>/<file> of example i
  int64_t label(int64_t i) const;
  // Examples per class, indexed by class id.
  std::vector<int64_t> class_counts() const;

 private:
  void check_index(int64_t i) const;

  ImageFolderOptions options_;
  std::vector<std::string> class_names_;
  // The relative paths "<class>/<file>" of all examples, concatenated;
  // example i is names_[offsets_[i], offsets_[i + 1]) (compact for millions).
  std::string names_;
  std::vector<uint64_t> offsets_;
  std::vector<int32_t> labels_;
};

}  // namespace forge::data
