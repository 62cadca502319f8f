// Pathfinder: the generator's labels, markers and connectivity (checked by an
// independent flood fill), determinism, the write -> read round trip, the
// reader on LRA-style metadata and its errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "data/pathfinder.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

using namespace forge::testing;
namespace fs = std::filesystem;

// Component ids of the lit pixels, linking lit pixels within Chebyshev
// distance `radius`; 0 for dark pixels.
std::vector<int> components(const Image& im, int64_t radius, int* count) {
  const int64_t H = im.height, W = im.width;
  std::vector<int> id(static_cast<size_t>(H * W), 0);
  *count = 0;
  for (int64_t s = 0; s < H * W; ++s) {
    if (!im.pixels[static_cast<size_t>(s)] || id[static_cast<size_t>(s)]) continue;
    const int c = ++*count;
    std::vector<int64_t> stack{s};
    id[static_cast<size_t>(s)] = c;
    while (!stack.empty()) {
      const int64_t p = stack.back();
      stack.pop_back();
      for (int64_t r = p / W - radius; r <= p / W + radius; ++r) {
        for (int64_t x = p % W - radius; x <= p % W + radius; ++x) {
          if (r < 0 || r >= H || x < 0 || x >= W) continue;
          const auto q = static_cast<size_t>(r * W + x);
          if (im.pixels[q] && !id[q]) {
            id[q] = c;
            stack.push_back(static_cast<int64_t>(q));
          }
        }
      }
    }
  }
  return id;
}

// Pixels whose 3x3 neighbourhood is fully lit.
Image eroded(const Image& im) {
  Image out = im;
  for (int64_t r = 0; r < im.height; ++r) {
    for (int64_t x = 0; x < im.width; ++x) {
      bool full = r > 0 && x > 0 && r + 1 < im.height && x + 1 < im.width;
      for (int64_t dr = -1; dr <= 1 && full; ++dr)
        for (int64_t dx = -1; dx <= 1 && full; ++dx)
          full = im.pixels[static_cast<size_t>((r + dr) * im.width + x + dx)] != 0;
      out.pixels[static_cast<size_t>(r * im.width + x)] = full ? 255 : 0;
    }
  }
  return out;
}

int64_t flat(const Image& im, const std::array<int64_t, 2>& rc) {
  return rc[0] * im.width + rc[1];
}

TEST(Pathfinder, LabelsBalancedAndDeterministic) {
  const PathfinderGenConfig c;
  const auto a = generate_pathfinder(c, 200, 11), b = generate_pathfinder(c, 200, 11),
             other = generate_pathfinder(c, 200, 12), prefix = generate_pathfinder(c, 30, 11);
  ASSERT_EQ(a.size(), 200u);
  int64_t connected = 0, label_changes = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    connected += a[i].label;
    if (i % 2) {
      EXPECT_NE(a[i].label, a[i - 1].label) << "pair " << i / 2;
    }
    if (i > 0) label_changes += a[i].label != a[i - 1].label;
    EXPECT_EQ(a[i].image.pixels, b[i].image.pixels) << i;
    EXPECT_EQ(a[i].label, b[i].label);
  }
  EXPECT_EQ(connected, 100);
  EXPECT_LT(label_changes, 199) << "labels simply alternate";
  for (size_t i = 0; i < prefix.size(); ++i)
    EXPECT_EQ(prefix[i].image.pixels, a[i].image.pixels) << "image " << i << " depends on count";
  int64_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i].image.pixels == other[i].image.pixels;
  EXPECT_EQ(same, 0);
}

TEST(Pathfinder, ImagesHaveTwoMarkersAndConnectivityMatchesLabel) {
  PathfinderGenConfig c;
  const int64_t R = pathfinder_link_radius(c);
  EXPECT_EQ(R, 2);
  const auto samples = generate_pathfinder(c, 300, 5);
  for (size_t i = 0; i < samples.size(); ++i) {
    const PathfinderSample& s = samples[i];
    const Image& im = s.image;
    ASSERT_EQ(im.channels, 1);
    ASSERT_EQ(im.height, 32);
    ASSERT_EQ(im.width, 32);
    int64_t lit = 0;
    for (int64_t r = 0; r < 32; ++r) {
      for (int64_t x = 0; x < 32; ++x) {
        const uint8_t v = im.pixels[static_cast<size_t>(r * 32 + x)];
        ASSERT_TRUE(v == 0 || v == 255);
        lit += v != 0;
        if (r == 0 || x == 0 || r == 31 || x == 31) {
          EXPECT_EQ(v, 0) << "border pixel lit in " << i;
        }
      }
    }
    EXPECT_GT(lit, 2 * 9 + 2 * 8 * 2) << i;  // two markers, two paths of 8 dashes

    // Markers: the fully lit 3x3 blocks form exactly two blobs, at the markers.
    int blobs = 0;
    const Image core = eroded(im);
    const std::vector<int> blob = components(core, 1, &blobs);
    EXPECT_EQ(blobs, 2) << i;
    const int blob_a = blob[static_cast<size_t>(flat(im, s.marker_a))];
    const int blob_b = blob[static_cast<size_t>(flat(im, s.marker_b))];
    EXPECT_TRUE(blob_a > 0 && blob_b > 0 && blob_a != blob_b) << i;

    // Connectivity under the link radius: every path and distractor is its own
    // component, and the markers share one iff the label is 1.
    int n = 0;
    const std::vector<int> comp = components(im, R, &n);
    EXPECT_EQ(n, 2 + c.num_distractors) << i;
    const bool same = comp[static_cast<size_t>(flat(im, s.marker_a))] ==
                      comp[static_cast<size_t>(flat(im, s.marker_b))];
    EXPECT_EQ(same, s.label == 1) << i;

    // The paths are dashed: without the link radius (8-connected pixels) the
    // 18 gaps of the default config show as extra pieces, most of them.
    int pieces = 0;
    components(im, 1, &pieces);
    EXPECT_GE(pieces - n, 5) << i;
  }
}

