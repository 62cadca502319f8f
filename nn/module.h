// Module: the unit models are built from. A module owns named parameters
// (leaf tensors that require grad), buffers (state without grad) and child
// modules; names are dotted paths as in PyTorch state dicts ("blocks.0.ff.w1.weight"),
// so checkpoints map one to one onto the reference implementations.
//
// Parameters and buffers are plain Tensor members of the concrete layer; the
// module records a pointer to each member, so a layer's forward reads its
// members directly and a test or a weight-tying model may rebind a member to
// another tensor. Modules are therefore neither copyable nor movable and live
// in std::shared_ptr.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace forge::nn {

// What a non-strict load_state_dict did not load.
struct LoadReport {
  std::vector<std::string> missing;     // in the module, not in the state dict
  std::vector<std::string> unexpected;  // in the state dict, not in the module
  std::vector<std::string> mismatched;  // "name: expected [2, 3] f32, found [3, 2] f32"
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  std::string str() const;  // one line per problem; empty when ok()
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = delete;
  Module& operator=(Module&&) = delete;

  // ---- traversal: this module first, then children in registration order ----
  // Each distinct tensor once (a tied weight is listed under its first name), so
  // an optimizer updates it once.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // Elements over the distinct parameters.
  int64_t num_parameters() const;
  void zero_grad();

  // ---- device ----
  // Moves every parameter and buffer to `device` (tied tensors stay tied);
  // parameters stay leaves requiring grad, their gradients are dropped. The
  // slots are rebound, so tensors read before the move still live on the old
  // device (an optimizer is built after the move).
  void to(Device device);
  // The device of the first parameter (or buffer); the CPU for an empty module.
  Device device() const;

  // ---- mode: dropout and friends read is_training(); set recursively ----
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // The generator random layers draw from (null: the default generator); set
  // recursively so a run hands its generator to the whole model at once.
  void set_generator(Generator* gen);
  Generator* generator() const { return generator_; }

  // ---- state ----
  // Every parameter and buffer under its full name; tied tensors appear under
  // each of their names. The tensors are the module's own (not copies).
  std::map<std::string, Tensor> state_dict() const;
  // Copies values into the existing tensors in place, outside autograd. Strict:
  // any missing, unexpected or wrongly shaped / typed entry throws a forge::Error
  // that lists all of them, and nothing is changed. Non-strict: loads every entry
  // that matches and returns what did not.
  LoadReport load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);
  // The state dict as a safetensors file, and back (see load_state_dict).
  void save(const std::string& path) const;
  LoadReport load(const std::string& path, bool strict = true);

 protected:
  // Marks `slot` a leaf requiring grad and records it under `name`. The slot
  // must be a member of this module (it is read through its address).
  void register_parameter(const std::string& name, Tensor& slot);
  void register_buffer(const std::string& name, Tensor& slot);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> child) {
    add_child(name, child);
    return child;
  }

 private:
  void check_new_name(const std::string& name) const;
  void add_child(const std::string& name, std::shared_ptr<Module> child);
  // Every (full name, slot) below this module, tied or not.
  void collect(const std::string& prefix, bool parameters,
               std::vector<std::pair<std::string, Tensor*>>& out) const;

  std::vector<std::pair<std::string, Tensor*>> parameters_;
  std::vector<std::pair<std::string, Tensor*>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  Generator* generator_ = nullptr;
};

// An ordered list of children named "0", "1", ... (PyTorch's nn.ModuleList),
// so that "layers.3.attn.to_q.weight" names the fourth block's weight.
template <typename M>
class ModuleList : public Module {
 public:
  std::shared_ptr<M> push_back(std::shared_ptr<M> child) {
    items_.push_back(register_module(std::to_string(items_.size()), std::move(child)));
    return items_.back();
  }
  M& operator[](size_t i) const { return *items_.at(i); }
  size_t size() const { return items_.size(); }
  const std::vector<std::shared_ptr<M>>& items() const { return items_; }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

}  // namespace forge::nn
