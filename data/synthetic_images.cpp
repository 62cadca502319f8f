// The synthetic ImageFolder's pictures and files.
#include "data/synthetic_images.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <system_error>

#include "core/error.h"
#include "data/random.h"

namespace forge::data {

namespace {

namespace fs = std::filesystem;

constexpr int kShapeKinds = 5;  // disc, square, triangle, ring, cross
constexpr int kNoise = 40;      // background noise amplitude (levels); shapes get half

using Rgb = std::array<double, 3>;

// h in [0, 1) around the wheel, s and v in [0, 1]; RGB in [0, 255].
Rgb hsv_to_rgb(double h, double s, double v) {
  h = (h - std::floor(h)) * 6;
  const int sector = std::min(5, static_cast<int>(h));
  const double f = h - sector;
  const double p = v * (1 - s), q = v * (1 - s * f), t = v * (1 - s * (1 - f));
  // (r, g, b) in each sixth of the wheel, from red (h = 0) round to magenta.
  const Rgb by_sector[6] = {Rgb{v, t, p}, Rgb{q, v, p}, Rgb{p, v, t},
                            Rgb{p, q, v}, Rgb{t, p, v}, Rgb{v, p, q}};
  Rgb c = by_sector[sector];
  for (double& x : c) x *= 255;
  return c;
}

// Whether (u, v), in units of the shape's radius around its centre (already
// rotated), is inside a shape of `kind`.
bool inside(int kind, double u, double v) {
  const double r2 = u * u + v * v;
  switch (kind) {
    case 0:
      return r2 <= 1;
    case 1:
      return std::abs(u) <= 0.75 && std::abs(v) <= 0.75;
    case 2: {  // equilateral, inscribed in the unit circle, a vertex at (0, 1)
      const double s3 = std::numbers::sqrt3;
      return v >= -0.5 && s3 * u + v <= 1 && -s3 * u + v <= 1;
    }
    case 3:
      return r2 >= 0.36 && r2 <= 1;
    default:
      return (std::abs(u) <= 0.28 && std::abs(v) <= 1) || (std::abs(v) <= 0.28 && std::abs(u) <= 1);
  }
}

struct Shape {
  int kind = 0;
  double cy = 0, cx = 0, radius = 1, angle = 0;
  Rgb color{};
};

// A shape of `kind` whose radius is a fraction in [lo, hi] of the shorter
// side, placed so that at least most of it is inside.
Shape draw_shape(int kind, int64_t h, int64_t w, double lo, double hi, const Rgb& color, Rng& rng) {
  Shape s;
  s.kind = kind;
  s.radius = rng.uniform(lo, hi) * static_cast<double>(std::min(h, w));
  s.cy = rng.uniform(0.6 * s.radius, static_cast<double>(h) - 0.6 * s.radius);
  s.cx = rng.uniform(0.6 * s.radius, static_cast<double>(w) - 0.6 * s.radius);
  s.angle = rng.uniform(0, 2 * std::numbers::pi);
  s.color = color;
  return s;
}

// Paints the shape over `image`, with half of each pixel's noise as texture.
void paint(Image& image, const Shape& s, const std::vector<int8_t>& noise) {
  const double c = std::cos(s.angle), sn = std::sin(s.angle);
  const double reach = s.radius * std::numbers::sqrt2;
  const int64_t y0 = std::max<int64_t>(0, static_cast<int64_t>(s.cy - reach));
  const int64_t y1 = std::min<int64_t>(image.height, static_cast<int64_t>(s.cy + reach) + 1);
  const int64_t x0 = std::max<int64_t>(0, static_cast<int64_t>(s.cx - reach));
  const int64_t x1 = std::min<int64_t>(image.width, static_cast<int64_t>(s.cx + reach) + 1);
  for (int64_t y = y0; y < y1; ++y)
    for (int64_t x = x0; x < x1; ++x) {
      const double dy = (static_cast<double>(y) + 0.5 - s.cy) / s.radius;
      const double dx = (static_cast<double>(x) + 0.5 - s.cx) / s.radius;
      if (!inside(s.kind, c * dx + sn * dy, -sn * dx + c * dy)) continue;
      const size_t p = static_cast<size_t>(y * image.width + x) * 3;
      for (size_t k = 0; k < 3; ++k)
        image.pixels[p + k] = static_cast<uint8_t>(
            std::clamp(std::lround(s.color[k] + noise[p + k] / 2), long{0}, long{255}));
    }
}

}  // namespace

void check_synthetic_images_options(const SyntheticImagesOptions& o) {
  FORGE_CHECK(o.classes >= 1, "synthetic images: classes must be at least 1, got {}", o.classes);
  FORGE_CHECK(o.train_per_class >= 1 && o.eval_per_class >= 1,
              "synthetic images: train_per_class and eval_per_class must be at least 1, got {} "
              "and {}",
              o.train_per_class, o.eval_per_class);
  FORGE_CHECK(16 <= o.min_side && o.min_side <= o.max_side && o.max_side <= 8192,
              "synthetic images: expected 16 <= min_side <= max_side <= 8192, got min_side {} and "
              "max_side {}",
              o.min_side, o.max_side);
  FORGE_CHECK(o.quality >= 1 && o.quality <= 100,
              "synthetic images: quality must be in 1..100, got {}", o.quality);
}

std::string synthetic_class_name(const SyntheticImagesOptions& o, int64_t label) {
  const int digits = std::max<int>(2, static_cast<int>(std::to_string(o.classes - 1).size()));
  return fmt::format("class_{:0{}d}", label, digits);
}

Image synthetic_image(const SyntheticImagesOptions& o, bool train, int64_t label, int64_t index) {
  check_synthetic_images_options(o);
  FORGE_CHECK(label >= 0 && label < o.classes && index >= 0,
              "synthetic_image: class {} is not in [0, {}) or index {} is negative", label,
              o.classes, index);
  Rng rng(Rng::mix({o.seed, train ? uint64_t{0} : uint64_t{1}, static_cast<uint64_t>(label),
                    static_cast<uint64_t>(index)}));
  Image image;
  image.height = rng.randint(o.min_side, o.max_side);
  image.width = rng.randint(o.min_side, o.max_side);
  image.channels = 3;
  const auto n = static_cast<size_t>(image.height * image.width * 3);
  image.pixels.resize(n);

  // Per-sample noise in [-kNoise, kNoise], three samples from each word.
  std::vector<int8_t> noise(n);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t word = rng.next_u32();
    for (size_t k = 0; k < 3 && i + k < n; ++k)
      noise[i + k] =
          static_cast<int8_t>(((word >> (8 * k)) & 0xff) * (2 * kNoise + 1) / 256 - kNoise);
  }

