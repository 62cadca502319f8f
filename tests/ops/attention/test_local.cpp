// attention::local (blocked sliding-window attention): gradcheck of every
// option, agreement with a naive composite that builds the full N x N banded
// mask from the primitive ops, f32 against f64, causality, memory and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/attention/attention.h"
#include "ops/autocast.h"
#include "tests/ops/attention/attention_test_util.h"

namespace forge {
namespace {

using ops::attention::LocalOptions;
using namespace testing;

// The contract of ATTENTION.md "local", written with the primitive ops on the
// full [N, N] scores (fine for a test): the band, causality and the key padding
// mask as a [B, 1, N, N] mask; padded query rows and rows with no key as a
// [B, 1, N, 1] zero factor; dropout as a [B, H, N, N] factor drawn from the same
// Philox stream the op reserves (a fresh Generator(seed), one draw per
// (b, h, i, band position)).
Tensor naive_local(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                   const LocalOptions& o, uint64_t seed) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d = q.size(3);
  const int64_t w = o.window, lb = o.look_backward,
                lf = o.look_forward >= 0 ? o.look_forward : (o.causal ? 0 : 1);
  const int64_t bw = w * (lb + 1 + lf);
  Tensor masked = Tensor::zeros({B, 1, N, N}, DType::boolean);
  Tensor alive = Tensor::zeros({B, 1, N, 1}, DType::f64);
  bool* mp = masked.data<bool>();
  double* ap = alive.data<double>();
  const bool* kp = kpm.defined() ? kpm.data<bool>() : nullptr;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < N; ++i) {
      bool any = false;
      for (int64_t j = 0; j < N; ++j) {
        const bool in_band = j / w >= i / w - lb && j / w <= i / w + lf;
        const bool ok = in_band && (!kp || kp[b * N + j]) && (!o.causal || j <= i);
        mp[(b * N + i) * N + j] = !ok;
        any = any || ok;
      }
      ap[b * N + i] = any && (!kp || kp[b * N + i]) ? 1.0 : 0.0;
    }
  Tensor S = ops::mul(ops::matmul(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(d)));
  Tensor P = ops::softmax(ops::masked_fill(S, masked, -1e9), -1);
  if (o.dropout > 0) {
    Generator g(seed);
    const uint64_t off = g.reserve(static_cast<uint64_t>(B * H * N * bw));
    Tensor keep = Tensor::zeros({B, H, N, N}, DType::f64);
    double* dp = keep.data<double>();
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < N; ++j) {
          const int64_t pos = j - (i / w - lb) * w;
          if (pos < 0 || pos >= bw) continue;
          const auto idx = static_cast<uint64_t>((bh * N + i) * bw + pos);
          dp[(bh * N + i) * N + j] = Generator::uniform_f32(g.seed(), off, idx) >= o.dropout
                                         ? 1.0 / (1.0 - o.dropout)
                                         : 0.0;
        }
    P = ops::mul(P, keep.to(q.dtype()));
  }
  return ops::mul(ops::matmul(P, v), alive.to(q.dtype()));
}

// The output and the gradients of q, k, v of sum(fn(q, k, v) * G) on fresh leaves.
std::vector<Tensor> run_with_grads(const QkvFn& fn, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& G) {
  Tensor q2 = q.detach().clone(), k2 = k.detach().clone(), v2 = v.detach().clone();
  for (Tensor* t : {&q2, &k2, &v2}) t->set_requires_grad(true);
  Tensor o = fn(q2, k2, v2);
  autograd::backward(ops::sum(ops::mul(o, G.to(o.dtype()))));
  return {o.detach(), q2.grad(), k2.grad(), v2.grad()};
}

