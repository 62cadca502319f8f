// core/vmath.h: glibc's vector functions over arrays against libm, at every
// length (the vector body and the padded tail), in place, at the edges, and
// independent of an element's position in the array.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
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

TEST(VMath, ExpIsWithinFourUlpsOfLibmInF32AndF64) {
  expect_exp_matches_libm<float>(4);
  expect_exp_matches_libm<double>(4);
}

// Each function against libm over a range that covers its shape (and, for
// erfc, the far tail where 1 - erf would cancel), within `ulps` of the result.
template <typename T>
void expect_matches_libm(const char* name, void (*ours)(const T*, T*, int64_t), T (*libm)(T), T lo,
                         T hi, T ulps) {
  for (int64_t n : {1, 5, 16, 17, 31, 1001}) {
    std::vector<T> x(static_cast<size_t>(n)), y(x.size());
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = lo + (hi - lo) * T(i) / T(n);
    ours(x.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const T want = libm(x[static_cast<size_t>(i)]);
      EXPECT_NEAR(y[static_cast<size_t>(i)], want,
                  ulps * std::numeric_limits<T>::epsilon() * std::abs(want) +
                      std::numeric_limits<T>::denorm_min())
          << name << " n " << n << " x " << x[static_cast<size_t>(i)];
    }
  }
}

template <typename T>
void expect_all_match_libm() {
  expect_matches_libm<T>(
      "expm1", vmath::expm1, [](T v) { return std::expm1(v); }, T(-30), T(20), T(5));
  expect_matches_libm<T>(
      "expm1 near 0", vmath::expm1, [](T v) { return std::expm1(v); }, T(-1e-3), T(1e-3), T(5));
  expect_matches_libm<T>(
      "log", vmath::log, [](T v) { return std::log(v); }, T(1e-30), T(1e6), T(5));
  expect_matches_libm<T>(
      "log near 1", vmath::log, [](T v) { return std::log(v); }, T(0.9), T(1.1), T(5));
  expect_matches_libm<T>(
      "tanh", vmath::tanh, [](T v) { return std::tanh(v); }, T(-12), T(12), T(5));
  expect_matches_libm<T>(
      "erf", vmath::erf, [](T v) { return std::erf(v); }, T(-6), T(6), T(5));
  expect_matches_libm<T>(
      "erfc", vmath::erfc, [](T v) { return std::erfc(v); }, T(-6), T(9), T(5));
}

TEST(VMath, Expm1LogTanhErfErfcAreWithinFiveUlpsOfLibmInF32AndF64) {
  expect_all_match_libm<float>();
  expect_all_match_libm<double>();
}

// cos over the turn Box-Muller uses ([0, 2 pi]), within 4 epsilons of libm:
// absolute, as the values are at most 1 and cross zero twice.
TEST(VMath, CosIsWithinFourEpsilonsOfLibmOverATurn) {
  const auto check = [](auto zero) {
    using T = decltype(zero);
    for (int64_t n : {1, 7, 16, 17, 1001}) {
      std::vector<T> x(static_cast<size_t>(n)), y(x.size());
      for (int64_t i = 0; i < n; ++i)
        x[static_cast<size_t>(i)] = T(2 * 3.141592653589793) * T(i) / T(n);
      vmath::cos(x.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i)
        EXPECT_NEAR(y[static_cast<size_t>(i)], std::cos(x[static_cast<size_t>(i)]),
                    4 * std::numeric_limits<T>::epsilon())
            << "n " << n << " x " << x[static_cast<size_t>(i)];
    }
  };
  check(0.0f);
  check(0.0);
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
    EXPECT_NEAR(y[i], std::exp(x[i]), 4 * std::numeric_limits<float>::epsilon() * std::exp(x[i]));
}

// The same input gives the same bits wherever it sits: in the vector body, in
// the tail, alone (a tensor split among threads differently must not change).
template <typename T>
void expect_position_independent(void (*f)(const T*, T*, int64_t)) {
  std::vector<T> x(37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = T(0.37) * T(i) - T(5);
  std::vector<T> all(x.size());
  f(x.data(), all.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    T one;
    f(&x[i], &one, 1);
    EXPECT_EQ(one, all[i]) << "x " << x[i];
    std::vector<T> rest(x.size() - i);
    f(x.data() + i, rest.data(), static_cast<int64_t>(rest.size()));
    EXPECT_EQ(rest[0], all[i]) << "x " << x[i];
  }
}

template <typename T>
void expect_all_position_independent() {
  using F = void (*)(const T*, T*, int64_t);
  for (F f :
       std::initializer_list<F>{vmath::exp, vmath::expm1, vmath::tanh, vmath::erf, vmath::erfc})
    expect_position_independent<T>(f);
}

TEST(VMath, AnElementsResultDoesNotDependOnItsPosition) {
  expect_all_position_independent<float>();
  expect_all_position_independent<double>();
}

}  // namespace
}  // namespace forge
