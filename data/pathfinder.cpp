// Pathfinder: the generator (dashed paths, markers, connectivity checks), the
// writer and reader of Linsley's layout, and the Dataset.
#include "data/pathfinder.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numbers>
#include <optional>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/threading.h"

namespace forge::data {

namespace fs = std::filesystem;

namespace {

// How many random starts one path gets before the whole image is redrawn.
constexpr int kTriesPerPath = 100;

void check_config(const PathfinderGenConfig& c) {
  FORGE_CHECK(c.height >= 8 && c.width >= 8, "Pathfinder generator: image {}x{} is below 8x8",
              c.height, c.width);
  FORGE_CHECK(c.path_dashes >= 1 && c.distractor_dashes >= 1,
              "Pathfinder generator: path_dashes ({}) and distractor_dashes ({}) must be >= 1",
              c.path_dashes, c.distractor_dashes);
  FORGE_CHECK(c.dash_length > 0 && c.gap_length >= 0,
              "Pathfinder generator: need dash_length > 0 and gap_length >= 0, got {} and {}",
              c.dash_length, c.gap_length);
  FORGE_CHECK(c.max_turn_degrees >= 0 && c.max_turn_degrees <= 180,
              "Pathfinder generator: max_turn_degrees must be in [0, 180], got {}",
              c.max_turn_degrees);
  FORGE_CHECK(c.num_distractors >= 0, "Pathfinder generator: num_distractors must be >= 0, got {}",
              c.num_distractors);
  FORGE_CHECK(c.marker_radius >= 1.5 && 4 * c.marker_radius <= std::min(c.height, c.width),
              "Pathfinder generator: marker_radius must be in [1.5, min(height, width) / 4] (a "
              "marker must cover a 3x3 block), got {}",
              c.marker_radius);
  FORGE_CHECK(c.border >= 0 && 2 * c.border + 8 <= std::min(c.height, c.width),
              "Pathfinder generator: border {} leaves too little of a {}x{} image", c.border,
              c.height, c.width);
  FORGE_CHECK(c.max_attempts >= 1, "Pathfinder generator: max_attempts must be >= 1, got {}",
              c.max_attempts);
}

// The pixels of one path (repeats allowed) and the flat indices of its markers.
struct Trace {
  std::vector<int64_t> pixels;
  int64_t start = -1, end = -1;  // end pixels of the path, flat
};

class Drawer {
 public:
  Drawer(const PathfinderGenConfig& c, Rng& rng)
      : c_(c),
        rng_(rng),
        H_(c.height),
        W_(c.width),
        R_(pathfinder_link_radius(c)),
        lit_(static_cast<size_t>(H_ * W_)),
        blocked_(static_cast<size_t>(H_ * W_)) {}

  // One attempt at an image with the given label; false when some path found
  // no room or a check failed.
  bool draw(int64_t label, PathfinderSample& out) {
    std::fill(lit_.begin(), lit_.end(), 0);
    std::fill(blocked_.begin(), blocked_.end(), 0);
    // The marked path; for label 1 it carries both markers.
    const std::optional<Trace> p = place(c_.path_dashes, true, label == 1);
    if (!p) return false;
    const std::optional<Trace> q = place(c_.path_dashes, label == 0, false);
    if (!q) return false;
    for (int64_t d = 0; d < c_.num_distractors; ++d)
      if (!place(c_.distractor_dashes, false, false)) return false;

    const int64_t a = p->start, b = label == 1 ? p->end : q->start;
    if (linked(a, b) != (label == 1) || !only_markers_are_blobs(a, b)) return false;
    out.image.height = H_;
    out.image.width = W_;
    out.image.channels = 1;
    out.image.pixels.assign(lit_.size(), 0);
    for (size_t i = 0; i < lit_.size(); ++i) out.image.pixels[i] = lit_[i] ? 255 : 0;
    out.label = label;
    out.marker_a = {a / W_, a % W_};
    out.marker_b = {b / W_, b % W_};
    return true;
  }

 private:
  bool free(int64_t r, int64_t col) const {
    return r >= c_.border && r < H_ - c_.border && col >= c_.border && col < W_ - c_.border &&
           !blocked_[static_cast<size_t>(r * W_ + col)];
  }