// q, k [2, 2, N, d] and v [2, 2, N, dv] (seeds seed, seed + 1, seed + 2,
// requiring grad) and the output weight G [2, 2, N, dv] (seed + 3).
struct Inputs {
  Tensor q, k, v, G;
};
Inputs inputs(int64_t N, int64_t d, int64_t dv, uint64_t seed) {
  return {testing::uniform({2, 2, N, d}, seed), testing::uniform({2, 2, N, d}, seed + 1),
          testing::uniform({2, 2, N, dv}, seed + 2),
          testing::uniform({2, 2, N, dv}, seed + 3, DType::f64, -1, 1, false)};
}

struct RefCase {
  const char* name;
  int64_t N, window, look_backward, look_forward;
  bool causal, mask;
  double dropout;
};

const RefCase kRefCases[] = {
    {"default", 64, 16, 1, -1, false, false, 0},
    {"window-not-dividing-N", 45, 8, 1, -1, false, false, 0},
    {"causal", 64, 8, 1, -1, true, false, 0},
    {"look_backward=2,look_forward=2+mask", 45, 7, 2, 2, false, true, 0},
    {"look_backward=0,look_forward=0+mask", 40, 8, 0, 0, false, true, 0},
    {"causal+look_forward=1+mask+dropout", 50, 8, 1, 1, true, true, 0.2},
    {"dropout", 64, 16, 1, -1, false, false, 0.3},
    {"window>=N", 37, 64, 1, -1, false, true, 0},
};

LocalOptions options_of(const RefCase& c) {
  return LocalOptions{.window = c.window,
                      .look_backward = c.look_backward,
                      .look_forward = c.look_forward,
                      .causal = c.causal,
                      .dropout = c.dropout};
}

// Batch 0: the last 5 positions padded; batch 1: one padded key in the middle.
Tensor ref_mask(int64_t N) {
  Tensor m = testing::padding_mask(2, N, {5, 0});
  m.data<bool>()[N + N / 2] = false;
  return m;
}

QkvFn local_fn(const LocalOptions& o, const Tensor& kpm, uint64_t seed) {
  return [o, kpm, seed](const Tensor& q, const Tensor& k, const Tensor& v) {
    Generator g(seed);
    LocalOptions with_gen = o;
    with_gen.gen = &g;
    return ops::attention::local(q, k, v, kpm, with_gen);
  };
}

TEST(AttentionLocal, MatchesNaiveReferenceF64) {
  for (const RefCase& c : kRefCases) {
    SCOPED_TRACE(c.name);
    const auto [q, k, v, G] = inputs(c.N, 8, 12, 1);
    const Tensor kpm = c.mask ? ref_mask(c.N) : Tensor();
    const LocalOptions o = options_of(c);
    const auto got = run_with_grads(local_fn(o, kpm, 9), q, k, v, G);
    const auto want =
        run_with_grads([&](const Tensor& a, const Tensor& b,
                           const Tensor& e) { return naive_local(a, b, e, kpm, o, 9); },
                       q, k, v, G);
    const char* what[] = {"output", "dq", "dk", "dv"};
    for (size_t t = 0; t < got.size(); ++t) {
      SCOPED_TRACE(what[t]);
      EXPECT_LE(testing::max_abs_diff(got[t], want[t]), 1e-10);
    }
  }
}

TEST(AttentionLocal, F32MatchesF64) {
  for (const RefCase& c : kRefCases) {
    SCOPED_TRACE(c.name);
    const auto [q, k, v, G] = inputs(c.N, 8, 12, 5);
    const Tensor kpm = c.mask ? ref_mask(c.N) : Tensor();
    const QkvFn fn = local_fn(options_of(c), kpm, 3);
    const auto f64 = run_with_grads(fn, q, k, v, G);
    const auto f32 = run_with_grads(fn, q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), G);
    for (size_t t = 0; t < f64.size(); ++t) {
      EXPECT_EQ(f32[t].dtype(), DType::f32);
      EXPECT_LE(testing::max_abs_diff(f32[t].to(DType::f64), f64[t]), 2e-5) << "tensor " << t;
    }
  }
}

