// Tests of the tiled softmax attention op (ops/attention/softmax.cpp) against
// gradcheck and a naive O(N M) composite of primitive ops written from
// ATTENTION.md "softmax", plus causality, memory, masking, dropout and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/threading.h"
#include "ops/attention/attention.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "tests/ops/attention/attention_test_util.h"

namespace forge {
namespace {

namespace att = ops::attention;
using namespace testing;

// The dropout factors the op must use: Z [B, H, N, M] = 1/(1-p) where draw
// ((b H + h) N + i) M + j of the stream at `offset` is >= p, else 0.
Tensor dropout_factors(int64_t B, int64_t H, int64_t N, int64_t M, double p, uint64_t seed,
                       uint64_t offset) {
  Tensor z = Tensor::empty({B, H, N, M}, DType::f64);
  double* zp = z.data<double>();
  for (int64_t e = 0; e < z.numel(); ++e)
    zp[e] =
        Generator::uniform_f32(seed, offset, static_cast<uint64_t>(e)) >= p ? 1.0 / (1.0 - p) : 0.0;
  return z;
}

// The reference: ATTENTION.md "softmax" with primitive ops, materialising S.
//   S = scale q k^T, masked (kpm false or causal j > i) -> -1e30 (exp gives 0);
//   P = softmax_j(S) times 0 on rows with every key masked (they output 0);
//   P = P * Z (dropout factors, when given); o = P v.
Tensor naive_softmax_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                               double scale, bool causal, const Tensor& Z) {
  const int64_t B = q.size(0), N = q.size(2), M = k.size(2);
  Tensor visible = Tensor::ones({B, 1, N, M}, DType::boolean);
  bool* vp = visible.data<bool>();
  const auto mask = kpm.defined() ? kpm.to_vector<uint8_t>() : std::vector<uint8_t>();
  Tensor row_valid = Tensor::zeros({B, 1, N, 1}, DType::f64);
  double* rv = row_valid.data<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < M; ++j) {
        const bool see =
            (mask.empty() || mask[static_cast<size_t>(b * M + j)]) && !(causal && j > i);
        vp[(b * N + i) * M + j] = see;
        if (see) rv[b * N + i] = 1;
      }
  Tensor S = ops::mul(ops::matmul(q, k, false, true), scale);
  S = ops::where(visible, S, Tensor::scalar(-1e30, DType::f64));
  Tensor P = ops::mul(ops::softmax(S, -1), row_valid);
  if (Z.defined()) P = ops::mul(P, Z);
  return ops::matmul(P, v);
}

struct Inputs {
  Tensor q, k, v;
};

Inputs make_inputs(int64_t B, int64_t H, int64_t N, int64_t M, int64_t d, int64_t dv, uint64_t seed,
                   DType dtype = DType::f64) {
  return {uniform({B, H, N, d}, seed, dtype), uniform({B, H, M, d}, seed + 1, dtype),
          uniform({B, H, M, dv}, seed + 2, dtype)};
}

Inputs fresh(const Inputs& in, DType dtype) {
  auto leaf = [&](const Tensor& t) {
    Tensor c = t.detach().to(dtype).clone();
    c.set_requires_grad(true);
    return c;
  };
  return {leaf(in.q), leaf(in.k), leaf(in.v)};
}

// Backpropagates sum(o * w) (w a fixed random weight, so every do differs).
void backprop(const Tensor& o, uint64_t seed) {
  Tensor w = uniform(o.shape(), seed, o.dtype(), -1, 1, false);
  autograd::backward(ops::sum(ops::mul(o, w)));
}

// Medium shapes spanning several 64 x 128 tiles (and ragged last tiles), in f64.
struct RefCase {
  std::string name;
  int64_t N, M;
  std::vector<int64_t> pad;  // empty: no mask
  bool causal;
  double scale;  // 0: d^-1/2
  double dropout;
};