  // Background: a gradient along a random direction between two dull colours.
  const Rgb a = hsv_to_rgb(rng.uniform(), rng.uniform(0, 0.45), rng.uniform(0.25, 0.9));
  const Rgb b = hsv_to_rgb(rng.uniform(), rng.uniform(0, 0.45), rng.uniform(0.25, 0.9));
  const double theta = rng.uniform(0, 2 * std::numbers::pi);
  const double gy = std::sin(theta) / static_cast<double>(image.height);
  const double gx = std::cos(theta) / static_cast<double>(image.width);
  for (int64_t y = 0; y < image.height; ++y)
    for (int64_t x = 0; x < image.width; ++x) {
      // t in [0, 1] across the image along the direction.
      const double t =
          0.5 + 0.5 *
                    (gy * (2 * static_cast<double>(y) - static_cast<double>(image.height)) +
                     gx * (2 * static_cast<double>(x) - static_cast<double>(image.width))) /
                    std::numbers::sqrt2;
      const size_t p = static_cast<size_t>(y * image.width + x) * 3;
      for (size_t k = 0; k < 3; ++k)
        image.pixels[p + k] = static_cast<uint8_t>(
            std::clamp(std::lround(a[k] + t * (b[k] - a[k]) + noise[p + k]), long{0}, long{255}));
    }

  if (rng.bernoulli(0.5)) {
    const int kind = static_cast<int>(rng.randint(kShapeKinds));
    const Rgb color = hsv_to_rgb(rng.uniform(), rng.uniform(0.3, 1), rng.uniform(0.4, 1));
    paint(image, draw_shape(kind, image.height, image.width, 0.08, 0.18, color, rng), noise);
  }
  const double hue = (static_cast<double>(label) + rng.uniform()) / static_cast<double>(o.classes);
  const Rgb color = hsv_to_rgb(hue, rng.uniform(0.6, 1), rng.uniform(0.6, 1));
  paint(image,
        draw_shape(static_cast<int>(label % kShapeKinds), image.height, image.width, 0.18, 0.38,
                   color, rng),
        noise);
  return image;
}

void write_synthetic_image_folder(const std::string& root, const SyntheticImagesOptions& o) {
  check_synthetic_images_options(o);
  const int digits = std::max<int>(
      5,
      static_cast<int>(std::to_string(std::max(o.train_per_class, o.eval_per_class) - 1).size()));
  for (const bool train : {true, false}) {
    const int64_t count = train ? o.train_per_class : o.eval_per_class;
    for (int64_t c = 0; c < o.classes; ++c) {
      const fs::path dir = fs::path(root) / (train ? "train" : "val") / synthetic_class_name(o, c);
      std::error_code ec;
      fs::create_directories(dir, ec);
      FORGE_CHECK(!ec, "synthetic images: cannot create folder '{}': {}", dir.string(),
                  ec.message());
      for (int64_t i = 0; i < count; ++i)
        write_jpeg((dir / fmt::format("{:0{}d}.jpg", i, digits)).string(),
                   synthetic_image(o, train, c, i), o.quality);
    }
  }
}

}  // namespace forge::data
