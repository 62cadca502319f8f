#include "autograd/engine.h"

#include <unordered_map>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/cuda_tensor.h"
#include "core/threading.h"

namespace forge::autograd {

Tensor accumulate(const Tensor& a, const Tensor& b) {
  FORGE_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(),
              "gradient accumulation: shapes/dtypes differ ({} {} vs {} {})", shape_str(a.shape()),
              dtype_name(a.dtype()), shape_str(b.shape()), dtype_name(b.dtype()));
  FORGE_CHECK(a.device() == b.device(), "gradient accumulation: gradients on {} and {}",
              a.device().str(), b.device().str());
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  FORGE_IF_CUDA(a) {
    cuda::add(a.dtype(), a.raw_device_data(), b.raw_device_data(), out.raw_device_data(),
              a.numel(), a.device().index);
    return out;
  }
  FORGE_DISPATCH_FLOAT(a.dtype(), "gradient accumulation", [&] {
    const scalar_t* x = a.data<scalar_t>();
    const scalar_t* y = b.data<scalar_t>();
    scalar_t* o = out.data<scalar_t>();
    parallel_for(a.numel(), 1, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) o[i] = x[i] + y[i];
    });
  });
  return out;
}

namespace {

thread_local LeafGradHook leaf_grad_hook;
thread_local int backward_depth = 0;  // nesting of backward() calls on this thread

struct DepthGuard {
  DepthGuard() { ++backward_depth; }
  ~DepthGuard() { --backward_depth; }
};

void accumulate_into_leaf(TensorImpl& leaf, const Tensor& g) {
  FORGE_CHECK(g.shape() == leaf.shape, "gradient of shape {} does not fit leaf of shape {}",
              shape_str(g.shape()), shape_str(leaf.shape));
  if (!leaf.grad) {
    // Taken as is, not copied: a gradient may share storage with another
    // leaf's (an op may return one tensor for two inputs), which is safe
    // because nothing in the library writes into a gradient in place.
    leaf.grad = g.impl_ptr();
  } else {
    leaf.grad = accumulate(Tensor(leaf.grad), g).impl_ptr();
  }
}

}  // namespace

LeafGradHookGuard::LeafGradHookGuard(LeafGradHook hook) : previous_(std::move(leaf_grad_hook)) {
  leaf_grad_hook = std::move(hook);
}

LeafGradHookGuard::~LeafGradHookGuard() {
  leaf_grad_hook = std::move(previous_);
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              BackwardOptions options) {
  FORGE_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(),
              "backward: {} roots but {} root gradients", roots.size(), grad_roots.size());
  NoGradGuard no_grad;
  DepthGuard depth;
  const LeafGradHook* hook = backward_depth == 1 && leaf_grad_hook ? &leaf_grad_hook : nullptr;

  // Seed gradients: per (node, output) buffers, or straight into leaves.
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::vector<std::shared_ptr<Node>> root_nodes;
  for (size_t r = 0; r < roots.size(); ++r) {
    const Tensor& root = roots[r];
    FORGE_CHECK(root.requires_grad(),
                "backward: root {} (shape {}) does not require grad and has no graph", r,
                shape_str(root.shape()));
    Tensor seed;
    if (!grad_roots.empty() && grad_roots[r].defined()) {
      seed = grad_roots[r];
      FORGE_CHECK(seed.shape() == root.shape(),
                  "backward: gradient for root {} has shape {}, expected {}", r,
                  shape_str(seed.shape()), shape_str(root.shape()));
    } else {
      FORGE_CHECK(root.numel() == 1,
                  "backward: root {} has shape {}; give its gradient (only one-element roots "
                  "default to 1)",
                  r, shape_str(root.shape()));
      seed = Tensor::ones(root.shape(), root.dtype(), root.device());
    }
    if (root.is_leaf()) {
      accumulate_into_leaf(root.impl(), seed);
      continue;
    }
    const auto& node = root.grad_fn();
    auto& buf = buffers[node.get()];
    buf.resize(node->outputs.size());
    const uint32_t k = root.impl().output_nr;
    buf[k] = buf[k].defined() ? accumulate(buf[k], seed) : seed;
    root_nodes.push_back(node);
  }

  // Count, for every node reachable from the roots, how many edges lead into
  // it, and (for the hook) into every leaf.
  std::unordered_map<Node*, int> pending;
  std::unordered_map<TensorImpl*, int> leaf_pending;
  std::vector<Node*> stack;
  for (const auto& n : root_nodes) {
    if (pending.emplace(n.get(), 0).second) stack.push_back(n.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (hook && e.leaf) ++leaf_pending[e.leaf.get()];
      if (!e.node) continue;
      auto [it, inserted] = pending.emplace(e.node.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(e.node.get());
    }
  }

  // Kahn's algorithm: a node runs once every consumer has added its gradient.
  std::vector<Node*> ready;
  for (const auto& n : root_nodes) {
    if (pending[n.get()] == 0) {
      pending[n.get()] = -1;  // queued
      ready.push_back(n.get());
    }
  }
  while (!ready.empty()) {
    Node* n = ready.back();
    ready.pop_back();
    FORGE_CHECK(!n->released,
                "backward through the graph a second time: '{}' already freed its saved tensors; "
                "pass retain_graph = true to the first backward",
                n->name);
    std::vector<Tensor> grads = std::move(buffers[n]);
    buffers.erase(n);
    grads.resize(n->outputs.size());
    for (size_t k = 0; k < grads.size(); ++k) {
      if (!grads[k].defined()) {
        const OutputMeta& m = n->outputs[k];
        grads[k] = Tensor::zeros(m.shape, m.dtype, m.device);
      }
    }
    std::vector<Tensor> input_grads = n->backward(grads);
    if (!options.retain_graph) {
      n->backward = nullptr;
      n->released = true;
    }
    FORGE_CHECK(input_grads.size() == n->next.size(),
                "op '{}': backward returned {} gradients for {} inputs", n->name,
                input_grads.size(), n->next.size());
    for (size_t i = 0; i < n->next.size(); ++i) {
      const Edge& e = n->next[i];
      if (!e.active()) continue;
      const Tensor& g = input_grads[i];
      if (g.defined() && check_nan_enabled())
        check_finite(g, fmt::format("the gradient for input {} from the backward of op '{}'", i, n->name));
      if (g.defined()) {
        FORGE_CHECK(g.shape() == n->input_shapes[i],
                    "op '{}': gradient for input {} has shape {}, expected {}", n->name, i,
                    shape_str(g.shape()), shape_str(n->input_shapes[i]));
        if (e.leaf) {
          accumulate_into_leaf(*e.leaf, g);
        } else {
          auto& buf = buffers[e.node.get()];
          buf.resize(e.node->outputs.size());
          buf[e.output_nr] = buf[e.output_nr].defined() ? accumulate(buf[e.output_nr], g) : g;
        }
      }
      if (hook && e.leaf && --leaf_pending[e.leaf.get()] == 0) (*hook)(*e.leaf);
      if (e.node && --pending[e.node.get()] == 0) {
        pending[e.node.get()] = -1;
        ready.push_back(e.node.get());
      }
    }
  }
}

}  // namespace forge::autograd
