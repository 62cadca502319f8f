// RandAugment as timm's rand_augment_transform (the op table, the level
// functions, the config string) and random erasing as timm's RandomErasing
// (see augment.h). The PIL operations RandAugment's ops are made of are
// augment_color.cpp's and augment_geometry.cpp's; colour jitter is
// augment_color.cpp's.

// The magnitudes, factors and regions are computed as timm computes them in
// Python (double, no FMA): no contraction of a * b + c into one fused
// multiply-add here, nor in the headers' inline code (Rng::uniform(lo, hi)),
// which is why this comes before the includes.
#include "data/fp_contract_off.h"  // before any other include

#include "data/augment.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>

#include "core/error.h"

namespace forge::data {

namespace {

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