// Under bf16 autocast on the CPU, bands of at least 128 keys multiply bf16
// copies of q, k, v, do and of the probability and dS tiles with f32
// accumulation: the output and gradients are f32, follow the op in f64 on the
// bf16-rounded inputs up to the rounding of the tiles, and differ from the
// f32 op's. Narrower bands stay f32 (the f32 op's result exactly).
TEST(AttentionLocal, Bf16AutocastOnTheCpuMultipliesInBf16) {
  FORGE_REQUIRE_CPU_BF16();
  const RefCase cases[] = {
      {"w64 (band 192)+mask+dropout", 300, 64, 1, -1, false, true, 0.2},
      {"w128 causal (band 256)+mask", 300, 128, 1, -1, true, true, 0},
      {"w16 (band 48): f32", 300, 16, 1, -1, false, true, 0},
  };
  for (const RefCase& c : cases) {
    SCOPED_TRACE(c.name);
    const auto [q, k, v, G] = inputs(c.N, 16, 16, 11);
    const Tensor kpm = ref_mask(c.N);
    const QkvFn fn = local_fn(options_of(c), kpm, 5);
    const QkvFn autocast = [&](const Tensor& a, const Tensor& b, const Tensor& e) {
      ops::AutocastGuard guard(DType::bf16);
      return fn(a, b, e);
    };
    const auto f32 = [](const Tensor& t) { return t.to(DType::f32); };
    const auto low = run_with_grads(autocast, f32(q), f32(k), f32(v), G);
    const auto plain = run_with_grads(fn, f32(q), f32(k), f32(v), G);
    if (c.window == 16) {
      for (size_t t = 0; t < low.size(); ++t)
        EXPECT_EQ(testing::max_abs_diff(low[t], plain[t]), 0.0) << "tensor " << t;
      continue;
    }
    using testing::bf16_rounded;
    const auto ref = run_with_grads(fn, bf16_rounded(q), bf16_rounded(k), bf16_rounded(v), G);
    for (size_t t = 0; t < low.size(); ++t) {
      EXPECT_EQ(low[t].dtype(), DType::f32);
      // About 2-2.5x the errors measured (o 1.6-1.9e-3, gradients 2.1-2.9e-3).
      EXPECT_LT(testing::scaled_error(low[t], ref[t]), t == 0 ? 4e-3 : 7e-3) << "tensor " << t;
    }
    EXPECT_GT(testing::scaled_error(low[0], plain[0]), 5e-4) << "the tiles did not run in bf16";
  }
}

TEST(AttentionLocal, PaddedQueryRowsAreZeroWithZeroGradient) {
  const int64_t N = 20;
  const auto [q, k, v, G] = inputs(N, 4, 4, 1);
  const Tensor kpm = testing::padding_mask(2, N, {3, 0});
  LocalOptions o;
  o.window = 6;  // N = 20 is padded to 24 inside the op
  const auto got = run_with_grads(local_fn(o, kpm, 1), q, k, v, G);
  const auto out = got[0].to_vector<double>(), dq = got[1].to_vector<double>();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = N - 3; i < N; ++i)
      for (int64_t c = 0; c < 4; ++c) {
        const auto at = static_cast<size_t>(((0 * 2 + h) * N + i) * 4 + c);
        EXPECT_EQ(out[at], 0.0) << "row " << i;
        EXPECT_EQ(dq[at], 0.0) << "row " << i;
      }
  // Padded keys get no gradient either: nothing attends to them.
  const auto dk = got[2].to_vector<double>(), dvv = got[3].to_vector<double>();
  for (int64_t i = N - 3; i < N; ++i)
    for (int64_t c = 0; c < 4; ++c) {
      EXPECT_EQ(dk[static_cast<size_t>(i * 4 + c)], 0.0);
      EXPECT_EQ(dvv[static_cast<size_t>(i * 4 + c)], 0.0);
    }
}

