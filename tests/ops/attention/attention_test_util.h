// Helpers shared by the attention op tests: inputs, an op's output and
// gradients, the causal-leak check and peak-memory measurement from the
// allocator's counters.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace forge::testing {

// max |a - b| over max |b|: the error relative to the tensor's scale (for
// low-precision results, whose errors scale with the values).
inline double scaled_error(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return diff / scale;
}

// A [B, M] bool key padding mask with the last `pad[b]` keys of batch b padded.
inline Tensor padding_mask(int64_t B, int64_t M, const std::vector<int64_t>& pad) {
  Tensor m = Tensor::ones({B, M}, DType::boolean);
  bool* p = m.data<bool>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = M - pad[static_cast<size_t>(b)]; j < M; ++j) p[b * M + j] = false;
  return m;
}

// Inputs of an attention op that do not require grad: q [B, H, N, d],
// k [B, H, M, d], v [B, H, M, dv], f64 uniform in [-1, 1) from seeds seed,
// seed + 1, seed + 2.
struct Qkv {
  Tensor q, k, v;
};
inline Qkv qkv_inputs(int64_t B, int64_t H, int64_t N, int64_t M, int64_t d, int64_t dv,
                      uint64_t seed) {
  return {uniform({B, H, N, d}, seed, DType::f64, -1, 1, false),
          uniform({B, H, M, d}, seed + 1, DType::f64, -1, 1, false),
          uniform({B, H, M, dv}, seed + 2, DType::f64, -1, 1, false)};
}

// An attention op under test: fn(q, k, v) -> o.
using QkvFn = std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v)>;

// An op's output and the gradients of q, k and v.
struct AttentionGrads {
  Tensor o, dq, dk, dv;
};

// Forward and the gradients of sum(o * w) (w fixed and random from `w_seed`,
// so every row of do differs) with respect to fresh copies of q, k, v in `dtype`.
inline AttentionGrads forward_backward(const QkvFn& fn, const Tensor& q, const Tensor& k,
                                       const Tensor& v, DType dtype, uint64_t w_seed = 99) {
  auto leaf = [&](const Tensor& t) {
    Tensor c = t.detach().to(dtype).clone();
    c.set_requires_grad(true);
    return c;
  };
  Tensor q2 = leaf(q), k2 = leaf(k), v2 = leaf(v);
  Tensor o = fn(q2, k2, v2);
  Tensor w = uniform(o.shape(), w_seed, dtype, -1, 1, false);
  autograd::backward(ops::sum(ops::mul(o, w)));
  return {o.detach(), q2.grad(), k2.grad(), v2.grad()};
}

// expect_close on the outputs and on each gradient.
inline void expect_same_grads(const AttentionGrads& a, const AttentionGrads& b, double tol) {
  expect_close(a.o, b.o, tol);
  expect_close(a.dq, b.dq, tol);
  expect_close(a.dk, b.dk, tol);
  expect_close(a.dv, b.dv, tol);
}

// fn and ref agree to 1e-10 in f64, output and gradients, on q [2, 2, N, 8],
// k [2, 2, M, 8] and v [2, 2, M, 12] (seeds 1, 2, 3).
inline void expect_matches_reference_f64(const QkvFn& fn, const QkvFn& ref, int64_t N, int64_t M) {
  const Tensor q = uniform({2, 2, N, 8}, 1), k = uniform({2, 2, M, 8}, 2),
               v = uniform({2, 2, M, 12}, 3);
  expect_same_grads(forward_backward(fn, q, k, v, DType::f64),
                    forward_backward(ref, q, k, v, DType::f64), 1e-10);
}

// fn in f32 gives an f32 output and dq, within 1e-4 of fn in f64 (output and
// gradients), on q [2, 2, N, 8], k [2, 2, M, 8] and v [2, 2, M, 12] (seeds 4, 5, 6).
inline void expect_f32_matches_f64(const QkvFn& fn, int64_t N, int64_t M) {
  const Tensor q = uniform({2, 2, N, 8}, 4), k = uniform({2, 2, M, 8}, 5),
               v = uniform({2, 2, M, 12}, 6);
  const AttentionGrads lo = forward_backward(fn, q, k, v, DType::f32);
  EXPECT_EQ(lo.o.dtype(), DType::f32);
  EXPECT_EQ(lo.dq.dtype(), DType::f32);
  expect_same_grads(lo, forward_backward(fn, q, k, v, DType::f64), 1e-4);
}

// An attention op with a [B, M] key padding mask: fn(q, k, v, mask) -> o, no
// mask when `mask` is undefined.
using MaskedQkvFn =
    std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask)>;

// Padding keys drop out: fn with the last 4 of 12 keys padded equals fn on the
// first 8 keys alone (1e-14), on q [1, 2, 9, 4], k [1, 2, 12, 4], v [1, 2, 12, 5].
inline void expect_masked_keys_equal_dropped(const MaskedQkvFn& fn) {
  const Tensor q = uniform({1, 2, 9, 4}, 10), k = uniform({1, 2, 12, 4}, 11),
               v = uniform({1, 2, 12, 5}, 12);
  NoGradGuard no_grad;
  const Tensor masked = fn(q, k, v, padding_mask(1, 12, {4}));
  const Tensor dropped = fn(q, ops::narrow(k, 2, 0, 8), ops::narrow(v, 2, 0, 8), Tensor());
  expect_close(masked, dropped, 1e-14);
}

