// Image transforms for classification, after torchvision / timm's DeiT:
//   train: RandomResizedCrop(size, scale, ratio, interpolation)
//          -> RandomHorizontalFlip(p) [-> RandAugment] [-> ColorJitter]
//          -> ToTensor -> Normalize(mean, std) [-> RandomErasing]
//   eval:  Resize(shorter side = floor(size / crop_pct), interpolation)
//          -> CenterCrop(size) -> ToTensor -> Normalize(mean, std)
// Tensors here are f32 [C, H, W]; an Image is the decoded u8 HWC picture. The
// augmentations in brackets are data/augment.h's, each off by default.
//
// Resampling is antialiased as PIL (and torchvision with antialias=True) does
// it: output pixel o of a box [b, b + L) resized to n pixels is centred at
// b + (o + 0.5) * L / n and weighs input pixels with the filter stretched by
// s = max(1, L / n), renormalised where it leaves the image: bilinear, a
// triangle of radius s; bicubic, Keys' cubic with a = -0.5 and radius 2 s.
// Upsampling is therefore plain half-pixel interpolation with replicated
// edges, and downsampling averages every input pixel instead of skipping some
// (no aliasing on 4x reductions). Bicubic values are clipped to [0, 255]
// after each pass, as PIL's 8-bit passes are. Without RandAugment and colour
// jitter, crop, resize, flip and ToTensor are fused into one resampling pass
// in f32, so the result is not rounded to u8 between steps as PIL's is (at
// most about 1/255 apart: tests/data/check_resize_pil.py); with them the crop
// is rounded to u8 (as PIL gives it to timm's RandAugment), augmented, then
// converted.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "data/augment.h"
#include "data/image_io.h"
#include "data/random.h"

namespace forge::data {

struct ImageTransformOptions {
  int64_t size = 224;  // output is [C, size, size]
  bool train = true;   // false: the evaluation transform even when an Rng is given
  double scale_min = 0.08, scale_max = 1;           // crop area / image area
  double ratio_min = 3.0 / 4, ratio_max = 4.0 / 3;  // crop width / height
  double hflip = 0.5;                               // flip probability (train)
  double crop_pct = 0.875;                          // eval: resize to floor(size / crop_pct)
  // The resampling filter of the crop and the resizes: bilinear or bicubic.
  Interpolation interpolation = Interpolation::bilinear;
  // Training augmentations after the crop and flip (off by default): timm's
  // RandAugment, torchvision's ColorJitter, timm's RandomErasing (prob 0: off).
  bool rand_augment = false;
  RandAugmentOptions rand_augment_options;
  ColorJitterOptions color_jitter;
  RandomErasingOptions erasing{.prob = 0};
  // Files: decode a JPEG with libjpeg-turbo's scaled IDCT (1/2, 1/4, 1/8) when
  // the crop is resized down by at least twice that (data/image_io.h,
  // jpeg_scale_denom); false: always at full size.
  bool scaled_jpeg_decode = true;
  // Per output channel, or one value for all. Empty: the ImageNet statistics
  // (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225), averaged over the three
  // channels for grayscale output (0.449 / 0.226), as timm does.
  std::vector<double> mean, std;
  // true: 1-channel output (RGB images converted to luma 0.299 R + 0.587 G +
  // 0.114 B, rounded to u8 like PIL's convert("L")); false: 3 channels (gray
  // images replicated).
  bool grayscale = false;
};

// What transform_image normalises with: the options' mean / std, or the
// ImageNet statistics when they give none.
std::vector<double> effective_mean(const ImageTransformOptions& options);
std::vector<double> effective_std(const ImageTransformOptions& options);

// Throws forge::Error naming the first invalid field.
void check_image_transform_options(const ImageTransformOptions& options);

// The full pipeline: f32 [C, size, size] with C = grayscale ? 1 : 3. The train
// path when `rng` is given and options.train; the eval path otherwise. Draws
// from rng, in order: the crop (two uniforms per attempt, then two randints),
// one uniform for the flip, then RandAugment's, colour jitter's and random
// erasing's draws (data/augment.h), each only when it is on.
Tensor transform_image(const Image& image, const ImageTransformOptions& options, Rng* rng);

// The same from an encoded file (PNG or JPEG): the crop is drawn from the
// header's size, then the file is decoded (a JPEG at a reduced scale when
// options.scaled_jpeg_decode and the crop is resized down enough), so the
// draws are transform_image's. `what` names the file in errors.
Tensor transform_image_file(const std::vector<uint8_t>& bytes, const std::string& what,
                            const ImageTransformOptions& options, Rng* rng,
                            int64_t max_pixels = kDefaultMaxImagePixels);

// ---- the steps, for tests and for other pipelines ----

// A crop rectangle in input pixels.
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

// torchvision's RandomResizedCrop.get_params: up to 10 attempts draw an area
// fraction uniform in [scale_min, scale_max] and a log-uniform aspect ratio
// (width / height) in [ratio_min, ratio_max], w = round(sqrt(area * ratio)),
// h = round(sqrt(area / ratio)) (round half to even, like Python), accepted
// when it fits, at a uniform position; otherwise the largest centred crop
// whose ratio is clamped to the range.
CropBox random_resized_crop_box(int64_t height, int64_t width, double scale_min, double scale_max,
                                double ratio_min, double ratio_max, Rng& rng);

// torchvision's Resize(int): the shorter side becomes `shorter`, the longer
// one floor(shorter * long / short). Returns (height, width).
std::pair<int64_t, int64_t> shorter_side_size(int64_t height, int64_t width, int64_t shorter);

// u8 HWC -> f32 [C, H, W] in [0, 1] (ToTensor).
Tensor to_tensor(const Image& image);
// RGB -> 1-channel luma (see ImageTransformOptions::grayscale); gray is copied.
Image to_grayscale(const Image& image);

// f32 [C, H, W] -> [C, out_h, out_w]: the box of the input resampled (see the
// top of this file); the box must lie inside the image.
Tensor resized_crop(const Tensor& image, const CropBox& box, int64_t out_h, int64_t out_w,
                    Interpolation interpolation = Interpolation::bilinear);
Tensor resize(const Tensor& image, int64_t out_h, int64_t out_w,
              Interpolation interpolation = Interpolation::bilinear);
Tensor resize_shorter_side(const Tensor& image, int64_t shorter,
                           Interpolation interpolation = Interpolation::bilinear);
// The centred size x size window, top = round((H - size) / 2) (half to even,
// like torchvision); zero padding where size exceeds the image.
Tensor center_crop(const Tensor& image, int64_t size);
// Mirrors the width axis.
Tensor hflip(const Tensor& image);
// hflip with probability p (one uniform drawn).
Tensor random_horizontal_flip(const Tensor& image, double p, Rng& rng);
// In place: x[c] = (x[c] - mean[c]) / std[c]; mean and std have C values or one.
void normalize_(Tensor& image, const std::vector<double>& mean, const std::vector<double>& std);

}  // namespace forge::data
