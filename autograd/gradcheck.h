// Numerical gradient check: compares the analytic Jacobian (one backward per
// output element) with central differences in float64, for every input that
// requires grad, and reports the worst element on failure.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace forge::autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // on failure: the input, element, analytic and numeric values
  double max_abs_error = 0;
};

// fn maps the inputs to one f64 tensor. Inputs that require grad must be f64
// leaves; the others (indices, masks) are passed through untouched.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions options = {});

}  // namespace forge::autograd
