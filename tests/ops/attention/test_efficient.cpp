// Tests of attention::efficient (Efficient Attention, Shen et al.): gradcheck
// of every option, the fused op against a naive O(N^2) composite of primitive
// ops (forward and gradients), f32 against f64, no causal leak, the memory
// rule, fully masked feature columns, the blind spot of the first bucket and
// argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "ops/attention/attention.h"
#include "tests/ops/attention/attention_test_util.h"

namespace forge {
namespace {

using namespace testing;

// [B, 1, M, 1] bool: true for a padding key.
Tensor padding_positions(const Tensor& mask) {
  const auto bytes = mask.to_vector<bool>();
  std::vector<bool> pad(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) pad[i] = !bytes[i];
  Tensor t = Tensor::empty({mask.size(0), 1, mask.size(1), 1}, DType::boolean);
  bool* p = t.data<bool>();
  for (size_t i = 0; i < pad.size(); ++i) p[i] = pad[i];
  return t;
}

// [N, N] f64: 1 where query i sees key j: j in an earlier bucket of s, or j <= i when s == 1.
Tensor visible(int64_t N, int64_t s) {
  std::vector<double> t(static_cast<size_t>(N * N), 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < N; ++j)
      t[static_cast<size_t>(i * N + j)] = (s == 1 ? j <= i : j / s < i / s) ? 1.0 : 0.0;
  return Tensor::from_vector(t, {N, N});
}

// ATTENTION.md "efficient" with primitive ops, O(N^2).
// Non-causal: k = -inf and v = 0 on padding keys, o = (q' k'^T) v.
// Causal: A = q' exp(k)^T on the visible keys, o = A v / max(rowsum(A), 1e-3).
Tensor naive_efficient(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                       bool causal, int64_t s) {
  const Tensor qp = ops::softmax(q, -1) * (1.0 / std::sqrt(static_cast<double>(q.size(3))));
  if (!causal) {
    Tensor km = k, vm = v;
    if (mask.defined()) {
      km = ops::masked_fill(k, padding_positions(mask), -std::numeric_limits<double>::infinity());
      vm = ops::masked_fill(v, padding_positions(mask), 0.0);
    }
    return ops::matmul(ops::matmul(qp, ops::softmax(km, 2), false, true), vm);
  }
  Tensor kp = ops::exp(k), vm = v;
  if (mask.defined()) {
    kp = ops::masked_fill(kp, padding_positions(mask), 0.0);
    vm = ops::masked_fill(v, padding_positions(mask), 0.0);
  }
  const Tensor a = ops::matmul(qp, kp, false, true) * visible(q.size(2), s);
  return ops::matmul(a, vm) / ops::clamp(ops::sum(a, {-1}, true), 1e-3);
}

QkvFn op(const Tensor& mask, bool causal, int64_t s) {
  return [mask, causal, s](const Tensor& q, const Tensor& k, const Tensor& v) {
    ops::attention::EfficientOptions options;
    options.causal = causal;
    options.bucket_size = s;
    return ops::attention::efficient(q, k, v, mask, options);
  };
}

QkvFn naive(const Tensor& mask, bool causal, int64_t s) {
  return [mask, causal, s](const Tensor& q, const Tensor& k, const Tensor& v) {
    return naive_efficient(q, k, v, mask, causal, s);
  };
}

// Causal rows run in blocks of about 64 (a multiple of the bucket size), so
// N = 144..192 crosses block boundaries; bucket 3 gives blocks of 66.
// Non-causal rows run in blocks of 64: 600 queries and 530 keys cross many.
struct RefCase {
  const char* name;
  int64_t N, M;
  bool masked, causal;
  int64_t bucket_size;
};
const RefCase kRefCases[] = {{"plain", 48, 48, false, false, 64},
                             {"mask", 48, 48, true, false, 64},
                             {"cross+mask", 40, 56, true, false, 64},
                             {"blocks+mask", 600, 530, true, false, 64},
                             {"causal", 150, 150, false, true, 1},
                             {"causal+mask", 150, 150, true, true, 1},
                             {"causal+buckets", 150, 150, false, true, 3},
                             {"causal+buckets+mask", 144, 144, true, true, 8},
                             {"causal+default-buckets", 192, 192, false, true, 64}};

TEST(AttentionEfficient, MatchesNaiveCompositeF64) {
  for (const RefCase& c : kRefCases) {
    SCOPED_TRACE(c.name);
    const Tensor mask = c.masked ? padding_mask(2, c.M, {3, 17}) : Tensor();
    testing::expect_matches_reference_f64(op(mask, c.causal, c.bucket_size),
                                          naive(mask, c.causal, c.bucket_size), c.N, c.M);
  }
}

TEST(AttentionEfficient, F32MatchesF64) {
  for (const RefCase& c : kRefCases) {
    SCOPED_TRACE(c.name);
    const Tensor mask = c.masked ? padding_mask(2, c.M, {3, 17}) : Tensor();
    testing::expect_f32_matches_f64(op(mask, c.causal, c.bucket_size), c.N, c.M);
  }
}

TEST(AttentionEfficient, CausalDoesNotLeak) {
  for (int64_t s : {1, 4, 16, 72}) {
    SCOPED_TRACE("bucket_size " + std::to_string(s));
    testing::expect_no_causal_leak_masked_and_f32(
        [s](const Tensor& mask) { return op(mask, true, s); }, 144);
  }
}

TEST(AttentionEfficient, MemoryGrowsLinearly) {
  for (int64_t s : {0, 1, 64}) {
    const bool causal = s > 0;
    SCOPED_TRACE(causal ? "causal, bucket_size " + std::to_string(s) : std::string("non-causal"));
    testing::expect_memory_linear_in_n(
        op(Tensor(), causal, causal ? s : 64),
        "efficient" + (causal ? " causal s=" + std::to_string(s) : std::string()));
  }
}

// Non-causal padding keys drop out: the masked op equals the op on the real keys alone.
TEST(AttentionEfficient, MaskedKeysEqualDroppedKeys) {
  testing::expect_masked_keys_equal_dropped(
      [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
        return ops::attention::efficient(q, k, v, mask);
      });
}

// Every key of batch 1 padded: each feature column of k' has no real key and
// contributes 0, so that batch's output and gradients are 0, never NaN; batch 0
// is untouched.
TEST(AttentionEfficient, FullyMaskedColumnsContributeZero) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const Tensor q = uniform({2, 2, 6, 3}, 13), k = uniform({2, 2, 6, 3}, 14),
                 v = uniform({2, 2, 6, 4}, 15);
    const AttentionGrads r =
        forward_backward(op(padding_mask(2, 6, {0, 6}), causal, 1), q, k, v, DType::f64);
    const AttentionGrads open = forward_backward(op(Tensor(), causal, 1), q, k, v, DType::f64);
    ASSERT_NO_FATAL_FAILURE(testing::expect_masked_batch_zero(r));
    const auto o = r.o.to_vector<double>(), o_open = open.o.to_vector<double>();
    for (size_t i = 0; i < o.size() / 2; ++i) EXPECT_EQ(o[i], o_open[i]);
    for (const Tensor* g : {&r.dq, &r.dk, &r.dv})
      for (double x : g->to_vector<double>()) ASSERT_TRUE(std::isfinite(x));
  }
}