  // A random dashed path of `dashes` dashes on free pixels, or nothing.
  std::optional<Trace> trace(int64_t dashes) {
    Trace t;
    const int64_t r0 = rng_.randint(c_.border, H_ - c_.border - 1);
    const int64_t c0 = rng_.randint(c_.border, W_ - c_.border - 1);
    double x = static_cast<double>(c0) + 0.5, y = static_cast<double>(r0) + 0.5;
    double theta = rng_.uniform(0, 2 * std::numbers::pi);
    const double max_turn = c_.max_turn_degrees * std::numbers::pi / 180;
    // Samples a quarter pixel apart hit every pixel the dash crosses, 8-connected.
    const auto steps = static_cast<int64_t>(std::ceil(c_.dash_length / 0.25));
    for (int64_t d = 0; d < dashes; ++d) {
      const double dx = std::cos(theta), dy = std::sin(theta);
      for (int64_t k = 0; k <= steps; ++k) {
        const double s = c_.dash_length * static_cast<double>(k) / static_cast<double>(steps);
        const auto r = static_cast<int64_t>(std::floor(y + s * dy));
        const auto col = static_cast<int64_t>(std::floor(x + s * dx));
        if (!free(r, col)) return std::nullopt;
        t.pixels.push_back(r * W_ + col);
      }
      // The next dash starts gap_length after this one ends: their pixels are
      // at most ceil(gap_length) apart in each coordinate.
      x += (c_.dash_length + c_.gap_length) * dx;
      y += (c_.dash_length + c_.gap_length) * dy;
      theta += rng_.uniform(-max_turn, max_turn);
    }
    t.start = t.pixels.front();
    t.end = t.pixels.back();
    return t;
  }

  // Adds the disc of marker_radius around pixel `centre`; false when it does not fit.
  bool add_marker(int64_t centre, Trace& t) const {
    const int64_t cr = centre / W_, cc = centre % W_;
    const auto reach = static_cast<int64_t>(std::floor(c_.marker_radius));
    for (int64_t dr = -reach; dr <= reach; ++dr) {
      for (int64_t dc = -reach; dc <= reach; ++dc) {
        if (static_cast<double>(dr * dr + dc * dc) > c_.marker_radius * c_.marker_radius) continue;
        if (!free(cr + dr, cc + dc)) return false;
        t.pixels.push_back((cr + dr) * W_ + cc + dc);
      }
    }
    return true;
  }

  // Draws a path (with markers on the requested ends) clear of everything drawn
  // so far, then blocks its R-neighbourhood for the paths that follow.
  std::optional<Trace> place(int64_t dashes, bool mark_start, bool mark_end) {
    for (int tries = 0; tries < kTriesPerPath; ++tries) {
      std::optional<Trace> t = trace(dashes);
      if (!t) continue;
      if (mark_start && !add_marker(t->start, *t)) continue;
      if (mark_end && !add_marker(t->end, *t)) continue;
      for (int64_t p : t->pixels) {
        lit_[static_cast<size_t>(p)] = 1;
        const int64_t r = p / W_, col = p % W_;
        for (int64_t rr = std::max<int64_t>(0, r - R_); rr <= std::min(H_ - 1, r + R_); ++rr)
          for (int64_t cc = std::max<int64_t>(0, col - R_); cc <= std::min(W_ - 1, col + R_); ++cc)
            blocked_[static_cast<size_t>(rr * W_ + cc)] = 1;
      }
      return t;
    }
    return std::nullopt;
  }

  // Flood fill over lit pixels, linking pixels within Chebyshev distance R.
  bool linked(int64_t from, int64_t to) const {
    std::vector<uint8_t> seen(lit_.size(), 0);
    std::vector<int64_t> queue{from};
    seen[static_cast<size_t>(from)] = 1;
    for (size_t head = 0; head < queue.size(); ++head) {
      const int64_t p = queue[head];
      if (p == to) return true;
      const int64_t r = p / W_, col = p % W_;
      for (int64_t rr = std::max<int64_t>(0, r - R_); rr <= std::min(H_ - 1, r + R_); ++rr) {
        for (int64_t cc = std::max<int64_t>(0, col - R_); cc <= std::min(W_ - 1, col + R_); ++cc) {
          const auto q = static_cast<size_t>(rr * W_ + cc);
          if (lit_[q] && !seen[q]) {
            seen[q] = 1;
            queue.push_back(static_cast<int64_t>(q));
          }
        }
      }
    }
    return false;
  }

