// Pathfinder (Linsley et al. 2018; LRA's Pathfinder-32): is there a path
// between the two marker dots? The reader takes the layout of Linsley's
// generator that LRA's TFDS builder reads, and a generator draws new images.
//
// Layout: `root/metadata/*.npy` are, despite the extension, text files with one
// image a line, fields separated by spaces: `imgs/0 sample_0.png <n> <label>
// ...`. LRA reads field 0 (the folder, relative to root), field 1 (the file
// name) and field 3 (the label: 1 connected, 0 not); the other fields are
// ignored. Metadata files are read in numeric order of their names (0.npy,
// 1.npy, ..., then non-numeric names in lexicographic order), lines in order.
// Zero-byte images are skipped, as LRA's pipeline filters them out. Images are
// 8-bit gray PNGs, all of one size. An example is f32 [1, H, W] in [0, 1]
// (pixel / 255); data/pixel_sequence.h turns it into a token sequence.
//
// The generator, in the spirit of Linsley's: two long dashed paths and a few
// short dashed distractors on a black image, drawn in white (255). A path is a
// chain of straight dashes `dash_length` long separated by gaps `gap_length`
// long; its direction turns by a uniform angle in [-max_turn, max_turn] after
// each dash. Markers are discs of `marker_radius` centred on path ends. Label
// 1: both markers are on the ends of one path (the other long path is bare);
// label 0: one marker on each long path. Labels are balanced: examples 2k and
// 2k + 1 get one label each, in random order.
//
// Connectivity is exact under the link radius R = max(1, ceil(gap_length)):
// call two lit pixels linked when their Chebyshev distance is at most R. A gap
// never separates pixels of one path by more than R, and different paths and
// distractors are kept more than R apart (dilation by R blocks the pixels the
// next path may use), so the components of the lit pixels under this linking
// are exactly the drawn paths. Each image is also checked by a flood fill from
// one marker (it reaches the other iff the label is 1) and by a 3x3 erosion
// (the two markers are the only two blobs of fully lit 3x3 blocks, which needs
// marker_radius >= 1.5); a failing image is redrawn. No pixel of any path lies
// within `border` pixels of the image edges.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image_io.h"

namespace forge::data {

struct PathfinderGenConfig {
  int64_t height = 32;
  int64_t width = 32;
  int64_t path_dashes = 8;       // dashes of each long path
  double dash_length = 2.0;      // pixels
  double gap_length = 2.0;       // pixels between dashes
  double max_turn_degrees = 30;  // direction change per dash, uniform in [-max, max]
  int64_t num_distractors = 2;
  int64_t distractor_dashes = 3;
  double marker_radius = 1.5;   // >= 1.5: a marker covers a 3x3 block
  int64_t border = 1;           // empty pixels along each edge
  int64_t max_attempts = 1000;  // drawings per image before giving up
};

// R above: the Chebyshev distance within which lit pixels count as linked.
int64_t pathfinder_link_radius(const PathfinderGenConfig& config);

struct PathfinderSample {
  Image image;                              // 1 channel, height x width, pixels 0 or 255
  int64_t label = 0;                        // 1: the markers lie on the same path
  std::array<int64_t, 2> marker_a{-1, -1};  // (row, col) of the marker centres;
  std::array<int64_t, 2> marker_b{-1, -1};  // unknown (-1) for images read from disk
};

// `count` images; image i depends only on (config, seed, i).
std::vector<PathfinderSample> generate_pathfinder(const PathfinderGenConfig& config, int64_t count,
                                                  uint64_t seed);

// Writes the reader's layout: image i as `root/imgs/<i / per_folder>/sample_<i % per_folder>.png`
// and one `root/metadata/<folder>.npy` per folder, each written after its images
// (to a temporary name, then renamed), so no metadata line names a missing image.
void write_pathfinder(const std::string& root, const std::vector<PathfinderSample>& samples,
                      int64_t per_folder = 1000);

// root/metadata/*.npy in the order they are read: numeric stems in numeric
// order, then the other stems by name.
std::vector<std::string> pathfinder_metadata_files(const std::string& root);

// Reads the layout above. Errors name the metadata file and line, or the image;
// an image of more than `max_image_pixels` pixels is refused (image_io.h).
std::vector<PathfinderSample> read_pathfinder(const std::string& root,
                                              int64_t* num_skipped_empty = nullptr,
                                              int64_t max_image_pixels = kDefaultMaxImagePixels);

// Examples: f32 [1, H, W] in [0, 1], label 0 or 1.
class Pathfinder : public Dataset {
 public:
  explicit Pathfinder(const std::string& root, int64_t max_image_pixels = kDefaultMaxImagePixels);
  // `name` says where the samples came from in describe().
  Pathfinder(const std::vector<PathfinderSample>& samples, std::string name);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Example get(int64_t i, Rng* rng) const override;
  int64_t num_classes() const override { return 2; }
  std::vector<std::string> class_names() const override { return {"disconnected", "connected"}; }
  std::string describe() const override;

  int64_t height() const { return height_; }
  int64_t width() const { return width_; }

 private:
  void add(const std::vector<PathfinderSample>& samples);

  std::string name_;
  int64_t height_ = 0, width_ = 0;
  std::vector<uint8_t> pixels_;  // example i: pixels_[i * H * W, (i + 1) * H * W)
  std::vector<int64_t> labels_;
  int64_t num_skipped_empty_ = 0;
};

}  // namespace forge::data
