// ScaleNorm, ReZero and TokenShift as compositions of ops.
#include "nn/norms.h"

#include "ops/ops.h"

namespace forge::nn {

ScaleNorm::ScaleNorm(double epsilon, DType dtype) : eps(epsilon), g(Tensor::ones({1}, dtype)) {
  FORGE_CHECK(eps > 0, "ScaleNorm: expected eps > 0, got {}", eps);
  register_parameter("g", g);
}

Tensor ScaleNorm::forward(const Tensor& x) {
  FORGE_CHECK(x.dim() >= 1, "ScaleNorm: expected x (..., D), got a scalar");
  // Clamping the squared norm at eps^2 gives the same values and gradients as
  // clamping the norm at eps, and keeps sqrt's derivative finite on zero rows.
  const Tensor norm = ops::sqrt(ops::clamp(ops::sum(ops::square(x), {-1}, true), eps * eps));
  return x / norm * g;
}

ReZero::ReZero(DType dtype) : g(Tensor::zeros({1}, dtype)) {
  register_parameter("g", g);
}

Tensor ReZero::forward(const Tensor& y) {
  return y * g;
}

TokenShift::TokenShift(std::vector<int64_t> s) : shifts(std::move(s)) {
  FORGE_CHECK(!shifts.empty(), "TokenShift: expected at least one shift, got none");
}

std::vector<int64_t> TokenShift::default_shifts(bool causal) {
  return causal ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{1, 0, -1};
}

Tensor TokenShift::forward(const Tensor& x, const Tensor& mask) {
  // Without a mask, or with an x that is not (B, N, D) (the op names it), the
  // op alone.
  if (!mask.defined() || x.dim() != 3) return ops::token_shift(x, shifts);
  const int64_t B = x.size(0), N = x.size(1);
  FORGE_CHECK(mask.shape() == (Shape{B, N}) &&
                  (mask.dtype() == DType::boolean || mask.dtype() == DType::u8),
              "TokenShift: expected a bool or u8 mask (B, N) = [{}, {}], got {} {}", B, N,
              dtype_name(mask.dtype()), shape_str(mask.shape()));
  // The moving segments come from x with its padded positions zeroed.
  const Tensor kept =
      ops::where(mask.view({B, N, 1}), x, Tensor::zeros({1}, x.dtype(), x.device()));
  return ops::token_shift(x, shifts, kept);
}

}  // namespace forge::nn
