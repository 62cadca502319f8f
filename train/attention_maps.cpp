// Drawing attention maps (see attention_maps.h).
#include "train/attention_maps.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "data/image_io.h"
#include "data/transforms.h"
#include "ops/ops.h"

namespace forge::train {

namespace fs = std::filesystem;

namespace {

// A perceptually ordered colour map: viridis's colours at nine points,
// interpolated linearly between them; v in [0, 1].
std::array<uint8_t, 3> colour(double v) {
  static constexpr double kStops[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                                          {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                                          {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
  const double x = std::clamp(v, 0.0, 1.0) * 8;
  const int i = std::min(7, static_cast<int>(x));
  const double f = x - i;
  std::array<uint8_t, 3> c{};
  for (int k = 0; k < 3; ++k)
    c[static_cast<size_t>(k)] =
        static_cast<uint8_t>(std::lround(kStops[i][k] + f * (kStops[i + 1][k] - kStops[i][k])));
  return c;
}

// An RGB picture of `rows` x `cols` values (row-major), each cell a block of
// `scale` x `scale` pixels, coloured by value / max.
data::Image heat(const std::vector<double>& v, int64_t rows, int64_t cols, int64_t scale) {
  const double peak = std::max(*std::max_element(v.begin(), v.end()), 1e-30);
  data::Image img;
  img.height = rows * scale;
  img.width = cols * scale;
  img.channels = 3;
  img.pixels.resize(static_cast<size_t>(img.height * img.width * 3));
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = 0; x < img.width; ++x) {
      const auto c = colour(v[static_cast<size_t>((y / scale) * cols + x / scale)] / peak);
      std::copy(c.begin(), c.end(), img.pixels.begin() + (y * img.width + x) * 3);
    }
  return img;
}

// A [C, H, W] tensor as an RGB picture, min-max scaled.
data::Image picture_of(const Tensor& chw) {
  const Tensor x = chw.to(Device::cpu()).to(DType::f64);
  const int64_t C = x.size(0), H = x.size(1), W = x.size(2);
  const double* p = x.data<double>();
  const auto [lo, hi] = std::minmax_element(p, p + C * H * W);
  const double range = std::max(*hi - *lo, 1e-30);
  data::Image img;
  img.height = H;
  img.width = W;
  img.channels = 3;
  img.pixels.resize(static_cast<size_t>(H * W * 3));
  for (int64_t i = 0; i < H * W; ++i)
    for (int64_t k = 0; k < 3; ++k)
      img.pixels[static_cast<size_t>(i * 3 + k)] =
          static_cast<uint8_t>(std::lround(255 * (p[(C == 3 ? k : 0) * H * W + i] - *lo) / range));
  return img;
}

// `left` and `right` (same height) side by side with a white gap.
data::Image beside(const data::Image& left, const data::Image& right) {
  constexpr int64_t kGap = 6;
  data::Image img;
  img.height = left.height;
  img.width = left.width + kGap + right.width;
  img.channels = 3;
  img.pixels.assign(static_cast<size_t>(img.height * img.width * 3), 255);
  for (int64_t y = 0; y < img.height; ++y) {
    std::copy_n(left.pixels.begin() + y * left.width * 3, left.width * 3,
                img.pixels.begin() + y * img.width * 3);
    std::copy_n(right.pixels.begin() + y * right.width * 3, right.width * 3,
                img.pixels.begin() + (y * img.width + left.width + kGap) * 3);
  }
  return img;
}

// The picture (shown at least 224 pixels high) beside a patch-grid map
// resampled to its size.
data::Image picture_and_grid(const data::Image& picture, const std::vector<double>& grid,
                             int64_t g) {
  const int64_t factor = std::max<int64_t>(1, (224 + picture.height - 1) / picture.height);
  const int64_t side = picture.height * factor;
  data::Image big;
  big.height = side;
  big.width = picture.width * factor;
  big.channels = 3;
  big.pixels.resize(static_cast<size_t>(big.height * big.width * 3));
  for (int64_t y = 0; y < big.height; ++y)
    for (int64_t x = 0; x < big.width; ++x)
      std::copy_n(picture.pixels.begin() + ((y / factor) * picture.width + x / factor) * 3, 3,
                  big.pixels.begin() + (y * big.width + x) * 3);
  Tensor cells = Tensor::empty({1, g, g});
  for (int64_t i = 0; i < g * g; ++i)
    cells.data<float>()[i] = static_cast<float>(grid[static_cast<size_t>(i)]);
  const Tensor smooth = data::resize(cells, side, big.width);
  std::vector<double> v(static_cast<size_t>(side * big.width));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::max(0.0f, smooth.data<float>()[i]);
  return beside(big, heat(v, side, big.width, 1));
}

// What the patches receive in a ViT's N x N map: the class token's row, or
// with mean pooling the mean over the patch queries.
std::vector<double> patch_weights(const double* a, int64_t N, const VitLayout& l) {
  const int64_t first = l.cls ? 1 : 0, P = l.grid * l.grid;
  std::vector<double> w(static_cast<size_t>(P), 0.0);
  for (int64_t j = 0; j < P; ++j) {
    if (l.cls) {
      w[static_cast<size_t>(j)] = a[first + j];
    } else {
      for (int64_t i = 0; i < N; ++i)
        w[static_cast<size_t>(j)] += a[i * N + first + j] / static_cast<double>(N);
    }
  }
  return w;
}

}  // namespace

std::vector<double> attention_rollout(const std::vector<Tensor>& maps) {
  std::vector<double> rollout;  // N x N, the running product
  for (const Tensor& map : maps) {
    const Tensor a = map.to(Device::cpu()).to(DType::f64);  // (1, H, N, N)
    const int64_t H = a.size(1), N = a.size(2);
    FORGE_CHECK(a.size(3) == N, "attention_rollout: a map is {} x {}, not square", N, a.size(3));
    const double* p = a.data<double>();
    // 0.5 mean_h(A) + 0.5 I, rows renormalised
    std::vector<double> mixed(static_cast<size_t>(N * N), 0.0);
    for (int64_t i = 0; i < N; ++i) {
      double row = 0;
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t h = 0; h < H; ++h) s += p[(h * N + i) * N + j];
        mixed[static_cast<size_t>(i * N + j)] =
            0.5 * s / static_cast<double>(H) + (i == j ? 0.5 : 0.0);
        row += mixed[static_cast<size_t>(i * N + j)];
      }
      for (int64_t j = 0; j < N; ++j) mixed[static_cast<size_t>(i * N + j)] /= row;
    }
    if (rollout.empty()) {
      rollout = mixed;
      continue;
    }
    // This layer's mixing applied after the earlier layers': mixed x rollout.
    std::vector<double> next(static_cast<size_t>(N * N), 0.0);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t k = 0; k < N; ++k)
        for (int64_t j = 0; j < N; ++j)
          next[static_cast<size_t>(i * N + j)] +=
              mixed[static_cast<size_t>(i * N + k)] * rollout[static_cast<size_t>(k * N + j)];
    rollout.swap(next);
  }
  return rollout;
}

