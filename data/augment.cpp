// RandAugment, colour jitter and random erasing (see augment.h). The PIL
// operations retrace PIL 9.4's C code (libImaging's Blend.c, Filter.c,
// Convert.c, Geometry.c, ImageOps.py's LUTs) operation for operation, in the
// same float / double / fixed-point types, so that their results are the same
// bytes; the comments name the PIL function each one follows.

// Each float operation must round as it does in PIL's build (baseline x86-64,
// no FMA): no contraction of a * b + c into one fused multiply-add here.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "data/augment.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numbers>
#include <string_view>

#include "core/error.h"

namespace forge::data {

namespace {

// ---- images and lookup tables ----

Image blank_like(const Image& image) {
  return Image{image.height, image.width, image.channels,
               std::vector<uint8_t>(image.pixels.size())};
}

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

// ---- Image.transform(AFFINE) ----

// Geometry.c's COORD (truncation, -1 for negatives); values beyond int's
// range are outside any image, as they are on x86 in PIL.
int64_t coord(double v) {
  if (v < 0.0 || v >= 2147483648.0) return -1;
  return static_cast<int64_t>(v);
}

// Geometry.c's FLOOR.
int64_t floor_int(double v) {
  return static_cast<int64_t>(std::floor(v));
}

Image filled(const Image& like, std::array<uint8_t, 3> fill) {
  Image out = blank_like(like);
  if (like.channels == 1) {
    std::fill(out.pixels.begin(), out.pixels.end(), fill[0]);
  } else {
    for (size_t i = 0; i < out.pixels.size(); i += 3)
      std::copy(fill.begin(), fill.end(), out.pixels.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return out;
}

void copy_pixel(const Image& in, int64_t yin, int64_t xin, Image& out, int64_t y, int64_t x) {
  const int64_t c = in.channels;
  const uint8_t* s = in.pixels.data() + (yin * in.width + xin) * c;
  uint8_t* d = out.pixels.data() + (y * out.width + x) * c;
  for (int64_t k = 0; k < c; ++k) d[k] = s[k];
}

// Nearest, b = d = 0 (Geometry.c ImagingScaleAffine): positions accumulated
// in double from the first pixel centre; columns tabulated once.
void nearest_scale(const Image& in, const std::array<double, 6>& a, Image& out) {
  const int64_t w = out.width, h = out.height;
  double xo = a[2] + a[0] * 0.5;
  double yo = a[5] + a[4] * 0.5;
  int64_t xmin = w, xmax = 0;
  std::vector<int64_t> xintab(static_cast<size_t>(w), 0);
  for (int64_t x = 0; x < w; ++x) {
    const int64_t xin = coord(xo);
    if (xin >= 0 && xin < in.width) {
      xmax = x + 1;
      xmin = std::min(xmin, x);
      xintab[static_cast<size_t>(x)] = xin;
    }
    xo += a[0];
  }
  for (int64_t y = 0; y < h; ++y) {
    const int64_t yi = coord(yo);
    if (yi >= 0 && yi < in.height)
      for (int64_t x = xmin; x < xmax; ++x)
        copy_pixel(in, yi, xintab[static_cast<size_t>(x)], out, y, x);
    yo += a[4];
  }
}

// Geometry.c check_fixed: the corner maps within 16.16 fixed point's range.
bool fits_fixed(const std::array<double, 6>& a, int64_t x, int64_t y) {
  const auto fx = static_cast<double>(x), fy = static_cast<double>(y);
  return std::fabs(fx * a[0] + fy * a[1] + a[2]) < 32768.0 &&
         std::fabs(fx * a[3] + fy * a[4] + a[5]) < 32768.0;
}

// Nearest, general matrix, 16.16 fixed point (Geometry.c affine_fixed).
void nearest_fixed(const Image& in, const std::array<double, 6>& a, Image& out) {
  const auto fix = [](double v) { return floor_int(v * 65536.0 + 0.5); };
  const int64_t a0 = fix(a[0]), a1 = fix(a[1]), a3 = fix(a[3]), a4 = fix(a[4]);
  int64_t a2 = fix(a[2] + a[0] * 0.5 + a[1] * 0.5);
  int64_t a5 = fix(a[5] + a[3] * 0.5 + a[4] * 0.5);
  for (int64_t y = 0; y < out.height; ++y) {
    int64_t xx = a2, yy = a5;
    for (int64_t x = 0; x < out.width; ++x) {
      const int64_t xin = xx >> 16;
      if (xin >= 0 && xin < in.width) {
        const int64_t yin = yy >> 16;
        if (yin >= 0 && yin < in.height) copy_pixel(in, yin, xin, out, y, x);
      }
      xx += a0;
      yy += a3;
    }
    a2 += a1;
    a5 += a4;
  }
}

// Nearest, general matrix beyond fixed point's range (ImagingTransformAffine's
// double loop).
void nearest_double(const Image& in, const std::array<double, 6>& a, Image& out) {
  double xo = a[2] + a[1] * 0.5 + a[0] * 0.5;
  double yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
  for (int64_t y = 0; y < out.height; ++y) {
    double xx = xo, yy = yo;
    for (int64_t x = 0; x < out.width; ++x) {
      const int64_t xin = coord(xx);
      if (xin >= 0 && xin < in.width) {
        const int64_t yin = coord(yy);
        if (yin >= 0 && yin < in.height) copy_pixel(in, yin, xin, out, y, x);
      }
      xx += a[0];
      yy += a[3];
    }
    xo += a[1];
    yo += a[4];
  }
}

// Geometry.c's BILINEAR: a + (b - a) * d.
double lerp(double a, double b, double d) {
  return a + (b - a) * d;
}

// Geometry.c's BICUBIC: PIL's transform cubic (a = -1) in Horner form.
double cubic(double v1, double v2, double v3, double v4, double d) {
  const double p1 = v2;
  const double p2 = -v1 + v3;
  const double p3 = 2 * (v1 - v2) + v3 - v4;
  const double p4 = -v1 + v2 - v3 + v4;
  return p1 + d * (p2 + d * (p3 + d * p4));
}

// The same for four u8 taps: PIL forms p1..p4 in int (exact, as they are in
// double) and converts them.
double cubic_u8(int v1, int v2, int v3, int v4, double d) {
  const auto p1 = static_cast<double>(v2);
  const auto p2 = static_cast<double>(-v1 + v3);
  const auto p3 = static_cast<double>(2 * (v1 - v2) + v3 - v4);
  const auto p4 = static_cast<double>(-v1 + v2 - v3 + v4);
  return p1 + d * (p2 + d * (p3 + d * p4));
}

// RGB pixels take the filters below with the three channels as the lanes of
// one vector (a fourth lane idle): every lane computes exactly what the
// scalar code computes for its channel, in the same double operations.
using Int4 = int32_t __attribute__((vector_size(16)));
using Double4 = double __attribute__((vector_size(32)));

// Pixel x (in bytes: x * 3) of an RGB row as int lanes {r, g, b, 0}.
Int4 rgb_lanes(const uint8_t* row, int64_t x) {
  return Int4{row[x], row[x + 1], row[x + 2], 0};
}

// Vectors of 32 bytes go by reference and results into out-parameters:
// passed by value they would change the calling convention between builds
// with and without AVX (-Wpsabi).
void to_double4(const Int4& v, Double4& out) {
  out = __builtin_convertvector(v, Double4);
}

void lerp4(const Double4& a, const Double4& b, double d, Double4& out) {
  out = a + (b - a) * d;
}

void cubic4(const Double4& v1, const Double4& v2, const Double4& v3, const Double4& v4, double d,
            Double4& out) {
  const Double4 p1 = v2;
  const Double4 p2 = -v1 + v3;
  const Double4 p3 = 2 * (v1 - v2) + v3 - v4;
  const Double4 p4 = -v1 + v2 - v3 + v4;
  out = p1 + d * (p2 + d * (p3 + d * p4));
}

void cubic_u8_4(const Int4& v1, const Int4& v2, const Int4& v3, const Int4& v4, double d,
                Double4& out) {
  Double4 p1, p2, p3, p4;
  to_double4(v2, p1);
  to_double4(-v1 + v3, p2);
  to_double4(2 * (v1 - v2) + v3 - v4, p3);
  to_double4(-v1 + v2 - v3 + v4, p4);
  out = p1 + d * (p2 + d * (p3 + d * p4));
}

// bilinear_filter8 / bilinear_filter32RGB at (xin, yin) for a C-channel
// image; false outside.
template <int C>
bool sample_bilinear(const Image& im, double xin, double yin, uint8_t* out) {
  if (xin < 0.0 || xin >= static_cast<double>(im.width) || yin < 0.0 ||
      yin >= static_cast<double>(im.height))
    return false;
  xin -= 0.5;
  yin -= 0.5;
  const int64_t x = floor_int(xin), y = floor_int(yin);
  const double dx = xin - static_cast<double>(x), dy = yin - static_cast<double>(y);
  const int64_t row = im.width * C;
  const int64_t x0 = std::clamp<int64_t>(x, 0, im.width - 1) * C;
  const int64_t x1 = std::clamp<int64_t>(x + 1, 0, im.width - 1) * C;
  const uint8_t* r0 = im.pixels.data() + std::clamp<int64_t>(y, 0, im.height - 1) * row;
  const bool has_r1 = y + 1 >= 0 && y + 1 < im.height;
  const uint8_t* r1 = has_r1 ? im.pixels.data() + (y + 1) * row : r0;
  if constexpr (C == 3) {
    Double4 a, b, v1, v2, v;
    to_double4(rgb_lanes(r0, x0), a);
    to_double4(rgb_lanes(r0, x1), b);
    lerp4(a, b, dx, v1);
    if (has_r1) {
      to_double4(rgb_lanes(r1, x0), a);
      to_double4(rgb_lanes(r1, x1), b);
      lerp4(a, b, dx, v2);
    } else {
      v2 = v1;
    }
    lerp4(v1, v2, dy, v);
    for (int c = 0; c < 3; ++c) out[c] = static_cast<uint8_t>(v[c]);
  } else {
    for (int b = 0; b < C; ++b) {
      const double v1 = lerp(r0[x0 + b], r0[x1 + b], dx);
      const double v2 = has_r1 ? lerp(r1[x0 + b], r1[x1 + b], dx) : v1;
      out[b] = static_cast<uint8_t>(lerp(v1, v2, dy));
    }
  }
  return true;
}

// bicubic_filter8 / bicubic_filter32RGB for a C-channel image: taps clamped
// to the image in x; in y the first row clamped and missing later rows repeat
// the previous row's value. Inside the image (the common case) no tap is
// clamped and every row is present.
template <int C>
bool sample_bicubic(const Image& im, double xin, double yin, uint8_t* out) {
  if (xin < 0.0 || xin >= static_cast<double>(im.width) || yin < 0.0 ||
      yin >= static_cast<double>(im.height))
    return false;
  xin -= 0.5;
  yin -= 0.5;
  const int64_t x = floor_int(xin) - 1, y = floor_int(yin) - 1;
  const double dx = xin - static_cast<double>(x + 1), dy = yin - static_cast<double>(y + 1);
  const int64_t row = im.width * C;
  const uint8_t* base = im.pixels.data();
  int64_t xs[4];
  const uint8_t* rows[4];
  bool has[4] = {true, true, true, true};
  if (x >= 0 && x + 3 < im.width && y >= 0 && y + 3 < im.height) {
    for (int k = 0; k < 4; ++k) {
      xs[k] = (x + k) * C;
      rows[k] = base + (y + k) * row;
    }
  } else {
    for (int k = 0; k < 4; ++k) {
      xs[k] = std::clamp<int64_t>(x + k, 0, im.width - 1) * C;
      has[k] = k == 0 || (y + k >= 0 && y + k < im.height);
      rows[k] = has[k] ? base + std::clamp<int64_t>(y + k, 0, im.height - 1) * row : base;
    }
  }
  const auto clip = [](double s) -> uint8_t {
    return s <= 0.0 ? 0 : s >= 255.0 ? 255 : static_cast<uint8_t>(s);
  };
  if constexpr (C == 3) {
    Double4 v[4];
    for (int k = 0; k < 4; ++k) {
      if (k > 0 && !has[k]) {
        v[k] = v[k - 1];
        continue;
      }
      const uint8_t* r = rows[k];
      cubic_u8_4(rgb_lanes(r, xs[0]), rgb_lanes(r, xs[1]), rgb_lanes(r, xs[2]),
                 rgb_lanes(r, xs[3]), dx, v[k]);
    }
    Double4 sv;
    cubic4(v[0], v[1], v[2], v[3], dy, sv);
    for (int b = 0; b < 3; ++b) out[b] = clip(sv[b]);
  } else {
    for (int b = 0; b < C; ++b) {
      const auto row_value = [&](int k) {
        const uint8_t* r = rows[k] + b;
        return cubic_u8(r[xs[0]], r[xs[1]], r[xs[2]], r[xs[3]], dx);
      };
      double v[4];
      v[0] = row_value(0);
      for (int k = 1; k < 4; ++k) v[k] = has[k] ? row_value(k) : v[k - 1];
      out[b] = clip(cubic(v[0], v[1], v[2], v[3], dy));
    }
  }
  return true;
}

// Geometry.c ImagingGenericTransform with affine_transform: the source
// position a0 (x + 0.5) + a1 (y + 0.5) + a2 summed in that order; the
// products of the column terms are tabulated once per call.
template <bool (*sample)(const Image&, double, double, uint8_t*)>
void generic_affine(const Image& in, const std::array<double, 6>& a, Image& out) {
  const auto w = static_cast<size_t>(out.width);
  std::vector<double> ax(w), dx(w);
  for (size_t x = 0; x < w; ++x) {
    const double xin = static_cast<double>(x) + 0.5;
    ax[x] = a[0] * xin;
    dx[x] = a[3] * xin;
  }
  for (int64_t y = 0; y < out.height; ++y) {
    const double yin = static_cast<double>(y) + 0.5;
    const double by = a[1] * yin, ey = a[4] * yin;
    uint8_t* o = out.pixels.data() + y * out.width * out.channels;
    for (size_t x = 0; x < w; ++x)
      sample(in, ax[x] + by + a[2], dx[x] + ey + a[5], o + x * static_cast<size_t>(out.channels));
  }
}

// ---- rotate's matrix and transposes ----

// Python's round(x, 15): correctly rounded to 15 decimals (glibc's printf is
// exact, as CPython's dtoa is).
double round15(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15f", x);
  return std::strtod(buf, nullptr);
}

// Python's float %: the result takes the divisor's sign.
double python_mod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0) {
    if ((b < 0) != (m < 0)) m += b;
  } else {
    m = std::copysign(0.0, b);
  }
  return m;
}

// out(r, c) = in(src(r, c)) for an output of out_h x out_w.
template <typename Src>
Image remap(const Image& in, int64_t out_h, int64_t out_w, Src src) {
  Image out{out_h, out_w, in.channels, std::vector<uint8_t>(in.pixels.size())};
  for (int64_t r = 0; r < out_h; ++r)
    for (int64_t c = 0; c < out_w; ++c) {
      const auto [yr, xc] = src(r, c);
      copy_pixel(in, yr, xc, out, r, c);
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

// ---- RandAugment's ops ----

enum class Op {
  auto_contrast,
  equalize,
  invert,
  rotate,
  posterize,
  posterize_increasing,
  solarize,
  solarize_increasing,
  solarize_add,
  color,
  color_increasing,
  contrast,
  contrast_increasing,
  brightness,
  brightness_increasing,
  sharpness,
  sharpness_increasing,
  shear_x,
  shear_y,
  translate_x_rel,
  translate_y_rel,
};

struct NamedOp {
  Op op;
  std::string_view name;
};

constexpr NamedOp kNamedOps[] = {
    {Op::auto_contrast, "AutoContrast"},
    {Op::equalize, "Equalize"},
    {Op::invert, "Invert"},
    {Op::rotate, "Rotate"},
    {Op::posterize, "Posterize"},
    {Op::posterize_increasing, "PosterizeIncreasing"},
    {Op::solarize, "Solarize"},
    {Op::solarize_increasing, "SolarizeIncreasing"},
    {Op::solarize_add, "SolarizeAdd"},
    {Op::color, "Color"},
    {Op::color_increasing, "ColorIncreasing"},
    {Op::contrast, "Contrast"},
    {Op::contrast_increasing, "ContrastIncreasing"},
    {Op::brightness, "Brightness"},
    {Op::brightness_increasing, "BrightnessIncreasing"},
    {Op::sharpness, "Sharpness"},
    {Op::sharpness_increasing, "SharpnessIncreasing"},
    {Op::shear_x, "ShearX"},
    {Op::shear_y, "ShearY"},
    {Op::translate_x_rel, "TranslateXRel"},
    {Op::translate_y_rel, "TranslateYRel"},
};

// timm's _RAND_TRANSFORMS and _RAND_INCREASING_TRANSFORMS.
constexpr std::array<Op, 15> kRandOps = {
    Op::auto_contrast, Op::equalize,     Op::invert,  Op::rotate,          Op::posterize,
    Op::solarize,      Op::solarize_add, Op::color,   Op::contrast,        Op::brightness,
    Op::sharpness,     Op::shear_x,      Op::shear_y, Op::translate_x_rel, Op::translate_y_rel};
constexpr std::array<Op, 15> kRandIncreasingOps = {Op::auto_contrast,
                                                   Op::equalize,
                                                   Op::invert,
                                                   Op::rotate,
                                                   Op::posterize_increasing,
                                                   Op::solarize_increasing,
                                                   Op::solarize_add,
                                                   Op::color_increasing,
                                                   Op::contrast_increasing,
                                                   Op::brightness_increasing,
                                                   Op::sharpness_increasing,
                                                   Op::shear_x,
                                                   Op::shear_y,
                                                   Op::translate_x_rel,
                                                   Op::translate_y_rel};

std::string_view op_name(Op op) {
  for (const auto& n : kNamedOps)
    if (n.op == op) return n.name;
  return "?";
}

Op op_by_name(const std::string& name) {
  for (const auto& n : kNamedOps)
    if (n.name == name) return n.op;
  std::string known;
  for (const auto& n : kNamedOps) known += (known.empty() ? "" : ", ") + std::string(n.name);
  FORGE_FAIL("RandAugment: unknown op \"{}\"; the ops are {}", name, known);
}

// timm's _randomly_negate: one uniform, negative when it is > 0.5.
double random_sign(double v, Rng& rng) {
  return rng.uniform() > 0.5 ? -v : v;
}

// timm's level functions (m on the 0..10 scale) and NAME_TO_OP calls.
void apply_op(Image& image, Op op, double m, const RandAugmentOptions& o, Rng& rng) {
  const double level = m / 10.0;  // (level / _LEVEL_DENOM)
  const auto enhance_increasing = [&] {
    return std::max(0.1, 1.0 + random_sign(level * 0.9, rng));
  };
  const auto transform = [&](const std::array<double, 6>& matrix) {
    image = affine(image, matrix, o.interpolation, o.fill);
  };
  switch (op) {
    case Op::auto_contrast:
      image = auto_contrast(image);
      break;
    case Op::equalize:
      image = equalize(image);
      break;
    case Op::invert:
      image = invert(image);
      break;
    case Op::rotate:
      image = rotate(image, random_sign(level * 30.0, rng), o.interpolation, o.fill);
      break;
    case Op::posterize:
      image = posterize(image, static_cast<int>(std::min(level * 4, 1e6)));
      break;
    case Op::posterize_increasing:
      image = posterize(image, 4 - static_cast<int>(std::min(level * 4, 1e6)));
      break;
    case Op::solarize:
      image = solarize(image, static_cast<int>(std::min(level * 256, 256.0)));
      break;
    case Op::solarize_increasing:
      image = solarize(image, 256 - static_cast<int>(std::min(level * 256, 256.0)));
      break;
    case Op::solarize_add:
      image = solarize_add(image, static_cast<int>(std::min(level * 110, 128.0)), 128);
      break;
    case Op::color:
      image = enhance_color(image, level * 1.8 + 0.1);
      break;
    case Op::color_increasing:
      image = enhance_color(image, enhance_increasing());
      break;
    case Op::contrast:
      image = enhance_contrast(image, level * 1.8 + 0.1);
      break;
    case Op::contrast_increasing:
      image = enhance_contrast(image, enhance_increasing());
      break;
    case Op::brightness:
      image = enhance_brightness(image, level * 1.8 + 0.1);
      break;
    case Op::brightness_increasing:
      image = enhance_brightness(image, enhance_increasing());
      break;
    case Op::sharpness:
      image = enhance_sharpness(image, level * 1.8 + 0.1);
      break;
    case Op::sharpness_increasing:
      image = enhance_sharpness(image, enhance_increasing());
      break;
    case Op::shear_x:
      transform({1, random_sign(level * 0.3, rng), 0, 0, 1, 0});
      break;
    case Op::shear_y:
      transform({1, 0, 0, random_sign(level * 0.3, rng), 1, 0});
      break;
    case Op::translate_x_rel: {
      const double pct = random_sign(level * o.translate_pct, rng);
      transform({1, 0, pct * static_cast<double>(image.width), 0, 1, 0});
      break;
    }
    case Op::translate_y_rel: {
      const double pct = random_sign(level * o.translate_pct, rng);
      transform({1, 0, 0, 0, 1, pct * static_cast<double>(image.height)});
      break;
    }
  }
}

void check_rand_augment_options(const RandAugmentOptions& o, const char* what) {
  FORGE_CHECK(o.num_ops >= 0, "{}: num_ops (n) must be >= 0, got {}", what, o.num_ops);
  FORGE_CHECK(std::isfinite(o.magnitude) && o.magnitude >= 0,
              "{}: magnitude (m) must be finite and >= 0, got {}", what, o.magnitude);
  FORGE_CHECK(o.magnitude_std >= 0, "{}: magnitude_std (mstd) must be >= 0 (or infinity), got {}",
              what, o.magnitude_std);
  FORGE_CHECK(std::isfinite(o.magnitude_max) && o.magnitude_max > 0,
              "{}: magnitude_max (mmax) must be finite and positive, got {}", what,
              o.magnitude_max);
  FORGE_CHECK(o.prob >= 0 && o.prob <= 1, "{}: prob (p) must be in [0, 1], got {}", what, o.prob);
  FORGE_CHECK(std::isfinite(o.translate_pct), "{}: translate_pct must be finite, got {}", what,
              o.translate_pct);
}

// The whole of `text` as a number; false when it is not one.
bool parse_number(std::string_view text, double& out) {
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, out);
  return r.ec == std::errc() && r.ptr == end && std::isfinite(out);
}

bool parse_int(std::string_view text, int& out) {
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, out);
  return r.ec == std::errc() && r.ptr == end;
}

// plane[top + r, left + c] = value over an h x w window of a row-major plane.
void fill_region(float* plane, int64_t width, int64_t top, int64_t left, int64_t h, int64_t w,
                 float value) {
  for (int64_t r = 0; r < h; ++r) {
    float* p = plane + (top + r) * width + left;
    std::fill(p, p + w, value);
  }
}

}  // namespace

// ---- the PIL operations ----

Image auto_contrast(const Image& image) {
  check_image(image, "auto_contrast");
  const auto h = histograms(image);
  std::array<Lut, 3> luts;
  for (int64_t c = 0; c < image.channels; ++c)
    luts[static_cast<size_t>(c)] = autocontrast_lut(h[static_cast<size_t>(c)]);
  return apply_luts(image, luts);
}

Image equalize(const Image& image) {
  check_image(image, "equalize");
  const auto h = histograms(image);
  std::array<Lut, 3> luts;
  for (int64_t c = 0; c < image.channels; ++c)
    luts[static_cast<size_t>(c)] = equalize_lut(h[static_cast<size_t>(c)]);
  return apply_luts(image, luts);
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

Image affine(const Image& image, const std::array<double, 6>& a, Interpolation interp,
             std::array<uint8_t, 3> fill) {
  check_image(image, "affine");
  for (double v : a)
    FORGE_CHECK(std::isfinite(v), "affine: the matrix must be finite, got ({})",
                fmt::join(a, ", "));
  Image out = filled(image, fill);
  switch (interp) {
    case Interpolation::nearest:
      if (a[1] == 0 && a[3] == 0)
        nearest_scale(image, a, out);
      else if (fits_fixed(a, 0, 0) && fits_fixed(a, image.width, image.height) &&
               fits_fixed(a, 0, image.height) && fits_fixed(a, image.width, 0))
        nearest_fixed(image, a, out);
      else
        nearest_double(image, a, out);
      break;
    case Interpolation::bilinear:
      if (image.channels == 1)
        generic_affine<sample_bilinear<1>>(image, a, out);
      else
        generic_affine<sample_bilinear<3>>(image, a, out);
      break;
    case Interpolation::bicubic:
      if (image.channels == 1)
        generic_affine<sample_bicubic<1>>(image, a, out);
      else
        generic_affine<sample_bicubic<3>>(image, a, out);
      break;
  }
  return out;
}

Image rotate(const Image& image, double degrees, Interpolation interp,
             std::array<uint8_t, 3> fill) {
  check_image(image, "rotate");
  FORGE_CHECK(std::isfinite(degrees), "rotate: the angle must be finite, got {}", degrees);
  const double angle = python_mod(degrees, 360.0);
  const int64_t h = image.height, w = image.width;
  using P = std::pair<int64_t, int64_t>;
  if (angle == 0) return image;
  if (angle == 180)
    return remap(image, h, w, [&](int64_t r, int64_t c) { return P{h - 1 - r, w - 1 - c}; });
  if (angle == 90 && w == h)
    return remap(image, h, w, [&](int64_t r, int64_t c) { return P{c, w - 1 - r}; });
  if (angle == 270 && w == h)
    return remap(image, h, w, [&](int64_t r, int64_t c) { return P{h - 1 - c, r}; });
  // Image.rotate's inverse matrix about (w / 2, h / 2), as PIL forms it.
  const double cx = static_cast<double>(w) / 2.0, cy = static_cast<double>(h) / 2.0;
  const double rad = -(angle * (std::numbers::pi / 180.0));
  std::array<double, 6> m = {round15(std::cos(rad)),  round15(std::sin(rad)), 0.0,
                             round15(-std::sin(rad)), round15(std::cos(rad)), 0.0};
  const double c = m[0] * -cx + m[1] * -cy + m[2];
  const double f = m[3] * -cx + m[4] * -cy + m[5];
  m[2] = c + cx;
  m[5] = f + cy;
  return affine(image, m, interp, fill);
}

// ---- RandAugment ----

RandAugmentOptions parse_rand_augment(const std::string& spec) {
  const char* expected =
      "m<float>, n<int>, mstd<float>, mmax<float>, inc<0|1> or p<float>, e.g. "
      "\"rand-m9-mstd0.5-inc1\"";
  std::vector<std::string_view> parts;
  std::string_view rest(spec);
  for (;;) {
    const size_t dash = rest.find('-');
    parts.push_back(rest.substr(0, dash));
    if (dash == std::string_view::npos) break;
    rest.remove_prefix(dash + 1);
  }
  FORGE_CHECK(parts[0] == "rand",
              "RandAugment spec \"{}\": expected \"rand\" followed by '-'-separated parts ({})",
              spec, expected);
  // timm's defaults for what the string leaves out.
  RandAugmentOptions o;
  o.magnitude = 10;
  o.num_ops = 2;
  o.magnitude_std = 0;
  o.magnitude_max = 10;
  o.increasing = false;
  o.prob = 0.5;
  std::vector<std::string_view> seen;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string_view part = parts[i];
    const size_t digit = part.find_first_of("0123456789");
    const std::string_view key = part.substr(0, digit);
    const std::string_view value =
        digit == std::string_view::npos ? std::string_view() : part.substr(digit);
    const bool known =
        key == "m" || key == "n" || key == "mstd" || key == "mmax" || key == "inc" || key == "p";
    FORGE_CHECK(known, "RandAugment spec \"{}\": unknown part \"{}\" (expected {})", spec, part,
                expected);
    FORGE_CHECK(std::find(seen.begin(), seen.end(), key) == seen.end(),
                "RandAugment spec \"{}\": part \"{}\" sets {} a second time", spec, part, key);
    seen.push_back(key);
    double number = 0;
    int integer = 0;
    const bool integral = key == "n" || key == "inc";
    const bool ok = integral ? parse_int(value, integer) : parse_number(value, number);
    FORGE_CHECK(ok, "RandAugment spec \"{}\": part \"{}\" needs {} after \"{}\", got \"{}\"", spec,
                part, integral ? "an integer" : "a number", key, value);
    if (key == "m") {
      o.magnitude = number;
    } else if (key == "n") {
      o.num_ops = integer;
    } else if (key == "mstd") {
      o.magnitude_std = number > 100 ? std::numeric_limits<double>::infinity() : number;
    } else if (key == "mmax") {
      o.magnitude_max = number;
    } else if (key == "inc") {
      FORGE_CHECK(integer == 0 || integer == 1,
                  "RandAugment spec \"{}\": part \"{}\" must be inc0 or inc1", spec, part);
      o.increasing = integer == 1;
    } else {
      o.prob = number;
    }
  }
  check_rand_augment_options(o, fmt::format("RandAugment spec \"{}\"", spec).c_str());
  return o;
}

std::string rand_augment_spec(const RandAugmentOptions& o) {
  // timm reads any mstd above 100 as uniform sampling.
  const double mstd = std::isinf(o.magnitude_std) ? 101 : o.magnitude_std;
  return fmt::format("rand-m{}-n{}-mstd{}-mmax{}-inc{}-p{}", o.magnitude, o.num_ops, mstd,
                     o.magnitude_max, o.increasing ? 1 : 0, o.prob);
}

std::vector<std::string> rand_augment_ops(bool increasing) {
  std::vector<std::string> names;
  for (Op op : increasing ? kRandIncreasingOps : kRandOps) names.emplace_back(op_name(op));
  return names;
}

void apply_augment_op(Image& image, const std::string& name, double magnitude,
                      const RandAugmentOptions& o, Rng& rng) {
  check_image(image, "RandAugment");
  FORGE_CHECK(std::isfinite(magnitude), "RandAugment: magnitude must be finite, got {}", magnitude);
  apply_op(image, op_by_name(name), magnitude, o, rng);
}

void rand_augment(Image& image, const RandAugmentOptions& o, Rng& rng) {
  check_rand_augment_options(o, "RandAugment");
  check_image(image, "RandAugment");
  const auto& ops = o.increasing ? kRandIncreasingOps : kRandOps;
  for (int slot = 0; slot < o.num_ops; ++slot) {
    const Op op = ops[static_cast<size_t>(rng.randint(static_cast<int64_t>(ops.size())))];
    if (rng.uniform() > o.prob) continue;
    double m = o.magnitude;
    if (std::isinf(o.magnitude_std))
      m = rng.uniform(0, m);
    else if (o.magnitude_std > 0)
      m = m + o.magnitude_std * rng.normal();
    m = std::max(0.0, std::min(m, o.magnitude_max));
    apply_op(image, op, m, o, rng);
  }
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

// ---- random erasing ----

void random_erasing(Tensor& image, const RandomErasingOptions& o, Rng& rng) {
  FORGE_CHECK(image.defined() && image.dim() == 3 && image.dtype() == DType::f32,
              "random_erasing: expected an f32 [C, H, W] image tensor, got {} {}",
              image.defined() ? dtype_name(image.dtype()) : "undefined",
              image.defined() ? shape_str(image.shape()) : "");
  FORGE_CHECK(o.prob >= 0 && o.prob <= 1, "random_erasing: prob must be in [0, 1], got {}", o.prob);
  FORGE_CHECK(o.min_area > 0 && o.min_area <= o.max_area,
              "random_erasing: expected 0 < min_area <= max_area, got [{}, {}]", o.min_area,
              o.max_area);
  FORGE_CHECK(o.min_aspect > 0 && (o.max_aspect == 0 || o.max_aspect >= o.min_aspect),
              "random_erasing: expected 0 < min_aspect <= max_aspect (or max_aspect 0), got "
              "[{}, {}]",
              o.min_aspect, o.max_aspect);
  FORGE_CHECK(o.min_count >= 1 && o.min_count <= o.max_count,
              "random_erasing: expected 1 <= min_count <= max_count, got [{}, {}]", o.min_count,
              o.max_count);
  if (rng.uniform() > o.prob) return;
  const int64_t channels = image.size(0), height = image.size(1), width = image.size(2);
  float* x = image.data<float>();
  const double area = static_cast<double>(height * width);
  const int64_t count =
      o.min_count == o.max_count ? o.min_count : rng.randint(o.min_count, o.max_count);
  const double log_lo = std::log(o.min_aspect);
  const double log_hi = std::log(o.max_aspect == 0 ? 1 / o.min_aspect : o.max_aspect);
  for (int64_t k = 0; k < count; ++k)
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double target = rng.uniform(o.min_area, o.max_area) * area / static_cast<double>(count);
      const double aspect = std::exp(rng.uniform(log_lo, log_hi));
      const auto h = static_cast<int64_t>(std::nearbyint(std::sqrt(target * aspect)));
      const auto w = static_cast<int64_t>(std::nearbyint(std::sqrt(target / aspect)));
      if (!(w < width && h < height)) continue;
      const int64_t top = rng.randint(0, height - h), left = rng.randint(0, width - w);
      for (int64_t c = 0; c < channels; ++c) {
        float* plane = x + c * height * width;
        if (o.mode == EraseMode::pixel) {
          for (int64_t r = 0; r < h; ++r) rng.normals(plane + (top + r) * width + left, w);
        } else {
          const float value = o.mode == EraseMode::rand ? static_cast<float>(rng.normal()) : 0.0f;
          fill_region(plane, width, top, left, h, w, value);
        }
      }
      break;
    }
}

}  // namespace forge::data
