// Whether ops record a graph. Thread-local, like PyTorch's grad mode.
#pragma once

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

}  // namespace forge::autograd

namespace forge {
using autograd::NoGradGuard;
}
