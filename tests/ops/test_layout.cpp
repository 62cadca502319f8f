// Layout ops: forward values against hand-computed numbers, view-ness of the
// free ops, f64 gradchecks for every op, and the errors users will meet.
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/layout/layout.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using namespace testing;
using Ins = std::vector<Tensor>;

// 0, 1, 2, ... in `shape` and `dtype`.
Tensor iota(const Shape& shape, DType dtype = DType::f32) {
  return Tensor::arange(0, static_cast<double>(shape_numel(shape)), 1, dtype).view(shape);
}

// Backward of `y` seeded with ones.
void backward_ones(const Tensor& y) {
  autograd::backward({y}, {Tensor::ones(y.shape(), y.dtype())});
}

// ---------------------------------------------------------------- views

TEST(LayoutView, ReshapeSharesStorageAndInfersMinusOne) {
  Tensor x = iota({2, 3});
  Tensor y = ops::reshape(x, {3, -1});
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(y.raw_data(), x.raw_data());
  expect_values(y, {0, 1, 2, 3, 4, 5});
  x.data<float>()[4] = 40;
  EXPECT_EQ(y.data<float>()[4], 40.0f);

  Tensor xi = iota({4}, DType::i32);
  Tensor yi = ops::reshape(xi, {2, 1, 2});
  EXPECT_EQ(yi.shape(), (Shape{2, 1, 2}));
  EXPECT_EQ(yi.raw_data(), xi.raw_data());
}

TEST(LayoutView, FlattenUnsqueezeSqueezeShapes) {
  Tensor x = iota({2, 3, 4, 5}, DType::f64);
  EXPECT_EQ(ops::flatten(x).shape(), (Shape{120}));
  EXPECT_EQ(ops::flatten(x, 1, 2).shape(), (Shape{2, 12, 5}));
  EXPECT_EQ(ops::flatten(x, -2).shape(), (Shape{2, 3, 20}));
  EXPECT_EQ(ops::flatten(x, 0, 0).shape(), (Shape{2, 3, 4, 5}));
  EXPECT_EQ(ops::flatten(Tensor::scalar(3.0)).shape(), (Shape{1}));
  EXPECT_EQ(ops::unsqueeze(x, 0).shape(), (Shape{1, 2, 3, 4, 5}));
  EXPECT_EQ(ops::unsqueeze(x, -1).shape(), (Shape{2, 3, 4, 5, 1}));
  EXPECT_EQ(ops::unsqueeze(x, 2).shape(), (Shape{2, 3, 1, 4, 5}));
  Tensor u = ops::unsqueeze(x, -3);
  EXPECT_EQ(u.shape(), (Shape{2, 3, 1, 4, 5}));
  EXPECT_EQ(ops::squeeze(u, 2).shape(), x.shape());
  EXPECT_EQ(ops::squeeze(u, -3).shape(), x.shape());
  EXPECT_EQ(ops::flatten(x, 1).raw_data(), x.raw_data());
  EXPECT_EQ(ops::squeeze(u, 2).raw_data(), x.raw_data());
}

TEST(LayoutView, Gradcheck) {
  // A transpose after each view makes the gradient's layout matter.
  EXPECT_GRADCHECK(
      [](const Ins& in) {
        return ops::transpose(ops::reshape(in[0], {4, -1}), 0, 1);
      },
      {leaf64({2, 3, 4}, 1)});
  EXPECT_GRADCHECK([](const Ins& in) { return ops::transpose(ops::flatten(in[0], 1, -1), 0, 1); },
                   {leaf64({2, 3, 2}, 2)});
  EXPECT_GRADCHECK([](const Ins& in) { return ops::transpose(ops::unsqueeze(in[0], -1), 0, 2); },
                   {leaf64({3, 2}, 3)});
  EXPECT_GRADCHECK([](const Ins& in) { return ops::transpose(ops::squeeze(in[0], -2), 0, 1); },
                   {leaf64({3, 1, 2}, 4)});
}

TEST(LayoutView, Errors) {
  Tensor x = iota({2, 3});
  expect_error([&] { ops::reshape(x, {4, 2}); }, {"[4, 2]", "[2, 3]"});
  expect_error([&] { ops::reshape(x, {-1, -1}); }, {"-1"});
  expect_error([&] { ops::squeeze(x, 1); }, {"squeeze", "size 1", "[2, 3]"});
  expect_error([&] { ops::flatten(x, 1, 0); }, {"flatten", "start_dim 1", "end_dim 0"});
  expect_error([&] { ops::unsqueeze(x, 3); }, {"unsqueeze", "dim 3"});
}

// ---------------------------------------------------------------- transpose / permute

