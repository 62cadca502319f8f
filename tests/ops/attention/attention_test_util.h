// Helpers shared by the attention op tests: inputs, an op's output and
// gradients, the causal-leak check and peak-memory measurement from the
// allocator's counters.
#pragma once

#include <gtest/gtest.h>

#include <functional>
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

// An attention op under test: fn(q, k, v) -> o.
using QkvFn = std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v)>;

// An op's output and the gradients of q, k and v.
struct AttentionGrads {
  Tensor o, dq, dk, dv;
};

// Forward and the gradients of sum(o * w) (w fixed and random, so every row
// of do differs) with respect to fresh copies of q, k, v in `dtype`.
inline AttentionGrads forward_backward(const QkvFn& fn, const Tensor& q, const Tensor& k,
                                       const Tensor& v, DType dtype) {
  auto leaf = [&](const Tensor& t) {
    Tensor c = t.detach().to(dtype).clone();
    c.set_requires_grad(true);
    return c;
  };
  Tensor q2 = leaf(q), k2 = leaf(k), v2 = leaf(v);
  Tensor o = fn(q2, k2, v2);
  Tensor w = uniform(o.shape(), 99, dtype, -1, 1, false);
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

}  // namespace forge::testing
