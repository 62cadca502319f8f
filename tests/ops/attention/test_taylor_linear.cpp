// taylor_linear: gradcheck of every option, forward and gradients against a
// naive O(N M) composite of primitive ops, f32 against f64, masking, errors and
// the memory rule.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "ops/attention/attention.h"
#include "tests/ops/attention/attention_test_util.h"

namespace forge {
namespace {

using ops::attention::taylor_linear;
using namespace testing;

// The contract written out with an explicit [B, H, N, M] score matrix:
// A = 1 + q' k'^T (masked keys zeroed), o = A v / (rowsum(A) + eps sum_c q'_c),
// which is (s + q' C) / (n + q' . (sum_j k'_j + eps)) expanded.
Tensor naive_taylor_linear(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  using namespace ops;
  const Tensor qn = q / sqrt(sum(q * q, {-1}, true));
  const Tensor kn = k / sqrt(sum(k * k, {-1}, true));
  Tensor A = matmul(qn, kn, false, true) + 1.0;
  if (mask.defined()) A = A * mask.to(q.dtype()).view({q.size(0), 1, 1, k.size(2)});
  const Tensor den = sum(A, {-1}, true) + 1e-6 * sum(qn, {-1}, true);
  return matmul(A, v) / den;
}

// Output and the gradients of sum(o * w) for a fixed random weight w.
AttentionGrads run(const QkvFn& fn, DType dtype, int64_t N, int64_t M, int64_t d, int64_t dv) {
  Tensor q = uniform({2, 2, N, d}, 21, dtype), k = uniform({2, 2, M, d}, 22, dtype),
         v = uniform({2, 2, M, dv}, 23, dtype);
  Tensor o = fn(q, k, v);
  const Tensor w = uniform(o.shape(), 24, dtype, -1, 1, false);
  autograd::backward(ops::sum(o * w));
  return {o.detach(), q.grad(), k.grad(), v.grad()};
}

TEST(AttentionTaylorLinear, MatchesNaiveReference) {
  struct Config {
    int64_t N, M;
    bool mask;
  };
  for (const Config& c :
       {Config{48, 48, false}, Config{41, 41, true}, Config{37, 53, false}, Config{44, 33, true},
        Config{600, 530, true}}) {  // the last: many 64-row blocks, ragged ends
    SCOPED_TRACE("N = " + std::to_string(c.N) + ", M = " + std::to_string(c.M) +
                 (c.mask ? ", mask" : ""));
    const Tensor mask = c.mask ? testing::padding_mask(2, c.M, {3, 11}) : Tensor();
    const AttentionGrads got = run([&](const Tensor& q, const Tensor& k,
                                       const Tensor& v) { return taylor_linear(q, k, v, mask); },
                                   DType::f64, c.N, c.M, 12, 10);
    const AttentionGrads want =
        run([&](const Tensor& q, const Tensor& k,
                const Tensor& v) { return naive_taylor_linear(q, k, v, mask); },
            DType::f64, c.N, c.M, 12, 10);
    expect_same_grads(got, want, 1e-10);
  }
}

TEST(AttentionTaylorLinear, Float32MatchesFloat64) {
  const Tensor mask = testing::padding_mask(2, 57, {0, 9});
  auto fn = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
    return taylor_linear(q, k, v, mask);
  };
  const AttentionGrads f32 = run(fn, DType::f32, 64, 57, 16, 16),
                       f64 = run(fn, DType::f64, 64, 57, 16, 16);
  expect_same_grads(
      {f32.o.to(DType::f64), f32.dq.to(DType::f64), f32.dk.to(DType::f64), f32.dv.to(DType::f64)},
      f64, 2e-5);
}

TEST(AttentionTaylorLinear, MaskedKeysAreDroppedNotZeroed) {
  // A padded key is absent: the output equals the op on the real keys alone
  // (a zeroed key would still count in n), and padded keys get no gradient.
  Tensor q = uniform({1, 2, 6, 4}, 31), k = uniform({1, 2, 9, 4}, 32),
         v = uniform({1, 2, 9, 5}, 33);
  const Tensor o = taylor_linear(q, k, v, testing::padding_mask(1, 9, {4}));
  autograd::backward(ops::sum(o));
  const Tensor kr = ops::narrow(k.detach(), 2, 0, 5), vr = ops::narrow(v.detach(), 2, 0, 5);
  testing::expect_close(o, taylor_linear(q.detach(), kr, vr), 1e-14);
  const auto dk = k.grad().to_vector<double>(), dv = v.grad().to_vector<double>();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 5; j < 9; ++j) {
      for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(dk[static_cast<size_t>((h * 9 + j) * 4 + c)], 0.0);
      for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(dv[static_cast<size_t>((h * 9 + j) * 5 + c)], 0.0);
    }
}

TEST(AttentionTaylorLinear, ScaleInvariantInQueriesAndKeys) {
  // Only the directions of q and k enter (both are L2-normalised).
  NoGradGuard no_grad;
  const auto [q, k, v] = testing::qkv_inputs(2, 1, 7, 8, 3, 2, 41);
  testing::expect_close(taylor_linear(ops::mul(q, 3.5), ops::mul(k, 0.25), v),
                        taylor_linear(q, k, v), 1e-14);
}

TEST(AttentionTaylorLinear, ErrorsNameTheOpAndArgument) {
  const Tensor q = Tensor::ones({2, 2, 5, 4}), k = Tensor::ones({2, 2, 6, 4}),
               v = Tensor::ones({2, 2, 6, 3});
  EXPECT_NE(error_of([&] {
              taylor_linear(q, k, Tensor::ones({2, 2, 5, 3}));
            }).find("taylor_linear: v"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              taylor_linear(q, k, v, Tensor::ones({2, 5}, DType::boolean));
            }).find("taylor_linear: key_padding_mask must be [B, M] = [2, 6]"),
            std::string::npos);
}

TEST(AttentionTaylorLinear, MemoryGrowsLinearly) {
  auto fn = [](const Tensor& q, const Tensor& k, const Tensor& v) {
    return taylor_linear(q, k, v);
  };
  const testing::PeakBytes p = testing::expect_memory_linear_in_n(fn, "taylor_linear");
  RecordProperty("peak_bytes_2048", std::to_string(p.n2048));
  RecordProperty("peak_bytes_8192", std::to_string(p.n8192));
}

}  // namespace
}  // namespace forge
