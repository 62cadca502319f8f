// Module bookkeeping: registration, dotted-name traversal and state dicts.
#include "nn/module.h"

#include <set>

#include "autograd/grad_mode.h"
#include "core/safetensors.h"

namespace forge::nn {

std::string LoadReport::str() const {
  std::string s;
  for (const auto& n : missing) s += fmt::format("missing: {}\n", n);
  for (const auto& n : unexpected) s += fmt::format("unexpected: {}\n", n);
  for (const auto& n : mismatched) s += fmt::format("mismatched: {}\n", n);
  return s;
}

void Module::check_new_name(const std::string& name) const {
  FORGE_CHECK(!name.empty() && name.find('.') == std::string::npos,
              "Module: name '{}' must be non-empty and contain no '.' (dots separate levels)",
              name);
  auto taken = [&](const auto& list) {
    for (const auto& [n, _] : list)
      if (n == name) return true;
    return false;
  };
  FORGE_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_),
              "Module: name '{}' is already registered in this module", name);
}

void Module::register_parameter(const std::string& name, Tensor& slot) {
  check_new_name(name);
  FORGE_CHECK(slot.defined() && slot.is_leaf(),
              "Module: parameter '{}' must be a defined leaf tensor", name);
  slot.set_requires_grad(true);
  parameters_.emplace_back(name, &slot);
}

void Module::register_buffer(const std::string& name, Tensor& slot) {
  check_new_name(name);
  FORGE_CHECK(slot.defined(), "Module: buffer '{}' must be a defined tensor", name);
  buffers_.emplace_back(name, &slot);
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> child) {
  check_new_name(name);
  FORGE_CHECK(child != nullptr, "Module: child '{}' is null", name);
  child->train(training_);
  children_.emplace_back(name, std::move(child));
}

void Module::collect(const std::string& prefix, bool parameters,
                     std::vector<std::pair<std::string, Tensor*>>& out) const {
  for (const auto& [name, slot] : parameters ? parameters_ : buffers_)
    out.emplace_back(prefix + name, slot);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", parameters, out);
}

namespace {

// Keeps the first name of each distinct tensor (tied weights share an impl).
std::vector<std::pair<std::string, Tensor>> distinct(
    const std::vector<std::pair<std::string, Tensor*>>& slots) {
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<const TensorImpl*> seen;
  for (const auto& [name, slot] : slots)
    if (seen.insert(slot->impl_ptr().get()).second) out.emplace_back(name, *slot);
  return out;
}

std::string describe(const Tensor& t) {
  return fmt::format("{} {}", shape_str(t.shape()), dtype_name(t.dtype()));
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", true, slots);
  return distinct(slots);
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [_, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", false, slots);
  return distinct(slots);
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [_, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::zero_grad() {
  for (auto& t : parameters()) t.zero_grad();
}

void Module::to(Device device) {
  std::vector<std::pair<std::string, Tensor*>> params, buffers;
  collect("", true, params);
  collect("", false, buffers);
  // A tied tensor sits in several slots: each distinct tensor is copied once
  // and every slot that held it gets the copy, so the tie survives the move.
  std::map<const TensorImpl*, Tensor> moved;
  const auto move = [&](Tensor* slot, bool parameter) {
    if (!slot->defined() || slot->device() == device) return;
    auto it = moved.find(&slot->impl());
    if (it == moved.end()) {
      Tensor copy = slot->detach().to(device);
      if (parameter) copy.set_requires_grad(true);
      it = moved.emplace(&slot->impl(), copy).first;
    }
    *slot = it->second;
  };
  for (auto& [name, slot] : params) move(slot, true);
  for (auto& [name, slot] : buffers) move(slot, false);
}

Device Module::device() const {
  const auto params = named_parameters();
  if (!params.empty()) return params.front().second.device();
  const auto buffers = named_buffers();
  return buffers.empty() ? Device::cpu() : buffers.front().second.device();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [_, child] : children_) child->train(on);
}

void Module::set_generator(Generator* gen) {
  generator_ = gen;
  for (auto& [_, child] : children_) child->set_generator(gen);
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", true, slots);
  collect("", false, slots);
  std::map<std::string, Tensor> out;
  for (const auto& [name, slot] : slots) out.emplace(name, *slot);
  return out;
}

LoadReport Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  const std::map<std::string, Tensor> own = state_dict();
  LoadReport report;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, source)
  for (const auto& [name, dst] : own) {
    auto it = state.find(name);
    if (it == state.end()) {
      report.missing.push_back(name);
    } else if (!it->second.defined() || it->second.shape() != dst.shape() ||
               it->second.dtype() != dst.dtype()) {
      report.mismatched.push_back(
          fmt::format("{}: expected {}, found {}", name, describe(dst),
                      it->second.defined() ? describe(it->second) : "undefined"));
    } else {
      copies.emplace_back(dst, it->second);
    }
  }
  for (const auto& [name, _] : state)
    if (!own.contains(name)) report.unexpected.push_back(name);
  // All problems are known before the first copy, so a strict failure leaves
  // the module untouched.
  if (strict && !report.ok())
    FORGE_FAIL(
        "load_state_dict: the state dict does not match the module ({} missing, {} unexpected, {} "
        "mismatched):\n{}",
        report.missing.size(), report.unexpected.size(), report.mismatched.size(), report.str());
  NoGradGuard no_grad;
  for (auto& [dst, src] : copies)
    dst.copy_from(src.device() == dst.device() ? src : src.to(dst.device()));
  return report;
}

void Module::save(const std::string& path) const {
  safetensors::save(path, state_dict());
}

LoadReport Module::load(const std::string& path, bool strict) {
  return load_state_dict(safetensors::load(path).tensors, strict);
}

}  // namespace forge::nn
