// Mixup and CutMix as a loader BatchTransform, in the batch mode of timm's
// Mixup: one lambda per batch, each row mixed with its mirror row (i with
// B-1-i), and the loss weighted lam * CE(label) + (1 - lam) * CE(label_mix).
#pragma once

#include <cstdint>

#include "data/loader.h"

namespace forge::data {

struct MixupOptions {
  double mixup_alpha = 0;    // > 0 enables mixup, lam ~ Beta(alpha, alpha)
  double cutmix_alpha = 0;   // > 0 enables cutmix, lam ~ Beta(alpha, alpha)
  double prob = 1;           // probability that a batch is mixed at all
  double switch_prob = 0.5;  // both enabled: probability of cutmix rather than mixup
};

// The transform for a batch of f32 [B, C, H, W] images (other batches are an
// error). Draws, in order: u < prob; u < switch_prob when both alphas are on;
// lam; for cutmix the box centre (y then x). A mixed batch gets label_mix
// (the labels reversed) and mix_lambda; an unmixed one keeps mix_lambda = 1
// and label_mix undefined. Both alphas 0: a transform that does nothing.
// The draws do not depend on B and a row mixes only with its mirror, so a
// loader shard may apply it to its compact [slice; mirror] batch (BatchTransform).
BatchTransform make_mixup(const MixupOptions& options);

// A CutMix box: rows [y0, y1) and columns [x0, x1) of an H x W image.
struct CutBox {
  int64_t y0 = 0, y1 = 0, x0 = 0, x1 = 0;
  int64_t area() const { return (y1 - y0) * (x1 - x0); }
};

// timm's rand_bbox: sides floor(H sqrt(1 - lam)) and floor(W sqrt(1 - lam)),
// centre uniform over the image, clipped to it (so the area may be smaller
// than (1 - lam) H W; the transform corrects lam to 1 - area / (H W)).
CutBox cutmix_box(int64_t H, int64_t W, double lam, Rng& rng);

}  // namespace forge::data
