// The small problem the optimizer tests share: two parameters in two groups,
// gradients from a fixed formula of the current values and the step, and a
// runner for the tests' scalar reference implementations over doubles.
//   w (2, 3), group 0, decays at the test's weight decay, lr scale 1
//   b (3),    group 1, no decay, lr scale 0.5
//   grad of element i of parameter k (w: 0, b: 1) at update t (1-based):
//     g = p_i - c_i + 0.3 sin(i + t + k),  c_i = 0.1 i (w) or -0.05 i (b)
// The PyTorch constants in the tests come from the same problem written in
// Python (torch.optim with the two groups, lr 0.1 and group 1 at lr 0.05).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace forge::optim::testing {

constexpr double kBaseLr = 0.1;
constexpr double kGroup1Scale = 0.5;

inline double target_of(int k, int64_t i) {
  return k == 0 ? 0.1 * i : -0.05 * i;
}

inline double grad_of(double p, int k, int64_t i, int64_t t) {
  return p - target_of(k, i) + 0.3 * std::sin(static_cast<double>(i + t + k));
}

struct Problem {
  Tensor w, b;

  explicit Problem(DType dtype = DType::f64) {
    w = Tensor::from_vector<double>({0.5, -1.2, 0.3, 2.0, -0.7, 0.1}, {2, 3}).to(dtype);
    b = Tensor::from_vector<double>({0.2, -0.4, 0.9}).to(dtype);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
  }

  std::vector<ParamGroup> groups(double weight_decay) const {
    ParamGroup g0, g1;
    g0.params = {{"w", w}};
    g0.weight_decay = weight_decay;
    g1.params = {{"b", b}};
    g1.lr_scale = kGroup1Scale;
    return {g0, g1};
  }

  // Fresh grad tensors for update t, in the parameters' dtype.
  void set_grads(int64_t t) {
    int k = 0;
    for (Tensor* p : {&w, &b}) {
      const auto v = p->to_vector<double>();
      std::vector<double> g(v.size());
      for (size_t i = 0; i < v.size(); ++i) g[i] = grad_of(v[i], k, static_cast<int64_t>(i), t);
      p->set_grad(Tensor::from_vector(g, p->shape()).to(p->dtype()));
      ++k;
    }
  }

  // w then b, flattened.
  std::vector<double> values() const {
    auto v = w.to_vector<double>();
    const auto vb = b.to_vector<double>();
    v.insert(v.end(), vb.begin(), vb.end());
    return v;
  }

  // `steps` rounds of set_grads(t) and opt.step().
  void run(Optimizer& opt, int64_t first_t, int64_t steps) {
    for (int64_t t = first_t; t < first_t + steps; ++t) {
      set_grads(t);
      opt.step();
    }
  }
};

// A reference update of one parameter: p (its values), g (its grad), k (0: w,
// 1: b; the reference keeps its state per k), t (1-based), lr and weight decay
// of the parameter's group.
using ReferenceStep = std::function<void(std::vector<double>& p, const std::vector<double>& g,
                                         int k, int64_t t, double lr, double wd)>;

// Runs the reference on double copies of the problem's start values; returns
// w then b, flattened.
inline std::vector<double> reference_run(int64_t steps, double weight_decay,
                                         const ReferenceStep& step) {
  const Problem start;
  std::vector<double> p[2] = {start.w.to_vector<double>(), start.b.to_vector<double>()};
  for (int64_t t = 1; t <= steps; ++t) {
    for (int k = 0; k < 2; ++k) {
      std::vector<double> g(p[k].size());
      for (size_t i = 0; i < g.size(); ++i) g[i] = grad_of(p[k][i], k, static_cast<int64_t>(i), t);
      step(p[k], g, k, t, k == 0 ? kBaseLr : kBaseLr * kGroup1Scale, k == 0 ? weight_decay : 0.0);
    }
  }
  std::vector<double> out = p[0];
  out.insert(out.end(), p[1].begin(), p[1].end());
  return out;
}

inline void expect_near_all(const std::vector<double>& got, const std::vector<double>& want,
                            double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol) << "at flat index " << i;
}

}  // namespace forge::optim::testing