VitLayout vit_layout(const Recipe& r) {
  VitLayout l;
  l.vit = r.string("model.type") == "vit";
  l.cls = r.string("model.pool") == "cls";
  l.grid = l.vit ? r.integer("model.image_size") / r.integer("model.patch_size") : 0;
  return l;
}

AttentionMapsResult draw_attention_maps(TaskModel& task, const data::Batch& batch,
                                        const VitLayout& layout, const std::string& dir) {
  NoGradGuard no_grad;
  const std::vector<Tensor> maps = task.attention_maps(batch);
  AttentionMapsResult r;
  r.layers = static_cast<int64_t>(maps.size());
  // No layer with a map: nothing to draw, and no folder is made.
  if (std::none_of(maps.begin(), maps.end(), [](const Tensor& m) { return m.defined(); }))
    return r;
  fs::create_directories(dir);
  const data::Image picture =
      layout.vit ? picture_of(ops::squeeze(ops::narrow(batch.input, 0, 0, 1), 0)) : data::Image{};
  const int64_t tokens = (layout.cls ? 1 : 0) + layout.grid * layout.grid;
  bool can_roll = layout.vit && !maps.empty();
  for (size_t layer = 0; layer < maps.size(); ++layer) {
    if (!maps[layer].defined()) {
      can_roll = false;
      continue;
    }
    ++r.layers_with_maps;
    const Tensor a = maps[layer].to(Device::cpu()).to(DType::f64);  // (1, H, N, M)
    const int64_t H = a.size(1), N = a.size(2), M = a.size(3);
    const double* p = a.data<double>();
    const int64_t scale = std::max<int64_t>(1, 512 / std::max(N, M));
    for (int64_t h = 0; h < H; ++h) {
      const double* q = p + h * N * M;
      const std::string base =
          (fs::path(dir) / fmt::format("layer{:02}_head{:02}", layer, h)).string();
      data::write_png(base + ".png", heat(std::vector<double>(q, q + N * M), N, M, scale));
      r.files.push_back(base + ".png");
      if (layout.vit && N == tokens && M == tokens) {
        data::write_png(base + "_image.png",
                        picture_and_grid(picture, patch_weights(q, N, layout), layout.grid));
        r.files.push_back(base + "_image.png");
      }
    }
    can_roll = can_roll && N == tokens && M == tokens;
  }
  if (can_roll) {
    const std::vector<double> rollout = attention_rollout(maps);
    const std::string file = (fs::path(dir) / "rollout.png").string();
    data::write_png(file, picture_and_grid(picture, patch_weights(rollout.data(), tokens, layout),
                                           layout.grid));
    r.files.push_back(file);
    r.rollout = true;
  }
  return r;
}

}  // namespace forge::train
