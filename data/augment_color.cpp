// The PIL point and colour operations of augment.h (auto_contrast, equalize,
// invert, posterize, solarize, solarize_add, the ImageEnhance four,
// adjust_hue) and colour jitter, which is made of them. Each retraces PIL
// 9.4's C code (libImaging's Blend.c, Filter.c, Convert.c, ImageOps.py's
// LUTs) operation for operation, in the same float / fixed-point types, so
// that their results are the same bytes; the comments name the PIL function
// each one follows. The geometric operations are augment_geometry.cpp's;
// RandAugment and random erasing, augment.cpp's.

// Each float operation must round as it does in PIL's build (baseline x86-64,
// no FMA): no contraction of a * b + c into one fused multiply-add here.
#include "data/fp_contract_off.h"  // before any other include

#include "data/augment.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "data/augment_internal.h"

namespace forge::data {

using namespace augment_detail;

namespace {

// ---- lookup tables ----

using Lut = std::array<uint8_t, 256>;
using Histogram = std::array<int64_t, 256>;

Lut identity_lut() {
  Lut lut;
  for (int i = 0; i < 256; ++i) lut[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
  return lut;
}

// PIL's point() clips LUT entries to 0..255 (CLIP8).
uint8_t clip8(int64_t v) {
  return static_cast<uint8_t>(std::clamp<int64_t>(v, 0, 255));
}

Image apply_lut(const Image& image, const Lut& lut) {
  Image out = blank_like(image);
  const uint8_t* in = image.pixels.data();
  uint8_t* o = out.pixels.data();
  for (size_t i = 0; i < image.pixels.size(); ++i) o[i] = lut[in[i]];
  return out;
}

// One table per channel (channel c uses luts[c]).
Image apply_luts(const Image& image, const std::array<Lut, 3>& luts) {
  if (image.channels == 1) return apply_lut(image, luts[0]);
  Image out = blank_like(image);
  const uint8_t* in = image.pixels.data();
  uint8_t* o = out.pixels.data();
  for (size_t i = 0; i < image.pixels.size(); i += 3) {
    o[i] = luts[0][in[i]];
    o[i + 1] = luts[1][in[i + 1]];
    o[i + 2] = luts[2][in[i + 2]];
  }
  return out;
}

std::array<Histogram, 3> histograms(const Image& image) {
  std::array<Histogram, 3> h{};
  const uint8_t* p = image.pixels.data();
  const size_t n = image.pixels.size();
  if (image.channels == 1) {
    for (size_t i = 0; i < n; ++i) ++h[0][p[i]];
  } else {
    for (size_t i = 0; i < n; i += 3) {
      ++h[0][p[i]];
      ++h[1][p[i + 1]];
      ++h[2][p[i + 2]];
    }
  }
  return h;
}

// Each channel through the table lut_of(its histogram) builds.
Image apply_histogram_luts(const Image& image, Lut (*lut_of)(const Histogram&)) {
  const auto h = histograms(image);
  std::array<Lut, 3> luts;
  for (size_t c = 0; c < static_cast<size_t>(image.channels); ++c) luts[c] = lut_of(h[c]);
  return apply_luts(image, luts);
}

// PIL's RGB -> L (Convert.c rgb2l): 16-bit fixed-point luma, rounded.
uint8_t luma(const uint8_t* rgb) {
  return static_cast<uint8_t>(
      (uint32_t{rgb[0]} * 19595 + uint32_t{rgb[1]} * 38470 + uint32_t{rgb[2]} * 7471 + 0x8000) >>
      16);
}

// ImageOps.autocontrast with cutoff 0: the darkest present value to 0, the
// brightest to 255, int(ix * scale + offset) in double.
Lut autocontrast_lut(const Histogram& h) {
  int lo = 0, hi = 255;
  while (lo < 256 && h[static_cast<size_t>(lo)] == 0) ++lo;
  while (hi >= 0 && h[static_cast<size_t>(hi)] == 0) --hi;
  if (hi <= lo) return identity_lut();
  const double scale = 255.0 / (hi - lo);
  const double offset = -lo * scale;
  Lut lut;
  for (int ix = 0; ix < 256; ++ix)
    lut[static_cast<size_t>(ix)] = clip8(static_cast<int64_t>(ix * scale + offset));
  return lut;
}

// ImageOps.equalize: integer cumulative histogram over step = (count -
// count of the last present value) // 255.
Lut equalize_lut(const Histogram& h) {
  int64_t present = 0, total = 0, last = 0;
  for (int64_t v : h)
    if (v != 0) {
      ++present;
      total += v;
      last = v;
    }
  if (present <= 1) return identity_lut();
  const int64_t step = (total - last) / 255;
  if (step == 0) return identity_lut();
  Lut lut;
  int64_t n = step / 2;
  for (size_t i = 0; i < 256; ++i) {
    lut[i] = clip8(n / step);
    n += h[i];
  }
  return lut;
}

// ---- ImageEnhance ----

// Image.blend(degenerate, image, factor) (Blend.c ImagingBlend) for one pair
// of values: in1 + alpha * (in2 - in1) in float32 with alpha = (float)factor,
// truncated (clipped to 0..255 when extrapolating; inside [0, 1] the value
// cannot leave the range, so one rule serves both of PIL's branches). The
// products alpha * d are tabulated for d in [-255, 255]: the same float
// products PIL forms, computed once.
class Blend {
 public:
  explicit Blend(double factor) {
    FORGE_CHECK(std::isfinite(factor), "image enhance: the factor must be finite, got {}", factor);
    const auto alpha = static_cast<float>(factor);
    for (int d = -255; d <= 255; ++d)
      scaled_[static_cast<size_t>(d + 255)] = alpha * static_cast<float>(d);
  }
  uint8_t operator()(int in1, int in2) const {
    const float v = static_cast<float>(in1) + scaled_[static_cast<size_t>(in2 - in1 + 255)];
    if (v <= 0.0f) return 0;
    if (v >= 255.0f) return 255;
    return static_cast<uint8_t>(v);
  }

 private:
  std::array<float, 511> scaled_{};
};

// Blend against a constant degenerate value (Brightness: 0; Contrast: the mean).
Image blend_constant(const Image& image, int degenerate, double factor) {
  const Blend blend(factor);
  Lut lut;
  for (int v = 0; v < 256; ++v) lut[static_cast<size_t>(v)] = blend(degenerate, v);
  return apply_lut(image, lut);
}

Image blend_images(const Image& degenerate, const Image& image, double factor) {
  const Blend blend(factor);
  Image out = blank_like(image);
  for (size_t i = 0; i < image.pixels.size(); ++i)
    out.pixels[i] = blend(degenerate.pixels[i], image.pixels[i]);
  return out;
}

// ImageFilter.SMOOTH (Filter.c ImagingFilter3x3): kernel 1 1 1 / 1 5 1 / 1 1 1
// divided by 13 in float32, summed per row from the row below to the row
// above onto the rounding offset 0.5, truncated; the outer rows and columns
// are copied. Images smaller than 3x3 are copied whole.
Image smooth(const Image& image) {
  if (image.height < 3 || image.width < 3) return image;
  const float k1 = 1.0f / 13.0f, k5 = 5.0f / 13.0f;
  const int64_t c = image.channels, w = image.width, row = w * c;
  Image out = image;
  for (int64_t y = 1; y < image.height - 1; ++y) {
    const uint8_t* above = image.pixels.data() + (y - 1) * row;
    const uint8_t* mid = above + row;
    const uint8_t* below = mid + row;
    uint8_t* o = out.pixels.data() + y * row;
    for (int64_t i = c; i < row - c; ++i) {
      float ss = 0.5f;
      ss += static_cast<float>(below[i - c]) * k1 + static_cast<float>(below[i]) * k1 +
            static_cast<float>(below[i + c]) * k1;
      ss += static_cast<float>(mid[i - c]) * k1 + static_cast<float>(mid[i]) * k5 +
            static_cast<float>(mid[i + c]) * k1;
      ss += static_cast<float>(above[i - c]) * k1 + static_cast<float>(above[i]) * k1 +
            static_cast<float>(above[i + c]) * k1;
      o[i] = ss <= 0.0f ? 0 : ss >= 255.0f ? 255 : static_cast<uint8_t>(ss);
    }
  }
  return out;
}

// ---- HSV as PIL converts it (Convert.c rgb2hsv_row / hsv2rgb), types kept ----

void rgb_to_hsv(const uint8_t* rgb, uint8_t* hsv) {
  const uint8_t r = rgb[0], g = rgb[1], b = rgb[2];
  const uint8_t maxc = std::max(r, std::max(g, b)), minc = std::min(r, std::min(g, b));
  hsv[2] = maxc;
  if (minc == maxc) {
    hsv[0] = hsv[1] = 0;
    return;
  }
  const auto cr = static_cast<float>(maxc - minc);
  const float s = cr / static_cast<float>(maxc);
  const float rc = static_cast<float>(maxc - r) / cr;
  const float gc = static_cast<float>(maxc - g) / cr;
  const float bc = static_cast<float>(maxc - b) / cr;
  float h;
  if (r == maxc)
    h = bc - gc;
  else if (g == maxc)
    h = static_cast<float>(2.0 + static_cast<double>(rc) - static_cast<double>(bc));
  else
    h = static_cast<float>(4.0 + static_cast<double>(gc) - static_cast<double>(rc));
  // fmod(h / 6.0 + 1.0, 1.0); h / 6 + 1 lies in [5/6, 11/6], where
  // subtracting 1 is exact, as fmod is.
  const double wrapped = static_cast<double>(h) / 6.0 + 1.0;
  h = static_cast<float>(wrapped >= 1.0 ? wrapped - 1.0 : wrapped);
  hsv[0] = clip8(static_cast<int64_t>(static_cast<double>(h) * 255.0));
  hsv[1] = clip8(static_cast<int64_t>(static_cast<double>(s) * 255.0));
}

void hsv_to_rgb(const uint8_t* hsv, uint8_t* rgb) {
  const uint8_t h = hsv[0], s = hsv[1], v = hsv[2];
  if (s == 0) {
    rgb[0] = rgb[1] = rgb[2] = v;
    return;
  }
  const double h6 = static_cast<double>(static_cast<float>(h)) * 6.0 / 255.0;
  const auto i = static_cast<int>(std::floor(h6));
  const auto f = static_cast<float>(h6 - static_cast<double>(static_cast<float>(i)));
  const auto fs = static_cast<float>(static_cast<double>(static_cast<float>(s)) / 255.0);
  const auto fv = static_cast<double>(static_cast<float>(v));
  const uint8_t p = clip8(static_cast<int64_t>(std::round(fv * (1.0 - static_cast<double>(fs)))));
  const uint8_t q =
      clip8(static_cast<int64_t>(std::round(fv * (1.0 - static_cast<double>(fs * f)))));
  const uint8_t t = clip8(static_cast<int64_t>(
      std::round(fv * (1.0 - static_cast<double>(fs) * (1.0 - static_cast<double>(f))))));
  const uint8_t sextants[6][3] = {{v, t, p}, {q, v, p}, {p, v, t}, {p, q, v}, {t, p, v}, {v, p, q}};
  const uint8_t* out = sextants[i % 6];
  rgb[0] = out[0];
  rgb[1] = out[1];
  rgb[2] = out[2];
}

}  // namespace

// ---- the PIL operations ----

Image auto_contrast(const Image& image) {
  check_image(image, "auto_contrast");
  return apply_histogram_luts(image, autocontrast_lut);
}

Image equalize(const Image& image) {
  check_image(image, "equalize");
  return apply_histogram_luts(image, equalize_lut);
}

Image invert(const Image& image) {
  check_image(image, "invert");
  Lut lut;
  for (int i = 0; i < 256; ++i) lut[static_cast<size_t>(i)] = static_cast<uint8_t>(255 - i);
  return apply_lut(image, lut);
}

Image posterize(const Image& image, int bits) {
  check_image(image, "posterize");
  if (bits >= 8) return image;
  // ~(2 ** (8 - bits) - 1): bits <= 0 keep no bit of a u8.
  const int mask = bits <= 0 ? 0 : ~((1 << (8 - bits)) - 1) & 0xff;
  Lut lut;
  for (int i = 0; i < 256; ++i) lut[static_cast<size_t>(i)] = static_cast<uint8_t>(i & mask);
  return apply_lut(image, lut);
}

Image solarize(const Image& image, int threshold) {
  check_image(image, "solarize");
  Lut lut;
  for (int i = 0; i < 256; ++i)
    lut[static_cast<size_t>(i)] = static_cast<uint8_t>(i < threshold ? i : 255 - i);
  return apply_lut(image, lut);
}

Image solarize_add(const Image& image, int add, int threshold) {
  check_image(image, "solarize_add");
  Lut lut;
  for (int i = 0; i < 256; ++i)
    lut[static_cast<size_t>(i)] = i < threshold ? clip8(int64_t{i} + add) : static_cast<uint8_t>(i);
  return apply_lut(image, lut);
}

Image enhance_color(const Image& image, double factor) {
  check_image(image, "enhance_color");
  const Blend blend(factor);
  if (image.channels == 1) return image;  // convert("L") of a gray image is itself
  Image out = blank_like(image);
  for (size_t i = 0; i < image.pixels.size(); i += 3) {
    const uint8_t* p = image.pixels.data() + i;
    const int gray = luma(p);
    for (size_t k = 0; k < 3; ++k) out.pixels[i + k] = blend(gray, p[k]);
  }
  return out;
}

Image enhance_contrast(const Image& image, double factor) {
  check_image(image, "enhance_contrast");
  // int(ImageStat.Stat(image.convert("L")).mean[0] + 0.5): the integer sum is
  // exact in double, so the mean is one correctly rounded division.
  int64_t sum = 0;
  if (image.channels == 1) {
    for (uint8_t v : image.pixels) sum += v;
  } else {
    for (size_t i = 0; i < image.pixels.size(); i += 3) sum += luma(image.pixels.data() + i);
  }
  const double mean =
      static_cast<double>(sum) / static_cast<double>(image.height * image.width) + 0.5;
  return blend_constant(image, static_cast<int>(mean), factor);
}

Image enhance_brightness(const Image& image, double factor) {
  check_image(image, "enhance_brightness");
  return blend_constant(image, 0, factor);
}

Image enhance_sharpness(const Image& image, double factor) {
  check_image(image, "enhance_sharpness");
  return blend_images(smooth(image), image, factor);
}

// ---- colour jitter ----

bool ColorJitterOptions::any() const {
  return brightness > 0 || contrast > 0 || saturation > 0 || hue > 0;
}

Image adjust_hue(const Image& image, double hue_factor) {
  check_image(image, "adjust_hue");
  FORGE_CHECK(hue_factor >= -0.5 && hue_factor <= 0.5,
              "adjust_hue: hue_factor must be in [-0.5, 0.5], got {}", hue_factor);
  if (image.channels == 1) return image;
  // np.uint8(hue_factor * 255): truncated toward zero, then taken mod 256.
  const auto shift = static_cast<uint8_t>(static_cast<int>(hue_factor * 255) & 0xff);
  Image out = blank_like(image);
  for (size_t i = 0; i < image.pixels.size(); i += 3) {
    uint8_t hsv[3];
    rgb_to_hsv(image.pixels.data() + i, hsv);
    hsv[0] = static_cast<uint8_t>(hsv[0] + shift);
    hsv_to_rgb(hsv, out.pixels.data() + i);
  }
  return out;
}

void color_jitter(Image& image, const ColorJitterOptions& o, Rng& rng) {
  FORGE_CHECK(o.brightness >= 0 && o.contrast >= 0 && o.saturation >= 0,
              "color_jitter: brightness, contrast and saturation must be >= 0, got {}, {}, {}",
              o.brightness, o.contrast, o.saturation);
  FORGE_CHECK(o.hue >= 0 && o.hue <= 0.5, "color_jitter: hue must be in [0, 0.5], got {}", o.hue);
  if (!o.any()) return;
  check_image(image, "color_jitter");
  std::vector<int> order = {0, 1, 2, 3};
  rng.shuffle(order);
  const auto factor = [&](double v) { return rng.uniform(std::max(0.0, 1 - v), 1 + v); };
  const double b = o.brightness > 0 ? factor(o.brightness) : 1;
  const double c = o.contrast > 0 ? factor(o.contrast) : 1;
  const double s = o.saturation > 0 ? factor(o.saturation) : 1;
  const double h = o.hue > 0 ? rng.uniform(-o.hue, o.hue) : 0;
  for (int k : order) {
    if (k == 0 && o.brightness > 0) image = enhance_brightness(image, b);
    if (k == 1 && o.contrast > 0) image = enhance_contrast(image, c);
    if (k == 2 && o.saturation > 0) image = enhance_color(image, s);
    if (k == 3 && o.hue > 0) image = adjust_hue(image, h);
  }
}

}  // namespace forge::data
