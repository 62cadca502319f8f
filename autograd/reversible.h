// Reversible residual layers (RevNet, Gomez et al. 2017; as used by Reformer):
// a sequence of couplings y1 = x1 + f(x2), y2 = x2 + g(y1) recorded as one
// node that saves only the final outputs. Its backward rebuilds each block's
// inputs from its outputs (x2 = y2 - g(y1), x1 = y1 - f(x2)) and re-runs f and
// g from the same generator positions, so memory does not grow with depth.
#pragma once

#include <functional>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace forge::autograd {

// Maps a tensor of x's shape to the same shape. It may read side inputs
// `context` (an encoder output, a mask), leaf parameters it captures (their
// .grad accumulates during backward) and draw random numbers from the
// generator given to reversible_sequence.
using CouplingFn = std::function<Tensor(const Tensor& x, const std::vector<Tensor>& context)>;

struct Coupling {
  CouplingFn f, g;
  // The leaf tensors f and g capture. Only used to decide whether to record:
  // a node's inputs are x1, x2 and context, so without these a sequence whose
  // inputs need no gradient would not record and the parameters would get none.
  std::vector<Tensor> params;
};

// For each block in order: y1 = x1 + f(x2), y2 = x2 + g(y1); then (x1, x2) =
// (y1, y2). Returns {y1, y2} of the last block; x1 and x2 have the same shape.
//
// Records one node when grad mode is on and any of x1, x2, context or a
// block's params requires grad. Context gradients are summed over all blocks.
// Tensors f or g capture that are neither leaves nor passed as context are not
// supported: the replay's backward would run (and free) their producers' part
// of the graph ahead of the outer backward. `gen` (the default generator when
// null) must outlive the backward, which leaves it where it found it.
std::vector<Tensor> reversible_sequence(const std::vector<Coupling>& blocks, const Tensor& x1,
                                        const Tensor& x2, const std::vector<Tensor>& context = {},
                                        Generator* gen = nullptr);

}  // namespace forge::autograd
