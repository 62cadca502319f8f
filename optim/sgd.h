// SGD with momentum, dampening, Nesterov momentum and L2 weight decay, with
// torch.optim.SGD's update. For a parameter p with grad g at its t-th update:
//   g = g + wd p                          (wd: the group's weight decay)
//   b = g                      when t = 1 (the momentum buffer starts at g)
//   b = momentum b + (1 - dampening) g    otherwise
//   g = g + momentum b (nesterov), or g = b
//   p = p - lr g
// Without momentum the buffer is not kept and p = p - lr (g + wd p).
#pragma once

#include "optim/optimizer.h"

namespace forge::optim {

struct SGDOptions {
  double momentum = 0;    // >= 0
  double dampening = 0;   // in [0, 1]
  bool nesterov = false;  // needs momentum > 0 and dampening = 0, as PyTorch
};

// State slot (momentum > 0 only): "momentum_buffer".
class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, double lr, const SGDOptions& options = {});
  std::string name() const override { return "sgd"; }
  const SGDOptions& options() const { return options_; }

 protected:
  void update(const Update& u) override;

 private:
  SGDOptions options_;
};

}  // namespace forge::optim
