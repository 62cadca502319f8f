// Tests of attention::linear (elu + 1 feature-map attention): gradcheck of
// every option, the fused op against a naive O(N^2) composite of primitive
// ops (forward and gradients), f32 against f64, no causal leak, the memory
// rule, masks, and argument errors.
#include <gtest/gtest.h>

#include <functional>
#include <iostream>
#include <string>

#include "ops/attention/attention.h"
#include "tests/ops/attention/attention_test_util.h"

namespace forge {
namespace {

using testing::AttentionGrads;
using testing::error_of;
using testing::expect_same_grads;
using testing::forward_backward;
using testing::padding_mask;
using testing::QkvFn;
using testing::uniform;

// [B, 1, M, 1] f64: 1 for a real key, 0 for padding.
Tensor keep_factor(const Tensor& mask) {
  const auto bytes = mask.to_vector<bool>();
  std::vector<double> f(bytes.begin(), bytes.end());
  return Tensor::from_vector(f, {mask.size(0), 1, mask.size(1), 1});
}

// [N, N] f64: 1 where j <= i.
Tensor lower_triangle(int64_t N) {
  std::vector<double> t(static_cast<size_t>(N * N), 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j <= i; ++j) t[static_cast<size_t>(i * N + j)] = 1;
  return Tensor::from_vector(t, {N, N});
}

// ATTENTION.md "linear" with primitive ops, O(N^2): A = phi(q) phi(k)^T
// (masked keys and, causal, j > i zeroed), o = A v / (rowsum(A) + eps).
Tensor naive_linear(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                    bool causal, double eps = 1e-6) {
  Tensor qp = ops::elu(q) + 1.0, kp = ops::elu(k) + 1.0;
  if (mask.defined()) kp = kp * keep_factor(mask);
  Tensor a = ops::matmul(qp, kp, false, true);
  if (causal) a = a * lower_triangle(q.size(2));
  return ops::matmul(a, v) / (ops::sum(a, {-1}, true) + eps);
}

QkvFn op(const Tensor& mask, bool causal) {
  return [mask, causal](const Tensor& q, const Tensor& k, const Tensor& v) {
    ops::attention::LinearOptions options;
    options.causal = causal;
    return ops::attention::linear(q, k, v, mask, options);
  };
}

QkvFn naive(const Tensor& mask, bool causal) {
  return [mask, causal](const Tensor& q, const Tensor& k, const Tensor& v) {
    return naive_linear(q, k, v, mask, causal);
  };
}

// (name, N, M, masked, causal): N = 150 crosses two chunk boundaries of the
// scan; 600 queries and 530 keys cross nine and eight of the non-causal
// passes' 64-row blocks, with ragged last blocks.
struct RefCase {
  const char* name;
  int64_t N, M;
  bool masked, causal;
};
const RefCase kRefCases[] = {{"plain", 48, 48, false, false},
                             {"mask", 48, 48, true, false},
                             {"cross+mask", 40, 56, true, false},
                             {"blocks+mask", 600, 530, true, false},
                             {"causal", 150, 150, false, true},
                             {"causal+mask", 150, 150, true, true}};

TEST(AttentionLinear, MatchesNaiveCompositeF64) {
  for (const RefCase& c : kRefCases) {
    SCOPED_TRACE(c.name);
    const Tensor q = uniform({2, 2, c.N, 8}, 1), k = uniform({2, 2, c.M, 8}, 2),
                 v = uniform({2, 2, c.M, 12}, 3);
    const Tensor mask = c.masked ? padding_mask(2, c.M, {3, 17}) : Tensor();
    expect_same_grads(forward_backward(op(mask, c.causal), q, k, v, DType::f64),
                      forward_backward(naive(mask, c.causal), q, k, v, DType::f64), 1e-10);
  }
}

TEST(AttentionLinear, F32MatchesF64) {
  for (const RefCase& c : kRefCases) {
    SCOPED_TRACE(c.name);
    const Tensor q = uniform({2, 2, c.N, 8}, 4), k = uniform({2, 2, c.M, 8}, 5),
                 v = uniform({2, 2, c.M, 12}, 6);
    const Tensor mask = c.masked ? padding_mask(2, c.M, {3, 17}) : Tensor();
    const AttentionGrads lo = forward_backward(op(mask, c.causal), q, k, v, DType::f32);
    EXPECT_EQ(lo.o.dtype(), DType::f32);
    EXPECT_EQ(lo.dq.dtype(), DType::f32);
    expect_same_grads(lo, forward_backward(op(mask, c.causal), q, k, v, DType::f64), 1e-4);
  }
}

TEST(AttentionLinear, CausalDoesNotLeak) {
  const Tensor q = uniform({2, 2, 150, 8}, 7, DType::f64, -1, 1, false),
               k = uniform({2, 2, 150, 8}, 8, DType::f64, -1, 1, false),
               v = uniform({2, 2, 150, 6}, 9, DType::f64, -1, 1, false);
  testing::expect_no_causal_leak(op(Tensor(), true), q, k, v);
  testing::expect_no_causal_leak(op(padding_mask(2, 150, {0, 5}), true), q, k, v);
  testing::expect_no_causal_leak(op(Tensor(), true), q.to(DType::f32), k.to(DType::f32),
                                 v.to(DType::f32));
}

TEST(AttentionLinear, MemoryGrowsLinearly) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const int64_t small = testing::attention_peak_bytes(op(Tensor(), causal), 2048, 16);
    const int64_t large = testing::attention_peak_bytes(op(Tensor(), causal), 8192, 16);
    std::cout << "[ linear" << (causal ? " causal" : "") << " ] peak bytes N=2048: " << small
              << ", N=8192: " << large << "\n";
    EXPECT_GT(small, 0);
    EXPECT_LE(static_cast<double>(large) / static_cast<double>(small), 4.6);
    EXPECT_LT(large, int64_t{8192} * 8192 * 4 / 16);
  }
}

