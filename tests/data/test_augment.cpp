// RandAugment, colour jitter and random erasing (data/augment.h): every PIL
// operation pixel-exact against PIL itself (check_augment_pil.py, run on our
// outputs), rand_augment against timm's AugmentOp / RandAugment written out
// again here, the spec parser, colour jitter against the composition of its
// steps, random erasing against its definition and its area statistics.

// The reference level arithmetic below must round as the library's does (no
// fused multiply-adds; see data/augment.cpp).
#include "data/fp_contract_off.h"  // before any other include

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/augment.h"
#include "data/image_io.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

using namespace forge::testing;

constexpr std::array<uint8_t, 3> kTimmFill = {124, 116, 104};

// A deterministic picture, not square. RGB: channel 0 runs through every
// level (pixel index mod 256), channel 1 is a smooth diagonal gradient,
// channel 2 has hard 8-pixel checks with hashed texture. Gray: the first rows
// run through every level, the rest alternate gradient and checks. Values are
// then mapped into [lo, hi] (low-contrast pictures for autocontrast / equalize).
Image test_image(int64_t h, int64_t w, int64_t c, int lo = 0, int hi = 255) {
  Image im{h, w, c, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      const int64_t i = y * w + x;
      const auto hash = static_cast<int64_t>((static_cast<uint32_t>(i) * 2654435761u) >> 27);
      const int64_t levels = i % 256;
      const int64_t gradient =
          (x * 255 / std::max<int64_t>(w - 1, 1) + y * 255 / std::max<int64_t>(h - 1, 1)) / 2;
      const int64_t checks = ((x / 8 + y / 8) % 2 ? 220 : 30) + hash;
      int64_t v[3] = {levels, gradient, checks};
      if (c == 1) v[0] = y * w < 256 + w ? levels : ((x / 8 + y / 8) % 2 ? gradient : checks);
      for (int64_t k = 0; k < c; ++k)
        im.pixels[static_cast<size_t>(i * c + k)] =
            static_cast<uint8_t>(lo + v[k] * (hi - lo) / 255);
    }
  return im;
}

// Uniform random pixels.
Image noise_image(int64_t h, int64_t w, int64_t c, uint64_t seed) {
  Image im{h, w, c, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
  Rng rng(seed);
  for (auto& v : im.pixels) v = static_cast<uint8_t>(rng.randint(256));
  return im;
}

// A shell command's combined output and exit status.
std::string run_command(const std::string& command, int& status) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) {
    status = -1;
    return "popen failed";
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  const int rc = pclose(pipe);
  status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return output;
}

// Input pictures, our outputs and cases.txt in a temp dir, for check_augment_pil.py.
class PilCases {
 public:
  void input(const std::string& name, const Image& image) {
    write_png(dir_.file(name + ".png"), image);
    inputs_.emplace_back(name, image);
  }
  const Image& image(const std::string& name) const {
    for (const auto& [n, im] : inputs_)
      if (n == name) return im;
    throw Error("no test input " + name);
  }
  void add(const std::string& input, const std::string& op, const std::string& args,
           const Image& ours) {
    const std::string out = fmt::format("out{}.png", lines_.size());
    write_png(dir_.file(out), ours);
    lines_.push_back(fmt::format("{}.png {} {} {}", input, out, op, args));
  }
  size_t size() const { return lines_.size(); }
  // Runs the checker; its exit status, with its output in `output`.
  int check(std::string& output) const {
    forge::testing::write_file(dir_.file("cases.txt"),
                               fmt::format("{}\n", fmt::join(lines_, "\n")));
    int status = 0;
    output = run_command(fmt::format("/usr/bin/python3 {}/tests/data/check_augment_pil.py {}",
                                     FORGE_SOURCE_DIR, dir_.str()),
                         status);
    return status;
  }

 private:
  TempDir dir_;
  std::vector<std::pair<std::string, Image>> inputs_;
  std::vector<std::string> lines_;
};

std::string num(double v) {
  return fmt::format("{:.17g}", v);
}

std::string fill_args(std::array<uint8_t, 3> fill) {
  return fmt::format("{} {} {}", fill[0], fill[1], fill[2]);
}

void expect_checker_passes(const PilCases& cases) {
  std::string output;
  const int status = cases.check(output);
  if (status == 77) GTEST_SKIP() << "/usr/bin/python3 lacks PIL or numpy: " << output;
  EXPECT_EQ(status, 0) << output;
  if (status == 0) std::printf("%s", output.c_str());  // the per-op summary
}