  // The pixels whose 3x3 neighbourhood is fully lit form exactly two
  // 8-connected blobs, one at each marker.
  bool only_markers_are_blobs(int64_t a, int64_t b) const {
    std::vector<uint8_t> core(lit_.size(), 0);
    for (int64_t r = 1; r + 1 < H_; ++r) {
      for (int64_t col = 1; col + 1 < W_; ++col) {
        bool full = true;
        for (int64_t dr = -1; dr <= 1 && full; ++dr)
          for (int64_t dc = -1; dc <= 1 && full; ++dc)
            full = lit_[static_cast<size_t>((r + dr) * W_ + col + dc)] != 0;
        core[static_cast<size_t>(r * W_ + col)] = full;
      }
    }
    if (!core[static_cast<size_t>(a)] || !core[static_cast<size_t>(b)]) return false;
    int blobs = 0;
    std::vector<int64_t> stack;
    for (size_t s = 0; s < core.size(); ++s) {
      if (core[s] != 1) continue;
      ++blobs;
      core[s] = 2;
      stack.assign(1, static_cast<int64_t>(s));
      while (!stack.empty()) {
        const int64_t p = stack.back();
        stack.pop_back();
        const int64_t r = p / W_, col = p % W_;
        for (int64_t rr = std::max<int64_t>(0, r - 1); rr <= std::min(H_ - 1, r + 1); ++rr) {
          for (int64_t cc = std::max<int64_t>(0, col - 1); cc <= std::min(W_ - 1, col + 1); ++cc) {
            const auto q = static_cast<size_t>(rr * W_ + cc);
            if (core[q] == 1) {
              core[q] = 2;
              stack.push_back(static_cast<int64_t>(q));
            }
          }
        }
      }
    }
    return blobs == 2;
  }

  const PathfinderGenConfig& c_;
  Rng& rng_;
  const int64_t H_, W_, R_;
  std::vector<uint8_t> lit_;      // 1 where something is drawn
  std::vector<uint8_t> blocked_;  // within R of something drawn
};

PathfinderSample draw_sample(const PathfinderGenConfig& c, uint64_t seed, int64_t i) {
  // Examples 2k and 2k + 1 take one label each, the order drawn per pair.
  Rng pair_rng(Rng::mix({seed, 0, static_cast<uint64_t>(i / 2)}));
  const bool first_connected = pair_rng.bernoulli(0.5);
  const int64_t label = (i % 2 == 0) == first_connected ? 1 : 0;
  Rng rng(Rng::mix({seed, 1, static_cast<uint64_t>(i)}));
  Drawer drawer(c, rng);
  PathfinderSample s;
  for (int64_t attempt = 0; attempt < c.max_attempts; ++attempt)
    if (drawer.draw(label, s)) return s;
  FORGE_FAIL(
      "Pathfinder generator: no valid {}x{} image with label {} in {} attempts (example {}): too "
      "crowded for two {}-dash paths and {} {}-dash distractors kept {} pixels apart; use a larger "
      "image or fewer or shorter paths",
      c.height, c.width, label, c.max_attempts, i, c.path_dashes, c.num_distractors,
      c.distractor_dashes, pathfinder_link_radius(c) + 1);
}

std::string excerpt(std::string_view s) {
  constexpr size_t kMax = 80;
  return s.size() <= kMax ? std::string(s) : std::string(s.substr(0, kMax)) + "...";
}

// Metadata files in numeric order of their stems, then other stems by name.
std::vector<fs::path> metadata_files(const fs::path& dir) {
  std::vector<std::pair<std::pair<int, uint64_t>, fs::path>> keyed;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".npy") continue;
    const std::string stem = e.path().stem().string();
    const bool numeric = !stem.empty() && stem.size() <= 18 &&
                         stem.find_first_not_of("0123456789") == std::string::npos;
    keyed.push_back({{numeric ? 0 : 1, numeric ? std::stoull(stem) : 0}, e.path()});
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<fs::path> files;
  for (auto& k : keyed) files.push_back(std::move(k.second));
  return files;
}

}  // namespace

