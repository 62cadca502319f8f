// matmul / linear: against naive loops for every transpose combination and
// broadcast batch, gradcheck in f64, and shape errors.
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "core/threading.h"
#include "ops/autocast.h"
#include "ops/blas.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using namespace testing;

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

// An f32 leaf from leaf64's values.
Tensor leaf32(const Shape& shape, uint64_t seed) {
  Tensor t = leaf64(shape, seed).detach().to(DType::f32);
  t.set_requires_grad(true);
  return t;
}

// Autocast in bf16 on the CPU (oneDNN's bf16 GEMM): the product and both
// gradients are f32 and equal the exact products of the bf16-rounded operands
// (and gradient) up to f32 accumulation, and differ from the f32 product.
TEST_P(MatmulShapes, Bf16AutocastOnTheCpuMultipliesTheRoundedOperands) {
  FORGE_REQUIRE_CPU_BF16();
  const MatmulCase& c = GetParam();
  const Tensor a = leaf32(c.a, 1), b = leaf32(c.b, 2);
  Tensor out;
  {
    ops::AutocastGuard bf16(DType::bf16);
    out = ops::matmul(a, b, c.ta, c.tb);
  }
  EXPECT_EQ(out.dtype(), DType::f32);
  testing::expect_close(out, naive_matmul(bf16_rounded(a), bf16_rounded(b), c.ta, c.tb), 1e-5);
  EXPECT_GT(testing::max_abs_diff(out, ops::matmul(a.detach(), b.detach(), c.ta, c.tb)), 1e-4)
      << "the operands were not rounded to bf16";
  const Tensor dc = leaf64(out.shape(), 3).detach().to(DType::f32);
  autograd::backward({out}, {dc});
  ASSERT_EQ(a.grad().dtype(), DType::f32);
  // d op(a) = dc op(b)^T and d op(b) = op(a)^T dc, on the rounded values.
  const Tensor g = bf16_rounded(dc), ar = bf16_rounded(a), br = bf16_rounded(b);
  const Tensor da = c.ta ? naive_matmul(br, g, c.tb, true) : naive_matmul(g, br, false, !c.tb);
  const Tensor db = c.tb ? naive_matmul(g, ar, true, c.ta) : naive_matmul(ar, g, !c.ta, false);
  testing::expect_close(a.grad(), ops::sum_to(da, a.shape()), 1e-5);
  testing::expect_close(b.grad(), ops::sum_to(db, b.shape()), 1e-5);
}

// linear (and so the patch embedding on the CPU) under bf16 autocast: the
// fused f32 bias is added exactly, the product is of the rounded operands.
TEST(Linear, Bf16AutocastOnTheCpu) {
  FORGE_REQUIRE_CPU_BF16();
  const Tensor x = leaf32({3, 17, 40}, 21), w = leaf32({24, 40}, 22), bias = leaf32({24}, 23);
  ops::AutocastGuard bf16(DType::bf16);
  const Tensor y = ops::linear(x, w, bias);
  EXPECT_EQ(y.dtype(), DType::f32);
  testing::expect_close(
      y, ops::add(naive_matmul(bf16_rounded(x), bf16_rounded(w), false, true), bias.to(DType::f64)),
      1e-5);
  // f16 autocast leaves CPU tensors in f32, and so does f64.
  ops::AutocastGuard f16(DType::f16);
  EXPECT_EQ(
      testing::max_abs_diff(ops::linear(x, w), ops::matmul(x.detach(), w.detach(), false, true)),
      0.0);
}

// The bf16 GEMM itself: alpha, beta, leading dimensions of tiles inside larger
// matrices, every transpose case, k = 0, and calls from inside an OpenMP
// region (each thread its own cached primitives), against long double loops.
TEST(Matmul, Bf16GemmWithStridesScalesAndThreads) {
  FORGE_REQUIRE_CPU_BF16();
  const int64_t n = 37, m = 29, k = 45, ld = 64;  // operands are tiles of 64-wide rows
  Generator gen(9);
  const auto bits = [&](int64_t count) {
    const Tensor t = Tensor::randn({count}, DType::f32, &gen).to(DType::bf16);
    const BF16* p = t.data<BF16>();
    return std::vector<BF16>(p, p + count);
  };
  const std::vector<BF16> a = bits(64 * ld), b = bits(64 * ld);
  const auto val = [](BF16 v) { return bf16_bits_to_float(static_cast<uint16_t>(v)); };
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const int64_t kk : {k, int64_t{0}}) {
        SCOPED_TRACE(::testing::Message() << "ta " << ta << " tb " << tb << " k " << kk);
        std::vector<float> c0(static_cast<size_t>(n * ld));
        for (size_t i = 0; i < c0.size(); ++i) c0[i] = 0.25f * static_cast<float>(i % 7);
        std::vector<std::vector<float>> cs(4, c0);
        // Four calls at once on two threads and more (the cache is per thread).
        parallel_for(4, 1 << 20, [&](int64_t s, int64_t e) {
          for (int64_t t = s; t < e; ++t)
            ops::gemm(ta, tb, n, m, kk, 0.5f, a.data(), ld, b.data(), ld, t % 2 ? 1.5f : 0.0f,
                      cs[static_cast<size_t>(t)].data(), ld);
        });
        for (int64_t t = 0; t < 4; ++t) {
          const float beta = t % 2 ? 1.5f : 0.0f;
          double worst = 0;
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < ld; ++j) {
              const auto at = static_cast<size_t>(i * ld + j);
              long double want = c0[at];  // columns past m are left alone
              if (j < m) {
                long double dot = 0;
                for (int64_t p = 0; p < kk; ++p)
                  dot += static_cast<long double>(val(ta ? a[static_cast<size_t>(p * ld + i)]
                                                         : a[static_cast<size_t>(i * ld + p)])) *
                         val(tb ? b[static_cast<size_t>(j * ld + p)]
                                : b[static_cast<size_t>(p * ld + j)]);
                want = 0.5L * dot + beta * static_cast<long double>(c0[at]);
              }
              worst = std::max(
                  worst, static_cast<double>(std::abs(cs[static_cast<size_t>(t)][at] - want)));
            }
          EXPECT_LT(worst, 2e-5) << "call " << t;
        }
      }
}

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
