// Tests of attention::linear (elu + 1 feature-map attention): gradcheck of
// every option, the fused op against a naive O(N^2) composite of primitive
// ops (forward and gradients), f32 against f64, no causal leak, the memory
// rule, masks, and argument errors.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "ops/attention/attention.h"
#include "tests/ops/attention/attention_test_util.h"

namespace forge {
namespace {

using namespace testing;

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
const RefCase kRefCases[] = {
    {"plain", 48, 48, false, false},     {"mask", 48, 48, true, false},
    {"cross+mask", 40, 56, true, false}, {"blocks+mask", 600, 530, true, false},
    {"causal", 150, 150, false, true},   {"causal+mask", 150, 150, true, true}};

TEST(AttentionLinear, MatchesNaiveCompositeF64) {
  for (const RefCase& c : kRefCases) {
    SCOPED_TRACE(c.name);
    const Tensor mask = c.masked ? padding_mask(2, c.M, {3, 17}) : Tensor();
    testing::expect_matches_reference_f64(op(mask, c.causal), naive(mask, c.causal), c.N, c.M);
  }
}

TEST(AttentionLinear, F32MatchesF64) {
  for (const RefCase& c : kRefCases) {
    SCOPED_TRACE(c.name);
    const Tensor mask = c.masked ? padding_mask(2, c.M, {3, 17}) : Tensor();
    testing::expect_f32_matches_f64(op(mask, c.causal), c.N, c.M);
  }
}

TEST(AttentionLinear, CausalDoesNotLeak) {
  testing::expect_no_causal_leak_masked_and_f32([](const Tensor& mask) { return op(mask, true); },
                                                150);
}

TEST(AttentionLinear, MemoryGrowsLinearly) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    testing::expect_memory_linear_in_n(op(Tensor(), causal), causal ? "linear causal" : "linear");
  }
}

// Padding keys drop out: the masked op equals the op on the real keys alone.
TEST(AttentionLinear, MaskedKeysEqualDroppedKeys) {
  testing::expect_masked_keys_equal_dropped(
      [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
        return ops::attention::linear(q, k, v, mask);
      });
}

// A batch with every key padded gives 0 (num = 0, den = eps), not NaN, and zero gradients.
TEST(AttentionLinear, FullyMaskedBatchIsZero) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const Tensor q = uniform({2, 2, 6, 3}, 13), k = uniform({2, 2, 6, 3}, 14),
                 v = uniform({2, 2, 6, 4}, 15);
    ASSERT_NO_FATAL_FAILURE(testing::expect_masked_batch_zero(
        forward_backward(op(padding_mask(2, 6, {0, 6}), causal), q, k, v, DType::f64)));
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
