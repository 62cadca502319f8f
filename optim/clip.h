// Gradient clipping by the global L2 norm (torch.nn.utils.clip_grad_norm_).
// Gradients are never scaled in place (autograd may share a grad tensor with
// other tensors): a clipped parameter gets a new, scaled grad through set_grad.
// With mixed precision, clip the unscaled grads: scale(loss).backward, then
// GradScaler::unscale, then clip, then GradScaler::step (optim/grad_scaler.h).
//
// GPU grads: each grad's sum of squares is taken on its device in f64 (block
// partial sums, then one ordered pass; optim/update_cuda.h), the sums of one
// device are read back with a single copy, and the total is added up on the
// host in parameter order as on the CPU; the scaled copies are made on the
// grads' devices. The GPU path also takes bf16 / f16 grads.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace forge::optim {

// sqrt of the sum of squares of every element of every defined grad, in f64 and
// in a fixed order (the same bits for any thread count). Parameters without a
// grad are skipped; none at all gives 0. CPU grads must be f32 or f64.
double grad_norm(const std::vector<Tensor>& params);

// Returns the norm before clipping. With coef = max_norm / (norm + 1e-6), as
// PyTorch, every grad is replaced by grad * coef when coef < 1. A non-finite
// norm is returned as it is and no grad is touched (the caller stops the run).
// max_norm must be > 0.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace forge::optim
