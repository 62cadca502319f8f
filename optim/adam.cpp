// Adam and AdamW's per-parameter update (see adam.h), in the parameter's dtype
// and in the order of PyTorch's single-tensor implementation; coefficients such
// as 1 - beta1 are formed in f64 and then rounded, as PyTorch's Python scalars.
// A GPU parameter takes the same update in one fused kernel (optim/update_cuda.h).
#include "optim/adam.h"

#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "optim/kernels.h"
#include "optim/update_cuda.h"

namespace forge::optim {
namespace {

template <typename T>
void adam_update(T* p, const T* grad, T* m, T* v, int64_t n, T l2, T beta1, T one_minus_beta1,
                 T beta2, T one_minus_beta2, T bias_correction2_sqrt, T eps, T step_size) {
  detail::elementwise(n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T g = grad[i];
      if (l2 != T(0)) g = g + l2 * p[i];
      m[i] = m[i] * beta1 + one_minus_beta1 * g;
      v[i] = v[i] * beta2 + one_minus_beta2 * g * g;
      const T denom = std::sqrt(v[i]) / bias_correction2_sqrt + eps;
      p[i] = p[i] + (-step_size) * (m[i] / denom);
    }
  });
}

}  // namespace

void check_adam_options(const AdamOptions& o, const char* who) {
  FORGE_CHECK(o.beta1 >= 0 && o.beta1 < 1, "{}: expected beta1 in [0, 1), got {}", who, o.beta1);
  FORGE_CHECK(o.beta2 >= 0 && o.beta2 < 1, "{}: expected beta2 in [0, 1), got {}", who, o.beta2);
  FORGE_CHECK(std::isfinite(o.eps) && o.eps >= 0, "{}: expected a finite eps >= 0, got {}", who,
              o.eps);
}

Adam::Adam(std::vector<ParamGroup> groups, double lr, const AdamOptions& options)
    : Adam(std::move(groups), lr, options, false) {}

Adam::Adam(std::vector<ParamGroup> groups, double lr, const AdamOptions& options, bool decoupled)
    : Optimizer(std::move(groups), lr, {"exp_avg", "exp_avg_sq"}),
      options_(options),
      decoupled_(decoupled) {
  check_adam_options(options_, decoupled_ ? "AdamW" : "Adam");
}

cuda::optim::AdamCoefficients Adam::gpu_coefficients(const Update& u) const {
  const double t = static_cast<double>(u.step);
  const double bias_correction1 = 1 - std::pow(options_.beta1, t);
  const double bias_correction2 = 1 - std::pow(options_.beta2, t);
  cuda::optim::AdamCoefficients c;
  c.decay = decoupled_ && u.weight_decay != 0;
  c.keep = 1 - u.lr * u.weight_decay;
  c.l2 = decoupled_ ? 0.0 : u.weight_decay;
  c.beta1 = options_.beta1;
  c.one_minus_beta1 = 1 - options_.beta1;
  c.beta2 = options_.beta2;
  c.one_minus_beta2 = 1 - options_.beta2;
  c.bias_correction2_sqrt = std::sqrt(bias_correction2);
  c.eps = options_.eps;
  c.step_size = u.lr / bias_correction1;
  return c;
}

// With multi_tensor(), the GPU parameters go to adam_update_many, one call
// per (device, dtype) in parameter order; the others as update() takes them.
void Adam::update_all(const std::vector<Update>& updates) {
  if (!multi_tensor()) return Optimizer::update_all(updates);
  std::map<std::pair<int, DType>, std::vector<cuda::optim::AdamTensor>> gpu;
  for (const Update& u : updates) {
    if (u.param.device().is_cpu()) {
      update(u);
      continue;
    }
    cuda::optim::AdamTensor x;
    x.p = u.param.raw_device_data();
    x.grad = u.grad.raw_device_data();
    x.m = u.slots[0].raw_device_data();
    x.v = u.slots[1].raw_device_data();
    x.n = u.param.numel();
    x.c = gpu_coefficients(u);
    gpu[{u.param.device().index, u.param.dtype()}].push_back(x);
  }
  if constexpr (kCudaBuilt)
    for (const auto& [where, tensors] : gpu)
      cuda::optim::adam_update_many(where.second, where.first, tensors);
}

void Adam::update(const Update& u) {
  const double t = static_cast<double>(u.step);
  const double bias_correction1 = 1 - std::pow(options_.beta1, t);
  const double bias_correction2 = 1 - std::pow(options_.beta2, t);
  const double step_size = u.lr / bias_correction1;
  FORGE_IF_CUDA(u.param) {
    cuda::optim::adam_update(u.param.dtype(), u.param.device().index, u.param.raw_device_data(),
                             u.grad.raw_device_data(), u.slots[0].raw_device_data(),
                             u.slots[1].raw_device_data(), u.param.numel(), gpu_coefficients(u));
    return;
  }
  FORGE_DISPATCH_FLOAT(u.param.dtype(), "Adam", [&] {
    using T = scalar_t;
    T* p = u.param.data<T>();
    const int64_t n = u.param.numel();
    if (decoupled_ && u.weight_decay != 0) {
      const T keep = static_cast<T>(1 - u.lr * u.weight_decay);
      detail::elementwise(n, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) p[i] = p[i] * keep;
      });
    }
    adam_update<T>(p, u.grad.data<T>(), u.slots[0].data<T>(), u.slots[1].data<T>(), n,
                   static_cast<T>(decoupled_ ? 0.0 : u.weight_decay),
                   static_cast<T>(options_.beta1), static_cast<T>(1 - options_.beta1),
                   static_cast<T>(options_.beta2), static_cast<T>(1 - options_.beta2),
                   static_cast<T>(std::sqrt(bias_correction2)), static_cast<T>(options_.eps),
                   static_cast<T>(step_size));
  });
}

}  // namespace forge::optim
