// Global-norm gradient clipping (see clip.h).
#include "optim/clip.h"

#include <cmath>

#include "optim/kernels.h"

namespace forge::optim {
namespace {

double sum_of_squares(const Tensor& g, size_t index) {
  FORGE_CHECK(g.device().is_cpu(), "grad_norm: the grad of parameter {} is on {}; expected the CPU",
              index, g.device().str());
  return FORGE_DISPATCH_FLOAT(g.dtype(), "grad_norm", [&] {
    const scalar_t* x = g.data<scalar_t>();
    return detail::blocked_sum(g.numel(), [&](int64_t i) {
      const double v = static_cast<double>(x[i]);
      return v * v;
    });
  });
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  double total = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    FORGE_CHECK(params[k].defined(), "grad_norm: parameter {} is an undefined tensor", k);
    const Tensor g = params[k].grad();
    if (g.defined()) total += sum_of_squares(g, k);
  }
  return std::sqrt(total);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  FORGE_CHECK(max_norm > 0, "clip_grad_norm: expected max_norm > 0, got {}", max_norm);
  const double norm = grad_norm(params);
  if (!std::isfinite(norm)) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1) return norm;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor scaled = Tensor::empty(g.shape(), g.dtype());
    FORGE_DISPATCH_FLOAT(g.dtype(), "clip_grad_norm", [&] {
      const scalar_t* src = g.data<scalar_t>();
      scalar_t* dst = scaled.data<scalar_t>();
      const auto c = static_cast<scalar_t>(coef);
      detail::elementwise(g.numel(), 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dst[i] = src[i] * c;
      });
    });
    Tensor handle = p;  // shares p's impl, so set_grad reaches the parameter
    handle.set_grad(scaled);
  }
  return norm;
}

}  // namespace forge::optim