// Padding keys drop out: the masked op equals the op on the real keys alone.
TEST(AttentionLinear, MaskedKeysEqualDroppedKeys) {
  const Tensor q = uniform({1, 2, 9, 4}, 10), k = uniform({1, 2, 12, 4}, 11),
               v = uniform({1, 2, 12, 5}, 12);
  NoGradGuard no_grad;
  const Tensor masked = ops::attention::linear(q, k, v, padding_mask(1, 12, {4}));
  const Tensor dropped =
      ops::attention::linear(q, ops::narrow(k, 2, 0, 8), ops::narrow(v, 2, 0, 8));
  testing::expect_close(masked, dropped, 1e-14);
}

// A batch with every key padded gives 0 (num = 0, den = eps), not NaN, and zero gradients.
TEST(AttentionLinear, FullyMaskedBatchIsZero) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const Tensor q = uniform({2, 2, 6, 3}, 13), k = uniform({2, 2, 6, 3}, 14),
                 v = uniform({2, 2, 6, 4}, 15);
    const AttentionGrads r =
        forward_backward(op(padding_mask(2, 6, {0, 6}), causal), q, k, v, DType::f64);
    const auto o = r.o.to_vector<double>(), dq = r.dq.to_vector<double>(),
               dk = r.dk.to_vector<double>(), dv = r.dv.to_vector<double>();
    for (size_t i = 0; i < o.size(); ++i) ASSERT_TRUE(std::isfinite(o[i]));
    for (size_t i = o.size() / 2; i < o.size(); ++i) EXPECT_EQ(o[i], 0.0);
    for (size_t i = dq.size() / 2; i < dq.size(); ++i) EXPECT_EQ(dq[i], 0.0);
    for (size_t i = dk.size() / 2; i < dk.size(); ++i) EXPECT_EQ(dk[i], 0.0);
    for (size_t i = dv.size() / 2; i < dv.size(); ++i) EXPECT_EQ(dv[i], 0.0);
  }
}

TEST(AttentionLinear, ErrorsNameTheProblem) {
  const Tensor q = Tensor::zeros({1, 1, 5, 4}), k = Tensor::zeros({1, 1, 7, 4}),
               v = Tensor::zeros({1, 1, 7, 3});
  ops::attention::LinearOptions causal;
  causal.causal = true;
  EXPECT_NE(
      error_of([&] { ops::attention::linear(q, k, v, Tensor(), causal); }).find("N = 5, M = 7"),
      std::string::npos);
  ops::attention::LinearOptions bad_eps;
  bad_eps.eps = -1;
  EXPECT_NE(
      error_of([&] { ops::attention::linear(q, k, v, Tensor(), bad_eps); }).find("options.eps"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              ops::attention::linear(q, Tensor::zeros({1, 1, 7, 5}), v);
            }).find("attention::linear"),
            std::string::npos);
}

}  // namespace
}  // namespace forge