TEST(AugmentPil, LutAndEnhanceOpsMatchPilExactly) {
  PilCases cases;
  cases.input("rgb", test_image(37, 53, 3));
  cases.input("gray", test_image(37, 53, 1));
  cases.input("rgb_low", test_image(37, 53, 3, 40, 190));
  cases.input("gray_low", test_image(37, 53, 1, 17, 201));
  cases.input("tiny", test_image(2, 5, 3, 60, 90));
  cases.input("noise", noise_image(61, 79, 3, 4));
  Rng rng(7);
  std::vector<double> factors = {0, 0.1, 0.19, 0.37, 0.5, 0.64, 1, 1.1, 1.72, 1.81, 1.9, 2.5, -0.5};
  for (int i = 0; i < 8; ++i) factors.push_back(rng.uniform(0.1, 1.9));
  for (const char* name : {"rgb", "gray", "rgb_low", "gray_low", "tiny", "noise"}) {
    const Image& im = cases.image(name);
    cases.add(name, "autocontrast", "", auto_contrast(im));
    cases.add(name, "equalize", "", equalize(im));
    cases.add(name, "invert", "", invert(im));
    for (int bits : {-1, 0, 1, 2, 3, 4, 7, 8})
      cases.add(name, "posterize", std::to_string(bits), posterize(im, bits));
    for (int t : {0, 1, 26, 128, 230, 255, 256})
      cases.add(name, "solarize", std::to_string(t), solarize(im, t));
    for (auto [add, t] : std::vector<std::pair<int, int>>{
             {0, 128}, {33, 128}, {99, 128}, {110, 128}, {50, 64}, {200, 256}})
      cases.add(name, "solarize_add", fmt::format("{} {}", add, t), solarize_add(im, add, t));
    for (double f : factors) {
      cases.add(name, "color", num(f), enhance_color(im, f));
      cases.add(name, "contrast", num(f), enhance_contrast(im, f));
      cases.add(name, "brightness", num(f), enhance_brightness(im, f));
      cases.add(name, "sharpness", num(f), enhance_sharpness(im, f));
    }
  }
  expect_checker_passes(cases);
}

TEST(AugmentPil, AffineAndRotateMatchPilExactly) {
  PilCases cases;
  cases.input("rgb", test_image(37, 53, 3));
  cases.input("gray", test_image(37, 53, 1));
  cases.input("square", test_image(16, 16, 3));
  cases.input("tiny", test_image(2, 5, 3));
  cases.input("noise", noise_image(61, 79, 3, 5));
  // timm's shears and translations (both signs, m = 9 and 10), PIL's scale
  // path (b = d = 0: translations, scalings, a mirror), its fixed-point path
  // and its double path (c beyond 32768, one column inside), the identity.
  std::vector<std::array<double, 6>> matrices = {{1, 0.3, 0, 0, 1, 0},
                                                 {1, -0.27, 0, 0, 1, 0},
                                                 {1, 0.1234, 0, 0, 1, 0},
                                                 {1, 0, 0, 0.27, 1, 0},
                                                 {1, 0, 0, -0.3, 1, 0},
                                                 {1, 0, 23.85, 0, 1, 0},
                                                 {1, 0, -21.465, 0, 1, 0},
                                                 {1, 0, 5, 0, 1, 0},
                                                 {1, 0, 0, 0, 1, -14.985},
                                                 {1, 0, 0, 0, 1, 7},
                                                 {0.9, 0.2, 3.1, -0.15, 1.1, -2.4},
                                                 {1.3, 0, -4.2, 0, 0.8, 5.5},
                                                 {-1, 0, 53, 0, 1, 0},
                                                 {0.5, 0, 10, 0, 2.5, -20},
                                                 {1000, 0.3, -40480, 0.01, 1, 0},
                                                 {1, 0, 0, 0, 1, 0}};
  std::vector<double> angles = {0,  9,   -9,  17.3, -27,   30,  -30,   45,
                                90, -90, 180, 270,  123.4, 360, -360.5};
  // timm's random levels: rotations in [-30, 30], shears in [-0.3, 0.3],
  // translations up to 0.45 of the side.
  Rng rng(3);
  for (int i = 0; i < 6; ++i) {
    angles.push_back(rng.uniform(-30, 30));
    matrices.push_back({1, rng.uniform(-0.3, 0.3), 0, 0, 1, 0});
    matrices.push_back({1, 0, 0, rng.uniform(-0.3, 0.3), 1, 0});
    matrices.push_back({1, 0, rng.uniform(-24, 24), 0, 1, rng.uniform(-17, 17)});
  }
  for (const char* name : {"rgb", "gray", "square", "tiny", "noise"}) {
    const Image& im = cases.image(name);
    for (Interpolation interp :
         {Interpolation::nearest, Interpolation::bilinear, Interpolation::bicubic}) {
      for (size_t k = 0; k < matrices.size(); ++k) {
        const auto& m = matrices[k];
        const std::array<uint8_t, 3> fill =
            k % 4 == 3 ? std::array<uint8_t, 3>{0, 255, 7} : kTimmFill;
        cases.add(name, "affine",
                  fmt::format("{} {} {}", interpolation_name(interp),
                              fmt::join(std::vector<std::string>{num(m[0]), num(m[1]), num(m[2]),
                                                                 num(m[3]), num(m[4]), num(m[5])},
                                        " "),
                              fill_args(fill)),
                  affine(im, m, interp, fill));
      }
      for (double deg : angles)
        cases.add(
            name, "rotate",
            fmt::format("{} {} {}", interpolation_name(interp), num(deg), fill_args(kTimmFill)),
            rotate(im, deg, interp, kTimmFill));
    }
  }
  expect_checker_passes(cases);
}

TEST(AugmentPil, AdjustHueMatchesTorchvisionOnPil) {
  PilCases cases;
  cases.input("rgb", test_image(37, 53, 3));
  cases.input("rgb_low", test_image(37, 53, 3, 40, 190));
  cases.input("gray", test_image(37, 53, 1));
  cases.input("noise", noise_image(61, 79, 3, 6));
  for (const char* name : {"rgb", "rgb_low", "gray", "noise"})
    for (double hue : {-0.5, -0.37, -0.1, -0.01, -0.003, 0.0, 0.004, 0.05, 0.25, 0.4999, 0.5})
      cases.add(name, "adjust_hue", num(hue), adjust_hue(cases.image(name), hue));
  expect_checker_passes(cases);
}