std::vector<std::string> pathfinder_metadata_files(const std::string& root) {
  std::vector<std::string> out;
  for (const fs::path& p : metadata_files(fs::path(root) / "metadata")) out.push_back(p.string());
  return out;
}

int64_t pathfinder_link_radius(const PathfinderGenConfig& config) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(config.gap_length)));
}

std::vector<PathfinderSample> generate_pathfinder(const PathfinderGenConfig& config, int64_t count,
                                                  uint64_t seed) {
  check_config(config);
  FORGE_CHECK(count >= 0, "Pathfinder generator: count must be >= 0, got {}", count);
  std::vector<PathfinderSample> samples(static_cast<size_t>(count));
  std::exception_ptr error;
  std::mutex error_mutex;
  // Each image depends only on (seed, i), so the split across threads does not
  // change the result.
  parallel_for(count, config.height * config.width * 64, [&](int64_t begin, int64_t end) {
    try {
      for (int64_t i = begin; i < end; ++i)
        samples[static_cast<size_t>(i)] = draw_sample(config, seed, i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
  return samples;
}

void write_pathfinder(const std::string& root, const std::vector<PathfinderSample>& samples,
                      int64_t per_folder) {
  FORGE_CHECK(per_folder >= 1, "write_pathfinder: per_folder must be >= 1, got {}", per_folder);
  const fs::path base(root);
  fs::create_directories(base / "metadata");
  const auto n = static_cast<int64_t>(samples.size());
  for (int64_t folder = 0; folder * per_folder < n; ++folder) {
    const std::string rel = fmt::format("imgs/{}", folder);
    fs::create_directories(base / rel);
    std::string meta;
    for (int64_t j = 0; j < per_folder && folder * per_folder + j < n; ++j) {
      const int64_t i = folder * per_folder + j;
      const PathfinderSample& s = samples[static_cast<size_t>(i)];
      FORGE_CHECK(s.image.channels == 1, "write_pathfinder: sample {} has {} channels, expected 1",
                  i, s.image.channels);
      FORGE_CHECK(s.label == 0 || s.label == 1,
                  "write_pathfinder: sample {} has label {}, expected 0 or 1", i, s.label);
      const std::string file = fmt::format("sample_{}.png", j);
      write_png((base / rel / file).string(), s.image);
      meta += fmt::format("{} {} {} {}\n", rel, file, j, s.label);
    }
    const fs::path path = base / "metadata" / fmt::format("{}.npy", folder);
    const fs::path tmp = path.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      FORGE_CHECK(out, "write_pathfinder: cannot create {}", tmp.string());
      out << meta;
      out.flush();
      FORGE_CHECK(out, "write_pathfinder: writing {} failed", tmp.string());
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    FORGE_CHECK(!ec, "write_pathfinder: cannot rename {} to {}: {}", tmp.string(), path.string(),
                ec.message());
  }
}

std::vector<PathfinderSample> read_pathfinder(const std::string& root, int64_t* num_skipped_empty,
                                              int64_t max_image_pixels) {
  const fs::path base(root), meta_dir = base / "metadata";
  FORGE_CHECK(fs::is_directory(meta_dir),
              "Pathfinder: {} is not a directory; expected the layout root/metadata/*.npy + the "
              "images they name",
              meta_dir.string());
  const std::vector<fs::path> files = metadata_files(meta_dir);
  FORGE_CHECK(!files.empty(), "Pathfinder: no *.npy metadata files in {}", meta_dir.string());
  std::vector<PathfinderSample> samples;
  int64_t skipped = 0;
  for (const fs::path& meta : files) {
    std::ifstream in(meta, std::ios::binary);
    FORGE_CHECK(in, "Pathfinder: cannot open {}", meta.string());
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      std::vector<std::string_view> f;
      for (size_t i = 0; i < line.size();) {
        if (line[i] == ' ') {
          ++i;
          continue;
        }
        const size_t end = std::min(line.find(' ', i), line.size());
        f.push_back(std::string_view(line).substr(i, end - i));
        i = end;
      }
      if (f.empty()) continue;
      const std::string where = fmt::format("{}:{}", meta.string(), line_no);
      FORGE_CHECK(f.size() >= 4,
                  "{}: expected 'folder file index label ...' (at least 4 space-separated "
                  "fields), found {} in '{}'",
                  where, f.size(), excerpt(line));
      FORGE_CHECK(f[3] == "0" || f[3] == "1", "{}: expected the label (field 4) 0 or 1, found '{}'",
                  where, excerpt(f[3]));
      const fs::path image_path = base / std::string(f[0]) / std::string(f[1]);
      std::error_code ec;
      const auto bytes = fs::file_size(image_path, ec);
      FORGE_CHECK(!ec, "{}: cannot read the image {}: {}", where, image_path.string(),
                  ec.message());
      if (bytes == 0) {
        ++skipped;
        continue;
      }
      PathfinderSample s;
      try {
        s.image = read_image(image_path.string(), max_image_pixels);
      } catch (const Error& e) {
        FORGE_FAIL("{}: {}", where, message_of(e));
      }
      FORGE_CHECK(s.image.channels == 1, "{}: the image {} has {} channels, expected 1 (gray)",
                  where, image_path.string(), s.image.channels);
      if (!samples.empty()) {
        const Image& first = samples.front().image;
        FORGE_CHECK(s.image.height == first.height && s.image.width == first.width,
                    "{}: the image {} is {}x{}, the images before it {}x{}", where,
                    image_path.string(), s.image.height, s.image.width, first.height, first.width);
      }
      s.label = f[3] == "1";
      samples.push_back(std::move(s));
    }
  }
  if (num_skipped_empty) *num_skipped_empty = skipped;
  return samples;
}

Pathfinder::Pathfinder(const std::string& root, int64_t max_image_pixels) : name_(root) {
  add(read_pathfinder(root, &num_skipped_empty_, max_image_pixels));
}

Pathfinder::Pathfinder(const std::vector<PathfinderSample>& samples, std::string name)
    : name_(std::move(name)) {
  add(samples);
}

void Pathfinder::add(const std::vector<PathfinderSample>& samples) {
  FORGE_CHECK(!samples.empty(), "Pathfinder {}: no images", name_);
  height_ = samples.front().image.height;
  width_ = samples.front().image.width;
  const int64_t hw = height_ * width_;
  pixels_.reserve(samples.size() * static_cast<size_t>(hw));
  for (size_t i = 0; i < samples.size(); ++i) {
    const PathfinderSample& s = samples[i];
    FORGE_CHECK(s.image.channels == 1 && s.image.height == height_ && s.image.width == width_,
                "Pathfinder {}: image {} is {}x{}x{}, expected 1x{}x{}", name_, i, s.image.channels,
                s.image.height, s.image.width, height_, width_);
    FORGE_CHECK(static_cast<int64_t>(s.image.pixels.size()) == hw,
                "Pathfinder {}: image {} has {} pixels, expected {}", name_, i,
                s.image.pixels.size(), hw);
    FORGE_CHECK(s.label == 0 || s.label == 1, "Pathfinder {}: image {} has label {}", name_, i,
                s.label);
    pixels_.insert(pixels_.end(), s.image.pixels.begin(), s.image.pixels.end());
    labels_.push_back(s.label);
  }
}

Example Pathfinder::get(int64_t i, Rng*) const {
  FORGE_CHECK(i >= 0 && i < size(), "Pathfinder {}: index {} out of range [0, {})", name_, i,
              size());
  const int64_t hw = height_ * width_;
  Tensor t = Tensor::empty({1, height_, width_}, DType::f32);
  float* p = t.data<float>();
  const uint8_t* src = pixels_.data() + i * hw;
  for (int64_t k = 0; k < hw; ++k) p[k] = static_cast<float>(src[k]) / 255.0f;
  Example e;
  e.input = t;
  e.label = labels_[static_cast<size_t>(i)];
  return e;
}

std::string Pathfinder::describe() const {
  const auto connected = std::count(labels_.begin(), labels_.end(), 1);
  std::string s = fmt::format("Pathfinder {}: {} images 1x{}x{}, {} connected, {} not", name_,
                              size(), height_, width_, connected, size() - connected);
  if (num_skipped_empty_) s += fmt::format(", {} empty images skipped", num_skipped_empty_);
  return s;
}

}  // namespace forge::data