// The op against the naive composite, forward and every gradient, in f64.
void expect_matches_reference(int64_t B, int64_t H, const RefCase& c, uint64_t seed) {
  SCOPED_TRACE(c.name);
  const int64_t d = 8, dv = 12;
  const Inputs base = make_inputs(B, H, c.N, c.M, d, dv, seed);
  const Tensor kpm = c.pad.empty() ? Tensor() : padding_mask(B, c.M, c.pad);
  Generator gen(seed);
  const uint64_t offset = gen.offset();
  att::SoftmaxOptions options{
      .scale = c.scale, .causal = c.causal, .dropout = c.dropout, .gen = &gen};
  const Inputs a = fresh(base, DType::f64), r = fresh(base, DType::f64);
  const Tensor o = att::softmax(a.q, a.k, a.v, kpm, options);
  const Tensor Z =
      c.dropout > 0 ? dropout_factors(B, H, c.N, c.M, c.dropout, gen.seed(), offset) : Tensor();
  const Tensor o_ref = naive_softmax_attention(
      r.q, r.k, r.v, kpm, c.scale > 0 ? c.scale : 1 / std::sqrt(static_cast<double>(d)), c.causal,
      Z);
  expect_close(o, o_ref, 1e-10);
  backprop(o, seed + 5);
  backprop(o_ref, seed + 5);
  expect_close(a.q.grad(), r.q.grad(), 1e-10);
  expect_close(a.k.grad(), r.k.grad(), 1e-10);
  expect_close(a.v.grad(), r.v.grad(), 1e-10);
}

TEST(AttentionSoftmax, MatchesNaiveReference) {
  const std::vector<RefCase> cases = {
      {"plain", 150, 150, {}, false, 0, 0},
      {"causal", 200, 200, {}, true, 0, 0},
      {"mask", 130, 130, {7, 60}, false, 0, 0},
      {"causal+mask", 170, 170, {0, 45}, true, 0, 0},
      {"cross+mask", 70, 300, {133, 300}, false, 0, 0},
      {"scale", 90, 140, {}, false, 0.7, 0},
      {"dropout+mask", 100, 140, {0, 20}, false, 0, 0.2},
      {"causal+dropout", 150, 150, {}, true, 0, 0.3},
  };
  uint64_t seed = 100;
  for (const RefCase& c : cases) expect_matches_reference(2, 2, c, seed += 10);
}

// With fewer batch-heads than threads the backward splits into a key-tile
// pass (dk, dv) and a query-tile pass (dq); force that path with B = H = 1.
TEST(AttentionSoftmax, FewHeadsSplitBackwardMatchesReference) {
  const int threads = num_threads();
  set_num_threads(4);
  const std::vector<RefCase> cases = {
      {"causal+mask+dropout", 200, 200, {30}, true, 0, 0.2},
      {"cross+mask", 100, 260, {70}, false, 0.5, 0},
  };
  uint64_t seed = 900;
  for (const RefCase& c : cases) expect_matches_reference(1, 1, c, seed += 10);
  set_num_threads(threads);
}

// f32 (its vectorised exp included) against f64; scale 4 spreads the scores
// over tens of units, so exp is exercised far below its argument 0.
TEST(AttentionSoftmax, Float32MatchesFloat64) {
  const int64_t B = 2, H = 2, N = 140, M = 140, d = 16, dv = 16;
  for (double scale : {0.0, 4.0})
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "non-causal") + ", scale " +
                   std::to_string(scale));
      const Inputs base = make_inputs(B, H, N, M, d, dv, 300);
      const Tensor kpm = padding_mask(B, M, {0, 30});
      att::SoftmaxOptions options;
      options.causal = causal;
      options.scale = scale;
      options.dropout = 0.1;
      const Inputs a = fresh(base, DType::f32), r = fresh(base, DType::f64);
      Generator g32(7), g64(7);
      options.gen = &g32;
      const Tensor o32 = att::softmax(a.q, a.k, a.v, kpm, options);
      options.gen = &g64;
      const Tensor o64 = att::softmax(r.q, r.k, r.v, kpm, options);
      EXPECT_EQ(o32.dtype(), DType::f32);
      backprop(o32, 9);
      backprop(o64, 9);
      // About 10x the errors measured (scale 4: 2e-6 and 8e-6; default: 1e-7 and 3e-7).
      const double tol_o = scale > 0 ? 2e-5 : 1e-6, tol_g = scale > 0 ? 1e-4 : 3e-6;
      expect_close(o32, o64, tol_o);
      expect_close(a.q.grad(), r.q.grad(), tol_g);
      expect_close(a.k.grad(), r.k.grad(), tol_g);
      expect_close(a.v.grad(), r.v.grad(), tol_g);
    }
}

