// The tape: every op that sees an input requiring grad records one Node with
// an edge per input and one backward closure. The closure captures only what
// its backward needs (saved tensors detached, so no node owns itself) and
// returns one gradient per input, undefined where that input needs none.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace forge::autograd {

struct Node;

// Where an input's gradient goes: into the node that produced it (and which of
// its outputs it was), or into a leaf's .grad, or nowhere.
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t output_nr = 0;
  std::shared_ptr<TensorImpl> leaf;
  bool active() const { return node != nullptr || leaf != nullptr; }
};

struct OutputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

struct Node {
  std::string name;
  std::vector<Edge> next;           // one per input of the op
  std::vector<Shape> input_shapes;  // to check the gradients the closure returns
  std::vector<OutputMeta> outputs;  // to make zero gradients for unused outputs
  BackwardFn backward;
  bool released = false;  // backward ran without retain_graph: saved tensors are gone

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  // Releases a chain of nodes iteratively: freeing a 10^5-op graph by
  // recursion through the edges would overflow the stack.
  ~Node();
};

// True when grad mode is on and any input requires grad: the op must record.
bool needs_grad(const std::vector<Tensor>& inputs);

// Records `outputs` as made by one node named `name` from `inputs`, when
// needs_grad(inputs); otherwise does nothing. Marks the outputs as requiring grad.
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn fn);

// Single-output form; returns the output for chaining.
Tensor record(const char* name, const std::vector<Tensor>& inputs, const Tensor& output,
              BackwardFn fn);

}  // namespace forge::autograd
