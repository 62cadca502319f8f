// SGD's per-parameter update (see sgd.h), in the parameter's dtype, on the CPU
// or (optim/update_cuda.h) the parameter's GPU.
#include "optim/sgd.h"

#include <cmath>

#include "optim/kernels.h"
#include "optim/update_cuda.h"

namespace forge::optim {
namespace {

std::vector<std::string> sgd_slots(const SGDOptions& o) {
  FORGE_CHECK(std::isfinite(o.momentum) && o.momentum >= 0,
              "SGD: expected a finite momentum >= 0, got {}", o.momentum);
  FORGE_CHECK(o.dampening >= 0 && o.dampening <= 1, "SGD: expected dampening in [0, 1], got {}",
              o.dampening);
  FORGE_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
              "SGD: nesterov needs momentum > 0 and dampening = 0, got momentum {} and "
              "dampening {}",
              o.momentum, o.dampening);
  if (o.momentum == 0) return {};
  return {"momentum_buffer"};
}

template <typename T>
void sgd_update(T* p, const T* grad, T* buf, int64_t n, bool first, T lr, T wd, T momentum,
                T one_minus_dampening, bool nesterov) {
  detail::elementwise(n, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T g = grad[i];
      if (wd != T(0)) g = g + wd * p[i];
      if (buf) {
        buf[i] = first ? g : buf[i] * momentum + one_minus_dampening * g;
        g = nesterov ? g + momentum * buf[i] : buf[i];
      }
      p[i] = p[i] + (-lr) * g;
    }
  });
}

}  // namespace

SGD::SGD(std::vector<ParamGroup> groups, double lr, const SGDOptions& options)
    : Optimizer(std::move(groups), lr, sgd_slots(options)), options_(options) {}

void SGD::update(const Update& u) {
  FORGE_IF_CUDA(u.param) {
    void* buf = u.slots.empty() ? nullptr : u.slots[0].raw_device_data();
    cuda::optim::sgd_update(
        u.param.dtype(), u.param.device().index, u.param.raw_device_data(),
        u.grad.raw_device_data(), buf, u.param.numel(), u.step == 1,
        {u.lr, u.weight_decay, options_.momentum, 1 - options_.dampening, options_.nesterov});
    return;
  }
  FORGE_DISPATCH_FLOAT(u.param.dtype(), "SGD", [&] {
    using T = scalar_t;
    T* buf = u.slots.empty() ? nullptr : u.slots[0].data<T>();
    sgd_update<T>(u.param.data<T>(), u.grad.data<T>(), buf, u.param.numel(), u.step == 1,
                  static_cast<T>(u.lr), static_cast<T>(u.weight_decay),
                  static_cast<T>(options_.momentum), static_cast<T>(1 - options_.dampening),
                  options_.nesterov);
  });
}

}  // namespace forge::optim
