// Adam (torch.optim.Adam: weight decay as L2, added to the gradient) and AdamW
// (torch.optim.AdamW: decoupled weight decay), with PyTorch's bias correction.
// For a parameter p with grad g at its t-th update (wd: the group's decay):
//   Adam:  g = g + wd p                 AdamW:  p = p (1 - lr wd)
//   m = beta1 m + (1 - beta1) g
//   v = beta2 v + (1 - beta2) g^2
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// AdamW with the lr folded into the decay is also flax.optim.Adam's
// weight_decay (the LRA code's optimizer): p - lr (update + wd p).
#pragma once

#include "optim/optimizer.h"
#include "optim/update_cuda.h"

namespace forge::optim {

struct AdamOptions {
  double beta1 = 0.9;    // in [0, 1)
  double beta2 = 0.999;  // in [0, 1)
  double eps = 1e-8;     // >= 0
};

// State slots: "exp_avg" (m), "exp_avg_sq" (v).
class Adam : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, double lr, const AdamOptions& options = {});
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }
  const AdamOptions& options() const { return options_; }

 protected:
  Adam(std::vector<ParamGroup> groups, double lr, const AdamOptions& options, bool decoupled);
  void update(const Update& u) override;
  void update_all(const std::vector<Update>& updates) override;

 private:
  // The coefficients of the fused GPU update of u.
  cuda::optim::AdamCoefficients gpu_coefficients(const Update& u) const;

  AdamOptions options_;
  bool decoupled_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<ParamGroup> groups, double lr, const AdamOptions& options = {})
      : Adam(std::move(groups), lr, options, true) {}
};

// Checks betas in [0, 1) and eps >= 0, naming `who` ("Adam", "LAMB").
void check_adam_options(const AdamOptions& o, const char* who);

}  // namespace forge::optim