TEST(LayoutPermute, TransposeValuesInEveryDtype) {
  // [[1, 2, 3], [4, 5, 6]]^T = [[1, 4], [2, 5], [3, 6]]
  Tensor f = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor t = ops::transpose(f, 0, 1);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  expect_values(t, {1, 4, 2, 5, 3, 6});
  expect_values(ops::transpose(f.to(DType::f64), -1, -2), {1, 4, 2, 5, 3, 6});
  Tensor i = ops::transpose(f.to(DType::i32), 1, 0);
  EXPECT_EQ(i.dtype(), DType::i32);
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{1, 4, 2, 5, 3, 6}));
  Tensor b = Tensor::from_vector<bool>({true, false, false, true, true, false}, {2, 3});
  EXPECT_EQ(ops::transpose(b, 0, 1).to_vector<bool>(),
            (std::vector<bool>{true, true, false, true, false, false}));
  EXPECT_NE(t.raw_data(), f.raw_data());
}

TEST(LayoutPermute, Permute3dValues) {
  Tensor x = iota({2, 3, 4}, DType::i64);  // x[a][b][c] = 12a + 4b + c
  // out[c][a][b] = x[a][b][c]
  Tensor y = ops::permute(x, {2, 0, 1});
  EXPECT_EQ(y.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(y.to_vector<int64_t>(),
            (std::vector<int64_t>{0, 4, 8,  12, 16, 20, 1, 5, 9,  13, 17, 21,
                                  2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23}));
  // The last dim stays last: rows are copied whole. out[b][a][c] = x[a][b][c].
  Tensor z = ops::permute(x, {1, 0, -1});
  EXPECT_EQ(z.shape(), (Shape{3, 2, 4}));
  EXPECT_EQ(z.to_vector<int64_t>(),
            (std::vector<int64_t>{0,  1,  2,  3,  12, 13, 14, 15, 4,  5,  6,  7,
                                  16, 17, 18, 19, 8,  9,  10, 11, 20, 21, 22, 23}));
  // Identity permutation copies.
  Tensor w = ops::permute(x, {0, 1, 2});
  EXPECT_NE(w.raw_data(), x.raw_data());
  EXPECT_EQ(w.to_vector<int64_t>(), x.to_vector<int64_t>());
}

TEST(LayoutPermute, Permute4dMatchesIndexFormula) {
  const Shape xs{2, 3, 4, 5};
  Tensor x = iota(xs, DType::f64);
  for (const std::vector<int64_t>& perm :
       {std::vector<int64_t>{3, 1, 0, 2}, {0, 2, 3, 1}, {-1, -3, -4, -2}, {1, 0, 2, 3}}) {
    Tensor y = ops::permute(x, perm);
    std::vector<int64_t> p(perm);
    for (auto& v : p) v = v < 0 ? v + 4 : v;
    ASSERT_EQ(y.shape(), (Shape{xs[p[0]], xs[p[1]], xs[p[2]], xs[p[3]]}));
    const double* yp = y.data<double>();
    int64_t flat = 0;
    int64_t o[4];
    for (o[0] = 0; o[0] < y.shape()[0]; ++o[0])
      for (o[1] = 0; o[1] < y.shape()[1]; ++o[1])
        for (o[2] = 0; o[2] < y.shape()[2]; ++o[2])
          for (o[3] = 0; o[3] < y.shape()[3]; ++o[3], ++flat) {
            int64_t xi[4];
            for (int k = 0; k < 4; ++k) xi[p[k]] = o[k];
            const double expected =
                static_cast<double>(((xi[0] * 3 + xi[1]) * 4 + xi[2]) * 5 + xi[3]);
            ASSERT_EQ(yp[flat], expected) << "perm " << shape_str(perm) << " at flat " << flat;
          }
  }
}

TEST(LayoutPermute, Gradcheck) {
  EXPECT_GRADCHECK([](const Ins& in) { return ops::transpose(in[0], 0, 1); }, {leaf64({3, 4}, 10)});
  EXPECT_GRADCHECK([](const Ins& in) { return ops::transpose(in[0], 0, -1); },
                   {leaf64({2, 3, 4}, 11)});
  EXPECT_GRADCHECK(
      [](const Ins& in) {
        return ops::permute(in[0], {2, 0, 1});
      },
      {leaf64({2, 3, 4}, 12)});
  EXPECT_GRADCHECK(
      [](const Ins& in) {
        return ops::permute(in[0], {3, 1, 0, 2});
      },
      {leaf64({2, 3, 2, 3}, 13)});
  EXPECT_GRADCHECK(
      [](const Ins& in) {
        return ops::permute(in[0], {0, 2, -1, 1});
      },
      {leaf64({2, 2, 3, 2}, 14)});
}

TEST(LayoutPermute, Errors) {
  Tensor x = iota({2, 3, 4});
  expect_error([&] { ops::permute(x, {0, 1}); }, {"permute", "3 dims", "[2, 3, 4]", "[0, 1]"});
  expect_error([&] { ops::permute(x, {0, 1, 1}); }, {"dim 1 appears twice", "[0, 1, 1]"});
  expect_error([&] { ops::permute(x, {0, 1, 3}); }, {"permute", "dim 3"});
  expect_error([&] { ops::transpose(x, 0, -4); }, {"transpose", "dim -4"});
}

// ---------------------------------------------------------------- narrow / slice

TEST(LayoutNarrow, Dim0IsAView) {
  Tensor x = iota({4, 3});
  Tensor y = ops::narrow(x, 0, 1, 2);
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(y.raw_data(), static_cast<void*>(x.data<float>() + 3));
  expect_values(y, {3, 4, 5, 6, 7, 8});
  x.data<float>()[3] = -1;
  EXPECT_EQ(y.data<float>()[0], -1.0f);
  expect_values(ops::narrow(x, 0, -1, 1), {9, 10, 11});
}

TEST(LayoutNarrow, InnerDimsCopy) {
  Tensor x = iota({2, 4}, DType::f64);
  Tensor y = ops::narrow(x, 1, 1, 2);
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  expect_values(y, {1, 2, 5, 6});
  EXPECT_NE(y.raw_data(), x.raw_data());
  Tensor xi = iota({2, 3, 2}, DType::i64);
  Tensor yi = ops::narrow(xi, -2, 2, 1);
  EXPECT_EQ(yi.shape(), (Shape{2, 1, 2}));
  EXPECT_EQ(yi.to_vector<int64_t>(), (std::vector<int64_t>{4, 5, 10, 11}));
  EXPECT_EQ(ops::narrow(x, 1, 4, 0).shape(), (Shape{2, 0}));
}

TEST(LayoutNarrow, Gradcheck) {
  EXPECT_GRADCHECK([](const Ins& in) { return ops::narrow(in[0], 0, 1, 2); }, {leaf64({4, 3}, 20)});
  EXPECT_GRADCHECK([](const Ins& in) { return ops::narrow(in[0], 1, 1, 2); },
                   {leaf64({2, 4, 2}, 21)});
  EXPECT_GRADCHECK([](const Ins& in) { return ops::narrow(in[0], -1, 0, 3); },
                   {leaf64({2, 2, 4}, 22)});
}

TEST(LayoutSlice, Values) {
  Tensor x = iota({10}, DType::f64);
  expect_values(ops::slice(x, 0, 1, 8, 2), {1, 3, 5, 7});
  expect_values(ops::slice(x, 0, -4, 100, 2), {6, 8});
  expect_values(ops::slice(x, 0, -100, 3), {0, 1, 2});
  expect_values(ops::slice(x, 0, 2, 10, 3), {2, 5, 8});
  EXPECT_EQ(ops::slice(x, 0, 7, 3).shape(), (Shape{0}));
  // x2 is (3, 5); columns -4:5:2 are 1 and 3.
  Tensor x2 = iota({3, 5}, DType::i32);
  Tensor y = ops::slice(x2, -1, -4, 5, 2);
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(y.to_vector<int32_t>(), (std::vector<int32_t>{1, 3, 6, 8, 11, 13}));
  Tensor r = ops::slice(iota({5, 2}), 0, 0, 5, 2);
  expect_values(r, {0, 1, 4, 5, 8, 9});
}

TEST(LayoutSlice, Gradcheck) {
  EXPECT_GRADCHECK([](const Ins& in) { return ops::slice(in[0], 1, -4, 5, 2); },
                   {leaf64({2, 5, 2}, 30)});
  EXPECT_GRADCHECK([](const Ins& in) { return ops::slice(in[0], 0, 0, 7, 3); },
                   {leaf64({7, 2}, 31)});
  EXPECT_GRADCHECK([](const Ins& in) { return ops::slice(in[0], -1, -3, -1); },
                   {leaf64({2, 5}, 32)});
}

TEST(LayoutSlice, Errors) {
  Tensor x = iota({2, 5});
  expect_error([&] { ops::slice(x, 1, 0, 5, 0); }, {"slice", "step must be positive", "got 0"});
  expect_error([&] { ops::slice(x, 1, 0, 5, -1); }, {"got -1"});
  expect_error([&] { ops::narrow(x, 1, 3, 3); }, {"narrow", "[3, 6)", "[2, 5]", "size 5"});
  expect_error([&] { ops::narrow(x, 2, 0, 1); }, {"narrow", "dim 2"});
}

// ---------------------------------------------------------------- cat / split / stack

TEST(LayoutCat, ValuesAlongFirstMiddleLastDims) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::from_vector<float>({10, 11, 12, 13, 14, 15}, {2, 3});
  Tensor last = ops::cat({a, b}, -1);
  EXPECT_EQ(last.shape(), (Shape{2, 5}));
  expect_values(last, {1, 2, 10, 11, 12, 3, 4, 13, 14, 15});
  Tensor first = ops::cat({a, ops::reshape(b, {3, 2})}, 0);
  EXPECT_EQ(first.shape(), (Shape{5, 2}));
  expect_values(first, {1, 2, 3, 4, 10, 11, 12, 13, 14, 15});
  // (2, 1, 2) ++ (2, 2, 2) along dim 1.
  Tensor p = Tensor::from_vector<int64_t>({1, 2, 3, 4}, {2, 1, 2});
  Tensor q = Tensor::from_vector<int64_t>({5, 6, 7, 8, 9, 10, 11, 12}, {2, 2, 2});
  Tensor mid = ops::cat({p, q}, 1);
  EXPECT_EQ(mid.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(mid.to_vector<int64_t>(),
            (std::vector<int64_t>{1, 2, 5, 6, 7, 8, 3, 4, 9, 10, 11, 12}));
  Tensor single = ops::cat({a}, 0);
  EXPECT_NE(single.raw_data(), a.raw_data());
  expect_values(single, {1, 2, 3, 4});
}

TEST(LayoutCat, Gradcheck) {
  const auto cat_at = [](int64_t dim) {
    return [dim](const Ins& in) { return ops::cat(in, dim); };
  };
  EXPECT_GRADCHECK(cat_at(0), {leaf64({1, 2, 3}, 40), leaf64({2, 2, 3}, 41)});
  EXPECT_GRADCHECK(cat_at(1),
                   {leaf64({2, 1, 3}, 42), leaf64({2, 3, 3}, 43), leaf64({2, 2, 3}, 44)});
  EXPECT_GRADCHECK(cat_at(-1), {leaf64({2, 2, 2}, 45), leaf64({2, 2, 1}, 46)});
}

TEST(LayoutCat, InputWithoutGradGetsNone) {
  Tensor a = leaf64({2, 2}, 47);
  Tensor b = iota({2, 1}, DType::f64);
  Tensor y = ops::cat({a, b}, 1);
  backward_ones(y);
  expect_values(a.grad(), {1, 1, 1, 1});
  EXPECT_FALSE(b.grad().defined());
}

TEST(LayoutCat, Errors) {
  Tensor a = iota({2, 3});
  expect_error(
      [&] {
        ops::cat({a, iota({2, 3}), iota({3, 4})}, 1);
      },
      {"cat", "tensor 2 has shape [3, 4]", "tensor 0 has shape [2, 3]", "dim 1"});
  expect_error([&] { ops::cat({a, iota({2, 3, 1})}, 0); }, {"tensor 1 has shape [2, 3, 1]"});
  expect_error(
      [&] {
        ops::cat({a, iota({2, 3}, DType::f64)}, 0);
      },
      {"cat", "tensor 1 is f64", "tensor 0 is f32"});
  expect_error([&] { ops::cat({}, 0); }, {"cat", "empty list"});
  expect_error([&] { ops::cat({a, a}, 2); }, {"cat", "dim 2"});
}

TEST(LayoutSplit, Values) {
  Tensor x = iota({2, 5});
  auto parts = ops::split(x, std::vector<int64_t>{2, 3}, 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].shape(), (Shape{2, 2}));
  expect_values(parts[0], {0, 1, 5, 6});
  expect_values(parts[1], {2, 3, 4, 7, 8, 9});
  auto even = ops::split(x, 2, -1);
  ASSERT_EQ(even.size(), 3u);
  EXPECT_EQ(even[2].shape(), (Shape{2, 1}));
  expect_values(even[1], {2, 3, 7, 8});
  expect_values(even[2], {4, 9});
  auto rows = ops::split(iota({3, 2}, DType::i32), 2, 0);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(rows[1].to_vector<int32_t>(), (std::vector<int32_t>{4, 5}));
  auto with_empty = ops::split(x, std::vector<int64_t>{0, 5}, 1);
  EXPECT_EQ(with_empty[0].shape(), (Shape{2, 0}));
}

