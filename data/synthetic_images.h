// A synthetic ImageFolder: JPEG pictures of coloured shapes on noisy
// backgrounds, written as root/train/<class>/<index>.jpg and
// root/val/<class>/<index>.jpg, so that the image_folder source, its
// transforms and the loader can be exercised and timed without ImageNet.
//
// A picture of class c: a background with a gradient between two colours of
// low saturation (any hue) and per-pixel noise; sometimes a smaller distractor
// shape of any kind and hue; then the class's shape, of kind c % 5 (disc,
// square, triangle, ring, cross) with a random position, size and rotation,
// in a saturated colour whose hue lies in the class's band
// [c / classes, (c + 1) / classes) of the colour wheel, textured by the same
// noise. Hue and shape together identify the class; the distractor, the
// noise and the random geometry keep it from being trivial. Sides are random
// and independent (non-square) in [min_side, max_side].
//
// Determinism: the picture of (split, class, index) draws only from
// Rng(Rng::mix({seed, split, class, index})) (split 0 train, 1 val), and
// libjpeg's encoder is deterministic, so the same options write
// byte-identical files.
#pragma once

#include <cstdint>
#include <string>

#include "data/image_io.h"

namespace forge::data {

struct SyntheticImagesOptions {
  int64_t classes = 4;
  int64_t train_per_class = 32, eval_per_class = 8;
  int64_t min_side = 48, max_side = 96;  // ImageNet-like: 300 .. 500
  int quality = 90;                      // JPEG quality 1..100
  uint64_t seed = 0;
};

// Throws naming the first invalid field: classes >= 1, train_per_class >= 1,
// eval_per_class >= 1, 16 <= min_side <= max_side <= 8192, quality in 1..100.
void check_synthetic_images_options(const SyntheticImagesOptions& o);

// "class_00", ...: two digits, more when classes > 100 (so names sort by id).
std::string synthetic_class_name(const SyntheticImagesOptions& o, int64_t label);

// The RGB picture of example `index` of class `label` in the split (train or val).
Image synthetic_image(const SyntheticImagesOptions& o, bool train, int64_t label, int64_t index);

// Writes every picture as root/<train|val>/<class name>/<index, 5 digits>.jpg,
// creating the folders; existing files of those names are replaced, other
// files are left alone.
void write_synthetic_image_folder(const std::string& root, const SyntheticImagesOptions& o);

}  // namespace forge::data