TEST(Pathfinder, CustomConfig) {
  PathfinderGenConfig c{.height = 40,
                        .width = 48,
                        .path_dashes = 5,
                        .dash_length = 3,
                        .gap_length = 2.5,
                        .num_distractors = 4,
                        .marker_radius = 2.0,
                        .border = 2};
  const int64_t R = pathfinder_link_radius(c);
  EXPECT_EQ(R, 3);
  const auto samples = generate_pathfinder(c, 40, 1);
  for (const PathfinderSample& s : samples) {
    EXPECT_EQ(s.image.height, 40);
    EXPECT_EQ(s.image.width, 48);
    int n = 0;
    const std::vector<int> comp = components(s.image, R, &n);
    EXPECT_EQ(n, 2 + 4);
    EXPECT_EQ(comp[static_cast<size_t>(flat(s.image, s.marker_a))] ==
                  comp[static_cast<size_t>(flat(s.image, s.marker_b))],
              s.label == 1);
    for (int64_t r = 0; r < 40; ++r) {
      for (int64_t x = 0; x < 48; ++x) {
        if (r < 2 || x < 2 || r >= 38 || x >= 46) {
          EXPECT_EQ(s.image.pixels[static_cast<size_t>(r * 48 + x)], 0);
        }
      }
    }
  }
}

TEST(Pathfinder, GeneratorErrors) {
  PathfinderGenConfig c;
  c.marker_radius = 1.0;
  expect_error([&] { generate_pathfinder(c, 1, 0); }, {"marker_radius", "3x3"});
  c = PathfinderGenConfig{};
  c.height = 16;
  c.width = 16;
  c.num_distractors = 12;
  c.distractor_dashes = 6;
  c.max_attempts = 3;
  expect_error([&] { generate_pathfinder(c, 4, 0); }, {"too crowded", "3 attempts", "16x16"});
}

TEST(Pathfinder, WriteReadRoundTrip) {
  TempDir dir;
  const auto samples = generate_pathfinder(PathfinderGenConfig{}, 20, 3);
  write_pathfinder(dir.str(), samples, 7);
  for (const char* f : {"metadata/0.npy", "metadata/1.npy", "metadata/2.npy", "imgs/0/sample_0.png",
                        "imgs/2/sample_5.png"})
    EXPECT_TRUE(fs::exists(dir.path() / f)) << f;
  EXPECT_FALSE(fs::exists(dir.path() / "metadata/3.npy"));
  EXPECT_FALSE(fs::exists(dir.path() / "metadata/0.npy.tmp"));
  std::ifstream meta(dir.path() / "metadata/1.npy");
  std::string line;
  std::getline(meta, line);
  EXPECT_EQ(line, fmt::format("imgs/1 sample_0.png 0 {}", samples[7].label));

  int64_t skipped = -1;
  const auto back = read_pathfinder(dir.str(), &skipped);
  EXPECT_EQ(skipped, 0);
  ASSERT_EQ(back.size(), samples.size());
  for (size_t i = 0; i < back.size(); ++i) {
    EXPECT_EQ(back[i].image.pixels, samples[i].image.pixels) << i;
    EXPECT_EQ(back[i].label, samples[i].label) << i;
  }

  const Pathfinder from_disk(dir.str()), in_memory(samples, "generated");
  EXPECT_EQ(from_disk.size(), 20);
  EXPECT_EQ(from_disk.num_classes(), 2);
  EXPECT_EQ(from_disk.height(), 32);
  EXPECT_EQ(from_disk.width(), 32);
  EXPECT_NE(from_disk.describe().find("20 images 1x32x32, 10 connected"), std::string::npos)
      << from_disk.describe();
  for (int64_t i = 0; i < 20; ++i) {
    const Example x = from_disk.get(i, nullptr), y = in_memory.get(i, nullptr);
    EXPECT_EQ(x.input.shape(), (Shape{1, 32, 32}));
    EXPECT_EQ(x.input.dtype(), DType::f32);
    EXPECT_EQ(x.input.to_vector<float>(), y.input.to_vector<float>());
    EXPECT_EQ(x.label, samples[static_cast<size_t>(i)].label);
    const auto v = x.input.to_vector<float>();
    for (size_t k = 0; k < v.size(); ++k)
      ASSERT_EQ(v[k], samples[static_cast<size_t>(i)].image.pixels[k] ? 1.0f : 0.0f);
  }
}