TEST(LayoutSplit, GradcheckWithSomeOutputsUnused) {
  // The middle piece is unused: its columns must get zero gradient.
  EXPECT_GRADCHECK(
      [](const Ins& in) {
        auto p = ops::split(in[0], std::vector<int64_t>{1, 2, 1}, 1);
        return ops::cat({p[2], p[0]}, 1);
      },
      {leaf64({2, 4, 2}, 50)});
  EXPECT_GRADCHECK([](const Ins& in) { return ops::split(in[0], 2, 0)[1]; }, {leaf64({5, 3}, 51)});
  EXPECT_GRADCHECK([](const Ins& in) { return ops::split(in[0], 3, -1)[1]; }, {leaf64({2, 5}, 52)});
}

TEST(LayoutSplit, UnusedOutputsGetZeroGradient) {
  Tensor x = leaf64({2, 4}, 53);
  auto p = ops::split(x, std::vector<int64_t>{1, 3}, 1);
  backward_ones(p[1]);
  expect_values(x.grad(), {0, 1, 1, 1, 0, 1, 1, 1});
  // Called directly with an undefined gradient (the engine passes zeros; the
  // closure must also accept nothing).
  Tensor y = leaf64({2, 4}, 54);
  auto q = ops::split(y, std::vector<int64_t>{3, 1}, 1);
  auto g = q[0].grad_fn()->backward({Tensor(), Tensor::full({2, 1}, 2.0, DType::f64)});
  ASSERT_EQ(g.size(), 1u);
  expect_values(g[0], {0, 0, 0, 2, 0, 0, 0, 2});
}

