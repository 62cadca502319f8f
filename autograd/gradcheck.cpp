#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"

namespace forge::autograd {

namespace {

// fn's output as doubles, evaluated without recording.
std::vector<double> evaluate(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                             const std::vector<Tensor>& inputs) {
  NoGradGuard no_grad;
  Tensor y = fn(inputs);
  FORGE_CHECK(y.dtype() == DType::f64, "gradcheck: fn must return a f64 tensor, got {}",
              dtype_name(y.dtype()));
  return y.to_vector<double>();
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions options) {
  // Private copies of the inputs: perturbing them must not touch the caller's.
  std::vector<Tensor> xs;
  std::vector<size_t> checked;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) {
      xs.push_back(t);
      continue;
    }
    Tensor c = t.clone();
    if (t.requires_grad()) {
      FORGE_CHECK(t.dtype() == DType::f64, "gradcheck: input {} requires grad but is {}; use f64",
                  i, dtype_name(t.dtype()));
      c.set_requires_grad(true);
      checked.push_back(i);
    }
    xs.push_back(c);
  }
  FORGE_CHECK(!checked.empty(), "gradcheck: no input requires grad");

  // Analytic Jacobian, one row per output element: backward of a one-hot seed.
  Tensor y;
  {
    GradModeGuard enable(true);
    y = fn(xs);
  }
  FORGE_CHECK(y.dtype() == DType::f64, "gradcheck: fn must return a f64 tensor, got {}",
              dtype_name(y.dtype()));
  const int64_t n_out = y.numel();
  FORGE_CHECK(y.requires_grad(),
              "gradcheck: fn's output does not depend on any input that requires grad");
  std::vector<std::vector<double>> analytic(checked.size());  // [input][out * n_in + in]
  for (size_t c = 0; c < checked.size(); ++c) {
    analytic[c].assign(static_cast<size_t>(n_out * xs[checked[c]].numel()), 0.0);
  }
  for (int64_t o = 0; o < n_out; ++o) {
    for (size_t c : checked) xs[c].zero_grad();
    Tensor seed = Tensor::zeros(y.shape(), DType::f64);
    seed.data<double>()[o] = 1.0;
    backward({y}, {seed}, {.retain_graph = true});
    for (size_t c = 0; c < checked.size(); ++c) {
      Tensor g = xs[checked[c]].grad();
      if (!g.defined()) continue;  // this output does not depend on the input
      const double* gp = g.data<double>();
      const int64_t n_in = g.numel();
      for (int64_t k = 0; k < n_in; ++k) analytic[c][static_cast<size_t>(o * n_in + k)] = gp[k];
    }
  }

  // Numeric Jacobian by central differences, and the comparison.
  GradcheckResult result;
  double worst_excess = 0;
  for (size_t c = 0; c < checked.size(); ++c) {
    Tensor& x = xs[checked[c]];
    double* xp = x.data<double>();
    const int64_t n_in = x.numel();
    for (int64_t k = 0; k < n_in; ++k) {
      const double orig = xp[k];
      xp[k] = orig + options.eps;
      const std::vector<double> plus = evaluate(fn, xs);
      xp[k] = orig - options.eps;
      const std::vector<double> minus = evaluate(fn, xs);
      xp[k] = orig;
      for (int64_t o = 0; o < n_out; ++o) {
        const double numeric =
            (plus[static_cast<size_t>(o)] - minus[static_cast<size_t>(o)]) / (2 * options.eps);
        const double a = analytic[c][static_cast<size_t>(o * n_in + k)];
        const double err = std::abs(a - numeric);
        result.max_abs_error = std::max(result.max_abs_error, std::isnan(err) ? INFINITY : err);
        const double allowed = options.atol + options.rtol * std::abs(numeric);
        const double excess = std::isnan(err) ? INFINITY : err - allowed;
        if (excess > 0 && excess > worst_excess) {
          worst_excess = excess;
          result.ok = false;
          result.message = fmt::format(
              "gradcheck failed: input {} (shape {}) element {}, output element {}: analytic "
              "{:.10g}, numeric "
              "{:.10g}, |diff| {:.3g} > atol {} + rtol {} * |numeric|",
              checked[c], shape_str(x.shape()), k, o, a, numeric, err, options.atol, options.rtol);
        }
      }
    }
  }
  return result;
}

}  // namespace forge::autograd
