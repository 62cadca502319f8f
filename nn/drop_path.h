// Stochastic depth ("drop path", Huang et al. 2016; timm's drop_path): each
// sample of a residual branch's output is zeroed with probability p and the
// kept samples are scaled by 1 / (1 - p), so the branch keeps its expectation.
#pragma once

#include "core/rng.h"
#include "core/tensor.h"

namespace forge::nn {

// x (B, ...) -> x * s, s (B, 1, ..., 1) in x's dtype and on its device:
// s_b = 1 / (1 - p) when u_b >= p, else 0, where u_b = uniform_f32(seed,
// offset, first + b) of one gen->reserve_rows(B) request (the default
// generator when gen is null). So a data-parallel shard's samples are rows of
// the global batch's mask, as in ops::dropout. The backward is mul's. The
// identity, drawing nothing, when !training or p = 0; p must be in [0, 1).
Tensor drop_path(const Tensor& x, double p, bool training, Generator* gen);

}  // namespace forge::nn