TEST(LayoutSplit, Errors) {
  Tensor x = iota({2, 5});
  expect_error(
      [&] {
        ops::split(x, std::vector<int64_t>{2, 2}, 1);
      },
      {"split", "[2, 2]", "sum to 4", "[2, 5]", "size 5"});
  expect_error([&] { ops::split(x, std::vector<int64_t>{6, -1}, 1); }, {"non-negative", "[6, -1]"});
  expect_error([&] { ops::split(x, 0, 1); }, {"split_size must be positive", "got 0"});
  expect_error([&] { ops::split(x, 2, 2); }, {"split", "dim 2"});
}

TEST(LayoutStack, Values) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3});
  Tensor b = Tensor::from_vector<float>({4, 5, 6});
  Tensor s0 = ops::stack({a, b}, 0);
  EXPECT_EQ(s0.shape(), (Shape{2, 3}));
  expect_values(s0, {1, 2, 3, 4, 5, 6});
  Tensor s1 = ops::stack({a, b}, -1);
  EXPECT_EQ(s1.shape(), (Shape{3, 2}));
  expect_values(s1, {1, 4, 2, 5, 3, 6});
  // Two (2, 2) inputs in the middle: out[i][k][j] = x_k[i][j].
  Tensor p = Tensor::from_vector<uint8_t>({1, 2, 3, 4}, {2, 2});
  Tensor q = Tensor::from_vector<uint8_t>({5, 6, 7, 8}, {2, 2});
  Tensor m = ops::stack({p, q}, 1);
  EXPECT_EQ(m.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(m.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 2, 5, 6, 3, 4, 7, 8}));
}

