// Crop / resize / flip / normalise for images. Every geometric step is one
// call of `resample`, which reads the source through strides, so the same code
// serves u8 HWC images (ToTensor fused in) and f32 CHW tensors, and a channel
// stride of 0 replicates a gray image into three channels.
#include "data/transforms.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif

#include "core/error.h"

namespace forge::data {

namespace {

const std::vector<double> kImageNetMean = {0.485, 0.456, 0.406};
const std::vector<double> kImageNetStd = {0.229, 0.224, 0.225};

// Python's round(): half to even (std::nearbyint in the default rounding mode).
int64_t round_half_even(double x) {
  return static_cast<int64_t>(std::nearbyint(x));
}

// A value in [0, 255] rounded half away from zero, as std::lround (exact:
// a float plus one half is exact in double), without the library call.
uint8_t round_to_u8(float v) {
  return static_cast<uint8_t>(std::floor(static_cast<double>(v) + 0.5));
}

// The taps of one axis: output k (0 <= k < n) reads input pixels
// first[k] .. first[k] + count[k] - 1 with weights[k * taps ...]; count 0 is
// an output outside the resized image (zero padding).
struct AxisTaps {
  int64_t taps = 0;
  std::vector<int64_t> first, count;
  std::vector<float> weights;
};

// Keys' cubic convolution kernel with a = -0.5 (PIL's and torchvision's
// bicubic), nonzero on |t| < 2.
double cubic(double t) {
  constexpr double a = -0.5;
  t = std::abs(t);
  if (t < 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
  if (t < 2) return (((t - 5) * t + 8) * t - 4) * a;
  return 0;
}

// Outputs out_start .. out_start + n - 1 of the input interval
// [box_start, box_start + box_len) of an axis of in_size pixels resized to
// out_size pixels (mirrored when flip). See transforms.h for the filters.
AxisTaps axis_taps(int64_t in_size, double box_start, double box_len, int64_t out_size,
                   int64_t out_start, int64_t n, bool flip, Interpolation interpolation) {
  const double scale = box_len / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const bool bicubic = interpolation == Interpolation::bicubic;
  const double support = (bicubic ? 2.0 : 1.0) * filter_scale;  // radius in input pixels
  AxisTaps a;
  a.taps = static_cast<int64_t>(std::ceil(2 * support)) + 1;
  a.first.assign(static_cast<size_t>(n), 0);
  a.count.assign(static_cast<size_t>(n), 0);
  a.weights.assign(static_cast<size_t>(n * a.taps), 0.0f);
  std::vector<double> w(static_cast<size_t>(a.taps));
  for (int64_t k = 0; k < n; ++k) {
    const int64_t o = out_start + (flip ? n - 1 - k : k);
    if (o < 0 || o >= out_size) continue;
    const double center = box_start + (static_cast<double>(o) + 0.5) * scale;
    const int64_t lo =
        std::max<int64_t>(static_cast<int64_t>(std::floor(center - support + 0.5)), 0);
    const int64_t hi =
        std::min<int64_t>(static_cast<int64_t>(std::floor(center + support + 0.5)), in_size);
    FORGE_CHECK(hi > lo && hi - lo <= a.taps,
                "resample: bad filter window [{}, {}) for output {} (input size {})", lo, hi, o,
                in_size);
    double sum = 0;
    for (int64_t x = lo; x < hi; ++x) {
      const double t = (static_cast<double>(x) + 0.5 - center) / filter_scale;
      const double v = bicubic ? cubic(t) : std::max(1 - std::abs(t), 0.0);
      w[static_cast<size_t>(x - lo)] = v;
      sum += v;
    }
    FORGE_CHECK(sum != 0, "resample: empty filter window for output {} (input size {})", o,
                in_size);
    const auto ks = static_cast<size_t>(k);
    a.first[ks] = lo;
    a.count[ks] = hi - lo;
    for (int64_t x = lo; x < hi; ++x)
      a.weights[ks * static_cast<size_t>(a.taps) + static_cast<size_t>(x - lo)] =
          static_cast<float>(w[static_cast<size_t>(x - lo)] / sum);
  }
  return a;
}

// Where the source's elements are: element (c, y, x) is at
// c * c_stride + y * y_stride + x * x_stride.
struct SourceLayout {
  int64_t channels = 0, height = 0, width = 0;
  int64_t c_stride = 0, y_stride = 0, x_stride = 0;
};

// The horizontal pass: tmp [C, rows, nx] = the x taps over source rows
// row_lo .. row_lo + rows - 1, clipped to [0, row_clip] when row_clip > 0.
// Each output sums its taps in order (acc += w * x).
template <typename T>
void horizontal_pass(const T* src, const SourceLayout& s, const AxisTaps& xs, int64_t row_lo,
                     int64_t rows, float row_clip, float* tmp) {
  const auto nx = static_cast<int64_t>(xs.first.size());
  for (int64_t c = 0; c < s.channels; ++c)
    for (int64_t r = 0; r < rows; ++r) {
      const T* line = src + c * s.c_stride + (row_lo + r) * s.y_stride;
      float* dst = tmp + (c * rows + r) * nx;
      for (int64_t k = 0; k < nx; ++k) {
        const auto ks = static_cast<size_t>(k);
        const float* w = xs.weights.data() + ks * static_cast<size_t>(xs.taps);
        const T* p = line + xs.first[ks] * s.x_stride;
        float acc = 0;
        for (int64_t t = 0; t < xs.count[ks]; ++t)
          acc += w[t] * static_cast<float>(p[t * s.x_stride]);
        dst[k] = row_clip > 0 ? std::clamp(acc, 0.0f, row_clip) : acc;
      }
    }
}

// The same for u8 sources of up to 4 channels, every channel of an output at
// once: each source row is first widened to f32 pixels of 4 lanes
// (channels, then zeros), so a tap is one 4-lane multiply-add: the same sums
// in the same order as horizontal_pass (whose products the compiler may fuse
// into the adds, so the two can differ in the last bit).
using Lanes4 = float __attribute__((vector_size(16)));

using Bytes4 = uint8_t __attribute__((vector_size(4)));

// Source row `line` widened into px [width + taps] (the pixels, then zeros).
template <int C>
void widen_row(const uint8_t* line, const SourceLayout& s, Lanes4* px) {
  int64_t x = 0;
  if (C == 3 && s.c_stride == 1 && s.x_stride == 3)
    for (; x + 1 < s.width; ++x) {  // 4 bytes a pixel: its 3 and the next one's first
#if defined(__SSE4_1__)
      int32_t b;
      std::memcpy(&b, line + 3 * x, sizeof b);
      const __m128 v = _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(b)));
      _mm_storeu_ps(reinterpret_cast<float*>(px + x), _mm_blend_ps(v, _mm_setzero_ps(), 8));
#else
      Bytes4 b;
      std::memcpy(&b, line + 3 * x, sizeof b);
      Lanes4 v = __builtin_convertvector(b, Lanes4);
      v[3] = 0;
      px[x] = v;
#endif
    }
  for (; x < s.width; ++x)
    for (int c = 0; c < C; ++c)
      px[x][c] = static_cast<float>(line[c * s.c_stride + x * s.x_stride]);
}

// Every output of the taps over px: kTaps (0: xs.taps, at run time) taps
// each, the weights past an output's count being zeros, which leave its sum
// as it is.
template <int C, int kTaps>
void taps_of_row(const Lanes4* px, const AxisTaps& xs, float row_clip, float* dst,
                 int64_t plane) {
  const auto nx = static_cast<int64_t>(xs.first.size());
  const int64_t taps = kTaps > 0 ? kTaps : xs.taps;
  for (int64_t k = 0; k < nx; ++k) {
    const auto ks = static_cast<size_t>(k);
    const float* w = xs.weights.data() + ks * static_cast<size_t>(xs.taps);
    const Lanes4* p = px + xs.first[ks];
    Lanes4 acc = {0, 0, 0, 0};
    for (int64_t t = 0; t < taps; ++t) acc += w[t] * p[t];
    for (int c = 0; c < C; ++c)
      dst[c * plane + k] = row_clip > 0 ? std::clamp(acc[c], 0.0f, row_clip) : acc[c];
  }
}

template <int C>
void horizontal_pass_u8(const uint8_t* src, const SourceLayout& s, const AxisTaps& xs,
                        int64_t row_lo, int64_t rows, float row_clip, float* tmp) {
  const auto nx = static_cast<int64_t>(xs.first.size());
  std::vector<Lanes4> px(static_cast<size_t>(s.width + xs.taps), Lanes4{0, 0, 0, 0});
  const int64_t plane = rows * nx;  // tmp's channel stride
  for (int64_t r = 0; r < rows; ++r) {
    widen_row<C>(src + (row_lo + r) * s.y_stride, s, px.data());
    float* dst = tmp + r * nx;
    switch (xs.taps) {  // bicubic: 5 taps when enlarging, up to 9 when shrinking by up to 2
      case 5: taps_of_row<C, 5>(px.data(), xs, row_clip, dst, plane); break;
      case 6: taps_of_row<C, 6>(px.data(), xs, row_clip, dst, plane); break;
      case 7: taps_of_row<C, 7>(px.data(), xs, row_clip, dst, plane); break;
      case 8: taps_of_row<C, 8>(px.data(), xs, row_clip, dst, plane); break;
      case 9: taps_of_row<C, 9>(px.data(), xs, row_clip, dst, plane); break;
      default: taps_of_row<C, 0>(px.data(), xs, row_clip, dst, plane); break;
    }
  }
}

// out: f32 [channels, ys.n, xs.n], value_scale times the separable filter of
// the source (horizontal pass over the rows the vertical taps read, then
// vertical), clipped to [0, clip] when clip > 0 (after each pass, as PIL).
template <typename T>
void resample(const T* src, const SourceLayout& s, const AxisTaps& ys, const AxisTaps& xs,
              float value_scale, float* out, float clip = 0) {
  const auto ny = static_cast<int64_t>(ys.first.size());
  const auto nx = static_cast<int64_t>(xs.first.size());
  int64_t row_lo = s.height, row_hi = 0;
  for (int64_t k = 0; k < ny; ++k) {
    if (ys.count[static_cast<size_t>(k)] == 0) continue;
    row_lo = std::min(row_lo, ys.first[static_cast<size_t>(k)]);
    row_hi = std::max(row_hi, ys.first[static_cast<size_t>(k)] + ys.count[static_cast<size_t>(k)]);
  }
  const int64_t rows = std::max<int64_t>(row_hi - row_lo, 0);
  // PIL clips its horizontal pass to 8 bits too: a bicubic overshoot at an
  // edge does not carry into the vertical pass.
  const float row_clip = clip > 0 ? clip / value_scale : 0.0f;
  std::vector<float> tmp(static_cast<size_t>(s.channels * rows * nx));  // [C, rows, nx]
  if constexpr (std::is_same_v<T, uint8_t>) {
    if (s.channels == 3)
      horizontal_pass_u8<3>(src, s, xs, row_lo, rows, row_clip, tmp.data());
    else if (s.channels == 1)
      horizontal_pass_u8<1>(src, s, xs, row_lo, rows, row_clip, tmp.data());
    else
      horizontal_pass(src, s, xs, row_lo, rows, row_clip, tmp.data());
  } else {
    horizontal_pass(src, s, xs, row_lo, rows, row_clip, tmp.data());
  }
  for (int64_t c = 0; c < s.channels; ++c)
    for (int64_t k = 0; k < ny; ++k) {
      const auto ks = static_cast<size_t>(k);
      float* dst = out + (c * ny + k) * nx;
      std::fill(dst, dst + nx, 0.0f);
      const float* w = ys.weights.data() + ks * static_cast<size_t>(ys.taps);
      for (int64_t t = 0; t < ys.count[ks]; ++t) {
        const float* line = tmp.data() + (c * rows + ys.first[ks] - row_lo + t) * nx;
        for (int64_t x = 0; x < nx; ++x) dst[x] += w[t] * line[x];
      }
      for (int64_t x = 0; x < nx; ++x) dst[x] *= value_scale;
      if (clip > 0)
        for (int64_t x = 0; x < nx; ++x) dst[x] = std::clamp(dst[x], 0.0f, clip);
    }
}

// A contiguous f32 [C, H, W] tensor's layout.
SourceLayout chw_layout(const Tensor& image, const char* what) {
  FORGE_CHECK(image.defined() && image.dim() == 3 && image.dtype() == DType::f32,
              "{}: expected an f32 [C, H, W] image tensor, got {} {}", what,
              image.defined() ? dtype_name(image.dtype()) : "undefined",
              image.defined() ? shape_str(image.shape()) : "");
  const int64_t c = image.size(0), h = image.size(1), w = image.size(2);
  FORGE_CHECK(c > 0 && h > 0 && w > 0, "{}: expected a non-empty image, got shape {}", what,
              shape_str(image.shape()));
  return SourceLayout{c, h, w, h * w, w, 1};
}

// A u8 HWC image's layout, read as `channels` channels (a gray image read as
// three repeats its one channel).
SourceLayout hwc_layout(const Image& image, int64_t channels) {
  return SourceLayout{channels,
                      image.height,
                      image.width,
                      image.channels == channels ? 1 : 0,
                      image.width * image.channels,
                      image.channels};
}

void check_interpolation(Interpolation interpolation, const char* what) {
  FORGE_CHECK(interpolation == Interpolation::bilinear || interpolation == Interpolation::bicubic,
              "{}: resizes are bilinear or bicubic", what);
}

void check_box(const CropBox& box, int64_t height, int64_t width, const char* what) {
  FORGE_CHECK(box.height > 0 && box.width > 0 && box.top >= 0 && box.left >= 0 &&
                  box.top + box.height <= height && box.left + box.width <= width,
              "{}: crop box (top {}, left {}, height {}, width {}) is not inside the {}x{} image",
              what, box.top, box.left, box.height, box.width, height, width);
}

std::vector<double> resolve_stat(const std::vector<double>& given,
                                 const std::vector<double>& imagenet, bool grayscale) {
  if (!given.empty()) return given;
  if (!grayscale) return imagenet;
  return {(imagenet[0] + imagenet[1] + imagenet[2]) / 3};
}

}  // namespace