TEST(AugmentPil, CheckerCatchesAOneLevelError) {
  PilCases cases;
  cases.input("rgb", test_image(37, 53, 3));
  Image wrong = invert(cases.image("rgb"));
  wrong.pixels[100] ^= 1;
  cases.add("rgb", "invert", "", wrong);
  std::string output;
  const int status = cases.check(output);
  if (status == 77) GTEST_SKIP() << "/usr/bin/python3 lacks PIL or numpy: " << output;
  EXPECT_EQ(status, 1) << output;
  EXPECT_NE(output.find("MISMATCH"), std::string::npos) << output;
}

// ---- RandAugment against timm's definition ----

const std::vector<std::string> kTimmRandTransforms = {
    "AutoContrast", "Equalize",    "Invert", "Rotate",        "Posterize",
    "Solarize",     "SolarizeAdd", "Color",  "Contrast",      "Brightness",
    "Sharpness",    "ShearX",      "ShearY", "TranslateXRel", "TranslateYRel"};
const std::vector<std::string> kTimmRandIncreasingTransforms = {"AutoContrast",
                                                                "Equalize",
                                                                "Invert",
                                                                "Rotate",
                                                                "PosterizeIncreasing",
                                                                "SolarizeIncreasing",
                                                                "SolarizeAdd",
                                                                "ColorIncreasing",
                                                                "ContrastIncreasing",
                                                                "BrightnessIncreasing",
                                                                "SharpnessIncreasing",
                                                                "ShearX",
                                                                "ShearY",
                                                                "TranslateXRel",
                                                                "TranslateYRel"};

// timm's _randomly_negate.
double randomly_negate(double v, Rng& rng) {
  return rng.uniform() > 0.5 ? -v : v;
}

// timm's AugmentOp after its noise: LEVEL_TO_ARG[name](magnitude), then NAME_TO_OP[name].
Image timm_op(const Image& img, const std::string& name, double magnitude,
              const RandAugmentOptions& o, Rng& rng) {
  const double level = magnitude / 10.0;  // level / _LEVEL_DENOM
  const auto transform = [&](std::array<double, 6> m) {
    return affine(img, m, o.interpolation, o.fill);
  };
  const auto enhance_increasing = [&] {
    return std::max(0.1, 1.0 + randomly_negate(level * .9, rng));
  };
  const int posterize_bits = static_cast<int>(level * 4);
  const int solarize_thresh = std::min(256, static_cast<int>(level * 256));
  if (name == "AutoContrast") return auto_contrast(img);
  if (name == "Equalize") return equalize(img);
  if (name == "Invert") return invert(img);
  if (name == "Rotate")
    return rotate(img, randomly_negate(level * 30., rng), o.interpolation, o.fill);
  if (name == "Posterize") return posterize_bits >= 8 ? img : posterize(img, posterize_bits);
  if (name == "PosterizeIncreasing") return posterize(img, 4 - posterize_bits);
  if (name == "Solarize") return solarize(img, solarize_thresh);
  if (name == "SolarizeIncreasing") return solarize(img, 256 - solarize_thresh);
  if (name == "SolarizeAdd")
    return solarize_add(img, std::min(128, static_cast<int>(level * 110)), 128);
  if (name == "Color") return enhance_color(img, level * 1.8 + 0.1);
  if (name == "ColorIncreasing") return enhance_color(img, enhance_increasing());
  if (name == "Contrast") return enhance_contrast(img, level * 1.8 + 0.1);
  if (name == "ContrastIncreasing") return enhance_contrast(img, enhance_increasing());
  if (name == "Brightness") return enhance_brightness(img, level * 1.8 + 0.1);
  if (name == "BrightnessIncreasing") return enhance_brightness(img, enhance_increasing());
  if (name == "Sharpness") return enhance_sharpness(img, level * 1.8 + 0.1);
  if (name == "SharpnessIncreasing") return enhance_sharpness(img, enhance_increasing());
  if (name == "ShearX") return transform({1, randomly_negate(level * 0.3, rng), 0, 0, 1, 0});
  if (name == "ShearY") return transform({1, 0, 0, randomly_negate(level * 0.3, rng), 1, 0});
  if (name == "TranslateXRel") {
    const double pct = randomly_negate(level * o.translate_pct, rng);
    return transform({1, 0, pct * static_cast<double>(img.width), 0, 1, 0});
  }
  if (name == "TranslateYRel") {
    const double pct = randomly_negate(level * o.translate_pct, rng);
    return transform({1, 0, 0, 0, 1, pct * static_cast<double>(img.height)});
  }
  ADD_FAILURE() << "no reference for op " << name;
  return img;
}

// timm's RandAugment.__call__ (choice with replacement) and AugmentOp.__call__
// (the prob test, the magnitude noise and its clipping), our Rng for random.
Image timm_rand_augment(Image img, const RandAugmentOptions& o, Rng& rng) {
  const auto& names = o.increasing ? kTimmRandIncreasingTransforms : kTimmRandTransforms;
  for (int slot = 0; slot < o.num_ops; ++slot) {
    const std::string& name = names[static_cast<size_t>(rng.randint(15))];
    if (rng.uniform() > o.prob) continue;
    double magnitude = o.magnitude;
    if (o.magnitude_std > 0) {
      if (std::isinf(o.magnitude_std))
        magnitude = rng.uniform(0, magnitude);
      else
        magnitude = magnitude + rng.normal() * o.magnitude_std;  // random.gauss(m, mstd)
    }
    magnitude = std::max(0., std::min(magnitude, o.magnitude_max));
    img = timm_op(img, name, magnitude, o, rng);
  }
  return img;
}

