// ScaleNorm, ReZero and TokenShift: names, values against plain loops over the
// definitions, gradients (f64 gradcheck) and shape errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "autograd/engine.h"
#include "nn/norms.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace forge::nn {
namespace {

using namespace forge::testing;

TEST(NormsScaleNorm, ValuesAndGrad) {
  ScaleNorm norm(1e-2, DType::f64);
  const auto state = norm.state_dict();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state.at("g").shape(), (Shape{1}));
  expect_values(norm.g, {1.0});
  norm.g.copy_from(Tensor::from_vector<double>({1.5}));
  // Rows: ordinary, norm below eps (divided by eps), zero.
  const std::vector<double> v = {3, -4, 1, 0.001, 0.002, -0.002, 0, 0, 0};
  std::vector<double> ref;
  for (size_t r = 0; r < 3; ++r) {
    double sq = 0;
    for (size_t c = 0; c < 3; ++c) sq += v[3 * r + c] * v[3 * r + c];
    for (size_t c = 0; c < 3; ++c)
      ref.push_back(v[3 * r + c] / std::max(std::sqrt(sq), 1e-2) * 1.5);
  }
  const Tensor x = Tensor::from_vector<double>(v, {3, 3}).set_requires_grad(true);
  const Tensor y = norm.forward(x);
  expect_values(y, ref, 1e-14);
  // A zero row has a finite gradient (1.5 / eps per element), not NaN.
  autograd::backward(ops::sum(y));
  expect_values(ops::narrow(x.grad(), 0, 2, 1), {150, 150, 150}, 1e-9);

  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        norm.g = in[1];
        return norm.forward(in[0]);
      },
      {leaf64({2, 3, 4}, 1), norm.g});
  expect_error([&] { norm.forward(Tensor::scalar(1.0, DType::f64)); }, {"(..., D)", "scalar"});
}

TEST(NormsReZero, StartsAtZeroAndGrad) {
  ReZero rezero(DType::f64);
  const auto state = rezero.state_dict();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state.at("g").shape(), (Shape{1}));
  const Tensor y = leaf64({2, 3}, 2);
  expect_values(rezero.forward(y), std::vector<double>(6, 0.0), 0.0);
  rezero.g.copy_from(Tensor::from_vector<double>({0.5}));
  std::vector<double> ref = y.to_vector<double>();
  for (double& r : ref) r *= 0.5;
  expect_values(rezero.forward(y), ref, 1e-15);
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        rezero.g = in[1];
        return rezero.forward(in[0]);
      },
      {leaf64({2, 3, 4}, 3), rezero.g});
}

// x (B, N, D) with the positions the mask (B, N) pads zeroed: what a masked
// shift moves (its moving segments carry no padding in).
Tensor padding_zeroed(const Tensor& x, const std::vector<uint8_t>& mask) {
  const int64_t D = x.size(2);
  std::vector<double> v = x.to_vector<double>();
  for (size_t e = 0; e < v.size(); ++e)
    if (!mask[e / static_cast<size_t>(D)]) v[e] = 0;
  return Tensor::from_vector<double>(v, x.shape());
}

TEST(NormsTokenShift, ValuesWithAndWithoutMask) {
  EXPECT_EQ(TokenShift::default_shifts(false), (std::vector<int64_t>{1, 0, -1}));
  EXPECT_EQ(TokenShift::default_shifts(true), (std::vector<int64_t>{1, 0}));
  const std::vector<uint8_t> mask = {1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0};  // (2, 6)
  const Tensor u8 = Tensor::from_vector<uint8_t>(mask, {2, 6});
  // D = 7 leaves one feature unshifted for three segments; shifts beyond N give zeros.
  for (const auto& shifts : std::vector<std::vector<int64_t>>{{1, 0, -1}, {1, 0}, {2, -9, 0}}) {
    TokenShift shift(shifts);
    EXPECT_EQ(shift.num_parameters(), 0);
    EXPECT_TRUE(shift.state_dict().empty());
    const Tensor x = leaf64({2, 6, 7}, 4);
    const std::vector<double> plain = naive_token_shift(x, x, shifts),
                              masked = naive_token_shift(x, padding_zeroed(x, mask), shifts);
    expect_values(shift.forward(x), plain, 0.0);
    expect_values(shift.forward(x, u8), masked, 0.0);
    expect_values(shift.forward(x, u8.to(DType::boolean)), masked, 0.0);
  }
}

TEST(NormsTokenShift, GradAndErrors) {
  TokenShift shift(TokenShift::default_shifts(false));
  const Tensor mask = Tensor::from_vector<uint8_t>({1, 0, 1, 1, 1, 1, 0, 1}, {2, 4});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return shift.forward(in[0], mask); },
                   {leaf64({2, 4, 7}, 5)});
  const Tensor x = Tensor::zeros({2, 4, 6}, DType::f64);
  expect_error(
      [&] {
        shift.forward(x, Tensor::ones({2, 5}, DType::u8));
      },
      {"mask (B, N) = [2, 4]", "u8 [2, 5]"});
  expect_error([&] { shift.forward(x, Tensor::ones({2, 4}, DType::f64)); }, {"bool or u8", "f64"});
  expect_error(
      [&] {
        shift.forward(Tensor::zeros({2, 4, 2}, DType::f64));
      },
      {"D >= 3", "[2, 4, 2]"});
  expect_error([&] { shift.forward(Tensor::zeros({4, 6}, DType::f64)); }, {"(B, N, D)", "[4, 6]"});
  expect_error([] { TokenShift({}); }, {"at least one shift"});
}

}  // namespace
}  // namespace forge::nn