// Under bf16 autocast on the CPU the tiles multiply bf16 copies of q, k, v
// (and of the probability and dS tiles, and of do) with f32 accumulation: the
// outputs and gradients are f32 and follow the op in f64 on the bf16-rounded
// inputs up to the rounding of P and dS (2^-9 relative each), and differ from
// the f32 op's. Across tiles, with a mask, causality and dropout, and with
// B = H = 1 on 4 threads (the backward's split into key and query passes).
// With fewer keys than a tile it stays f32.
TEST(AttentionSoftmax, Bf16AutocastOnTheCpuMultipliesInBf16) {
  FORGE_REQUIRE_CPU_BF16();
  const int threads = num_threads();
  set_num_threads(4);
  const std::vector<std::pair<RefCase, int64_t>> cases = {
      {{"causal+mask+dropout", 150, 150, {0, 30}, true, 0, 0.2}, 2},
      {{"cross+mask", 70, 300, {133, 0}, false, 0, 0}, 2},
      {{"few heads, causal+mask", 200, 200, {30}, true, 0, 0}, 1},
  };
  for (const auto& [c, BH] : cases) {
    SCOPED_TRACE(c.name);
    const Inputs base = make_inputs(BH, BH, c.N, c.M, 16, 16, 500);
    const Tensor kpm = padding_mask(BH, c.M, c.pad);
    att::SoftmaxOptions options;
    options.causal = c.causal;
    options.dropout = c.dropout;
    const auto run = [&](const Inputs& in, bool autocast) {
      Generator gen(11);
      options.gen = &gen;
      Tensor o;
      {
        ops::AutocastGuard guard(autocast ? DType::bf16 : DType::f32);
        o = att::softmax(in.q, in.k, in.v, kpm, options);
      }
      backprop(o, 12);
      return o;
    };
    using testing::bf16_rounded;
    const Inputs low = fresh(base, DType::f32), f32 = fresh(base, DType::f32),
                 ref = fresh({bf16_rounded(base.q), bf16_rounded(base.k), bf16_rounded(base.v)},
                             DType::f64);
    const Tensor o_low = run(low, true), o_f32 = run(f32, false), o_ref = run(ref, false);
    ASSERT_EQ(o_low.dtype(), DType::f32);
    ASSERT_EQ(low.q.grad().dtype(), DType::f32);
    // About 2.5x the errors measured (o 0.7-1.7e-3, gradients 1.6-2.9e-3; from
    // the f32 op 2.0-2.3e-3).
    EXPECT_LT(testing::scaled_error(o_low, o_ref), 4e-3);
    EXPECT_LT(testing::scaled_error(low.q.grad(), ref.q.grad()), 7e-3);
    EXPECT_LT(testing::scaled_error(low.k.grad(), ref.k.grad()), 7e-3);
    EXPECT_LT(testing::scaled_error(low.v.grad(), ref.v.grad()), 7e-3);
    EXPECT_GT(testing::scaled_error(o_low, o_f32), 5e-4) << "the tiles did not run in bf16";
  }
  set_num_threads(threads);
  // Fewer keys than one tile (a ViT's 17 tokens): f32 tiles, where one oneDNN
  // call would cost more than the product; the result is the f32 op's.
  const Inputs small = make_inputs(2, 2, 17, 17, 16, 16, 600);
  const Inputs a = fresh(small, DType::f32), b = fresh(small, DType::f32);
  Tensor o_auto;
  {
    ops::AutocastGuard guard(DType::bf16);
    o_auto = att::softmax(a.q, a.k, a.v, Tensor(), {});
  }
  EXPECT_EQ(testing::max_abs_diff(o_auto, att::softmax(b.q, b.k, b.v, Tensor(), {})), 0.0);
}