std::vector<RandAugmentOptions> option_sets() {
  std::vector<RandAugmentOptions> sets(5);
  sets[1].increasing = false;
  sets[1].prob = 1;
  sets[1].interpolation = Interpolation::nearest;
  sets[2].magnitude_std = std::numeric_limits<double>::infinity();
  sets[2].interpolation = Interpolation::bilinear;
  sets[2].num_ops = 3;
  sets[3].magnitude_std = 0;
  sets[3].magnitude = 12;
  sets[3].magnitude_max = 15;
  sets[3].num_ops = 4;
  sets[3].prob = 0.8;
  sets[4].magnitude_std = 2;
  sets[4].translate_pct = 0.3;
  sets[4].fill = {0, 255, 7};
  sets[4].increasing = false;
  return sets;
}

TEST(RandAugment, MatchesTimmsDefinition) {
  const std::vector<Image> images = {test_image(37, 53, 3), test_image(37, 53, 1),
                                     test_image(24, 20, 3, 40, 190)};
  int changed = 0, total = 0;
  for (const auto& o : option_sets())
    for (const Image& image : images)
      for (uint64_t seed = 0; seed < 40; ++seed) {
        Rng ours_rng(Rng::mix({seed, 11})), ref_rng(Rng::mix({seed, 11}));
        Image ours = image;
        rand_augment(ours, o, ours_rng);
        const Image ref = timm_rand_augment(image, o, ref_rng);
        ASSERT_EQ(ours.pixels, ref.pixels) << rand_augment_spec(o) << " seed " << seed;
        ASSERT_EQ(ours_rng.counter(), ref_rng.counter())
            << rand_augment_spec(o) << " seed " << seed;
        changed += ours.pixels != image.pixels;
        ++total;
      }
  EXPECT_GT(changed, total / 2);  // the comparison is not between untouched images
}

TEST(RandAugment, ProbZeroLeavesTheImage) {
  RandAugmentOptions o;
  o.prob = 0;
  o.num_ops = 4;
  const Image image = test_image(37, 53, 3);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    Image out = image;
    Rng rng(seed);
    rand_augment(out, o, rng);
    EXPECT_EQ(out.pixels, image.pixels) << "seed " << seed;
  }
}

// m = 9, no noise: each op's argument as timm's level function gives it,
// written out by hand; sign 1 or -1 is what the op's one uniform says.
Image expected_at_m9(const Image& im, const std::string& name, double sign,
                     const RandAugmentOptions& o) {
  const auto geo = [&](std::array<double, 6> m) { return affine(im, m, o.interpolation, o.fill); };
  if (name == "AutoContrast") return auto_contrast(im);
  if (name == "Equalize") return equalize(im);
  if (name == "Invert") return invert(im);
  if (name == "Rotate") return rotate(im, sign * 27.0, o.interpolation, o.fill);
  if (name == "Posterize") return posterize(im, 3);             // int(0.9 * 4)
  if (name == "PosterizeIncreasing") return posterize(im, 1);   // 4 - 3
  if (name == "Solarize") return solarize(im, 230);             // int(0.9 * 256)
  if (name == "SolarizeIncreasing") return solarize(im, 26);    // 256 - 230
  if (name == "SolarizeAdd") return solarize_add(im, 99, 128);  // int(0.9 * 110)
  if (name == "Color") return enhance_color(im, 1.72);          // 0.9 * 1.8 + 0.1
  if (name == "Contrast") return enhance_contrast(im, 1.72);
  if (name == "Brightness") return enhance_brightness(im, 1.72);
  if (name == "Sharpness") return enhance_sharpness(im, 1.72);
  const double inc = sign > 0 ? 1.81 : 0.19;  // 1 +- 0.9 * 0.9
  if (name == "ColorIncreasing") return enhance_color(im, inc);
  if (name == "ContrastIncreasing") return enhance_contrast(im, inc);
  if (name == "BrightnessIncreasing") return enhance_brightness(im, inc);
  if (name == "SharpnessIncreasing") return enhance_sharpness(im, inc);
  if (name == "ShearX") return geo({1, sign * 0.27, 0, 0, 1, 0});
  if (name == "ShearY") return geo({1, 0, 0, sign * 0.27, 1, 0});
  if (name == "TranslateXRel") return geo({1, 0, sign * 21.465, 0, 1, 0});  // 0.405 * 53
  if (name == "TranslateYRel") return geo({1, 0, 0, 0, 1, sign * 14.985});  // 0.405 * 37
  ADD_FAILURE() << "no expectation for " << name;
  return im;
}

TEST(RandAugment, LevelsAreTimmsAtAFixedMagnitude) {
  const Image image = test_image(37, 53, 3, 40, 250);  // every op at m = 9 changes it
  const std::set<std::string> signed_ops = {"Rotate",
                                            "ShearX",
                                            "ShearY",
                                            "TranslateXRel",
                                            "TranslateYRel",
                                            "ColorIncreasing",
                                            "ContrastIncreasing",
                                            "BrightnessIncreasing",
                                            "SharpnessIncreasing"};
  for (bool increasing : {false, true})
    for (const std::string& name : rand_augment_ops(increasing))
      for (uint64_t seed : {1, 2, 3, 4}) {
        RandAugmentOptions o;
        o.interpolation = seed % 2 ? Interpolation::bicubic : Interpolation::nearest;
        Rng peek(seed);
        const double sign = peek.uniform() > 0.5 ? -1 : 1;
        Image out = image;
        Rng rng(seed);
        apply_augment_op(out, name, 9, o, rng);
        EXPECT_EQ(out.pixels, expected_at_m9(image, name, sign, o).pixels)
            << name << " seed " << seed;
        EXPECT_TRUE(out.pixels != image.pixels) << name << " left the image unchanged";
        EXPECT_EQ(rng.counter(), signed_ops.count(name) ? 2u : 0u) << name;
      }
}

