// Dynamic loss scaling (see grad_scaler.h).
#include "optim/grad_scaler.h"

#include <atomic>
#include <cmath>
#include <vector>

#include "ops/elementwise/elementwise.h"
#include "optim/kernels.h"
#include "optim/update_cuda.h"

namespace forge::optim {
namespace {

// out = g * inv_scale on the host; returns whether an element of g or out is
// not finite.
bool unscale_on_host(const Tensor& g, const Tensor& out, double inv_scale) {
  std::atomic<bool> found{false};
  FORGE_DISPATCH_FLOAT(g.dtype(), "GradScaler::unscale", [&] {
    const scalar_t* src = g.data<scalar_t>();
    scalar_t* dst = out.data<scalar_t>();
    const auto c = static_cast<scalar_t>(inv_scale);
    detail::elementwise(g.numel(), 2, [&](int64_t begin, int64_t end) {
      bool local = false;
      for (int64_t i = begin; i < end; ++i) {
        dst[i] = src[i] * c;
        if (!std::isfinite(src[i]) || !std::isfinite(dst[i])) local = true;
      }
      if (local) found.store(true, std::memory_order_relaxed);
    });
  });
  return found.load();
}

}  // namespace

GradScaler::GradScaler(const GradScalerOptions& options)
    : options_(options), scale_(options.init_scale) {
  FORGE_CHECK(std::isfinite(options_.init_scale) && options_.init_scale > 0,
              "GradScaler: expected a finite init_scale > 0, got {}", options_.init_scale);
  FORGE_CHECK(std::isfinite(options_.growth_factor) && options_.growth_factor > 1,
              "GradScaler: expected a finite growth_factor > 1, got {}", options_.growth_factor);
  FORGE_CHECK(options_.backoff_factor > 0 && options_.backoff_factor < 1,
              "GradScaler: expected backoff_factor in (0, 1), got {}", options_.backoff_factor);
  FORGE_CHECK(options_.growth_interval > 0, "GradScaler: expected growth_interval > 0, got {}",
              options_.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  FORGE_CHECK(loss.defined(), "GradScaler::scale: the loss is an undefined tensor");
  if (!options_.enabled) return loss;
  return ops::mul(loss, scale_);
}

bool GradScaler::unscale(Optimizer& optimizer) {
  if (!options_.enabled) return true;
  OptimizerState& st = optimizers_[&optimizer];
  FORGE_CHECK(st.stage == Stage::ready,
              "GradScaler::unscale: this {} optimizer was already {} since the last update(); "
              "unscale at most once per optimizer and iteration, before step()",
              optimizer.name(), st.stage == Stage::unscaled ? "unscaled" : "stepped");
  const double inv_scale = 1.0 / scale_;
  bool found_inf = false;
  std::map<int, Tensor> flags;  // device index -> f32 (1): 1 once a GPU grad there is not finite
  for (Tensor p : optimizer.parameters()) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    const Tensor out = Tensor::empty(g.shape(), g.dtype(), g.device());
    FORGE_IF_CUDA(g) {
      const int index = g.device().index;
      auto it = flags.find(index);
      if (it == flags.end())
        it = flags.emplace(index, Tensor::zeros({1}, DType::f32, g.device())).first;
      cuda::optim::unscale(g.dtype(), index, g.raw_device_data(), out.raw_device_data(), g.numel(),
                           inv_scale, static_cast<float*>(it->second.raw_device_data()));
      p.set_grad(out);
      continue;
    }
    if (unscale_on_host(g, out, inv_scale)) found_inf = true;
    p.set_grad(out);
  }
  for (const auto& [index, flag] : flags)
    if (flag.item() != 0) found_inf = true;
  st.found_inf = found_inf;
  st.stage = Stage::unscaled;
  return !found_inf;
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  OptimizerState& st = optimizers_[&optimizer];
  FORGE_CHECK(st.stage != Stage::stepped,
              "GradScaler::step: already called for this {} optimizer since the last update(); "
              "call update() once per iteration",
              optimizer.name());
  if (st.stage == Stage::ready) unscale(optimizer);
  if (!st.found_inf) optimizer.step();
  st.stage = Stage::stepped;
  return !st.found_inf;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  bool recorded = false, found_inf = false;
  for (const auto& [opt, st] : optimizers_) {
    if (st.stage == Stage::ready) continue;
    recorded = true;
    if (st.found_inf) found_inf = true;
  }
  FORGE_CHECK(recorded,
              "GradScaler::update: no unscale() or step() since the last update(), so nothing "
              "says whether the grads were finite");
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
  optimizers_.clear();
}

std::map<std::string, double> GradScaler::state() const {
  return {{"scale", scale_}, {"growth_tracker", static_cast<double>(growth_tracker_)}};
}

void GradScaler::set_state(const std::map<std::string, double>& state) {
  std::vector<std::string> problems;
  const auto scale = state.find("scale");
  if (scale == state.end())
    problems.push_back("missing: scale");
  else if (!std::isfinite(scale->second) || scale->second <= 0)
    problems.push_back(fmt::format("scale: expected a finite value > 0, found {}", scale->second));
  const auto tracker = state.find("growth_tracker");
  if (tracker == state.end()) {
    problems.push_back("missing: growth_tracker");
  } else {
    const double t = tracker->second;
    if (!(t >= 0 && t < static_cast<double>(options_.growth_interval) && t == std::floor(t)))
      problems.push_back(fmt::format(
          "growth_tracker: expected a whole number in [0, {}) (the growth_interval), found {}",
          options_.growth_interval, t));
  }
  for (const auto& [key, value] : state)
    if (key != "scale" && key != "growth_tracker") problems.push_back("unexpected: " + key);
  FORGE_CHECK(problems.empty(), "GradScaler::set_state: the state does not fit:\n  {}",
              fmt::join(problems, "\n  "));
  scale_ = scale->second;
  growth_tracker_ = static_cast<int64_t>(tracker->second);
}

}  // namespace forge::optim