TEST(AttentionSoftmax, CausalLeaksNothing) {
  const Inputs in = make_inputs(2, 2, 150, 150, 8, 8, 400);
  const Tensor kpm = padding_mask(2, 150, {0, 10});
  for (double p : {0.0, 0.3}) {
    SCOPED_TRACE(p);
    testing::expect_no_causal_leak(
        [&](const Tensor& q, const Tensor& k, const Tensor& v) {
          Generator gen(5);
          att::SoftmaxOptions options;
          options.causal = true;
          options.dropout = p;
          options.gen = &gen;
          return att::softmax(q, k, v, kpm, options);
        },
        in.q, in.k, in.v);
  }
}

// softmax is tiled (online softmax, recomputation in the backward), so its
// memory grows linearly in N and stays far below one N x N f32 buffer.
TEST(AttentionSoftmax, MemoryIsLinearInN) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    auto fn = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
      att::SoftmaxOptions options;
      options.causal = causal;
      return att::softmax(q, k, v, Tensor(), options);
    };
    testing::expect_memory_linear_in_n(fn, causal ? "softmax causal" : "softmax", 32);
  }
}

TEST(AttentionSoftmax, FullyMaskedRowsAreZeroWithFiniteGradients) {
  const int64_t B = 2, H = 2, N = 70, M = 140;
  const Inputs in = make_inputs(B, H, N, M, 8, 6, 500);
  const Tensor kpm = padding_mask(B, M, {5, M});  // batch 1: every key masked
  const Tensor o = att::softmax(in.q, in.k, in.v, kpm);
  backprop(o, 3);
  const auto ov = o.to_vector<double>(), gq = in.q.grad().to_vector<double>(),
             gk = in.k.grad().to_vector<double>(), gv = in.v.grad().to_vector<double>();
  for (double x : ov) ASSERT_TRUE(std::isfinite(x));
  for (const auto* g : {&gq, &gk, &gv})
    for (double x : *g) ASSERT_TRUE(std::isfinite(x));
  const size_t half_o = ov.size() / 2, half_q = gq.size() / 2, half_k = gk.size() / 2,
               half_v = gv.size() / 2;
  for (size_t e = half_o; e < ov.size(); ++e) ASSERT_EQ(ov[e], 0.0) << "batch 1 output at " << e;
  for (size_t e = half_q; e < gq.size(); ++e) ASSERT_EQ(gq[e], 0.0) << "batch 1 dq at " << e;
  for (size_t e = half_k; e < gk.size(); ++e) ASSERT_EQ(gk[e], 0.0) << "batch 1 dk at " << e;
  for (size_t e = half_v; e < gv.size(); ++e) ASSERT_EQ(gv[e], 0.0) << "batch 1 dv at " << e;
  // Batch 0 is a real attention: not all zero.
  double sum = 0;
  for (size_t e = 0; e < half_o; ++e) sum += std::abs(ov[e]);
  EXPECT_GT(sum, 0.1);
}

TEST(AttentionSoftmax, CausalRowSeesOnlyPaddedKeysGivesZero) {
  // Keys 0..2 padded: causal rows 0..2 see nothing and output 0.
  const Inputs in = make_inputs(1, 2, 9, 9, 4, 4, 550);
  Tensor kpm = Tensor::ones({1, 9}, DType::boolean);
  for (int64_t j = 0; j < 3; ++j) kpm.data<bool>()[j] = false;
  att::SoftmaxOptions options;
  options.causal = true;
  const Tensor o = att::softmax(in.q, in.k, in.v, kpm, options);
  const auto ov = o.to_vector<double>();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 9; ++i)
      for (int64_t c = 0; c < 4; ++c) {
        const double x = ov[static_cast<size_t>((h * 9 + i) * 4 + c)];
        if (i < 3) {
          EXPECT_EQ(x, 0.0);
        } else {
          EXPECT_TRUE(std::isfinite(x));
        }
      }
}