TEST(RandAugment, EveryOpIsReachableWithItsExactMagnitude) {
  // prob 1, mstd 0: each slot is the drawn op at exactly m (no noise draw).
  const Image image = test_image(37, 53, 3, 40, 250);
  for (bool increasing : {false, true}) {
    RandAugmentOptions o{.num_ops = 1, .magnitude_std = 0, .prob = 1, .increasing = increasing};
    const auto names = rand_augment_ops(increasing);
    std::vector<int> hits(names.size(), 0);
    for (uint64_t seed = 0; seed < 600; ++seed) {
      Image out = image;
      Rng rng(seed);
      rand_augment(out, o, rng);
      Rng redraw(seed);
      const auto k = static_cast<size_t>(redraw.randint(15));
      redraw.uniform();
      Image expected = image;
      apply_augment_op(expected, names[k], 9, o, redraw);
      ASSERT_EQ(out.pixels, expected.pixels) << names[k] << " seed " << seed;
      EXPECT_TRUE(out.pixels != image.pixels) << names[k] << " left the image unchanged";
      ++hits[k];
    }
    for (size_t k = 0; k < names.size(); ++k) {
      EXPECT_GT(hits[k], 20) << names[k] << " (" << hits[k] << " of 600)";
      EXPECT_LT(hits[k], 60) << names[k] << " (" << hits[k] << " of 600)";
    }
  }
}

TEST(RandAugment, DeterministicPerSeed) {
  const Image image = test_image(37, 53, 3);
  const RandAugmentOptions o;
  std::vector<std::vector<uint8_t>> distinct;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Image a = image, b = image;
    Rng ra(seed), rb(seed);
    rand_augment(a, o, ra);
    rand_augment(b, o, rb);
    EXPECT_EQ(a.pixels, b.pixels) << "seed " << seed;
    if (std::find(distinct.begin(), distinct.end(), a.pixels) == distinct.end())
      distinct.push_back(a.pixels);
  }
  EXPECT_GT(distinct.size(), 10u);
}

TEST(RandAugment, OpSetsAreTimms) {
  EXPECT_EQ(rand_augment_ops(false), kTimmRandTransforms);
  EXPECT_EQ(rand_augment_ops(true), kTimmRandIncreasingTransforms);
}

TEST(RandAugment, RejectsBadOpsAndOptions) {
  Image image = test_image(8, 8, 3);
  Rng rng(1);
  RandAugmentOptions o;
  expect_error([&] { apply_augment_op(image, "Cutout", 9, o, rng); }, {"Cutout", "ShearX"});
  o.prob = 1.5;
  expect_error([&] { rand_augment(image, o, rng); }, {"prob", "1.5"});
  o = {};
  o.magnitude_max = 0;
  expect_error([&] { rand_augment(image, o, rng); }, {"magnitude_max"});
  Image bad{2, 2, 4, std::vector<uint8_t>(16)};
  expect_error([&] { rand_augment(bad, RandAugmentOptions{}, rng); }, {"channels", "4"});
}

// ---- parse_rand_augment ----

TEST(RandAugmentSpec, ParsesDeitsString) {
  const RandAugmentOptions o = parse_rand_augment("rand-m9-mstd0.5-inc1");
  EXPECT_EQ(o.magnitude, 9);
  EXPECT_EQ(o.magnitude_std, 0.5);
  EXPECT_TRUE(o.increasing);
  EXPECT_EQ(o.num_ops, 2);
  EXPECT_EQ(o.prob, 0.5);
  EXPECT_EQ(o.magnitude_max, 10);
  EXPECT_EQ(o.interpolation, Interpolation::bicubic);
  EXPECT_EQ(o.fill, kTimmFill);
  EXPECT_EQ(o.translate_pct, 0.45);
}

TEST(RandAugmentSpec, DefaultsAreTimms) {
  const RandAugmentOptions o = parse_rand_augment("rand");
  EXPECT_EQ(o.magnitude, 10);
  EXPECT_EQ(o.num_ops, 2);
  EXPECT_EQ(o.magnitude_std, 0);
  EXPECT_EQ(o.magnitude_max, 10);
  EXPECT_FALSE(o.increasing);
  EXPECT_EQ(o.prob, 0.5);
}