TEST(LayoutStack, Gradcheck) {
  const auto stack_at = [](int64_t dim) {
    return [dim](const Ins& in) { return ops::stack(in, dim); };
  };
  EXPECT_GRADCHECK(stack_at(0), {leaf64({2, 3}, 60), leaf64({2, 3}, 61)});
  EXPECT_GRADCHECK(stack_at(1), {leaf64({2, 3}, 62), leaf64({2, 3}, 63), leaf64({2, 3}, 64)});
  EXPECT_GRADCHECK(stack_at(-1), {leaf64({2, 2, 2}, 65), leaf64({2, 2, 2}, 66)});
}

TEST(LayoutStack, Errors) {
  Tensor a = iota({2, 3});
  expect_error(
      [&] {
        ops::stack({a, a, iota({3, 2})}, 0);
      },
      {"stack", "tensor 2 has shape [3, 2]", "tensor 0 has shape [2, 3]"});
  expect_error([&] { ops::stack({}, 0); }, {"stack", "empty list"});
  expect_error([&] { ops::stack({a, a}, 3); }, {"stack", "dim 3"});
}

// ---------------------------------------------------------------- pad

TEST(LayoutPad, PositivePads) {
  // x is [[0, 1, 2], [3, 4, 5]]; one before and two after on the last dim.
  Tensor x = iota({2, 3});
  Tensor y = ops::pad(x, {1, 2}, 9);
  EXPECT_EQ(y.shape(), (Shape{2, 6}));
  expect_values(y, {9, 0, 1, 2, 9, 9, 9, 3, 4, 5, 9, 9});
  // Last dim (1, 0), first dim (0, 1).
  Tensor z = ops::pad(iota({2, 3}, DType::i32), {1, 0, 0, 1});
  EXPECT_EQ(z.shape(), (Shape{3, 4}));
  EXPECT_EQ(z.to_vector<int32_t>(), (std::vector<int32_t>{0, 0, 1, 2, 0, 3, 4, 5, 0, 0, 0, 0}));
}

TEST(LayoutPad, NegativePadsCrop) {
  Tensor x = iota({2, 3}, DType::f64);
  expect_values(ops::pad(x, {-1, 1}), {1, 2, 0, 4, 5, 0});
  // x3 is [[0, 1, 2], [3, 4, 5], [6, 7, 8]]; last dim (1, -1), first dim (-1, 1).
  Tensor x3 = iota({3, 3}, DType::f64);
  Tensor y = ops::pad(x3, {1, -1, -1, 1}, -5);
  EXPECT_EQ(y.shape(), (Shape{3, 3}));
  expect_values(y, {-5, 3, 4, -5, 6, 7, -5, -5, -5});
  Tensor c = ops::pad(x3, {-1, -1, -2, 0});
  EXPECT_EQ(c.shape(), (Shape{1, 1}));
  expect_values(c, {7});
}

TEST(LayoutPad, Gradcheck) {
  EXPECT_GRADCHECK(
      [](const Ins& in) {
        return ops::pad(in[0], {1, 2, 2, 1});
      },
      {leaf64({2, 3}, 70)});
  EXPECT_GRADCHECK(
      [](const Ins& in) {
        return ops::pad(in[0], {-1, -1, -1, 0});
      },
      {leaf64({3, 4}, 71)});
  EXPECT_GRADCHECK(
      [](const Ins& in) {
        return ops::pad(in[0], {2, -1, -1, 1}, 3.0);
      },
      {leaf64({2, 3, 3}, 72)});
}