std::vector<double> effective_mean(const ImageTransformOptions& o) {
  return resolve_stat(o.mean, kImageNetMean, o.grayscale);
}
std::vector<double> effective_std(const ImageTransformOptions& o) {
  return resolve_stat(o.std, kImageNetStd, o.grayscale);
}

void check_image_transform_options(const ImageTransformOptions& o) {
  FORGE_CHECK(o.size > 0, "image transform: size must be positive, got {}", o.size);
  FORGE_CHECK(o.scale_min > 0 && o.scale_min <= o.scale_max,
              "image transform: expected 0 < scale_min <= scale_max, got scale [{}, {}]",
              o.scale_min, o.scale_max);
  FORGE_CHECK(o.ratio_min > 0 && o.ratio_min <= o.ratio_max,
              "image transform: expected 0 < ratio_min <= ratio_max, got ratio [{}, {}]",
              o.ratio_min, o.ratio_max);
  FORGE_CHECK(o.hflip >= 0 && o.hflip <= 1, "image transform: hflip must be in [0, 1], got {}",
              o.hflip);
  FORGE_CHECK(o.crop_pct > 0 && o.crop_pct <= 1,
              "image transform: crop_pct must be in (0, 1], got {}", o.crop_pct);
  check_interpolation(o.interpolation, "image transform");
  const size_t channels = o.grayscale ? 1 : 3;
  for (const auto* stat : {&o.mean, &o.std}) {
    const char* name = stat == &o.mean ? "mean" : "std";
    FORGE_CHECK(stat->empty() || stat->size() == 1 || stat->size() == channels,
                "image transform: {} needs {} values (or 1), got {}", name, channels, stat->size());
  }
  for (double s : o.std)
    FORGE_CHECK(s > 0, "image transform: std values must be positive, got {}", s);
}

