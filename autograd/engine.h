// The backward engine: runs the recorded nodes in reverse topological order,
// summing the gradients that reach each node from all of its consumers, and
// accumulating into the .grad of the leaves.
#pragma once

#include <functional>
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

// Called by the outermost backward() once per leaf of its graph, as soon as
// every gradient that leaf will receive from this backward has been added to
// its .grad (also when none arrived: .grad is then what it was). Data-parallel
// training (dist/) starts a bucket's all-reduce from it while the rest of the
// backward runs. A backward nested in another (checkpoint and reversible
// replays) does not call it: their leaves are inputs of the replaying node, so
// the outer backward calls it once that node has run. A tied parameter (one
// leaf used twice) is called once, after its last use.
using LeafGradHook = std::function<void(TensorImpl& leaf)>;

// Installs `hook` for the calling thread's backward passes while alive.
class LeafGradHookGuard {
 public:
  explicit LeafGradHookGuard(LeafGradHook hook);
  ~LeafGradHookGuard();
  LeafGradHookGuard(const LeafGradHookGuard&) = delete;
  LeafGradHookGuard& operator=(const LeafGradHookGuard&) = delete;

 private:
  LeafGradHook previous_;
};

// Elementwise a + b of two same-shaped tensors (the accumulation the engine
// uses; exposed for optimizers and tests).
Tensor accumulate(const Tensor& a, const Tensor& b);

}  // namespace forge::autograd
