// Every attention op with a small gradcheck case, by name, so that the
// `attnforge gradcheck` command and a test can run them all.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "core/tensor.h"

namespace forge::ops::attention {

struct GradcheckCase {
  std::string name;  // "<mechanism>/<option set>", e.g. "softmax/causal+mask"
  // Fresh f64 inputs (those that need a gradient require grad) and the function of them.
  std::function<std::vector<Tensor>()> make_inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  // Tolerances, where the mechanism's definition needs other than the defaults
  // (FAVOR+'s stop-grad stabiliser: see favor.cpp).
  autograd::GradcheckOptions options = {};
};

// Each mechanism's file defines its own list; registry.cpp joins them.
std::vector<GradcheckCase> softmax_gradcheck_cases();
std::vector<GradcheckCase> local_gradcheck_cases();
std::vector<GradcheckCase> efficient_gradcheck_cases();
std::vector<GradcheckCase> linear_gradcheck_cases();
std::vector<GradcheckCase> taylor_linear_gradcheck_cases();
std::vector<GradcheckCase> linformer_gradcheck_cases();
std::vector<GradcheckCase> favor_gradcheck_cases();
std::vector<GradcheckCase> taylorshift_gradcheck_cases();

const std::vector<GradcheckCase>& gradcheck_registry();

}  // namespace forge::ops::attention