CropBox random_resized_crop_box(int64_t height, int64_t width, double scale_min, double scale_max,
                                double ratio_min, double ratio_max, Rng& rng) {
  FORGE_CHECK(height > 0 && width > 0, "random_resized_crop_box: empty image {}x{}", height, width);
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(ratio_min), log_hi = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(scale_min, scale_max);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int64_t w = round_half_even(std::sqrt(target_area * aspect));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t top = rng.randint(0, height - h);
      const int64_t left = rng.randint(0, width - w);
      return {top, left, h, w};
    }
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < ratio_min) {
    h = round_half_even(static_cast<double>(w) / ratio_min);
  } else if (in_ratio > ratio_max) {
    w = round_half_even(static_cast<double>(h) * ratio_max);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

std::pair<int64_t, int64_t> shorter_side_size(int64_t height, int64_t width, int64_t shorter) {
  FORGE_CHECK(height > 0 && width > 0 && shorter > 0,
              "shorter_side_size: expected positive sizes, got {}x{} -> {}", height, width,
              shorter);
  if (width <= height) return {shorter * height / width, shorter};
  return {shorter, shorter * width / height};
}

Tensor to_tensor(const Image& image) {
  check_image(image, "to_tensor");
  Tensor out = Tensor::empty({image.channels, image.height, image.width});
  float* o = out.data<float>();
  const int64_t hw = image.height * image.width;
  for (int64_t p = 0; p < hw; ++p)
    for (int64_t c = 0; c < image.channels; ++c)
      o[c * hw + p] =
          static_cast<float>(image.pixels[static_cast<size_t>(p * image.channels + c)]) / 255.0f;
  return out;
}

Image to_grayscale(const Image& image) {
  check_image(image, "to_grayscale");
  if (image.channels == 1) return image;
  Image out{image.height, image.width, 1,
            std::vector<uint8_t>(static_cast<size_t>(image.height * image.width))};
  for (size_t p = 0; p < out.pixels.size(); ++p) {
    const uint8_t* rgb = image.pixels.data() + 3 * p;
    const double luma = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2];
    out.pixels[p] = static_cast<uint8_t>(std::min(std::lround(luma), 255L));
  }
  return out;
}

