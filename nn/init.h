// Parameter initialisers, in place and outside autograd, as torch.nn.init.
// Every random one draws from `gen` (the default generator when null), so a
// seeded run builds the same model. Fans follow PyTorch: for a weight of shape
// (out, in, k...) fan_in = in * prod(k), fan_out = out * prod(k); a 1-d tensor
// has fan_in = fan_out = its size.
#pragma once

#include <utility>

#include "core/rng.h"
#include "core/tensor.h"

namespace forge::nn::init {

void zeros_(Tensor& t);
void ones_(Tensor& t);
void normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
void uniform_(Tensor& t, double lo = 0.0, double hi = 1.0, Generator* gen = nullptr);
// N(0, gain^2 * 2 / (fan_in + fan_out)).
void xavier_normal_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);
// U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
void xavier_uniform_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);
// N(mean, std^2) restricted to [a, b] (absolute bounds, as torch.nn.init):
// draws outside the interval are redrawn until every element lies inside. The
// interval must hold at least 1e-4 of the normal's mass, so the loop ends
// quickly; narrower intervals are an error rather than a hang.
void trunc_normal_(Tensor& t, double mean = 0.0, double std = 1.0, double a = -2.0, double b = 2.0,
                   Generator* gen = nullptr);

// (fan_in, fan_out) of a weight shape as described above.
std::pair<int64_t, int64_t> fans(const Shape& shape);

}  // namespace forge::nn::init