TEST(RandAugmentSpec, ParsesEveryPartAndRoundTrips) {
  const RandAugmentOptions o = parse_rand_augment("rand-n3-m7.5-mstd101-mmax12-inc0-p0.7");
  EXPECT_EQ(o.num_ops, 3);
  EXPECT_EQ(o.magnitude, 7.5);
  EXPECT_TRUE(std::isinf(o.magnitude_std));  // timm: mstd > 100 is uniform sampling
  EXPECT_EQ(o.magnitude_max, 12);
  EXPECT_FALSE(o.increasing);
  EXPECT_EQ(o.prob, 0.7);
  for (const std::string spec :
       {"rand-m9-mstd0.5-inc1", "rand-n3-m7.5-mstd101-mmax12-inc0-p0.7", "rand", "rand-p1-m0"}) {
    const RandAugmentOptions a = parse_rand_augment(spec);
    const RandAugmentOptions b = parse_rand_augment(rand_augment_spec(a));
    EXPECT_EQ(b.magnitude, a.magnitude) << spec;
    EXPECT_EQ(b.num_ops, a.num_ops) << spec;
    EXPECT_EQ(b.magnitude_std, a.magnitude_std) << spec;
    EXPECT_EQ(b.magnitude_max, a.magnitude_max) << spec;
    EXPECT_EQ(b.increasing, a.increasing) << spec;
    EXPECT_EQ(b.prob, a.prob) << spec;
  }
  EXPECT_EQ(rand_augment_spec(parse_rand_augment("rand-m9-mstd0.5-inc1")),
            "rand-m9-n2-mstd0.5-mmax10-inc1-p0.5");
}

TEST(RandAugmentSpec, RejectsUnknownAndMalformedParts) {
  const std::vector<std::pair<std::string, std::string>> bad = {{"rand-x3", "\"x3\""},
                                                                {"rand-m", "\"m\""},
                                                                {"auto-m9", "\"rand\""},
                                                                {"", "\"rand\""},
                                                                {"rand-m9-", "\"\""},
                                                                {"rand-mx", "\"mx\""},
                                                                {"rand-n2.5", "\"n2.5\""},
                                                                {"rand-inc2", "\"inc2\""},
                                                                {"rand-p1.5", "prob"},
                                                                {"rand-m9-m8", "\"m8\""},
                                                                {"rand-tweights", "\"tweights\""},
                                                                {"rand-m9x", "\"m9x\""},
                                                                {"rand-mmax0", "mmax"},
                                                                {"rand-mstd", "\"mstd\""}};
  for (const auto& [spec, part] : bad) {
    const std::string& s = spec;  // clang's C++20 lambdas cannot capture a structured binding
    expect_error([&] { parse_rand_augment(s); }, {part, "\"" + s + "\""});
  }
}

// ---- colour jitter ----

struct Jitter {
  std::vector<int> order;
  double brightness = 1, contrast = 1, saturation = 1, hue = 0;
};

// torchvision's ColorJitter.get_params and forward, with our Rng.
Image reference_jitter(Image img, const ColorJitterOptions& o, Rng& rng, Jitter& d) {
  d.order = {0, 1, 2, 3};
  rng.shuffle(d.order);
  const auto draw = [&](double v) { return rng.uniform(std::max(0.0, 1 - v), 1 + v); };
  if (o.brightness > 0) d.brightness = draw(o.brightness);
  if (o.contrast > 0) d.contrast = draw(o.contrast);
  if (o.saturation > 0) d.saturation = draw(o.saturation);
  if (o.hue > 0) d.hue = rng.uniform(-o.hue, o.hue);
  for (int k : d.order) {
    if (k == 0 && o.brightness > 0) img = enhance_brightness(img, d.brightness);
    if (k == 1 && o.contrast > 0) img = enhance_contrast(img, d.contrast);
    if (k == 2 && o.saturation > 0) img = enhance_color(img, d.saturation);
    if (k == 3 && o.hue > 0) img = adjust_hue(img, d.hue);
  }
  return img;
}

TEST(ColorJitter, IsTheFourAdjustmentsInADrawnOrder) {
  const std::vector<ColorJitterOptions> sets = {
      {0.4, 0.4, 0.4, 0}, {0.3, 0.2, 0.5, 0.1}, {0, 0, 0, 0.5}, {0, 1.5, 0, 0}, {2, 0, 0.8, 0.02}};
  const std::vector<Image> images = {test_image(37, 53, 3), test_image(37, 53, 1)};
  std::set<int> firsts;
  for (const auto& o : sets)
    for (const Image& image : images)
      for (uint64_t seed = 0; seed < 40; ++seed) {
        Rng rng(seed), ref_rng(seed);
        Image out = image;
        color_jitter(out, o, rng);
        Jitter d;
        const Image ref = reference_jitter(image, o, ref_rng, d);
        ASSERT_EQ(out.pixels, ref.pixels) << "seed " << seed;
        EXPECT_EQ(rng.counter(), ref_rng.counter());
        EXPECT_TRUE(std::is_permutation(d.order.begin(), d.order.end(),
                                        std::vector<int>{0, 1, 2, 3}.begin()));
        firsts.insert(d.order[0]);
        const auto in_range = [](double f, double v) {
          return v == 0 ? f == 1 : f >= std::max(0.0, 1 - v) && f <= 1 + v;
        };
        EXPECT_TRUE(in_range(d.brightness, o.brightness)) << d.brightness;
        EXPECT_TRUE(in_range(d.contrast, o.contrast)) << d.contrast;
        EXPECT_TRUE(in_range(d.saturation, o.saturation)) << d.saturation;
        EXPECT_LE(std::abs(d.hue), o.hue);
      }
  EXPECT_EQ(firsts.size(), 4u);  // every adjustment comes first sometimes
}