TEST(AttentionSoftmax, DropoutIsReproducibleAndUsesTheGenerator) {
  const int64_t B = 2, H = 2, N = 40, M = 50;
  const Inputs in = make_inputs(B, H, N, M, 8, 8, 600);
  att::SoftmaxOptions options;
  options.dropout = 0.4;
  Generator g1(77), g2(77);
  options.gen = &g1;
  const Tensor a = att::softmax(in.q, in.k, in.v, Tensor(), options);
  // One draw per score element, reserved once: ceil(B H N M / 4) Philox blocks.
  EXPECT_EQ(g1.offset(), static_cast<uint64_t>((B * H * N * M + 3) / 4));
  options.gen = &g2;
  const Tensor b = att::softmax(in.q, in.k, in.v, Tensor(), options);
  EXPECT_EQ(testing::max_abs_diff(a, b), 0.0);
  // The next call draws a fresh mask.
  const Tensor c = att::softmax(in.q, in.k, in.v, Tensor(), options);
  EXPECT_GT(testing::max_abs_diff(a, c), 1e-3);
  // The default generator when none is given, also reproducible from its seed.
  options.gen = nullptr;
  manual_seed(77);
  const Tensor e = att::softmax(in.q, in.k, in.v, Tensor(), options);
  EXPECT_EQ(testing::max_abs_diff(a, e), 0.0);
  // p = 0 is the plain op.
  options.dropout = 0;
  const Tensor plain = att::softmax(in.q, in.k, in.v, Tensor(), options);
  EXPECT_GT(testing::max_abs_diff(a, plain), 1e-3);
  expect_close(
      plain,
      naive_softmax_attention(in.q, in.k, in.v, Tensor(), 1 / std::sqrt(8.0), false, Tensor()),
      1e-12);
}

TEST(AttentionSoftmax, ScaleZeroMeansInverseSqrtD) {
  const Inputs in = make_inputs(2, 2, 20, 30, 9, 5, 700);
  att::SoftmaxOptions explicit_scale;
  explicit_scale.scale = 1.0 / 3.0;
  const Tensor by_default = att::softmax(in.q, in.k, in.v);
  const Tensor given = att::softmax(in.q, in.k, in.v, Tensor(), explicit_scale);
  EXPECT_EQ(testing::max_abs_diff(by_default, given), 0.0);
  att::SoftmaxOptions other;
  other.scale = 2.0;
  const Tensor sharper = att::softmax(in.q, in.k, in.v, Tensor(), other);
  EXPECT_GT(testing::max_abs_diff(by_default, sharper), 1e-3);
  expect_close(sharper, naive_softmax_attention(in.q, in.k, in.v, Tensor(), 2.0, false, Tensor()),
               1e-12);
}

TEST(AttentionSoftmax, ErrorsNameTheProblem) {
  const Inputs in = make_inputs(2, 2, 5, 7, 4, 4, 800);
  att::SoftmaxOptions causal;
  causal.causal = true;
  EXPECT_NE(error_of([&] {
              att::softmax(in.q, in.k, in.v, Tensor(), causal);
            }).find("softmax: needs keys as long"),
            std::string::npos);
  att::SoftmaxOptions bad_p;
  bad_p.dropout = 1.0;
  EXPECT_NE(error_of([&] {
              att::softmax(in.q, in.k, in.v, Tensor(), bad_p);
            }).find("dropout must be in [0, 1), got 1"),
            std::string::npos);
  att::SoftmaxOptions bad_scale;
  bad_scale.scale = -1;
  EXPECT_NE(error_of([&] {
              att::softmax(in.q, in.k, in.v, Tensor(), bad_scale);
            }).find("scale must be >= 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              att::softmax(in.q, in.k, in.v, padding_mask(2, 5, {0, 0}));
            }).find("key_padding_mask must be [B, M] = [2, 7]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              att::softmax(in.q, in.k, Tensor::zeros({2, 2, 6, 4}, DType::f64));
            }).find("softmax: v"),
            std::string::npos);
  const Tensor no_d = Tensor::zeros({2, 2, 5, 0}, DType::f64);
  EXPECT_NE(error_of([&] {
              att::softmax(no_d, Tensor::zeros({2, 2, 7, 0}, DType::f64), in.v);
            }).find("non-empty last dim, got d = 0"),
            std::string::npos);
}

}  // namespace
}  // namespace forge
