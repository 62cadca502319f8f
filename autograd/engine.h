// The backward engine: runs the recorded nodes in reverse topological order,
// summing the gradients that reach each node from all of its consumers, and
// accumulating into the .grad of the leaves.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace forge::autograd {

struct BackwardOptions {
  bool retain_graph = false;  // keep saved tensors so backward can run again
};

// Back-propagates from `roots` seeded with `grad_roots` (same shapes). A
// one-element root may omit its seed (1 is used).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots = {},
              BackwardOptions options = {});

inline void backward(const Tensor& root, BackwardOptions options = {}) {
  backward({root}, {}, options);
}

// Elementwise a + b of two same-shaped tensors (the accumulation the engine
// uses; exposed for optimizers and tests).
Tensor accumulate(const Tensor& a, const Tensor& b);

}  // namespace forge::autograd
