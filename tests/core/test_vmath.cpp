// core/vmath.h: SLEEF's vectorised exp over arrays against libm, at every
// length (the vector body and the scalar tail), in place, and at the edges.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/vmath.h"

namespace forge {
namespace {

template <typename T>
void expect_exp_matches_libm(T ulps) {
  for (int64_t n : {0, 1, 3, 4, 7, 8, 15, 16, 17, 33, 1000}) {
    std::vector<T> x(static_cast<size_t>(n)), y(x.size());
    for (int64_t i = 0; i < n; ++i)
      x[static_cast<size_t>(i)] = T(-80) + T(160) * T(i) / T(std::max<int64_t>(n, 1));
    vmath::exp(x.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const T want = std::exp(x[static_cast<size_t>(i)]);
      EXPECT_NEAR(y[static_cast<size_t>(i)], want, ulps * std::numeric_limits<T>::epsilon() * want)
          << "n " << n << " x " << x[static_cast<size_t>(i)];
    }
    vmath::exp(x.data(), x.data(), n);  // in place
    EXPECT_EQ(x, y);
  }
}

TEST(VMath, ExpIsWithinTwoUlpsOfLibmInF32AndF64) {
  expect_exp_matches_libm<float>(2);
  expect_exp_matches_libm<double>(2);
}

TEST(VMath, ExpEdges) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {0.0f,  -0.0f,   -inf, inf,  -200.0f, 200.0f, std::nanf(""), 1.0f, -1.0f,
                          88.0f, -103.0f, 0.5f, 2.0f, -2.0f,   10.0f,  -10.0f,        0.25f};
  std::vector<float> y(x.size());
  vmath::exp(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], inf);
  EXPECT_EQ(y[4], 0.0f);
  EXPECT_EQ(y[5], inf);
  EXPECT_TRUE(std::isnan(y[6]));
  for (size_t i = 7; i < x.size(); ++i)
    EXPECT_NEAR(y[i], std::exp(x[i]), 2 * std::numeric_limits<float>::epsilon() * std::exp(x[i]));
}

}  // namespace
}  // namespace forge