Tensor resized_crop(const Tensor& image, const CropBox& box, int64_t out_h, int64_t out_w,
                    Interpolation interpolation) {
  const SourceLayout s = chw_layout(image, "resized_crop");
  check_box(box, s.height, s.width, "resized_crop");
  FORGE_CHECK(out_h > 0 && out_w > 0, "resized_crop: expected a positive output size, got {}x{}",
              out_h, out_w);
  check_interpolation(interpolation, "resized_crop");
  const AxisTaps ys =
      axis_taps(s.height, static_cast<double>(box.top), static_cast<double>(box.height), out_h, 0,
                out_h, false, interpolation);
  const AxisTaps xs =
      axis_taps(s.width, static_cast<double>(box.left), static_cast<double>(box.width), out_w, 0,
                out_w, false, interpolation);
  Tensor out = Tensor::empty({s.channels, out_h, out_w});
  resample(image.data<float>(), s, ys, xs, 1.0f, out.data<float>());
  return out;
}

Tensor resize(const Tensor& image, int64_t out_h, int64_t out_w, Interpolation interpolation) {
  chw_layout(image, "resize");
  return resized_crop(image, CropBox{0, 0, image.size(1), image.size(2)}, out_h, out_w,
                      interpolation);
}

Tensor resize_shorter_side(const Tensor& image, int64_t shorter, Interpolation interpolation) {
  chw_layout(image, "resize_shorter_side");
  const auto [h, w] = shorter_side_size(image.size(1), image.size(2), shorter);
  return resize(image, h, w, interpolation);
}

