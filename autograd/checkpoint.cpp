#include "autograd/checkpoint.h"

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"

namespace forge::autograd {

std::vector<Tensor> checkpoint(const TensorFn& fn, const std::vector<Tensor>& inputs,
                               Generator* gen, const std::vector<Tensor>& params) {
  Generator& g = gen ? *gen : default_generator();
  const GeneratorState start = g.state();
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  // The node's inputs: fn's inputs, then the params (whose gradients reach
  // their .grad during the replay, so the node returns none for them).
  std::vector<Tensor> node_inputs = inputs;
  for (const Tensor& p : params) {
    FORGE_CHECK(p.defined() && p.is_leaf(),
                "checkpoint: params must be defined leaf tensors (a layer's weights)");
    node_inputs.push_back(p);
  }
  if (!needs_grad(node_inputs)) return outputs;

  // Saved: the inputs (detached, remembering which need a gradient) and the
  // generator position; nothing fn computed on the way.
  std::vector<Tensor> saved;
  std::vector<bool> wants;
  for (const Tensor& t : inputs) {
    saved.push_back(t.defined() ? t.detach() : Tensor());
    wants.push_back(t.defined() && t.requires_grad());
  }
  // Outputs are fresh tensors of fn's; give each its own handle so recording
  // does not touch a tensor fn may also have returned elsewhere.
  std::vector<Tensor> results;
  for (const Tensor& o : outputs) results.push_back(o.detach());

  record("checkpoint", node_inputs, results,
         [fn, saved, wants, start, &g, n_params = params.size()](const std::vector<Tensor>& grads) {
           // Replay fn from the same generator position, then put the generator back
           // where the rest of the backward pass expects it.
           const GeneratorState now = g.state();
           g.set_state(start);
           std::vector<Tensor> xs;
           for (size_t i = 0; i < saved.size(); ++i) {
             Tensor x = saved[i].defined() ? saved[i].detach() : Tensor();
             if (wants[i]) x.set_requires_grad(true);
             xs.push_back(x);
           }
           std::vector<Tensor> recomputed;
           {
             GradModeGuard enable(true);
             recomputed = fn(xs);
           }
           g.set_state(now);
           FORGE_CHECK(recomputed.size() == grads.size(),
                       "checkpoint: fn returned {} outputs on recompute, {} before",
                       recomputed.size(), grads.size());
           std::vector<Tensor> roots, seeds;
           for (size_t k = 0; k < recomputed.size(); ++k) {
             if (recomputed[k].requires_grad()) {
               roots.push_back(recomputed[k]);
               seeds.push_back(grads[k]);
             }
           }
           if (!roots.empty()) backward(roots, seeds);
           std::vector<Tensor> input_grads;
           for (size_t i = 0; i < xs.size(); ++i) {
             input_grads.push_back(wants[i] ? xs[i].grad() : Tensor());
           }
           input_grads.resize(input_grads.size() + n_params);
           return input_grads;
         });
  return results;
}

}  // namespace forge::autograd
