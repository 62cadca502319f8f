// ImageFolder: the directory scan, and per example read -> decode -> transform.
#include "data/image_folder.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <system_error>
#include <utility>

#include "core/error.h"
#include "data/image_io.h"

namespace forge::data {

namespace {

namespace fs = std::filesystem;

bool is_hidden(const std::string& name) {
  return !name.empty() && name[0] == '.';
}

bool has_image_extension(const std::string& name) {
  std::string ext = fs::path(name).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

// The names of the entries of `dir` that are (or link to) folders when
// `folders`, else regular files; sorted bytewise, hidden names skipped.
std::vector<std::string> list_dir(const fs::path& dir, bool folders) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  FORGE_CHECK(!ec, "ImageFolder: cannot list folder '{}': {}", dir.string(), ec.message());
  std::vector<std::string> names;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    FORGE_CHECK(!ec, "ImageFolder: cannot list folder '{}': {}", dir.string(), ec.message());
    const std::string name = it->path().filename().string();
    if (is_hidden(name)) continue;
    std::error_code type_ec;
    // A link to nothing is refused, not skipped: an image (or a class) would
    // silently be missing from the data. (Files: those named as images.)
    if (it->is_symlink(type_ec) && !fs::exists(it->path(), type_ec) &&
        (folders || has_image_extension(name))) {
      std::error_code read_ec;
      FORGE_FAIL("ImageFolder: '{}' is a symbolic link to '{}', which does not exist; restore "
                 "its target or remove the link",
                 it->path().string(), fs::read_symlink(it->path(), read_ec).string());
    }
    const bool keep = folders ? it->is_directory(type_ec) : it->is_regular_file(type_ec);
    if (keep && !type_ec) names.push_back(name);
  }
  FORGE_CHECK(!ec, "ImageFolder: cannot list folder '{}': {}", dir.string(), ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

ImageFolder::ImageFolder(ImageFolderOptions options) : options_(std::move(options)) {
  check_image_transform_options(options_.transform);
  const fs::path root(options_.root);
  std::error_code ec;
  FORGE_CHECK(!options_.root.empty(), "ImageFolder: no root folder given");
  FORGE_CHECK(options_.max_image_pixels >= 1,
              "ImageFolder: max_image_pixels must be at least 1, got {}",
              options_.max_image_pixels);
  FORGE_CHECK(fs::is_directory(root, ec), "ImageFolder: root '{}' is not an existing folder{}",
              options_.root, ec ? ": " + ec.message() : "");
  class_names_ = list_dir(root, true);
  FORGE_CHECK(!class_names_.empty(),
              "ImageFolder: root '{}' has no class folders (expected root/<class>/<image files>)",
              options_.root);
  offsets_.push_back(0);
  for (size_t c = 0; c < class_names_.size(); ++c) {
    int64_t found = 0;
    for (const std::string& file : list_dir(root / class_names_[c], false)) {
      if (!has_image_extension(file)) continue;
      names_ += class_names_[c];
      names_ += '/';
      names_ += file;
      offsets_.push_back(names_.size());
      labels_.push_back(static_cast<int32_t>(c));
      ++found;
    }
    FORGE_CHECK(found > 0, "ImageFolder: class folder '{}' has no .png/.jpg/.jpeg images",
                (root / class_names_[c]).string());
  }
}

void ImageFolder::check_index(int64_t i) const {
  FORGE_CHECK(i >= 0 && i < size(), "ImageFolder '{}': index {} is out of range [0, {})",
              options_.root, i, size());
}

std::string ImageFolder::path(int64_t i) const {
  check_index(i);
  const auto k = static_cast<size_t>(i);
  return (fs::path(options_.root) / names_.substr(offsets_[k], offsets_[k + 1] - offsets_[k]))
      .string();
}

int64_t ImageFolder::label(int64_t i) const {
  check_index(i);
  return labels_[static_cast<size_t>(i)];
}

std::vector<int64_t> ImageFolder::class_counts() const {
  std::vector<int64_t> counts(class_names_.size(), 0);
  for (int32_t label : labels_) ++counts[static_cast<size_t>(label)];
  return counts;
}

Example ImageFolder::get(int64_t i, Rng* rng) const {
  Example ex;
  const std::string file = path(i);
  ex.input = transform_image_file(read_image_bytes(file), file, options_.transform, rng,
                                  options_.max_image_pixels);
  ex.label = labels_[static_cast<size_t>(i)];
  return ex;
}

std::string ImageFolder::describe() const {
  const ImageTransformOptions& t = options_.transform;
  const char* filter = interpolation_name(t.interpolation);
  const std::string eval = fmt::format(
      "{} resize {} + center crop {}", filter,
      static_cast<int64_t>(std::floor(static_cast<double>(t.size) / t.crop_pct)), t.size);
  std::string augment;
  if (t.rand_augment) augment += ", RandAugment " + rand_augment_spec(t.rand_augment_options);
  if (t.color_jitter.any())
    augment += fmt::format(", colour jitter ({}, {}, {}, {})", t.color_jitter.brightness,
                           t.color_jitter.contrast, t.color_jitter.saturation, t.color_jitter.hue);
  if (t.erasing.prob > 0) augment += fmt::format(", random erasing {}", t.erasing.prob);
  const std::string train =
      t.train
          ? fmt::format(
                "train: {} random resized crop scale [{}, {}] ratio [{:.3g}, {:.3g}], "
                "hflip {}{}; eval: {}",
                filter, t.scale_min, t.scale_max, t.ratio_min, t.ratio_max, t.hflip, augment, eval)
          : "eval: " + eval;
  return fmt::format("ImageFolder {}: {} images, {} classes -> {}x{}x{} ({})", options_.root,
                     size(), num_classes(), t.grayscale ? 1 : 3, t.size, t.size, train);
}

}  // namespace forge::data