namespace {

// torchvision's CenterCrop offset: half the excess rounded half to even, or
// minus half the shortfall (rounded down) when the image is padded.
int64_t center_offset(int64_t in, int64_t size) {
  if (size > in) return -((size - in) / 2);
  return round_half_even(static_cast<double>(in - size) / 2.0);
}

}  // namespace

Tensor center_crop(const Tensor& image, int64_t size) {
  const SourceLayout s = chw_layout(image, "center_crop");
  FORGE_CHECK(size > 0, "center_crop: size must be positive, got {}", size);
  const int64_t top = center_offset(s.height, size), left = center_offset(s.width, size);
  Tensor out = Tensor::zeros({s.channels, size, size});
  const float* src = image.data<float>();
  float* dst = out.data<float>();
  for (int64_t c = 0; c < s.channels; ++c)
    for (int64_t y = 0; y < size; ++y) {
      const int64_t sy = top + y;
      if (sy < 0 || sy >= s.height) continue;
      for (int64_t x = 0; x < size; ++x) {
        const int64_t sx = left + x;
        if (sx >= 0 && sx < s.width)
          dst[(c * size + y) * size + x] = src[(c * s.height + sy) * s.width + sx];
      }
    }
  return out;
}

Tensor hflip(const Tensor& image) {
  const SourceLayout s = chw_layout(image, "hflip");
  Tensor out = Tensor::empty(image.shape());
  const float* src = image.data<float>();
  float* dst = out.data<float>();
  for (int64_t row = 0; row < s.channels * s.height; ++row)
    std::reverse_copy(src + row * s.width, src + (row + 1) * s.width, dst + row * s.width);
  return out;
}