TEST(LayoutPad, Errors) {
  Tensor x = iota({2, 3});
  expect_error([&] { ops::pad(x, {1}); }, {"pad", "pairs", "got 1 values"});
  expect_error(
      [&] {
        ops::pad(x, {1, 1, 1, 1, 1, 1});
      },
      {"at most 2 dims", "[2, 3]", "got 6 values"});
  expect_error(
      [&] {
        ops::pad(x, {-2, -2});
      },
      {"pad", "(-2, -2)", "dim 1", "size 3", "negative size -1"});
}

// ---------------------------------------------------------------- index_select / gather /
// embedding

TEST(LayoutIndexSelect, Values) {
  Tensor x = iota({3, 4});
  Tensor rows = ops::index_select(x, 0, Tensor::from_vector<int64_t>({2, 0, 2}));
  EXPECT_EQ(rows.shape(), (Shape{3, 4}));
  expect_values(rows, {8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11});
  Tensor cols = ops::index_select(x, -1, Tensor::from_vector<int32_t>({3, 1}));
  EXPECT_EQ(cols.shape(), (Shape{3, 2}));
  expect_values(cols, {3, 1, 7, 5, 11, 9});
  Tensor xi = iota({2, 3, 2}, DType::i64);
  Tensor mid = ops::index_select(xi, 1, Tensor::from_vector<int32_t>({1}));
  EXPECT_EQ(mid.to_vector<int64_t>(), (std::vector<int64_t>{2, 3, 8, 9}));
}

TEST(LayoutIndexSelect, RepeatedIndicesAccumulate) {
  Tensor x = leaf64({3, 2}, 80);
  backward_ones(ops::index_select(x, 0, Tensor::from_vector<int64_t>({2, 0, 2, 2})));
  expect_values(x.grad(), {1, 1, 0, 0, 3, 3});
  Tensor w = leaf64({2, 3}, 81);
  backward_ones(ops::index_select(w, 1, Tensor::from_vector<int32_t>({1, 1, 0})));
  expect_values(w.grad(), {1, 2, 0, 1, 2, 0});
}

TEST(LayoutIndexSelect, Gradcheck) {
  const Tensor rep = Tensor::from_vector<int64_t>({1, 0, 1, 1});
  EXPECT_GRADCHECK([&](const Ins& in) { return ops::index_select(in[0], 0, rep); },
                   {leaf64({2, 3}, 82)});
  EXPECT_GRADCHECK([&](const Ins& in) { return ops::index_select(in[0], 1, in[1]); },
                   {leaf64({2, 3, 2}, 83), Tensor::from_vector<int32_t>({2, 2, 0})});
  EXPECT_GRADCHECK([&](const Ins& in) { return ops::index_select(in[0], -1, rep); },
                   {leaf64({3, 2}, 84)});
}

TEST(LayoutIndexSelect, Errors) {
  Tensor x = iota({3, 4});
  expect_error(
      [&] {
        ops::index_select(x, 0, Tensor::from_vector<int64_t>({0, 5}));
      },
      {"index_select", "index 5", "position [1]", "dim 0", "size 3", "[0, 3)"});
  expect_error([&] { ops::index_select(x, 1, Tensor::from_vector<int32_t>({-1})); },
               {"index -1", "position [0]", "[0, 4)"});
  expect_error(
      [&] {
        ops::index_select(x, 0, Tensor::from_vector<int64_t>({0, 1}, {1, 2}));
      },
      {"1-d index", "[1, 2]"});
  expect_error([&] { ops::index_select(x, 0, Tensor::from_vector<float>({0})); },
               {"i32 or i64", "f32"});
}

TEST(LayoutGather, Values) {
  // x is [[1, 2, 3], [4, 5, 6]].
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor along1 = ops::gather(x, 1, Tensor::from_vector<int64_t>({2, 0, 1, 1}, {2, 2}));
  EXPECT_EQ(along1.shape(), (Shape{2, 2}));
  expect_values(along1, {3, 1, 5, 5});
  Tensor along0 = ops::gather(x, 0, Tensor::from_vector<int32_t>({1, 0, 1}, {1, 3}));
  expect_values(along0, {4, 2, 6});
  // An index smaller than x off dim reads the leading corner: x3 is iota (3, 4).
  Tensor x3 = iota({3, 4}, DType::i64);
  Tensor small = ops::gather(x3, -1, Tensor::from_vector<int64_t>({3, 3, 0, 2}, {2, 2}));
  EXPECT_EQ(small.to_vector<int64_t>(), (std::vector<int64_t>{3, 3, 4, 6}));
}

TEST(LayoutGather, RepeatedIndicesAccumulate) {
  Tensor x = leaf64({2, 3}, 90);
  backward_ones(ops::gather(x, 1, Tensor::from_vector<int64_t>({2, 2, 2, 0, 1, 0}, {2, 3})));
  expect_values(x.grad(), {0, 0, 3, 2, 1, 0});
}

