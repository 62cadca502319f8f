#include "data/fashion_mnist.h"

#include <filesystem>

#include "core/error.h"
#include "data/idx.h"

namespace forge::data {

namespace {

const char* kHint =
    "install the Debian package dataset-fashion-mnist (it puts the files in "
    "/usr/share/datasets/fashion-mnist) or set the recipe key data.root to a directory holding "
    "them";

// "<root>/<stem>.gz", else "<root>/<stem>".
std::string find_file(const std::string& root, const std::string& stem) {
  namespace fs = std::filesystem;
  const fs::path gz = fs::path(root) / (stem + ".gz"), plain = fs::path(root) / stem;
  if (fs::is_regular_file(gz)) return gz.string();
  if (fs::is_regular_file(plain)) return plain.string();
  FORGE_FAIL("Fashion-MNIST: neither '{}' nor '{}' exists; {}", gz.string(), plain.string(), kHint);
}

}  // namespace

FashionMnist::FashionMnist(FashionMnistOptions options) : options_(std::move(options)) {
  const std::string& split = options_.split;
  FORGE_CHECK(split == "train" || split == "test",
              "Fashion-MNIST: split must be 'train' or 'test', got '{}'", split);
  FORGE_CHECK(std::filesystem::is_directory(options_.root),
              "Fashion-MNIST: directory '{}' does not exist; {}", options_.root, kHint);
  FORGE_CHECK(!options_.normalize || options_.std > 0,
              "Fashion-MNIST: std must be positive to normalise, got {}", options_.std);
  FORGE_CHECK(options_.random_crop_padding >= 0,
              "Fashion-MNIST: random_crop_padding must be >= 0, got {}",
              options_.random_crop_padding);

  const std::string prefix = split == "train" ? "train" : "t10k";
  images_path_ = find_file(options_.root, prefix + "-images-idx3-ubyte");
  labels_path_ = find_file(options_.root, prefix + "-labels-idx1-ubyte");

  IdxArray images = read_idx(images_path_);
  FORGE_CHECK(images.dims.size() == 3,
              "Fashion-MNIST: '{}' should hold images [N, H, W] (magic 0x00000803), found {} "
              "dimensions {}",
              images_path_, images.dims.size(), images.dims);
  IdxArray labels = read_idx(labels_path_);
  FORGE_CHECK(labels.dims.size() == 1,
              "Fashion-MNIST: '{}' should hold labels [N] (magic 0x00000801), found {} dimensions "
              "{}",
              labels_path_, labels.dims.size(), labels.dims);
  FORGE_CHECK(images.dims[0] == labels.dims[0],
              "Fashion-MNIST: '{}' holds {} images but '{}' holds {} labels", images_path_,
              images.dims[0], labels_path_, labels.dims[0]);
  for (size_t i = 0; i < labels.data.size(); ++i)
    FORGE_CHECK(labels.data[i] < 10, "Fashion-MNIST: '{}' has label {} at index {}, expected 0..9",
                labels_path_, labels.data[i], i);

  height_ = images.dims[1];
  width_ = images.dims[2];
  images_ = std::move(images.data);
  labels_ = std::move(labels.data);
  for (int v = 0; v < 256; ++v) {
    const double x = v / 255.0;
    lut_[static_cast<size_t>(v)] =
        static_cast<float>(options_.normalize ? (x - options_.mean) / options_.std : x);
  }
}

int64_t FashionMnist::label(int64_t i) const {
  FORGE_CHECK(i >= 0 && i < size(), "Fashion-MNIST: index {} out of range [0, {})", i, size());
  return labels_[static_cast<size_t>(i)];
}

const uint8_t* FashionMnist::pixels(int64_t i) const {
  FORGE_CHECK(i >= 0 && i < size(), "Fashion-MNIST: index {} out of range [0, {})", i, size());
  return images_.data() + i * height_ * width_;
}

Example FashionMnist::get(int64_t i, Rng* rng) const {
  const uint8_t* src = pixels(i);
  const int64_t H = height_, W = width_;
  Example ex;
  ex.label = labels_[static_cast<size_t>(i)];
  ex.input = Tensor::empty({1, H, W}, DType::f32);
  float* dst = ex.input.data<float>();

  int64_t dy = 0, dx = 0;  // source pixel of output (y, x) is (y + dy, x + dx) before flipping
  bool flip = false;
  if (rng) {
    const int64_t p = options_.random_crop_padding;
    if (p > 0) {
      dy = rng->randint(2 * p + 1) - p;
      dx = rng->randint(2 * p + 1) - p;
    }
    if (options_.hflip) flip = rng->bernoulli(0.5);
  }
  if (dy == 0 && dx == 0 && !flip) {
    for (int64_t k = 0; k < H * W; ++k) dst[k] = lut_[src[k]];
    return ex;
  }
  const float pad = lut_[0];  // zero padding, as the raw pixel 0
  for (int64_t y = 0; y < H; ++y) {
    const int64_t sy = y + dy;
    for (int64_t x = 0; x < W; ++x) {
      const int64_t sx = (flip ? W - 1 - x : x) + dx;
      dst[y * W + x] = sy >= 0 && sy < H && sx >= 0 && sx < W ? lut_[src[sy * W + sx]] : pad;
    }
  }
  return ex;
}

std::string FashionMnist::describe() const {
  std::string aug;
  if (options_.random_crop_padding > 0)
    aug += fmt::format(", random crop (padding {})", options_.random_crop_padding);
  if (options_.hflip) aug += ", hflip";
  return fmt::format("Fashion-MNIST {}: {} images 1x{}x{} from {}{}{}", options_.split, size(),
                     height_, width_, options_.root,
                     options_.normalize ? fmt::format(", normalised (mean {}, std {})",
                                                      options_.mean, options_.std)
                                        : std::string(", unnormalised [0, 1]"),
                     aug);
}

const std::array<const char*, 10>& FashionMnist::label_names() {
  static const std::array<const char*, 10> names = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

}  // namespace forge::data