TEST(AttentionLocal, NoCausalLeak) {
  const int64_t N = 37;
  Tensor q = testing::uniform({2, 2, N, 4}, 1), k = testing::uniform({2, 2, N, 4}, 2),
         v = testing::uniform({2, 2, N, 5}, 3);
  LocalOptions base;
  base.causal = true;
  base.window = 8;
  LocalOptions forward_band =
      base;  // look_forward = 1 with causal: the later window is in the band, masked
  forward_band.window = 5;
  forward_band.look_backward = 2;
  forward_band.look_forward = 1;
  LocalOptions dropped = base;
  dropped.dropout = 0.25;
  for (const LocalOptions& o : {base, forward_band, dropped}) {
    testing::expect_no_causal_leak(local_fn(o, Tensor(), 4), q, k, v);
    testing::expect_no_causal_leak(local_fn(o, Tensor(), 4), q.to(DType::f32), k.to(DType::f32),
                                   v.to(DType::f32));
  }
}

// The band is allowed (O(N w (look_backward + 1 + look_forward))), N x N never.
TEST(AttentionLocal, PeakMemoryGrowsLinearly) {
  LocalOptions o;
  o.window = 64;
  const QkvFn fn = [o](const Tensor& q, const Tensor& k, const Tensor& v) {
    return ops::attention::local(q, k, v, Tensor(), o);
  };
  const testing::PeakBytes p = testing::expect_memory_linear_in_n(fn, "local");
  RecordProperty("peak_2048", std::to_string(p.n2048));
  RecordProperty("peak_8192", std::to_string(p.n8192));
}

TEST(AttentionLocal, DropoutAdvancesTheStreamAndReplays) {
  const auto [q, k, v] = testing::qkv_inputs(1, 2, 12, 12, 4, 4, 1);
  LocalOptions o;
  o.window = 4;
  o.dropout = 0.5;
  Generator g(21);
  o.gen = &g;
  const Tensor first = ops::attention::local(q, k, v, Tensor(), o);
  const uint64_t bw = 4 * 3;
  EXPECT_EQ(g.offset(), (1 * 2 * 12 * bw + 3) / 4) << "one draw per (b, h, i, band position)";
  const Tensor second = ops::attention::local(q, k, v, Tensor(), o);
  EXPECT_GT(testing::max_abs_diff(first, second), 0.0);
  g.manual_seed(21);
  EXPECT_EQ(testing::max_abs_diff(first, ops::attention::local(q, k, v, Tensor(), o)), 0.0);
}

TEST(AttentionLocal, RejectsBadArguments) {
  Tensor q = Tensor::zeros({1, 2, 8, 4}), k = Tensor::zeros({1, 2, 8, 4}),
         v = Tensor::zeros({1, 2, 8, 4});
  auto message = [&](const LocalOptions& o, const Tensor& kk, const Tensor& vv) {
    return error_of([&] { ops::attention::local(q, kk, vv, Tensor(), o); });
  };
  LocalOptions o;
  o.window = 0;
  EXPECT_NE(message(o, k, v).find("attention::local: options.window must be >= 1, got 0"),
            std::string::npos);
  o = {};
  o.look_backward = -1;
  EXPECT_NE(message(o, k, v).find("options.look_backward must be >= 0, got -1"), std::string::npos);
  o = {};
  o.look_forward = -2;
  EXPECT_NE(message(o, k, v).find("options.look_forward must be >= 0"), std::string::npos);
  o = {};
  o.dropout = 1.0;
  EXPECT_NE(message(o, k, v).find("options.dropout must be in [0, 1), got 1"), std::string::npos);
  EXPECT_NE(
      message({}, Tensor::zeros({1, 2, 6, 4}), Tensor::zeros({1, 2, 6, 4})).find("N = 8, M = 6"),
      std::string::npos);
}

}  // namespace
}  // namespace forge
