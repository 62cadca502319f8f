// Image transforms for classification, after torchvision / DeiT:
//   train: RandomResizedCrop(size, scale, ratio) -> RandomHorizontalFlip(p)
//          -> ToTensor -> Normalize(mean, std)
//   eval:  Resize(shorter side = floor(size / crop_pct)) -> CenterCrop(size)
//          -> ToTensor -> Normalize(mean, std)
// Tensors here are f32 [C, H, W]; an Image is the decoded u8 HWC picture.
//
// Resampling is bilinear with antialiasing, as PIL (and torchvision with
// antialias=True) does it: output pixel o of a box [b, b + L) resized to n
// pixels is centred at b + (o + 0.5) * L / n, and averages input pixels with
// a triangle weight whose radius is max(1, L / n) input pixels, renormalised
// where it leaves the image. Upsampling is therefore plain half-pixel
// bilinear with replicated edges, and downsampling averages every input pixel
// instead of skipping some (no aliasing on 4x reductions). Crop, resize, flip
// and ToTensor are fused into one resampling pass in f32, so the result is not
// rounded to u8 between steps as PIL's is (a difference of at most 0.5/255).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"
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
// then one uniform for the flip.
Tensor transform_image(const Image& image, const ImageTransformOptions& options, Rng* rng);

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
Tensor resized_crop(const Tensor& image, const CropBox& box, int64_t out_h, int64_t out_w);
Tensor resize(const Tensor& image, int64_t out_h, int64_t out_w);
Tensor resize_shorter_side(const Tensor& image, int64_t shorter);
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
