// Gradient checkpointing: run fn without recording, keep only its inputs and
// the generator position, and in backward re-run it with recording from the
// same position, so gradients and dropout masks equal those of a plain run.
#pragma once

#include <functional>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace forge::autograd {

using TensorFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// `gen` is the generator fn draws from (the default one when null). `params`
// are the leaf tensors fn captures (a layer's weights): they decide, with the
// inputs, whether to record, so a layer whose input needs no gradient still
// trains; their gradients accumulate when fn is replayed, as in a plain run.
std::vector<Tensor> checkpoint(const TensorFn& fn, const std::vector<Tensor>& inputs,
                               Generator* gen = nullptr, const std::vector<Tensor>& params = {});

}  // namespace forge::autograd