TEST(LayoutGather, Gradcheck) {
  // 3-d x (2, 3, 4), index (2, 5, 3) along dim 1: repeated and smaller off dim.
  const Tensor idx1 = Tensor::from_vector<int64_t>(
      {0, 1, 2, 2, 2, 0, 1, 1, 1, 0, 2, 0, 1, 2, 0, 2, 2, 2, 0, 1, 0, 1, 0, 1, 0, 0, 0, 2, 1, 2},
      {2, 5, 3});
  EXPECT_GRADCHECK([&](const Ins& in) { return ops::gather(in[0], 1, idx1); },
                   {leaf64({2, 3, 4}, 91)});
  const Tensor idx_last = Tensor::from_vector<int32_t>({3, 3, 0, 1, 1, 1}, {2, 1, 3});
  EXPECT_GRADCHECK([&](const Ins& in) { return ops::gather(in[0], -1, idx_last); },
                   {leaf64({2, 2, 4}, 92)});
  const Tensor idx0 = Tensor::from_vector<int64_t>({1, 1, 0, 1, 0, 0}, {3, 2});
  EXPECT_GRADCHECK([&](const Ins& in) { return ops::gather(in[0], 0, idx0); },
                   {leaf64({2, 3}, 93)});
}

TEST(LayoutGather, Errors) {
  Tensor x = iota({2, 3});
  expect_error(
      [&] {
        ops::gather(x, 1, Tensor::from_vector<int64_t>({0, 1}));
      },
      {"gather", "rank 2", "[2, 3]", "[2]"});
  expect_error(
      [&] {
        ops::gather(x, 1, Tensor::from_vector<int64_t>({0, 0, 0}, {3, 1}));
      },
      {"gather", "[3, 1]", "larger than input shape [2, 3] at dim 0"});
  expect_error(
      [&] {
        ops::gather(x, 1, Tensor::from_vector<int64_t>({0, 1, 3, 0}, {2, 2}));
      },
      {"gather", "index 3", "position [1, 0]", "dim 1", "[0, 3)"});
}

TEST(LayoutEmbedding, Values) {
  Tensor w = Tensor::from_vector<float>({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2});
  Tensor ids = Tensor::from_vector<int32_t>({3, 0, 3, 1, 2, 2}, {2, 3});
  Tensor y = ops::embedding(w, ids);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 2}));
  expect_values(y, {30, 31, 0, 1, 30, 31, 10, 11, 20, 21, 20, 21});
  Tensor one = ops::embedding(w.to(DType::f64), Tensor::from_vector<int64_t>({2}), 2);
  expect_values(one, {20, 21});
}

TEST(LayoutEmbedding, PaddingRowGetsNoGradientAndRepeatsAccumulate) {
  Tensor w = leaf64({5, 3}, 100);
  Tensor ids = Tensor::from_vector<int64_t>({1, 3, 1, 0, 1}, {5});
  Tensor y = ops::embedding(w, ids, 3);
  // The padding row is still read in the forward.
  expect_values(ops::narrow(y, 0, 1, 1), ops::narrow(w, 0, 3, 1).to_vector<double>());
  backward_ones(y);
  expect_values(w.grad(), {1, 1, 1, 3, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0});
}

TEST(LayoutEmbedding, Gradcheck) {
  const Tensor ids = Tensor::from_vector<int32_t>({1, 3, 1, 0, 3, 1}, {2, 3});
  EXPECT_GRADCHECK([&](const Ins& in) { return ops::embedding(in[0], ids); },
                   {leaf64({4, 2}, 101)});
  // padding_idx drops a gradient that exists, which central differences would
  // see; the padding row is a constant input so both sides agree it has none,
  // and the check covers the other rows (the zero row itself is checked in
  // PaddingRowGetsNoGradientAndRepeatsAccumulate).
  EXPECT_GRADCHECK(
      [&](const Ins& in) {
        Tensor w = ops::cat({ops::narrow(in[0], 0, 0, 1), in[1], ops::narrow(in[0], 0, 1, 2)}, 0);
        return ops::embedding(w, ids, 1);
      },
      {leaf64({3, 2}, 102), Tensor::from_vector<double>({0.5, -0.25}, {1, 2})});
}

TEST(LayoutEmbedding, Errors) {
  Tensor w = iota({4, 2});
  expect_error(
      [&] {
        ops::embedding(w, Tensor::from_vector<int64_t>({0, 1, 4, 2}, {2, 2}));
      },
      {"embedding", "index 4", "position [1, 0]", "size 4", "[0, 4)"});
  expect_error([&] { ops::embedding(iota({4}), Tensor::from_vector<int64_t>({0})); },
               {"(V, D)", "[4]"});
  expect_error([&] { ops::embedding(w, Tensor::from_vector<int64_t>({0}), 4); },
               {"padding_idx", "got 4"});
}

