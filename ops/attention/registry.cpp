#include "ops/attention/registry.h"

namespace forge::ops::attention {

const std::vector<GradcheckCase>& gradcheck_registry() {
  static const std::vector<GradcheckCase> all = [] {
    std::vector<GradcheckCase> cases;
    for (auto list :
         {softmax_gradcheck_cases, local_gradcheck_cases, efficient_gradcheck_cases,
          linear_gradcheck_cases, taylor_linear_gradcheck_cases, linformer_gradcheck_cases,
          favor_gradcheck_cases, taylorshift_gradcheck_cases}) {
      for (GradcheckCase& c : list()) cases.push_back(std::move(c));
    }
    return cases;
  }();
  return all;
}

}  // namespace forge::ops::attention
