// Stochastic depth (see drop_path.h): a per-sample scale, then one broadcast
// multiply on x's device.
#include "nn/drop_path.h"

#include "ops/ops.h"

namespace forge::nn {

Tensor drop_path(const Tensor& x, double p, bool training, Generator* gen) {
  FORGE_CHECK(x.defined() && x.dim() >= 1,
              "drop_path: expected x (B, ...) with a leading batch dimension, got {}",
              x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  FORGE_CHECK(p >= 0 && p < 1, "drop_path: p must be in [0, 1), got {} (p = 1 drops every sample)",
              p);
  if (!training || p == 0) return x;
  // The per-sample scale s (B, 1, ..., 1) is dropout of ones: s_b = 1 / (1 - p)
  // when draw b >= p, else 0, drawn on x's device without a host round trip,
  // and under data parallelism this shard's rows of the global batch's draws.
  Shape shape(static_cast<size_t>(x.dim()), 1);
  shape[0] = x.size(0);
  const Tensor s = ops::dropout(Tensor::full(shape, 1.0, x.dtype(), x.device()), p, true, gen);
  return x * s;
}

}  // namespace forge::nn
