// The optimizer base: groups, per-parameter state, the checked step loop and
// the state dict.
#include "optim/optimizer.h"

#include <atomic>

#include <cmath>
#include <set>
#include <utility>

namespace forge::optim {
namespace {

constexpr const char* kNoDecayNames[] = {"token_emb", "pos_emb", "pos_embed", "cls_token"};

void check_lr(double lr, const char* where) {
  FORGE_CHECK(std::isfinite(lr) && lr >= 0, "{}: expected a finite lr >= 0, got {}", where, lr);
}

std::string describe(const Shape& shape, DType dtype) {
  return shape_str(shape) + " " + dtype_name(dtype);
}

}  // namespace

bool is_no_decay(const std::string& name, const Tensor& param) {
  if (param.dim() <= 1) return true;
  size_t begin = 0;
  while (begin <= name.size()) {
    size_t end = name.find('.', begin);
    if (end == std::string::npos) end = name.size();
    const std::string part = name.substr(begin, end - begin);
    for (const char* n : kNoDecayNames)
      if (part == n) return true;
    begin = end + 1;
  }
  return false;
}

std::vector<ParamGroup> param_groups(const nn::Module& model, double weight_decay,
                                     bool exclude_norms_biases_embeddings) {
  FORGE_CHECK(std::isfinite(weight_decay) && weight_decay >= 0,
              "param_groups: expected a finite weight_decay >= 0, got {}", weight_decay);
  if (!exclude_norms_biases_embeddings) {
    ParamGroup all;
    all.params = model.named_parameters();
    all.weight_decay = weight_decay;
    return {all};
  }
  ParamGroup decay, no_decay;
  decay.weight_decay = weight_decay;
  for (auto& [name, p] : model.named_parameters())
    (is_no_decay(name, p) ? no_decay : decay).params.emplace_back(name, p);
  return {decay, no_decay};
}

std::vector<ParamGroup> param_groups_layer_decay(
    const nn::Module& model, double weight_decay, bool exclude_norms_biases_embeddings,
    double layer_decay, const std::function<int64_t(const std::string&)>& layer_id,
    int64_t num_layers) {
  FORGE_CHECK(std::isfinite(weight_decay) && weight_decay >= 0,
              "param_groups_layer_decay: expected a finite weight_decay >= 0, got {}",
              weight_decay);
  FORGE_CHECK(std::isfinite(layer_decay) && layer_decay > 0,
              "param_groups_layer_decay: expected a finite layer_decay > 0, got {}", layer_decay);
  FORGE_CHECK(num_layers >= 1, "param_groups_layer_decay: expected num_layers >= 1, got {}",
              num_layers);
  std::vector<ParamGroup> groups;
  std::map<std::pair<int64_t, bool>, size_t> group_of;  // (layer, decays) -> index in groups
  for (auto& [name, p] : model.named_parameters()) {
    const int64_t id = layer_id(name);
    FORGE_CHECK(id >= 0 && id < num_layers,
                "param_groups_layer_decay: parameter '{}' is in layer {}; expected a layer in "
                "[0, {}) (num_layers)",
                name, id, num_layers);
    const bool decays = !exclude_norms_biases_embeddings || !is_no_decay(name, p);
    const auto [it, added] = group_of.emplace(std::pair{id, decays}, groups.size());
    if (added) {
      ParamGroup g;
      g.weight_decay = decays ? weight_decay : 0;
      g.lr_scale = std::pow(layer_decay, static_cast<double>(num_layers - 1 - id));
      groups.push_back(std::move(g));
    }
    groups[it->second].params.emplace_back(name, p);
  }
  return groups;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr, std::vector<std::string> slot_names)
    : groups_(std::move(groups)), slot_names_(std::move(slot_names)), lr_(lr) {
  check_lr(lr, "Optimizer");
  std::set<std::string> names;
  std::set<const TensorImpl*> tensors;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    FORGE_CHECK(std::isfinite(g.weight_decay) && g.weight_decay >= 0,
                "Optimizer: group {}: expected a finite weight_decay >= 0, got {}", gi,
                g.weight_decay);
    FORGE_CHECK(std::isfinite(g.lr_scale) && g.lr_scale >= 0,
                "Optimizer: group {}: expected a finite lr_scale >= 0, got {}", gi, g.lr_scale);
    for (const auto& [name, p] : g.params) {
      FORGE_CHECK(p.defined(), "Optimizer: group {}: parameter '{}' is an undefined tensor", gi,
                  name);
      FORGE_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::f64,
                  "Optimizer: group {}: parameter '{}' is a {} tensor on {}; expected f32 or f64",
                  gi, name, dtype_name(p.dtype()), p.device().str());
      FORGE_CHECK(names.insert(name).second,
                  "Optimizer: group {}: parameter name '{}' is listed twice (names key the "
                  "state dict and must be unique)",
                  gi, name);
      FORGE_CHECK(tensors.insert(&p.impl()).second,
                  "Optimizer: group {}: parameter '{}' is a tensor already listed under another "
                  "name; an optimizer must update each tensor once",
                  gi, name);
      State s{name, p, gi, 0, {}};
      for (size_t k = 0; k < slot_names_.size(); ++k)
        s.slots.push_back(Tensor::zeros(p.shape(), p.dtype(), p.device()));
      states_.push_back(std::move(s));
    }
  }
}

