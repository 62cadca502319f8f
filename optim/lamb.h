// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training
// BERT in 76 minutes", Algorithm 2), with the layer being one parameter tensor.
// For a parameter w with grad g at its t-th update (wd: the group's decay):
//   m = beta1 m + (1 - beta1) g,      m_hat = m / (1 - beta1^t)
//   v = beta2 v + (1 - beta2) g^2,    v_hat = v / (1 - beta2^t)
//   r = m_hat / (sqrt(v_hat) + eps) + wd w
//   trust = ||w|| / ||r||  (L2 over the whole tensor, in f64; 1 when either is 0)
//   w = w - lr trust r
// The variant: bias correction on (the paper's final version), the scaling
// function phi is the identity (no clamp of ||w||), and the trust ratio is
// applied to every parameter, those in a group without decay included.
#pragma once

#include "optim/optimizer.h"

namespace forge::optim {

struct LambOptions {
  double beta1 = 0.9;    // in [0, 1)
  double beta2 = 0.999;  // in [0, 1)
  double eps = 1e-6;     // >= 0
};

// State slots: "exp_avg" (m), "exp_avg_sq" (v).
class Lamb : public Optimizer {
 public:
  Lamb(std::vector<ParamGroup> groups, double lr, const LambOptions& options = {});
  std::string name() const override { return "lamb"; }
  const LambOptions& options() const { return options_; }

 protected:
  void update(const Update& u) override;

 private:
  LambOptions options_;
};

}  // namespace forge::optim