Tensor random_horizontal_flip(const Tensor& image, double p, Rng& rng) {
  return rng.bernoulli(p) ? hflip(image) : image;
}

void normalize_(Tensor& image, const std::vector<double>& mean, const std::vector<double>& std) {
  const SourceLayout s = chw_layout(image, "normalize");
  const auto c = static_cast<size_t>(s.channels);
  FORGE_CHECK((mean.size() == c || mean.size() == 1) && (std.size() == c || std.size() == 1),
              "normalize: mean and std need {} values (or 1) for a {}-channel image, got {} and {}",
              c, c, mean.size(), std.size());
  float* x = image.data<float>();
  const int64_t hw = s.height * s.width;
  for (size_t k = 0; k < c; ++k) {
    const double m = mean[mean.size() == 1 ? 0 : k], sd = std[std.size() == 1 ? 0 : k];
    FORGE_CHECK(sd > 0, "normalize: std[{}] must be positive, got {}", k, sd);
    const auto fm = static_cast<float>(m), inv = static_cast<float>(1.0 / sd);
    float* p = x + static_cast<int64_t>(k) * hw;
    for (int64_t i = 0; i < hw; ++i) p[i] = (p[i] - fm) * inv;
  }
}

namespace {

// Where one output comes from, in the pixels of the source at full size: the
// box [top, top + height) x [left, left + width), resized to resized_h x
// resized_w, of which the window at (offset_y, offset_x) of the output's size
// is kept (the eval centre crop; 0 and the box's full size for the train
// crop), mirrored when flip.
struct Plan {
  int64_t top = 0, left = 0, height = 0, width = 0;
  int64_t resized_h = 0, resized_w = 0, offset_y = 0, offset_x = 0;
  bool flip = false;
};

// Draws the crop and the flip (train) or computes the eval resize and crop of
// a height x width source.
Plan plan(int64_t height, int64_t width, const ImageTransformOptions& o, Rng* rng) {
  const int64_t size = o.size;
  if (rng != nullptr && o.train) {
    const CropBox box = random_resized_crop_box(height, width, o.scale_min, o.scale_max,
                                                o.ratio_min, o.ratio_max, *rng);
    const bool flip = rng->bernoulli(o.hflip);
    return {box.top, box.left, box.height, box.width, size, size, 0, 0, flip};
  }
  const auto resize_to = static_cast<int64_t>(std::floor(static_cast<double>(size) / o.crop_pct));
  const auto [h, w] = shorter_side_size(height, width, resize_to);
  return {0, 0, height, width, h, w, center_offset(h, size), center_offset(w, size), false};
}

// The taps of the plan's rows (ys) and columns (xs) over a source of
// full_h x full_w pixels decoded at 1 / denom of the planned size.
struct PlanTaps {
  AxisTaps ys, xs;
};
PlanTaps plan_taps(const Plan& p, int denom, int64_t full_h, int64_t full_w,
                   const ImageTransformOptions& o) {
  const double d = denom;
  return {axis_taps(full_h, static_cast<double>(p.top) / d, static_cast<double>(p.height) / d,
                    p.resized_h, p.offset_y, o.size, false, o.interpolation),
          axis_taps(full_w, static_cast<double>(p.left) / d, static_cast<double>(p.width) / d,
                    p.resized_w, p.offset_x, o.size, p.flip, o.interpolation)};
}

// The source pixels [lo, hi) the taps of an axis read (empty: none).
std::pair<int64_t, int64_t> taps_span(const AxisTaps& a) {
  int64_t lo = INT64_MAX, hi = 0;
  for (size_t k = 0; k < a.first.size(); ++k)
    if (a.count[k] > 0) {
      lo = std::min(lo, a.first[k]);
      hi = std::max(hi, a.first[k] + a.count[k]);
    }
  return lo < hi ? std::make_pair(lo, hi) : std::make_pair(int64_t{0}, int64_t{0});
}

// The taps moved to a source that starts `origin` pixels into the full one.
void shift_taps(AxisTaps& a, int64_t origin) {
  for (size_t k = 0; k < a.first.size(); ++k)
    if (a.count[k] > 0) a.first[k] -= origin;
}

// f32 [C, size, size]: a plan's taps (over the whole source, decoded at the
// plan's scale) applied to `input`, the source or the part of it at (at_y,
// at_x) that holds every pixel they read, then the augmentations and the
// normalisation.
Tensor render(const Image& input, const ImageTransformOptions& o, Rng* rng, PlanTaps taps,
              int64_t at_y, int64_t at_x) {
  check_image(input, "transform_image");
  const int64_t channels = o.grayscale ? 1 : 3;
  const Image gray = o.grayscale && input.channels == 3 ? to_grayscale(input) : Image{};
  const Image& image = gray.channels ? gray : input;
  const SourceLayout s = hwc_layout(image, channels);
  const int64_t size = o.size;
  shift_taps(taps.ys, at_y);
  shift_taps(taps.xs, at_x);
  const AxisTaps& ys = taps.ys;
  const AxisTaps& xs = taps.xs;
  const bool train = rng != nullptr && o.train;
  const float clip = o.interpolation == Interpolation::bicubic ? 1.0f : 0.0f;
  Tensor out = Tensor::empty({channels, size, size});
  if (train && (o.rand_augment || o.color_jitter.any())) {
    // The crop as PIL gives it to timm's RandAugment: rounded to u8.
    resample(image.pixels.data(), s, ys, xs, 1.0f, out.data<float>(), 255.0f);
    Image crop{size, size, channels,
               std::vector<uint8_t>(static_cast<size_t>(channels * size * size))};
    const float* f = out.data<float>();
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < size * size; ++i)
        crop.pixels[static_cast<size_t>(i * channels + c)] = round_to_u8(f[c * size * size + i]);
    if (o.rand_augment) rand_augment(crop, o.rand_augment_options, *rng);
    if (o.color_jitter.any()) color_jitter(crop, o.color_jitter, *rng);
    out = to_tensor(crop);
  } else {
    resample(image.pixels.data(), s, ys, xs, 1.0f / 255.0f, out.data<float>(), clip);
  }
  normalize_(out, effective_mean(o), effective_std(o));
  if (train && o.erasing.prob > 0) random_erasing(out, o.erasing, *rng);
  return out;
}

}  // namespace

