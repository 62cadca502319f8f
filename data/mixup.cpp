#include "data/mixup.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"

namespace forge::data {

namespace {

// x[i] := lam x[i] + (1 - lam) x[B-1-i] for every row at once (pairs are
// updated together, so each reads the other's original values). x: [B, K].
void mix_rows(float* x, int64_t B, int64_t K, double lam) {
  const float a = static_cast<float>(lam), b = static_cast<float>(1 - lam);
  for (int64_t i = 0; i < B / 2; ++i) {
    float* p = x + i * K;
    float* q = x + (B - 1 - i) * K;
    for (int64_t k = 0; k < K; ++k) {
      const float u = p[k], v = q[k];
      p[k] = a * u + b * v;
      q[k] = a * v + b * u;
    }
  }
}

// Swaps the box between each row pair (i, B-1-i): row i gets its partner's box. x: [B, C, H, W].
void paste_boxes(float* x, int64_t B, int64_t C, int64_t H, int64_t W, const CutBox& box) {
  const int64_t width = box.x1 - box.x0;
  for (int64_t i = 0; i < B / 2; ++i) {
    float* p = x + i * C * H * W;
    float* q = x + (B - 1 - i) * C * H * W;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = box.y0; y < box.y1; ++y) {
        const int64_t at = (c * H + y) * W + box.x0;
        std::swap_ranges(p + at, p + at + width, q + at);
      }
  }
}

}  // namespace

CutBox cutmix_box(int64_t H, int64_t W, double lam, Rng& rng) {
  const double ratio = std::sqrt(std::clamp(1.0 - lam, 0.0, 1.0));
  const int64_t cut_h = static_cast<int64_t>(static_cast<double>(H) * ratio);
  const int64_t cut_w = static_cast<int64_t>(static_cast<double>(W) * ratio);
  const int64_t cy = rng.randint(H), cx = rng.randint(W);
  CutBox box;
  box.y0 = std::clamp<int64_t>(cy - cut_h / 2, 0, H);
  box.y1 = std::clamp<int64_t>(cy + cut_h / 2, 0, H);
  box.x0 = std::clamp<int64_t>(cx - cut_w / 2, 0, W);
  box.x1 = std::clamp<int64_t>(cx + cut_w / 2, 0, W);
  return box;
}

BatchTransform make_mixup(const MixupOptions& options) {
  FORGE_CHECK(options.mixup_alpha >= 0 && options.cutmix_alpha >= 0,
              "mixup: alphas must be >= 0, got mixup_alpha {} and cutmix_alpha {}",
              options.mixup_alpha, options.cutmix_alpha);
  FORGE_CHECK(options.prob >= 0 && options.prob <= 1, "mixup: prob must be in [0, 1], got {}",
              options.prob);
  FORGE_CHECK(options.switch_prob >= 0 && options.switch_prob <= 1,
              "mixup: switch_prob must be in [0, 1], got {}", options.switch_prob);
  return [o = options](Batch& batch, Rng& rng) {
    const Tensor& x = batch.input;
    FORGE_CHECK(x.defined() && x.dtype() == DType::f32 && x.dim() == 4,
                "mixup/cutmix: expected a batch of f32 [B, C, H, W] images, got {} {}",
                x.defined() ? dtype_name(x.dtype()) : "undefined",
                x.defined() ? shape_str(x.shape()) : "");
    FORGE_CHECK(batch.label.defined() && batch.label.dtype() == DType::i64 &&
                    batch.label.numel() == x.size(0),
                "mixup/cutmix: expected i64 [{}] labels", x.size(0));
    batch.mix_lambda = 1.0;
    batch.label_mix = Tensor();
    const bool mixup_on = o.mixup_alpha > 0, cutmix_on = o.cutmix_alpha > 0;
    if (!mixup_on && !cutmix_on) return;
    if (!(rng.uniform() < o.prob)) return;
    const bool use_cutmix = mixup_on && cutmix_on ? rng.uniform() < o.switch_prob : cutmix_on;
    const double alpha = use_cutmix ? o.cutmix_alpha : o.mixup_alpha;
    double lam = rng.beta(alpha, alpha);

    const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    if (use_cutmix) {
      const CutBox box = cutmix_box(H, W, lam, rng);
      lam = 1.0 - static_cast<double>(box.area()) / static_cast<double>(H * W);
      if (lam < 1.0) paste_boxes(x.data<float>(), B, C, H, W, box);
    } else if (lam < 1.0) {
      mix_rows(x.data<float>(), B, C * H * W, lam);
    }
    if (!(lam < 1.0)) return;

    const int64_t* label = batch.label.data<int64_t>();
    batch.label_mix = Tensor::empty({B}, DType::i64);
    int64_t* mixed = batch.label_mix.data<int64_t>();
    for (int64_t i = 0; i < B; ++i) mixed[i] = label[B - 1 - i];
    batch.mix_lambda = lam;
  };
}

}  // namespace forge::data
