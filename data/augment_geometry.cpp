// The geometric PIL operations of augment.h: Image.transform(AFFINE) with
// its three engines (nearest: the scale, 16.16 fixed-point and double paths;
// bilinear and bicubic: the generic double-precision path) and Image.rotate.
// Each retraces PIL 9.4's Geometry.c operation for operation, in the same
// double / fixed-point types, so that the results are the same bytes; the
// comments name the PIL function each one follows.

// Each float operation must round as it does in PIL's build (baseline x86-64,
// no FMA): no contraction of a * b + c into one fused multiply-add here.
#include "data/fp_contract_off.h"  // before any other include

#include "data/augment.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numbers>

#include "core/error.h"
#include "data/augment_internal.h"

namespace forge::data {

using namespace augment_detail;

namespace {

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

}  // namespace

// ---- the PIL operations ----

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

}  // namespace forge::data