TEST(ColorJitter, OffDrawsNothingAndBadOptionsThrow) {
  const Image image = test_image(10, 12, 3);
  Image out = image;
  Rng rng(3);
  color_jitter(out, ColorJitterOptions{}, rng);
  EXPECT_EQ(out.pixels, image.pixels);
  EXPECT_EQ(rng.counter(), 0u);
  EXPECT_FALSE(ColorJitterOptions{}.any());
  EXPECT_TRUE((ColorJitterOptions{0, 0, 0, 0.1}.any()));
  expect_error([&] { color_jitter(out, {0, 0, 0, 0.6}, rng); }, {"hue", "0.6"});
  expect_error([&] { color_jitter(out, {-0.1, 0, 0, 0}, rng); }, {"brightness", "-0.1"});
  expect_error([&] { adjust_hue(image, 0.7); }, {"hue_factor", "0.7"});
  const Image gray = test_image(10, 12, 1);
  EXPECT_EQ(adjust_hue(gray, 0.3).pixels, gray.pixels);
}

// ---- random erasing ----

// Python's round(): half to even, written out.
int64_t round_half_even(double x) {
  double r = std::floor(x + 0.5);
  if (r - x == 0.5 && std::fmod(r, 2.0) != 0) r -= 1;
  return static_cast<int64_t>(r);
}

// timm's RandomErasing._erase on a [C, H, W] vector, with our Rng.
void reference_erasing(std::vector<float>& img, int64_t chan, int64_t img_h, int64_t img_w,
                       const RandomErasingOptions& o, Rng& rng) {
  if (rng.uniform() > o.prob) return;
  const double area = static_cast<double>(img_h * img_w);
  const int64_t count =
      o.min_count == o.max_count ? o.min_count : rng.randint(o.min_count, o.max_count);
  const double max_aspect = o.max_aspect == 0 ? 1 / o.min_aspect : o.max_aspect;
  const double log_lo = std::log(o.min_aspect), log_hi = std::log(max_aspect);
  for (int64_t n = 0; n < count; ++n)
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double target_area =
          rng.uniform(o.min_area, o.max_area) * area / static_cast<double>(count);
      const double aspect_ratio = std::exp(rng.uniform(log_lo, log_hi));
      const int64_t h = round_half_even(std::sqrt(target_area * aspect_ratio));
      const int64_t w = round_half_even(std::sqrt(target_area / aspect_ratio));
      if (w < img_w && h < img_h) {
        const int64_t top = rng.randint(0, img_h - h);
        const int64_t left = rng.randint(0, img_w - w);
        for (int64_t c = 0; c < chan; ++c) {
          const float channel_value =
              o.mode == EraseMode::rand ? static_cast<float>(rng.normal()) : 0.0f;
          for (int64_t y = top; y < top + h; ++y)
            for (int64_t x = left; x < left + w; ++x)
              img[static_cast<size_t>((c * img_h + y) * img_w + x)] =
                  o.mode == EraseMode::pixel ? static_cast<float>(rng.normal()) : channel_value;
        }
        break;
      }
    }
}

Tensor constant_image(int64_t c, int64_t h, int64_t w, float value) {
  return Tensor::full({c, h, w}, value);
}

TEST(RandomErasing, MatchesTimmsDefinition) {
  std::vector<RandomErasingOptions> sets(5);
  sets[0].prob = 1;
  sets[1].mode = EraseMode::constant;
  sets[1].prob = 0.7;
  sets[2].mode = EraseMode::rand;
  sets[2].prob = 1;
  sets[2].max_count = 4;
  sets[3].min_count = 2;
  sets[3].max_count = 3;
  sets[3].prob = 1;
  sets[3].max_aspect = 2;
  sets[4].min_area = 0.3;
  sets[4].max_area = 0.9;
  sets[4].prob = 1;
  int erased = 0, total = 0;
  for (const auto& o : sets)
    for (uint64_t seed = 0; seed < 60; ++seed) {
      Tensor t = constant_image(3, 19, 27, 5.0f);
      Rng rng(seed), ref_rng(seed);
      random_erasing(t, o, rng);
      std::vector<float> ref(3 * 19 * 27, 5.0f);
      reference_erasing(ref, 3, 19, 27, o, ref_rng);
      ASSERT_EQ(t.to_vector<float>(), ref) << "seed " << seed;
      EXPECT_EQ(rng.counter(), ref_rng.counter());
      erased += ref != std::vector<float>(ref.size(), 5.0f);
      ++total;
    }
  EXPECT_GT(erased, total / 2);
}

// The erased rectangle of one channel of an image that was all 5: (h, w), and
// whether the changed values form exactly that rectangle.
struct Region {
  int64_t top = 0, left = 0, h = 0, w = 0, changed = 0;
};
Region erased_region(const std::vector<float>& v, int64_t channel, int64_t hgt, int64_t wid) {
  int64_t y0 = hgt, y1 = -1, x0 = wid, x1 = -1;
  Region r;
  for (int64_t y = 0; y < hgt; ++y)
    for (int64_t x = 0; x < wid; ++x)
      if (v[static_cast<size_t>((channel * hgt + y) * wid + x)] != 5.0f) {
        y0 = std::min(y0, y), y1 = std::max(y1, y), x0 = std::min(x0, x), x1 = std::max(x1, x);
        ++r.changed;
      }
  if (r.changed) r = {y0, x0, y1 - y0 + 1, x1 - x0 + 1, r.changed};
  return r;
}