void Optimizer::set_lr(double lr) {
  check_lr(lr, "Optimizer::set_lr");
  lr_ = lr;
}

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> out;
  for (const State& s : states_) out.push_back(s.param);
  return out;
}

void Optimizer::step() {
  for (const State& s : states_) {
    const Tensor g = s.param.grad();
    if (!g.defined()) continue;
    FORGE_CHECK(g.device() == s.param.device() && g.shape() == s.param.shape() &&
                    g.dtype() == s.param.dtype(),
                "{}.step: the grad of '{}' is {} on {}; expected {} on {} like the parameter",
                name(), s.name, describe(g.shape(), g.dtype()), g.device().str(),
                describe(s.param.shape(), s.param.dtype()), s.param.device().str());
  }
  std::vector<Tensor> grads;  // kept alive for the updates that refer to them
  grads.reserve(states_.size());
  std::vector<Update> updates;
  for (State& s : states_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    ++s.step;
    const ParamGroup& group = groups_[s.group];
    grads.push_back(std::move(g));
    updates.push_back(
        Update{s.name, s.param, grads.back(), s.slots, s.step, lr_ * group.lr_scale, group.weight_decay});
  }
  update_all(updates);
  ++steps_;
}

void Optimizer::update_all(const std::vector<Update>& updates) {
  for (const Update& u : updates) update(u);
}

namespace {
std::atomic<bool> g_multi_tensor{false};
}  // namespace

void set_multi_tensor(bool on) {
  g_multi_tensor.store(on);
}

bool multi_tensor() {
  return g_multi_tensor.load();
}

void Optimizer::zero_grad() {
  for (State& s : states_) s.param.zero_grad();
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> out;
  out["steps"] = Tensor::scalar(static_cast<double>(steps_), DType::i64);
  out["lr"] = Tensor::scalar(lr_, DType::f64);
  for (const State& s : states_) {
    out["step." + s.name] = Tensor::scalar(static_cast<double>(s.step), DType::i64);
    for (size_t k = 0; k < slot_names_.size(); ++k)
      out[slot_names_[k] + "." + s.name] =
          s.slots[k].device().is_cpu() ? s.slots[k].clone() : s.slots[k].to(Device::cpu());
  }
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  // Every expected entry with its shape and dtype; then one pass that lists
  // every problem before anything is written.
  std::map<std::string, std::pair<Shape, DType>> expected;
  expected["steps"] = {Shape{}, DType::i64};
  expected["lr"] = {Shape{}, DType::f64};
  for (const State& s : states_) {
    expected["step." + s.name] = {Shape{}, DType::i64};
    for (const auto& slot : slot_names_)
      expected[slot + "." + s.name] = {s.param.shape(), s.param.dtype()};
  }
  std::vector<std::string> problems;
  for (const auto& [key, want] : expected) {
    const auto it = state.find(key);
    if (it == state.end()) {
      problems.push_back("missing: " + key);
      continue;
    }
    const Tensor& t = it->second;
    if (!t.defined()) {
      problems.push_back(key + ": expected " + describe(want.first, want.second) +
                         ", found an undefined tensor");
    } else if (t.shape() != want.first || t.dtype() != want.second) {
      problems.push_back(key + ": expected " + describe(want.first, want.second) + ", found " +
                         describe(t.shape(), t.dtype()));
    } else if (want.first.empty()) {
      const double v = t.item();
      const bool ok = key == "lr" ? std::isfinite(v) && v >= 0 : v >= 0;
      if (!ok) problems.push_back(fmt::format("{}: expected a value >= 0, found {}", key, v));
    }
  }
  for (const auto& [key, t] : state)
    if (!expected.count(key)) problems.push_back("unexpected: " + key);
  FORGE_CHECK(problems.empty(), "{}.load_state_dict: the state does not fit this optimizer:\n  {}",
              name(), fmt::join(problems, "\n  "));

  steps_ = static_cast<int64_t>(state.at("steps").item());
  lr_ = state.at("lr").item();
  for (State& s : states_) {
    s.step = static_cast<int64_t>(state.at("step." + s.name).item());
    for (size_t k = 0; k < slot_names_.size(); ++k)
      s.slots[k].copy_from(state.at(slot_names_[k] + "." + s.name));
  }
}

}  // namespace forge::optim
