// Gradient clipping by the global L2 norm (torch.nn.utils.clip_grad_norm_).
// Gradients are never scaled in place (autograd may share a grad tensor with
// other tensors): a clipped parameter gets a new, scaled grad through set_grad.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace forge::optim {

// sqrt of the sum of squares of every element of every defined grad, in f64 and
// in a fixed order (the same bits for any thread count). Parameters without a
// grad are skipped; none at all gives 0. Grads must be f32 or f64 CPU tensors.
double grad_norm(const std::vector<Tensor>& params);

// Returns the norm before clipping. With coef = max_norm / (norm + 1e-6), as
// PyTorch, every grad is replaced by grad * coef when coef < 1. A non-finite
// norm is returned as it is and no grad is touched (the caller stops the run).
// max_norm must be > 0.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace forge::optim
