// Shared helpers for the GoogleTest suites.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "core/error.h"
#include "core/tensor.h"

namespace forge::testing {

// A f64 leaf of `shape` with values uniform in [lo, hi), drawn from its own
// seeded generator (tests do not disturb each other's streams), requiring grad.
inline Tensor leaf64(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Generator g(seed);
  Tensor u = Tensor::rand(shape, DType::f64, &g);
  double* p = u.data<double>();
  for (int64_t i = 0; i < u.numel(); ++i) p[i] = lo + (hi - lo) * p[i];
  u.set_requires_grad(true);
  return u;
}

// Max |a - b| over all elements (same shape required), computed in f64.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

inline void expect_close(const Tensor& a, const Tensor& b, double tol) {
  ASSERT_TRUE(a.defined() && b.defined());
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_LE(max_abs_diff(a, b), tol) << "got\n" << a << "\nexpected\n" << b;
}

inline void expect_values(const Tensor& a, const std::vector<double>& expected, double tol = 1e-6) {
  const auto x = a.to_vector<double>();
  ASSERT_EQ(x.size(), expected.size());
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(x[i], expected[i], tol) << "at flat index " << i;
}

// f throws a forge::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const auto& p : parts)
      EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
    return;
  }
  ADD_FAILURE() << "expected a forge::Error";
}

}  // namespace forge::testing

// Runs gradcheck and fails the test with its report when it does not pass.
#define EXPECT_GRADCHECK(fn, ...)                                      \
  do {                                                                 \
    auto gc_result_ = ::forge::autograd::gradcheck((fn), __VA_ARGS__); \
    EXPECT_TRUE(gc_result_.ok) << gc_result_.message;                  \
  } while (0)