Image gray(int64_t h, int64_t w, uint8_t value, int64_t channels = 1) {
  Image im;
  im.height = h;
  im.width = w;
  im.channels = channels;
  im.pixels.assign(static_cast<size_t>(h * w * channels), value);
  return im;
}

TEST(Pathfinder, ReaderOnLraLayout) {
  TempDir dir;
  const fs::path root = dir.path();
  fs::create_directories(root / "imgs/0");
  fs::create_directories(root / "imgs/10");
  write_png((root / "imgs/0/sample_0.png").string(), gray(4, 5, 10));
  write_png((root / "imgs/0/sample_1.png").string(), gray(4, 5, 20));
  write_png((root / "imgs/10/sample_0.png").string(), gray(4, 5, 30));
  write_file(root / "imgs/10/sample_1.png", "");  // empty: skipped, as LRA does
  // Linsley's rows carry more fields; 10.npy sorts after 2.npy.
  write_file(root / "metadata/10.npy",
             "imgs/10 sample_0.png 0 1 1.5 2 14 2 1.0\nimgs/10 sample_1.png 1 0 1.5 2 14 2 1.0\n");
  write_file(root / "metadata/2.npy", "imgs/0 sample_1.png 1 0 x\r\n\nimgs/0 sample_0.png 0 1\n");
  write_file(root / "metadata/notes.txt", "not metadata\n");
  Pathfinder ds(root.string());
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.height(), 4);
  EXPECT_EQ(ds.width(), 5);
  const float v[] = {20 / 255.0f, 10 / 255.0f, 30 / 255.0f};
  const int64_t labels[] = {0, 1, 1};
  for (int64_t i = 0; i < 3; ++i) {
    const Example e = ds.get(i, nullptr);
    EXPECT_EQ(e.input.shape(), (Shape{1, 4, 5}));
    EXPECT_FLOAT_EQ(e.input.to_vector<float>()[7], v[i]);
    EXPECT_EQ(e.label, labels[i]);
  }
  EXPECT_NE(ds.describe().find("1 empty images skipped"), std::string::npos) << ds.describe();
}

TEST(Pathfinder, ReaderErrors) {
  TempDir dir;
  const fs::path root = dir.path();
  expect_error([&] { Pathfinder ds(root.string()); }, {"metadata", "not a directory"});
  fs::create_directories(root / "metadata");
  expect_error([&] { Pathfinder ds(root.string()); }, {"no *.npy"});

  fs::create_directories(root / "imgs/0");
  write_png((root / "imgs/0/a.png").string(), gray(4, 4, 1));
  write_png((root / "imgs/0/big.png").string(), gray(6, 4, 1));
  write_png((root / "imgs/0/rgb.png").string(), gray(4, 4, 1, 3));
  write_file(root / "imgs/0/bad.png", "not an image at all");
  const fs::path meta = root / "metadata/0.npy";
  auto expect_meta_error = [&](const std::string& text, const std::vector<std::string>& parts) {
    write_file(meta, text);
    std::vector<std::string> all = parts;
    all.push_back(meta.string());
    expect_error([&] { read_pathfinder(root.string()); }, all);
  };
  const std::string ok = "imgs/0 a.png 0 1\n";
  expect_meta_error(ok + "imgs/0 a.png 1\n", {":2:", "at least 4", "found 3"});
  expect_meta_error(ok + ok + "imgs/0 a.png 2 2\n", {":3:", "label", "'2'"});
  expect_meta_error(ok + "imgs/0 missing.png 1 0\n", {":2:", "missing.png"});
  expect_meta_error(ok + "imgs/0 bad.png 1 0\n", {":2:", "bad.png"});
  expect_meta_error(ok + "imgs/0 big.png 1 0\n", {":2:", "big.png", "6x4", "4x4"});
  expect_meta_error("imgs/0 rgb.png 1 0\n", {":1:", "rgb.png", "3 channels"});
  write_file(meta, ok);
  EXPECT_EQ(read_pathfinder(root.string()).size(), 1u);

  // The pixel limit reaches the decoder: a.png has 16 pixels.
  const std::string a = (root / "imgs/0/a.png").string();
  expect_error([&] { read_pathfinder(root.string(), nullptr, 15); },
               {meta.string() + ":1:", a, "4x4", "limit of 15", "data.max_image_pixels"});
  expect_error([&] { Pathfinder(root.string(), 15); }, {a, "limit of 15"});
  EXPECT_EQ(Pathfinder(root.string(), 16).size(), 1);
}

}  // namespace
}  // namespace forge::data