Tensor transform_image(const Image& input, const ImageTransformOptions& options, Rng* rng) {
  check_image_transform_options(options);
  check_image(input, "transform_image");
  const Plan p = plan(input.height, input.width, options, rng);
  return render(input, options, rng, plan_taps(p, 1, input.height, input.width, options), 0, 0);
}

Tensor transform_image_file(const std::vector<uint8_t>& bytes, const std::string& what,
                            const ImageTransformOptions& options, Rng* rng, int64_t max_pixels) {
  check_image_transform_options(options);
  const ImageHeader header = read_image_header(bytes, what, max_pixels);
  const Plan p = plan(header.height, header.width, options, rng);
  const int denom = header.jpeg && options.scaled_jpeg_decode
                        ? jpeg_scale_denom(p.height, p.width, p.resized_h, p.resized_w)
                        : 1;
  // The sides libjpeg gives at 1 / denom (rounded up); the taps over them say
  // which pixels are read, and only those rows and block columns are decoded.
  const int64_t full_h = (header.height + denom - 1) / denom;
  const int64_t full_w = (header.width + denom - 1) / denom;
  const PlanTaps taps = plan_taps(p, denom, full_h, full_w, options);
  const auto [y0, y1] = taps_span(taps.ys);
  const auto [x0, x1] = taps_span(taps.xs);
  if (!header.jpeg || y1 <= y0 || x1 <= x0)
    return render(decode_image(bytes, what, max_pixels, denom), options, rng, taps, 0, 0);
  ImageRegion got;
  const Image part =
      decode_image_region(bytes, what, max_pixels, denom, {y0, x0, y1 - y0, x1 - x0}, got);
  return render(part, options, rng, taps, got.top, got.left);
}

}  // namespace forge::data
