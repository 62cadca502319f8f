// The weight EMA (see ema.h): timm's ModelEmaV3 schedule and lerp, kept per
// distinct tensor of the model and matched to it by name at every call.
#include "optim/ema.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "ops/ops.h"

namespace forge::optim {
namespace {

std::string describe(const Tensor& t) {
  return shape_str(t.shape()) + " " + dtype_name(t.dtype());
}

Tensor cpu_copy(const Tensor& t) {
  return t.device().is_cpu() ? t.clone() : t.to(Device::cpu());
}

// torch.lerp(start, end, w): start + w (end - start) for w < 0.5, else
// end - (end - start)(1 - w), so w = 1 (decay 0) gives `end` exactly.
Tensor lerp(const Tensor& start, const Tensor& end, double w) {
  const Tensor diff = end - start;
  return w < 0.5 ? start + diff * w : end - diff * (1 - w);
}

}  // namespace

ModelEma::ModelEma(const nn::Module& model, const EmaOptions& o) : options_(o) {
  FORGE_CHECK(o.min_decay >= 0 && o.min_decay <= o.decay && o.decay <= 1,
              "ModelEma: expected 0 <= min_decay <= decay <= 1, got min_decay {} and decay {}",
              o.min_decay, o.decay);
  FORGE_CHECK(o.warmup_gamma > 0 && o.warmup_power > 0,
              "ModelEma: expected warmup_gamma > 0 and warmup_power > 0, got {} and {}",
              o.warmup_gamma, o.warmup_power);
  FORGE_CHECK(o.update_after_step >= 0, "ModelEma: expected update_after_step >= 0, got {}",
              o.update_after_step);
  // One entry per distinct tensor: a tied weight is averaged once, and
  // swap_into exchanges it once.
  std::map<const TensorImpl*, size_t> entry_of;
  auto add = [&](const std::vector<std::pair<std::string, Tensor>>& named, bool average) {
    for (const auto& [name, t] : named) {
      if (!entry_of.emplace(t.impl_ptr().get(), entries_.size()).second) continue;
      entries_.push_back({name, average, t.detach().clone()});
    }
  };
  add(model.named_parameters(), true);
  add(model.named_buffers(), false);
  for (const auto& [name, t] : model.state_dict()) index_[name] = entry_of.at(t.impl_ptr().get());
}

double ModelEma::decay(int64_t step) const {
  const int64_t s = std::max<int64_t>(0, step - options_.update_after_step - 1);
  if (s == 0) return 0.0;
  if (!options_.warmup) return options_.decay;
  const double d =
      1 - std::pow(1 + static_cast<double>(s) / options_.warmup_gamma, -options_.warmup_power);
  return std::max(std::min(d, options_.decay), options_.min_decay);
}

std::vector<Tensor> ModelEma::model_tensors(const nn::Module& model, const char* where) const {
  const std::map<std::string, Tensor> own = model.state_dict();
  std::vector<std::string> problems;
  for (const auto& [name, i] : index_) {
    const auto it = own.find(name);
    const Tensor& mine = entries_[i].value;
    if (it == own.end()) {
      problems.push_back("not in the model: " + name);
    } else if (it->second.shape() != mine.shape() || it->second.dtype() != mine.dtype()) {
      problems.push_back(name + ": the EMA holds " + describe(mine) + ", the model " +
                         describe(it->second));
    }
  }
  for (const auto& [name, t] : own)
    if (!index_.count(name)) problems.push_back("not in the EMA: " + name);
  FORGE_CHECK(problems.empty(),
              "{}: the model does not match this EMA (build the EMA from this model):\n  {}", where,
              fmt::join(problems, "\n  "));
  std::vector<Tensor> out;
  for (const Entry& e : entries_) out.push_back(own.at(e.name));
  return out;
}

void ModelEma::update(const nn::Module& model, int64_t step) {
  const std::vector<Tensor> current = model_tensors(model, "ModelEma::update");
  const double w = 1 - decay(step);
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    const Tensor m = current[i].device() == e.value.device() ? current[i].detach()
                                                             : current[i].to(e.value.device());
    if (e.average) {
      e.value = lerp(e.value, m, w);
    } else {
      e.value.copy_from(m);
    }
  }
}

std::map<std::string, Tensor> ModelEma::state_dict() const {
  std::map<std::string, Tensor> out;
  for (const auto& [name, i] : index_) out[name] = cpu_copy(entries_[i].value);
  return out;
}

void ModelEma::load_state_dict(const std::map<std::string, Tensor>& state) {
  std::vector<std::string> problems;
  for (const auto& [name, i] : index_) {
    const auto it = state.find(name);
    const Tensor& mine = entries_[i].value;
    if (it == state.end()) {
      problems.push_back("missing: " + name);
    } else if (!it->second.defined()) {
      problems.push_back(name + ": expected " + describe(mine) + ", found an undefined tensor");
    } else if (it->second.shape() != mine.shape() || it->second.dtype() != mine.dtype()) {
      problems.push_back(name + ": expected " + describe(mine) + ", found " + describe(it->second));
    }
  }
  for (const auto& [name, t] : state)
    if (!index_.count(name)) problems.push_back("unexpected: " + name);
  FORGE_CHECK(problems.empty(), "ModelEma::load_state_dict: the state does not fit this EMA:\n  {}",
              fmt::join(problems, "\n  "));
  for (const auto& [name, i] : index_) entries_[i].value.copy_from(state.at(name));
}

void ModelEma::swap_into(nn::Module& model) {
  std::vector<Tensor> current = model_tensors(model, "ModelEma::swap_into");
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Tensor mine = current[i].clone();
    current[i].copy_from(entries_[i].value);
    entries_[i].value.copy_from(mine);
  }
}

}  // namespace forge::optim
