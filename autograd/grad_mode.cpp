#include "autograd/grad_mode.h"

#include <atomic>
#include <cmath>

#include "core/error.h"

namespace forge::autograd {

namespace {
thread_local bool g_grad_enabled = true;
std::atomic<bool> g_check_nan{false};
}  // namespace

bool grad_enabled() {
  return g_grad_enabled;
}
void set_grad_enabled(bool enabled) {
  g_grad_enabled = enabled;
}

GradModeGuard::GradModeGuard(bool enabled) : previous_(g_grad_enabled) {
  g_grad_enabled = enabled;
}
GradModeGuard::~GradModeGuard() {
  g_grad_enabled = previous_;
}

bool check_nan_enabled() {
  return g_check_nan.load(std::memory_order_relaxed);
}
void set_check_nan(bool enabled) {
  g_check_nan.store(enabled, std::memory_order_relaxed);
}

void check_finite(const Tensor& t, const std::string& what) {
  if (!t.defined() || !is_floating(t.dtype())) return;
  // Tensors are contiguous; a GPU tensor is checked on the host (check-nan
  // mode is for finding a fault, not for speed), 16-bit floats widened.
  Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
  if (c.dtype() == DType::bf16 || c.dtype() == DType::f16) c = c.to(DType::f32);
  FORGE_DISPATCH_FLOAT(c.dtype(), "check_finite", [&] {
    const scalar_t* p = c.data<scalar_t>();
    for (int64_t i = 0; i < c.numel(); ++i) {
      if (!std::isfinite(static_cast<double>(p[i])))
        FORGE_FAIL("check-nan: {} is not finite: element {} of shape {} is {}", what, i,
                   shape_str(c.shape()), static_cast<double>(p[i]));
    }
  });
}

}  // namespace forge::autograd
