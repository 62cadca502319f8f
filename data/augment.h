// Training augmentations after timm / DeiT: RandAugment (timm's
// rand_augment_transform), colour jitter (torchvision's ColorJitter on PIL
// images) and random erasing (timm's RandomErasing).
//
// RandAugment and colour jitter work on the u8 HWC picture, because their
// operations are PIL's: every one below reproduces what PIL 9 computes, down to
// its float32 / fixed-point arithmetic and its truncations, so that a model
// trained here sees the pixels timm would have given it (tests/data/
// check_augment_pil.py compares each against PIL). Random erasing works on the
// normalised f32 [C, H, W] tensor, as timm applies it.
//
// Randomness comes from our Rng, not Python's `random`: the streams differ, the
// distributions and the order of the draws are the ones documented here.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/names.h"
#include "core/tensor.h"
#include "data/image_io.h"
#include "data/random.h"

namespace forge::data {

enum class Interpolation { nearest, bilinear, bicubic };
inline constexpr NameTable<Interpolation, 3> kInterpolationNames{
    "interpolation", {"nearest", "bilinear", "bicubic"}};
inline const char* interpolation_name(Interpolation i) { return name_of(kInterpolationNames, i); }
// The Interpolation of that name; throws naming it and the valid ones.
inline Interpolation interpolation_from_name(const std::string& name) {
  return enum_from_name(kInterpolationNames, name);
}

// ---- RandAugment as timm's rand_augment_transform ----

struct RandAugmentOptions {
  int num_ops = 2;       // n: ops per image, drawn uniformly WITH replacement from the set
  double magnitude = 9;  // m on timm's 0..10 scale (_LEVEL_DENOM = 10)
  double magnitude_std =
      0.5;  // mstd: per op, m ~ Normal(m, mstd); infinity: Uniform(0, m); 0: fixed
  double magnitude_max = 10;  // mmax: the noisy magnitude is clipped to [0, mmax]
  double prob = 0.5;          // each drawn op is applied with this probability
  bool increasing = true;     // inc1: timm's _RAND_INCREASING_TRANSFORMS, else _RAND_TRANSFORMS
  // Geometric ops' fill (timm: img_mean = round(255 * ImageNet mean)); a gray
  // image is filled with fill[0].
  std::array<uint8_t, 3> fill = {124, 116, 104};
  Interpolation interpolation = Interpolation::bicubic;  // geometric ops (DeiT passes bicubic)
  double translate_pct =
      0.45;  // TranslateXRel / TranslateYRel: the largest shift as a fraction of the side
};

// Parses timm's config string: "rand" followed by '-'-separated m<float>,
// n<int>, mstd<float>, mmax<float>, inc<0|1>, p<float>; e.g.
// "rand-m9-mstd0.5-inc1". A part's key is what precedes its first digit (as
// timm splits it). Fields the string does not set take timm's defaults, not
// RandAugmentOptions' (m 10, n 2, mstd 0, mmax 10, inc 0, p 0.5); mstd above
// 100 means infinity (uniform magnitudes), as in timm. The fields no string
// sets (fill, interpolation, translate_pct) keep RandAugmentOptions' defaults.
// Unknown or malformed parts (and timm's transform-set parts "t...", which are
// not supported) throw forge::Error naming the part and the whole string.
RandAugmentOptions parse_rand_augment(const std::string& spec);
// Back to the string, for logs; parse_rand_augment reads it back to the same
// options (an infinite mstd is written as timm's "mstd101").
std::string rand_augment_spec(const RandAugmentOptions& o);
// The names of the op set, in timm's order: increasing ? _RAND_INCREASING_TRANSFORMS
// : _RAND_TRANSFORMS (15 names, "AutoContrast" ... "TranslateYRel").
std::vector<std::string> rand_augment_ops(bool increasing);

// In place on a u8 HWC image (1 or 3 channels). Per op slot, draws from rng,
// in order:
//   1. randint(15): the op;
//   2. one uniform: the op is skipped when it is > prob (drawn even when prob is 1);
//   3. if applied, the magnitude noise: one uniform (mstd infinite: m' =
//      uniform(0, m)) or one normal (mstd > 0: m' = m + mstd * normal) or
//      nothing (mstd 0); m' is clipped to [0, mmax];
//   4. what the op's level function needs: one uniform (the sign, negative
//      when > 0.5) for Rotate, ShearX/Y, TranslateX/YRel and the *Increasing
//      enhance ops; nothing for the others.
void rand_augment(Image& image, const RandAugmentOptions& o, Rng& rng);
// One op by timm name (either set's) at a given magnitude (after noise and
// clipping), as timm's AugmentOp applies it after its level function; draws
// only step 4 above. Uses o.fill, o.interpolation and o.translate_pct.
void apply_augment_op(Image& image, const std::string& name, double magnitude,
                      const RandAugmentOptions& o, Rng& rng);

// ---- the PIL operations the ops are made of (u8 HWC in, new image out) ----
// Each is exactly what PIL 9.4 computes for an "L" (1 channel) or "RGB" image.

Image auto_contrast(const Image& image);        // ImageOps.autocontrast (cutoff 0), per channel
Image equalize(const Image& image);             // ImageOps.equalize, per channel
Image invert(const Image& image);               // ImageOps.invert
Image posterize(const Image& image, int bits);  // ImageOps.posterize; bits >= 8 copies, <= 0 zeroes
Image solarize(const Image& image, int threshold);  // ImageOps.solarize: v >= threshold -> 255 - v
// timm's solarize_add: v < threshold -> min(255, v + add).
Image solarize_add(const Image& image, int add, int threshold = 128);
// ImageEnhance: Image.blend(degenerate, image, factor) in float32, truncated
// to u8 (clipped when extrapolating). The degenerate image: the luma (PIL's
// convert("L"), fixed point) for Color, the rounded mean luma for Contrast,
// black for Brightness, the 3x3 SMOOTH filter (1 1 1 / 1 5 1 / 1 1 1, over 13;
// the border rows and columns kept) for Sharpness.
Image enhance_color(const Image& image, double factor);
Image enhance_contrast(const Image& image, double factor);
Image enhance_brightness(const Image& image, double factor);
Image enhance_sharpness(const Image& image, double factor);
// PIL's Image.transform(size, AFFINE, (a, b, c, d, e, f), resample, fillcolor
// = fill): output pixel (x, y) (column, row) samples the input at (a (x + 0.5)
// + b (y + 0.5) + c, d (x + 0.5) + e (y + 0.5) + f), pixel centres at +0.5;
// samples outside the image are `fill`. PIL's three engines are reproduced:
// bilinear / bicubic (its transform cubic has a = -1, not resize's -0.5)
// through its generic double-precision path with clamped taps, nearest through its scale path (b =
// d = 0) or its 16.16 fixed-point path (others, when the corners fit).
Image affine(const Image& image, const std::array<double, 6>& matrix, Interpolation interp,
             std::array<uint8_t, 3> fill);
// Image.rotate(degrees, resample, fillcolor=fill): counter-clockwise about the
// centre, same size; multiples of 180 (and of 90 on square images) are exact
// transposes, others PIL's affine matrix (entries rounded to 15 decimals).
Image rotate(const Image& image, double degrees, Interpolation interp, std::array<uint8_t, 3> fill);

// ---- colour jitter as torchvision's ColorJitter on PIL images ----

struct ColorJitterOptions {
  double brightness = 0, contrast = 0, saturation = 0, hue = 0;
  bool any() const;
};
// In place on a u8 HWC image. Nothing is drawn when !o.any(); otherwise, in
// order: a permutation of (brightness, contrast, saturation, hue) (Rng::shuffle
// of 0..3: three randints), then one uniform factor for each nonzero option in
// that fixed order: brightness, contrast, saturation in [max(0, 1 - v), 1 + v],
// hue in [-hue, hue] (hue <= 0.5). The set ones are applied in the drawn order
// with enhance_brightness, enhance_contrast, enhance_color and adjust_hue.
void color_jitter(Image& image, const ColorJitterOptions& o, Rng& rng);
// torchvision 0.14's adjust_hue on a PIL image: convert("HSV") with PIL, add
// int(hue_factor * 255) to H with uint8 wraparound, convert back to RGB (PIL).
// hue_factor in [-0.5, 0.5]; a gray image is copied unchanged.
Image adjust_hue(const Image& image, double hue_factor);

// ---- random erasing as timm's RandomErasing, on a normalised f32 [C, H, W] tensor ----

enum class EraseMode {
  constant,
  rand,
  pixel
};  // zeros / one normal value per channel / per-pixel normal values
struct RandomErasingOptions {
  double prob = 0.25;
  EraseMode mode = EraseMode::pixel;
  double min_area = 0.02, max_area = 1.0 / 3, min_aspect = 0.3,
         max_aspect = 0;  // 0: 1 / min_aspect
  int min_count = 1, max_count = 1;
};
// In place. Draws, in order: one uniform (nothing is erased when it is >
// prob); the count, randint(min_count, max_count) when they differ; then per
// region up to 10 attempts of two uniforms (area fraction in [min_area,
// max_area], divided by the count; log aspect in [log min_aspect, log
// max_aspect]) with h = round(sqrt(area * aspect)), w = round(sqrt(area /
// aspect)) (half to even), accepted when h < H and w < W; on acceptance
// randint(0, H - h) (top), randint(0, W - w) (left), then the fill's normals:
// C * h * w in [C, h, w] order (pixel), C (rand) or none (constant).
void random_erasing(Tensor& image, const RandomErasingOptions& o, Rng& rng);

}  // namespace forge::data
