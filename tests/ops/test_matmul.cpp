// matmul / linear: against naive loops for every transpose combination and
// broadcast batch, gradcheck in f64, and shape errors.
#include <gtest/gtest.h>

#include "ops/ops.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using testing::leaf64;

// Naive reference on f64: c[..., i, j] = sum_p op(a)[i, p] op(b)[p, j], batch
// dims broadcast (right-aligned).
Tensor naive_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const int64_t n = a.size(ta ? -1 : -2), k = a.size(ta ? -2 : -1), m = b.size(tb ? -2 : -1);
  Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape batch = ops::broadcast_shapes(ab, bb);
  Shape out = batch;
  out.push_back(n);
  out.push_back(m);
  Tensor c = Tensor::zeros(out, DType::f64);
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  double* cp = c.data<double>();
  auto offset = [&](int64_t i, const Shape& in) {
    int64_t off = 0, stride = 1;
    for (size_t d = batch.size(); d-- > 0;) {
      const int64_t idx = i % batch[d];
      i /= batch[d];
      const int64_t rel = static_cast<int64_t>(d) - static_cast<int64_t>(batch.size() - in.size());
      if (rel >= 0) {
        if (in[static_cast<size_t>(rel)] != 1) off += idx * stride;
        stride *= in[static_cast<size_t>(rel)];
      }
    }
    return off;
  };
  for (int64_t bi = 0; bi < shape_numel(batch); ++bi) {
    const double* A = av.data() + offset(bi, ab) * n * k;
    const double* B = bv.data() + offset(bi, bb) * k * m;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += (ta ? A[p * n + i] : A[i * k + p]) * (tb ? B[j * k + p] : B[p * m + j]);
        cp[bi * n * m + i * m + j] = s;
      }
  }
  return c;
}

struct MatmulCase {
  Shape a, b;
  bool ta, tb;
};

class MatmulShapes : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulShapes, MatchesNaiveAndPassesGradcheck) {
  const MatmulCase& c = GetParam();
  Tensor a = leaf64(c.a, 1), b = leaf64(c.b, 2);
  testing::expect_close(ops::matmul(a, b, c.ta, c.tb), naive_matmul(a, b, c.ta, c.tb), 1e-12);
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1], c.ta, c.tb); }, {a, b});
}

INSTANTIATE_TEST_SUITE_P(
    Matmul, MatmulShapes,
    ::testing::Values(MatmulCase{{3, 4}, {4, 5}, false, false},
                      MatmulCase{{4, 3}, {4, 5}, true, false},
                      MatmulCase{{3, 4}, {5, 4}, false, true},
                      MatmulCase{{4, 3}, {5, 4}, true, true},
                      MatmulCase{{2, 3, 4}, {4, 5}, false, false},  // shared weight, folded
                      MatmulCase{{2, 3, 4}, {5, 4}, false, true},   // shared weight, transposed
                      MatmulCase{{2, 4, 3}, {4, 5}, true, false},   // batch with transposed a
                      MatmulCase{{3, 4}, {2, 4, 5}, false, false},  // broadcast a
                      MatmulCase{{2, 1, 3, 4}, {3, 4, 2}, false, false},  // broadcast both
                      MatmulCase{{2, 3, 3, 4}, {2, 3, 2, 4}, false, true}));

TEST(Matmul, F32MatchesF64) {
  Tensor a = leaf64({3, 17, 33}, 3).detach(), b = leaf64({33, 9}, 4).detach();
  Tensor c32 = ops::matmul(a.to(DType::f32), b.to(DType::f32));
  EXPECT_EQ(c32.dtype(), DType::f32);
  testing::expect_close(c32.to(DType::f64), ops::matmul(a, b), 1e-5);
}

TEST(Matmul, LargeBatchOfSmallProductsRunsInParallelCorrectly) {
  Tensor a = leaf64({64, 8, 16}, 5).detach(), b = leaf64({64, 16, 8}, 6).detach();
  testing::expect_close(ops::matmul(a, b), naive_matmul(a, b, false, false), 1e-12);
}

TEST(Matmul, ZeroInnerDimGivesZeros) {
  Tensor c = ops::matmul(Tensor::ones({2, 0}, DType::f64), Tensor::ones({0, 3}, DType::f64));
  testing::expect_values(c, {0, 0, 0, 0, 0, 0});
}

TEST(Matmul, ShapeErrorsNameBothShapes) {
  try {
    ops::matmul(Tensor::ones({2, 3}), Tensor::ones({4, 5}));
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[4, 5]"), std::string::npos) << m;
  }
  EXPECT_THROW(ops::matmul(Tensor::ones({3}), Tensor::ones({3, 2})), Error);
  EXPECT_THROW(ops::matmul(Tensor::ones({2, 3}), Tensor::ones({3, 2}, DType::f64)), Error);
  EXPECT_THROW(ops::matmul(Tensor::ones({2, 2, 3}), Tensor::ones({3, 3, 2})),
               Error);  // batch 2 vs 3
}

TEST(Linear, MatchesDefinitionAndPassesGradcheck) {
  Tensor x = leaf64({2, 3, 4}, 7), w = leaf64({5, 4}, 8), b = leaf64({5}, 9);
  Tensor expected = ops::add(naive_matmul(x.detach(), w.detach(), false, true), b.detach());
  testing::expect_close(ops::linear(x, w, b), expected, 1e-12);
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); },
                   {x, w, b});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1]); }, {x, w});
}

// The bias is fused into the GEMM (rows start as the bias, beta = 1): f32 rows
// across threads, and an empty inner dimension, where y is the bias alone.
TEST(Linear, FusedBiasMatchesDefinition) {
  const Tensor x = leaf64({7, 33, 64}, 13).detach(), w = leaf64({48, 64}, 14).detach(),
               b = leaf64({48}, 15).detach();
  const Tensor expected = ops::add(naive_matmul(x, w, false, true), b);
  testing::expect_close(
      ops::linear(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32)).to(DType::f64), expected,
      1e-5);
  const Tensor empty = ops::linear(Tensor::ones({3, 0}), Tensor::ones({2, 0}),
                                   Tensor::from_vector<double>({1.5, -2}, {2}).to(DType::f32));
  testing::expect_values(empty, {1.5, -2, 1.5, -2, 1.5, -2}, 0);
}

TEST(Linear, OneDimensionalInput) {
  Tensor x = leaf64({4}, 10), w = leaf64({3, 4}, 11), b = leaf64({3}, 12);
  EXPECT_EQ(ops::linear(x, w, b).shape(), Shape({3}));
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); },
                   {x, w, b});
}

TEST(Linear, WrongShapesAreErrors) {
  EXPECT_THROW(ops::linear(Tensor::ones({2, 4}), Tensor::ones({3, 5})), Error);
  EXPECT_THROW(ops::linear(Tensor::ones({2, 4}), Tensor::ones({3, 4}), Tensor::ones({4})), Error);
}

}  // namespace
}  // namespace forge
