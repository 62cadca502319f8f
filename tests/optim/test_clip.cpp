// Global-norm clipping: the norm, the scaled grads (new tensors, the old grad
// tensors left as they were), the threshold, parameters without grads and
// non-finite norms.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "optim/clip.h"
#include "tests/test_util.h"

namespace forge::optim {
namespace {

using forge::testing::expect_values;

Tensor param_with_grad(const std::vector<double>& grad, DType dtype = DType::f64) {
  Tensor p = Tensor::zeros({static_cast<int64_t>(grad.size())}, dtype);
  p.set_requires_grad(true);
  p.set_grad(Tensor::from_vector(grad).to(dtype));
  return p;
}

// Grads (3, 4) and (12) have norm sqrt(9 + 16 + 144) = 13.
TEST(OptimClip, NormAndScaledCopies) {
  Tensor a = param_with_grad({3, 4}), b = param_with_grad({12}), none = Tensor::zeros({2});
  none.set_requires_grad(true);
  EXPECT_DOUBLE_EQ(grad_norm({a, b, none}), 13.0);

  const Tensor old_a = a.grad(), old_b = b.grad();
  const Tensor copy_a = old_a.clone();
  const double norm = clip_grad_norm({a, b, none}, 6.5);
  EXPECT_DOUBLE_EQ(norm, 13.0);
  const double coef = 6.5 / (13.0 + 1e-6);  // PyTorch's coefficient
  expect_values(a.grad(), {3 * coef, 4 * coef}, 1e-15);
  expect_values(b.grad(), {12 * coef}, 1e-15);
  EXPECT_NEAR(grad_norm({a, b}), 6.5, 1e-6);
  // Replaced, not written: the old grad tensors keep their values.
  EXPECT_FALSE(a.grad().same(old_a));
  EXPECT_FALSE(b.grad().same(old_b));
  expect_values(old_a, copy_a.to_vector<double>(), 0);
  expect_values(old_b, {12}, 0);
  EXPECT_FALSE(none.grad().defined());
}

TEST(OptimClip, BelowTheThresholdNothingChanges) {
  Tensor a = param_with_grad({3, 4});
  const Tensor old = a.grad();
  EXPECT_DOUBLE_EQ(clip_grad_norm({a}, 5.01), 5.0);
  EXPECT_TRUE(a.grad().same(old));
  expect_values(a.grad(), {3, 4}, 0);
}

// A grad shared with another tensor (as autograd may hand over) stays intact.
TEST(OptimClip, SharedGradStorageIsNotWritten) {
  const Tensor shared = Tensor::from_vector<double>({6, 8});
  Tensor a = Tensor::zeros({2}, DType::f64);
  a.set_requires_grad(true);
  a.set_grad(shared);
  EXPECT_DOUBLE_EQ(clip_grad_norm({a}, 1.0), 10.0);
  expect_values(shared, {6, 8}, 0);
  expect_values(a.grad(), {6 / (10 + 1e-6), 8 / (10 + 1e-6)}, 1e-15);
}

TEST(OptimClip, NonFiniteNormLeavesGrads) {
  for (double bad :
       {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    Tensor a = param_with_grad({1, bad}), b = param_with_grad({100});
    const Tensor old_b = b.grad();
    const double norm = clip_grad_norm({a, b}, 1.0);
    EXPECT_FALSE(std::isfinite(norm));
    EXPECT_TRUE(b.grad().same(old_b));
    expect_values(b.grad(), {100}, 0);
  }
}

TEST(OptimClip, Float32AndLargeTensors) {
  // 20000 elements of 0.5 (more than one summation block): norm 0.5 sqrt(20000).
  Tensor big = param_with_grad(std::vector<double>(20000, 0.5), DType::f32);
  Tensor small = param_with_grad({1.0}, DType::f32);
  const double expected = std::sqrt(20000 * 0.25 + 1.0);
  EXPECT_NEAR(grad_norm({big, small}), expected, 1e-9);
  clip_grad_norm({big, small}, 1.0);
  EXPECT_EQ(big.grad().dtype(), DType::f32);
  EXPECT_NEAR(grad_norm({big, small}), 1.0, 1e-6);
  EXPECT_DOUBLE_EQ(grad_norm({}), 0.0);
  forge::testing::expect_error([&] { clip_grad_norm({big}, 0.0); }, {"max_norm", "0"});
}

}  // namespace
}  // namespace forge::optim