// ---------------------------------------------------------------- recording and size

TEST(LayoutRecord, RecordsOnlyWhenNeeded) {
  Tensor c = iota({2, 3}, DType::f64);
  EXPECT_FALSE(ops::transpose(c, 0, 1).requires_grad());
  EXPECT_FALSE(ops::reshape(c, {6}).requires_grad());
  Tensor x = leaf64({2, 3}, 110);
  EXPECT_TRUE(ops::cat({c, x}, 0).requires_grad());
  NoGradGuard no_grad;
  EXPECT_FALSE(ops::permute(x, {1, 0}).requires_grad());
  EXPECT_FALSE(ops::narrow(x, 0, 0, 1).requires_grad());
  EXPECT_FALSE(ops::split(x, 1, 0)[0].requires_grad());
}

TEST(LayoutLarge, ParallelCopiesMatchTheIndexFormula) {
  // Large enough to take the threaded paths.
  const int64_t R = 300, C = 257;
  Tensor x = iota({R, C});
  Tensor t = ops::transpose(x, 0, 1);
  const float* tp = t.data<float>();
  for (int64_t j = 0; j < C; ++j)
    for (int64_t i = 0; i < R; ++i) ASSERT_EQ(tp[j * R + i], static_cast<float>(i * C + j));
  Tensor y = ops::cat({x, ops::slice(x, 1, 1, C, 2)}, 1);
  const float* yp = y.data<float>();
  const int64_t W = C + (C - 1) / 2;
  ASSERT_EQ(y.shape(), (Shape{R, W}));
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < W; ++j) {
      const int64_t src = j < C ? j : 1 + 2 * (j - C);
      ASSERT_EQ(yp[i * W + j], static_cast<float>(i * C + src));
    }
  // Scatter-add split across threads: id v appears ceil((5000 - v) / 7) times; id 6 is padding.
  std::vector<int64_t> ids(5000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i % 7);
  Tensor w = Tensor::zeros({7, 64}, DType::f64).set_requires_grad(true);
  backward_ones(ops::embedding(w, Tensor::from_vector<int64_t>(ids), 6));
  const auto g = w.grad().to_vector<double>();
  for (int64_t v = 0; v < 7; ++v) {
    const double count = v == 6 ? 0.0 : static_cast<double>((5000 - v + 6) / 7);
    for (int64_t k = 0; k < 64; ++k)
      ASSERT_EQ(g[static_cast<size_t>(v * 64 + k)], count) << "row " << v;
  }
}

TEST(LayoutTokenShift, ValuesAgainstTheDefinition) {
  // D = 11: a remainder of 2 features for three segments; shifts past N give zeros.
  for (const auto& shifts : std::vector<std::vector<int64_t>>{
           {1, 0, -1}, {0, 1, -1, 4, -4, 3, -3, 5, -5}, {2, -9, 0}, {7}}) {
    SCOPED_TRACE(shifts.size());
    for (DType dtype : {DType::f32, DType::f64}) {
      const Tensor x = leaf64({2, 6, 11}, 70).to(dtype), m = leaf64({2, 6, 11}, 71).to(dtype);
      expect_values(ops::token_shift(x, shifts), testing::naive_token_shift(x, x, shifts), 0.0);
      expect_values(ops::token_shift(x, shifts, m), testing::naive_token_shift(x, m, shifts), 0.0);
    }
  }
}

TEST(LayoutTokenShift, Gradcheck) {
  const std::vector<int64_t> shifts = {0, 1, -1, 3, -2};
  EXPECT_GRADCHECK([&](const Ins& in) { return ops::token_shift(in[0], shifts); },
                   {leaf64({2, 4, 12}, 72)});
  EXPECT_GRADCHECK([&](const Ins& in) { return ops::token_shift(in[0], shifts, in[1]); },
                   {leaf64({2, 4, 12}, 73), leaf64({2, 4, 12}, 74)});
  // The same tensor as both sources: the two gradients add up.
  EXPECT_GRADCHECK(
      [&](const Ins& in) {
        return ops::token_shift(in[0], {1, -1}, in[0]);
      },
      {leaf64({1, 5, 5}, 75)});
}

TEST(LayoutTokenShift, Errors) {
  const Tensor x = Tensor::zeros({2, 4, 6}, DType::f64);
  expect_error([&] { ops::token_shift(x, {}); }, {"at least one shift"});
  expect_error(
      [&] {
        ops::token_shift(Tensor::zeros({2, 4, 2}), {1, 0, -1});
      },
      {"D >= 3", "[2, 4, 2]"});
  expect_error([&] { ops::token_shift(Tensor::zeros({4, 6}), {1}); }, {"(B, N, D)", "[4, 6]"});
  expect_error(
      [&] {
        ops::token_shift(x, {1}, Tensor::zeros({2, 4, 6}));
      },
      {"moving must match x", "f64 [2, 4, 6]", "f32 [2, 4, 6]"});
}

}  // namespace
}  // namespace forge
