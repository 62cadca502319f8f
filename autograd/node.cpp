#include "autograd/node.h"

#include "autograd/grad_mode.h"

namespace forge::autograd {

Node::~Node() {
  std::vector<std::shared_ptr<Node>> pending;
  for (Edge& e : next) {
    if (e.node) pending.push_back(std::move(e.node));
  }
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    if (n.use_count() == 1) {
      // Last owner: take its edges before it dies, so its destructor finds none.
      for (Edge& e : n->next) {
        if (e.node) pending.push_back(std::move(e.node));
      }
    }
  }
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn fn) {
  if (!needs_grad(inputs)) return;
  auto node = std::make_shared<Node>();
  node->name = name;
  node->next.reserve(inputs.size());
  node->input_shapes.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    Edge e;
    if (t.defined() && t.requires_grad()) {
      if (t.is_leaf()) {
        e.leaf = t.impl_ptr();
      } else {
        e.node = t.grad_fn();
        e.output_nr = t.impl().output_nr;
      }
    }
    node->next.push_back(std::move(e));
    node->input_shapes.push_back(t.defined() ? t.shape() : Shape{});
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorImpl& out = outputs[i].impl();
    FORGE_CHECK(out.grad_fn == nullptr, "op '{}': output {} already belongs to a graph", name, i);
    for (const Tensor& t : inputs) {
      FORGE_CHECK(!t.same(outputs[i]),
                  "op '{}': output {} is one of its inputs; return a view instead", name, i);
    }
    node->outputs.push_back({out.shape, out.dtype, outputs[i].device()});
    out.requires_grad = true;
    out.output_nr = static_cast<uint32_t>(i);
  }
  node->backward = std::move(fn);
  for (const Tensor& t : outputs) t.impl().grad_fn = node;
  if (check_nan_enabled())
    for (size_t i = 0; i < outputs.size(); ++i)
      check_finite(outputs[i], fmt::format("the output {} of op '{}'", i, name));
}

Tensor record(const char* name, const std::vector<Tensor>& inputs, const Tensor& output,
              BackwardFn fn) {
  record(name, inputs, std::vector<Tensor>{output}, std::move(fn));
  return output;
}

}  // namespace forge::autograd
