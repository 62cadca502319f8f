// Whether ops record a graph. Thread-local, like PyTorch's grad mode.
#pragma once

#include <string>

#include "core/tensor.h"

namespace forge::autograd {

bool grad_enabled();
void set_grad_enabled(bool enabled);

// Sets grad mode for a scope and restores the previous mode at its end.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

// Ops inside this scope record nothing (evaluation, optimizer updates).
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

// Check-NaN mode (process-wide, off by default): every recorded op checks its
// outputs, and the backward engine every gradient an op returns, and the
// first non-finite value throws a forge::Error naming the op. Costs one pass
// over each output; meant for finding where a NaN loss comes from.
bool check_nan_enabled();
void set_check_nan(bool enabled);

// Throws naming `what` when a floating-point tensor holds a NaN or an infinity.
void check_finite(const Tensor& t, const std::string& what);

}  // namespace forge::autograd

namespace forge {
using autograd::NoGradGuard;
}