TEST(RandomErasing, ModesFillAsDocumented) {
  for (EraseMode mode : {EraseMode::constant, EraseMode::rand, EraseMode::pixel}) {
    RandomErasingOptions o;
    o.prob = 1;
    o.mode = mode;
    for (uint64_t seed = 0; seed < 30; ++seed) {
      Tensor t = constant_image(3, 32, 32, 5.0f);
      Rng rng(seed);
      random_erasing(t, o, rng);
      const auto v = t.to_vector<float>();
      const Region r0 = erased_region(v, 0, 32, 32);
      ASSERT_GT(r0.changed, 0) << "seed " << seed;
      EXPECT_EQ(r0.changed, r0.h * r0.w);  // a rectangle
      std::set<float> values;
      for (int64_t c = 0; c < 3; ++c) {
        const Region r = erased_region(v, c, 32, 32);
        EXPECT_EQ(r.top, r0.top);
        EXPECT_EQ(r.h, r0.h);
        EXPECT_EQ(r.w, r0.w);
        std::set<float> channel_values;
        for (int64_t y = r.top; y < r.top + r.h; ++y)
          for (int64_t x = r.left; x < r.left + r.w; ++x)
            channel_values.insert(v[static_cast<size_t>((c * 32 + y) * 32 + x)]);
        if (mode == EraseMode::constant) {
          EXPECT_EQ(channel_values, std::set<float>{0.0f});
        } else if (mode == EraseMode::rand) {
          EXPECT_EQ(channel_values.size(), 1u);
        } else {
          EXPECT_GT(channel_values.size(), static_cast<size_t>(r.h * r.w / 2));
        }
        values.insert(channel_values.begin(), channel_values.end());
      }
      if (mode == EraseMode::rand) {
        EXPECT_EQ(values.size(), 3u);  // one value per channel
      }
    }
  }
}

TEST(RandomErasing, ProbZeroAndOne) {
  for (double prob : {0.0, 1.0}) {
    RandomErasingOptions o;
    o.prob = prob;
    o.mode = EraseMode::constant;
    int changed = 0;
    for (uint64_t seed = 0; seed < 300; ++seed) {
      Tensor t = constant_image(1, 24, 24, 5.0f);
      Rng rng(seed);
      random_erasing(t, o, rng);
      changed += erased_region(t.to_vector<float>(), 0, 24, 24).changed > 0;
    }
    EXPECT_EQ(changed, prob == 0 ? 0 : 300) << "prob " << prob;
  }
}

TEST(RandomErasing, ErasedAreaFollowsTheRange) {
  // Per draw, the rectangle's unrounded sides (within 0.5 of h and w) give an
  // area in [min_area, max_area] of the image and an aspect h / w in [0.3, 1 /
  // 0.3]; over many draws the mean area fraction is near the middle of the
  // range (attempts whose rectangle does not fit are redrawn, which trims the
  // large, elongated ones a little).
  RandomErasingOptions o;
  o.prob = 1;
  o.mode = EraseMode::constant;
  const int64_t side = 64;
  const double area = side * side;
  double sum = 0, lo = 1, hi = 0;
  const int draws = 2000;
  for (uint64_t seed = 0; seed < draws; ++seed) {
    Tensor t = constant_image(1, side, side, 5.0f);
    Rng rng(seed);
    random_erasing(t, o, rng);
    const Region r = erased_region(t.to_vector<float>(), 0, side, side);
    ASSERT_EQ(r.changed, r.h * r.w) << "seed " << seed;
    const double h = static_cast<double>(r.h), w = static_cast<double>(r.w);
    EXPECT_GE((h + 0.5) * (w + 0.5), o.min_area * area) << "seed " << seed;
    EXPECT_LE((h - 0.5) * (w - 0.5), o.max_area * area) << "seed " << seed;
    EXPECT_GE((h + 0.5) / (w - 0.5), o.min_aspect) << "seed " << seed;
    EXPECT_LE((h - 0.5) / (w + 0.5), 1 / o.min_aspect) << "seed " << seed;
    const double fraction = h * w / area;
    sum += fraction;
    lo = std::min(lo, fraction);
    hi = std::max(hi, fraction);
  }
  const double mean = sum / draws;
  EXPECT_GT(mean, 0.15);
  EXPECT_LT(mean, 0.19);
  EXPECT_LT(lo, 0.03);  // both ends of [0.02, 1/3] are reached
  EXPECT_GT(hi, 0.30);
}

TEST(RandomErasing, DeterministicPerSeedAndChecked) {
  RandomErasingOptions o;
  o.prob = 1;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    Tensor a = constant_image(3, 16, 16, 5.0f), b = constant_image(3, 16, 16, 5.0f);
    Rng ra(seed), rb(seed);
    random_erasing(a, o, ra);
    random_erasing(b, o, rb);
    EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  }
  Tensor t = constant_image(3, 16, 16, 5.0f);
  Rng rng(1);
  RandomErasingOptions bad;
  bad.prob = 1.5;
  expect_error([&] { random_erasing(t, bad, rng); }, {"prob", "1.5"});
  bad = {};
  bad.min_area = 0;
  expect_error([&] { random_erasing(t, bad, rng); }, {"min_area"});
  bad = {};
  bad.min_aspect = 0;
  expect_error([&] { random_erasing(t, bad, rng); }, {"min_aspect"});
  bad = {};
  bad.max_count = 0;
  expect_error([&] { random_erasing(t, bad, rng); }, {"max_count"});
  Tensor flat = Tensor::full({16, 16}, 1.0);
  expect_error([&] { random_erasing(flat, RandomErasingOptions{}, rng); }, {"[C, H, W]"});
}

}  // namespace
}  // namespace forge::data
