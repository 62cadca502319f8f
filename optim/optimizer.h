// Optimizer: the base of SGD, Adam / AdamW and LAMB. It holds parameter
// groups (each with its weight decay and lr scale), one state per parameter
// (a step count and the subclass's slots, e.g. Adam's moments) and the base
// learning rate that a schedule sets before each step.
//
// step() reads each parameter's grad() and writes the parameter's data in place,
// outside autograd; a parameter without a grad is skipped (its state does not
// advance, as in PyTorch). Gradients are never written: autograd may hand a
// leaf a tensor that other tensors share, so the optimizer only reads them.
//
// Gradient accumulation needs nothing from the optimizer: the trainer scales
// the loss by 1 / accum, lets backward add up the grads of accum micro-batches,
// then calls step() and zero_grad() once.
//
// Devices: each parameter may live on the CPU or a GPU; its grad must be on the
// same device, and its slots are kept there. A GPU parameter is updated by one
// fused kernel (optim/update_cuda.h) in the same order of operations as the
// CPU loop. The state dict is device-independent: it holds CPU tensors, and
// loading copies from tensors on any device.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"

namespace forge::optim {

struct ParamGroup {
  std::vector<std::pair<std::string, Tensor>> params;  // (name, parameter)
  double weight_decay = 0;
  double lr_scale = 1;  // this group's lr = lr() * lr_scale
};

// True when a parameter is exempt from weight decay under the usual rule
// (timm's, BERT's): it has ndim <= 1 (biases, LayerNorm weights, ScaleNorm and
// ReZero's g, attention's tau), or a component of its dotted name is one of the
// embedding tables of nn/models.h: "token_emb" (token embedding, also the tied
// output weight), "pos_emb" (learned or axial positions), "pos_embed" (ViT's
// positions) or "cls_token".
bool is_no_decay(const std::string& name, const Tensor& param);

// The model's parameters (named_parameters order) in groups. Without the
// exclusion: one group, all at `weight_decay`. With it: group 0 holds the
// parameters that decay (at `weight_decay`), group 1 those that is_no_decay()
// picks (at 0); either may be empty.
std::vector<ParamGroup> param_groups(const nn::Module& model, double weight_decay,
                                     bool exclude_norms_biases_embeddings);

// Whether optimizers update the GPU parameters of one step together, in few
// launches (Adam / AdamW: cuda::optim::adam_update_many; the same results,
// bit for bit), for the whole process. Off by default until it has run on a
// GPU (issue 31; docs/GPU.md). The CPU ignores it.
void set_multi_tensor(bool on);
bool multi_tensor();

// Layer-wise lr decay (BEiT; timm's param_groups_layer_decay): parameter
// `name` of layer i = layer_id(name), in [0, num_layers), trains at lr_scale
// layer_decay^(num_layers - 1 - i), so the last layer (the head) at the full
// lr and each layer below it at layer_decay times the one above. One group per
// (layer, decays or not) in the order of their first parameter in
// named_parameters; decay as in param_groups. layer_decay = 1 gives every
// parameter param_groups' lr and decay. For a ViT: nn::vit_layer_id.
std::vector<ParamGroup> param_groups_layer_decay(
    const nn::Module& model, double weight_decay, bool exclude_norms_biases_embeddings,
    double layer_decay, const std::function<int64_t(const std::string&)>& layer_id,
    int64_t num_layers);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual std::string name() const = 0;  // "sgd", "adam", "adamw", "lamb"

  // One update of every parameter that has a grad. Every grad is checked
  // (shape, dtype) before any parameter changes.
  void step();
  // Drops the grads of the optimizer's parameters.
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr);
  int64_t steps() const { return steps_; }  // step() calls so far

  const std::vector<ParamGroup>& groups() const { return groups_; }
  std::vector<Tensor> parameters() const;  // every group's, in order

  // A copy of the state:
  //   "steps"              0-dim i64, step() calls so far
  //   "lr"                 0-dim f64, the current base lr
  //   "step.<param>"       0-dim i64, updates this parameter received
  //   "<slot>.<param>"     the subclass's slots, the parameter's shape and dtype
  //                        (e.g. "exp_avg.transformer.layers.0.attn.to_q.weight"),
  //                        on the CPU whatever the parameter's device
  std::map<std::string, Tensor> state_dict() const;
  // Strict: any missing, unexpected or wrongly shaped / typed entry throws a
  // forge::Error listing all of them, and nothing changes. Values are copied
  // (from any device to the parameters' devices).
  void load_state_dict(const std::map<std::string, Tensor>& state);

 protected:
  // `slot_names`: the per-parameter tensors the subclass keeps, each starting
  // as zeros of the parameter's shape, dtype and device. Parameters must be
  // defined f32 or f64 tensors (CPU or GPU), each listed once, with unique names.
  Optimizer(std::vector<ParamGroup> groups, double lr, std::vector<std::string> slot_names);

  struct Update {
    const std::string& name;
    const Tensor& param;         // written in place
    const Tensor& grad;          // same shape, dtype and device; read only
    std::vector<Tensor>& slots;  // in slot_names order, on the parameter's device
    int64_t step;                // this parameter's update count, 1 on its first
    double lr;                   // lr() * the group's lr_scale
    double weight_decay;         // the group's
  };
  virtual void update(const Update& u) = 0;
  // Every update of one step, in parameter order; the default calls update()
  // for each. A subclass may take the GPU ones together (Adam: one launch for
  // many tensors when multi_tensor()).
  virtual void update_all(const std::vector<Update>& updates);

 private:
  struct State {
    std::string name;
    Tensor param;
    size_t group;
    int64_t step = 0;
    std::vector<Tensor> slots;
  };

  std::vector<ParamGroup> groups_;
  std::vector<std::string> slot_names_;
  std::vector<State> states_;
  double lr_;
  int64_t steps_ = 0;
};

}  // namespace forge::optim
