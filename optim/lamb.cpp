// LAMB's per-parameter update (see lamb.h): the moments and r in one pass, the
// two norms as deterministic f64 sums, then the scaled step. On a GPU the same
// three stages run as kernels (optim/update_cuda.h), the trust ratio staying on
// the device.
#include "optim/lamb.h"

#include <cmath>

#include "optim/adam.h"
#include "optim/kernels.h"
#include "optim/update_cuda.h"

namespace forge::optim {

Lamb::Lamb(std::vector<ParamGroup> groups, double lr, const LambOptions& options)
    : Optimizer(std::move(groups), lr, {"exp_avg", "exp_avg_sq"}), options_(options) {
  check_adam_options({options_.beta1, options_.beta2, options_.eps}, "LAMB");
}

void Lamb::update(const Update& u) {
  const double t = static_cast<double>(u.step);
  const double bias_correction1 = 1 - std::pow(options_.beta1, t);
  const double bias_correction2 = 1 - std::pow(options_.beta2, t);
  FORGE_IF_CUDA(u.param) {
    const int device = u.param.device().index;
    const Tensor r = Tensor::empty(u.param.shape(), u.param.dtype(), u.param.device());
    const Tensor scratch =
        Tensor::empty({cuda::optim::reduce_scratch_size(device)}, DType::f64, u.param.device());
    cuda::optim::LambCoefficients c;
    c.beta1 = options_.beta1;
    c.one_minus_beta1 = 1 - options_.beta1;
    c.beta2 = options_.beta2;
    c.one_minus_beta2 = 1 - options_.beta2;
    c.bias_correction1 = bias_correction1;
    c.bias_correction2 = bias_correction2;
    c.eps = options_.eps;
    c.weight_decay = u.weight_decay;
    c.lr = u.lr;
    cuda::optim::lamb_update(u.param.dtype(), device, u.param.raw_device_data(),
                             u.grad.raw_device_data(), u.slots[0].raw_device_data(),
                             u.slots[1].raw_device_data(), r.raw_device_data(),
                             static_cast<double*>(scratch.raw_device_data()), u.param.numel(), c);
    return;
  }
  FORGE_DISPATCH_FLOAT(u.param.dtype(), "LAMB", [&] {
    using T = scalar_t;
    const int64_t n = u.param.numel();
    T* w = u.param.data<T>();
    const T* g = u.grad.data<T>();
    T* m = u.slots[0].data<T>();
    T* v = u.slots[1].data<T>();
    Tensor r_tensor = Tensor::empty(u.param.shape(), u.param.dtype());
    T* r = r_tensor.data<T>();
    const T beta1 = static_cast<T>(options_.beta1),
            one_minus_beta1 = static_cast<T>(1 - options_.beta1);
    const T beta2 = static_cast<T>(options_.beta2),
            one_minus_beta2 = static_cast<T>(1 - options_.beta2);
    const T bc1 = static_cast<T>(bias_correction1), bc2 = static_cast<T>(bias_correction2);
    const T eps = static_cast<T>(options_.eps), wd = static_cast<T>(u.weight_decay);
    detail::elementwise(n, 20, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        m[i] = m[i] * beta1 + one_minus_beta1 * g[i];
        v[i] = v[i] * beta2 + one_minus_beta2 * g[i] * g[i];
        r[i] = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps) + wd * w[i];
      }
    });
    const double w_norm = std::sqrt(detail::blocked_sum(n, [&](int64_t i) {
      const double x = static_cast<double>(w[i]);
      return x * x;
    }));
    const double r_norm = std::sqrt(detail::blocked_sum(n, [&](int64_t i) {
      const double x = static_cast<double>(r[i]);
      return x * x;
    }));
    const double trust = w_norm > 0 && r_norm > 0 ? w_norm / r_norm : 1.0;
    const T scale = static_cast<T>(-u.lr * trust);
    detail::elementwise(n, 2, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) w[i] = w[i] + scale * r[i];
    });
  });
}

}  // namespace forge::optim