// Batch 1 of 2 is zero: the second half of t's flat values are exactly 0.
inline void expect_second_half_zero(const Tensor& t) {
  const auto x = t.to_vector<double>();
  for (size_t i = x.size() / 2; i < x.size(); ++i) EXPECT_EQ(x[i], 0.0);
}

// An op run with every key of batch 1 (of 2) padded: the output is finite
// (asserted) and batch 1's output and gradients are exactly 0.
inline void expect_masked_batch_zero(const AttentionGrads& r) {
  for (double x : r.o.to_vector<double>()) ASSERT_TRUE(std::isfinite(x));
  for (const Tensor* t : {&r.o, &r.dq, &r.dk, &r.dv}) expect_second_half_zero(*t);
}

// A causal op must not look ahead: changing k and v at positions > i leaves
// outputs 0..i bit-identical. fn(q, k, v) -> [B, H, N, dv].
inline void expect_no_causal_leak(const QkvFn& fn, const Tensor& q, const Tensor& k,
                                  const Tensor& v) {
  NoGradGuard no_grad;
  const Tensor base = fn(q, k, v);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), dv = v.size(3);
  for (int64_t i : {int64_t{0}, N / 3, N / 2, N - 2}) {
    if (i < 0 || i + 1 >= N) continue;
    Tensor k2 = k.detach().clone(), v2 = v.detach().clone(), q2 = q.detach().clone();
    // Overwrite every position after i (q too: a later query must not change earlier outputs).
    for (Tensor* t : {&k2, &v2, &q2}) {
      const int64_t len = t->size(2), dim = t->size(3);
      FORGE_DISPATCH_FLOAT(t->dtype(), "leak test", [&] {
        scalar_t* p = t->data<scalar_t>();
        for (int64_t bh = 0; bh < B * H; ++bh)
          for (int64_t j = i + 1; j < len; ++j)
            for (int64_t c = 0; c < dim; ++c)
              p[(bh * len + j) * dim + c] = static_cast<scalar_t>(3.0 + 0.5 * c - 0.1 * j);
      });
    }
    const Tensor out = fn(q2, k2, v2);
    const auto a = base.to_vector<double>(), b = out.to_vector<double>();
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t r = 0; r <= i; ++r)
        for (int64_t c = 0; c < dv; ++c) {
          const size_t at = static_cast<size_t>((bh * N + r) * dv + c);
          ASSERT_EQ(a[at], b[at]) << "output row " << r << " changed when positions after " << i
                                  << " changed (batch-head " << bh << ", column " << c << ")";
        }
  }
}

// expect_no_causal_leak of make(mask) on q, k [2, 2, N, 8] and v [2, 2, N, 6]
// (seeds 7, 8, 9): unmasked, with the last 5 keys of batch 1 padded, and
// unmasked in f32.
inline void expect_no_causal_leak_masked_and_f32(
    const std::function<QkvFn(const Tensor& mask)>& make, int64_t N) {
  const auto [q, k, v] = qkv_inputs(2, 2, N, N, 8, 6, 7);
  expect_no_causal_leak(make(Tensor()), q, k, v);
  expect_no_causal_leak(make(padding_mask(2, N, {0, 5})), q, k, v);
  expect_no_causal_leak(make(Tensor()), q.to(DType::f32), k.to(DType::f32), v.to(DType::f32));
}

// Peak CPU bytes allocated above the starting level while fn runs.
inline int64_t peak_bytes_during(const std::function<void()>& fn) {
  const int64_t base = memory_stats().current;
  reset_peak_memory();
  fn();
  return memory_stats().peak - base;
}

// Forward + backward of fn on f32 inputs of length N (B = 1, H = 1): the peak
// allocated bytes beyond the inputs themselves.
inline int64_t attention_peak_bytes(const QkvFn& fn, int64_t N, int64_t d) {
  Tensor q = uniform({1, 1, N, d}, 1, DType::f32), k = uniform({1, 1, N, d}, 2, DType::f32),
         v = uniform({1, 1, N, d}, 3, DType::f32);
  return peak_bytes_during([&] {
    Tensor o = fn(q, k, v);
    autograd::backward(ops::sum(o));
  });
}

// Peak bytes of a forward + backward at N = 2048 and at N = 8192.
struct PeakBytes {
  int64_t n2048, n8192;
};

// The memory rule of an op that holds no N x N buffer, on peak(N) (bytes):
// prints "<label> peak bytes: ..."; the peak at N = 2048 is above 0, the one at
// 8192 at most 4.6x it and under 1/`fraction` of one 8192 x 8192 f32 buffer.
inline PeakBytes expect_peaks_linear_in_n(const std::function<int64_t(int64_t N)>& peak,
                                          const std::string& label, int64_t fraction = 16) {
  const PeakBytes p{peak(2048), peak(8192)};
  std::printf("%s peak bytes: N=2048 %lld, N=8192 %lld\n", label.c_str(),
              static_cast<long long>(p.n2048), static_cast<long long>(p.n8192));
  EXPECT_GT(p.n2048, 0);
  EXPECT_LE(static_cast<double>(p.n8192) / static_cast<double>(p.n2048), 4.6);
  EXPECT_LT(p.n8192, int64_t{8192} * 8192 * 4 / fraction);
  return p;
}

// expect_peaks_linear_in_n for fn on f32 q, k, v [1, 1, N, 16] (attention_peak_bytes).
inline PeakBytes expect_memory_linear_in_n(const QkvFn& fn, const std::string& label,
                                           int64_t fraction = 16) {
  return expect_peaks_linear_in_n([&](int64_t N) { return attention_peak_bytes(fn, N, 16); }, label,
                                  fraction);
}

}  // namespace forge::testing