// With buckets of s > 1 the first bucket sees no key and outputs 0; the
// second bucket sees exactly the first.
TEST(AttentionEfficient, FirstBucketIsBlind) {
  const Tensor q = uniform({1, 1, 8, 3}, 16), k = uniform({1, 1, 8, 3}, 17),
               v = uniform({1, 1, 8, 2}, 18);
  NoGradGuard no_grad;
  const auto o = op(Tensor(), true, 4)(q, k, v).to_vector<double>();
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(o[i], 0.0);
  const auto kv = k.to_vector<double>(), vv = v.to_vector<double>(), qv = q.to_vector<double>();
  // Row 4 by hand: q' = softmax(q_4) / sqrt(3), C and z over keys 0..3.
  double mx = std::max({qv[12], qv[13], qv[14]}), sum = 0, p[3];
  for (int f = 0; f < 3; ++f) sum += (p[f] = std::exp(qv[12 + f] - mx));
  double num[2] = {0, 0}, den = 0;
  for (int j = 0; j < 4; ++j)
    for (int f = 0; f < 3; ++f) {
      const double w = p[f] / sum / std::sqrt(3.0) * std::exp(kv[j * 3 + f]);
      den += w;
      for (int e = 0; e < 2; ++e) num[e] += w * vv[j * 2 + e];
    }
  EXPECT_NEAR(o[8], num[0] / den, 1e-14);
  EXPECT_NEAR(o[9], num[1] / den, 1e-14);
}

TEST(AttentionEfficient, ErrorsNameTheProblem) {
  const Tensor q = Tensor::zeros({1, 1, 6, 4}), k = Tensor::zeros({1, 1, 6, 4}),
               v = Tensor::zeros({1, 1, 6, 3});
  EXPECT_NE(
      error_of([&] { op(Tensor(), true, 4)(q, k, v); }).find("multiple of options.bucket_size = 4"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] { op(Tensor(), true, 0)(q, k, v); }).find("bucket_size must be >= 1, got 0"),
      std::string::npos);
  const Tensor k7 = Tensor::zeros({1, 1, 7, 4}), v7 = Tensor::zeros({1, 1, 7, 3});
  EXPECT_NE(error_of([&] { op(Tensor(), true, 1)(q, k7, v7); }).find("N = 6, M = 7"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { op(Tensor(), false, 64)(q, k7, v7); }, IfNoError::allow), "");
  const Tensor q0 = Tensor::zeros({1, 1, 6, 0}), k0 = Tensor::zeros({1, 1, 6, 0});
  EXPECT_NE(error_of([&] { op(Tensor(), false, 64)(q0, k0, v); }).find("d >= 1"),
            std::string::npos);
}

}  // namespace
}  // namespace forge
