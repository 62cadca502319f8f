// Stochastic depth: the op (whole samples kept and scaled or dropped, the
// keep rate and the expectation, identity in eval mode, gradients, data-
// parallel masks) and in stacks (rates over depth, eval mode, C1/C2 and
// reversible backward replaying the forward's masks, sharded batches).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "autograd/engine.h"
#include "nn/drop_path.h"
#include "nn/transformer.h"
#include "ops/ops.h"
#include "tests/nn/nn_test_util.h"
#include "tests/test_util.h"

namespace forge::nn {
namespace {

using namespace forge::testing;

TEST(DropPath, KeepsWholeSamplesScaledOrDropsThemAsTheDrawsSay) {
  // p = 0.75: 1 / (1 - p) = 4, so a kept sample is exactly x / (1 - p).
  const double p = 0.75;
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator g(1);
    Tensor x = leaf64({64, 3, 5}, 2).detach().to(dt);
    Tensor y = drop_path(x, p, true, &g);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_EQ(g.offset(), 16u);  // one request of 64 draws: 16 Philox blocks
    const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
    int64_t kept = 0;
    for (int64_t b = 0; b < 64; ++b) {
      const bool keep = Generator::uniform_f32(1, 0, static_cast<uint64_t>(b)) >= p;
      kept += keep;
      for (int64_t i = b * 15; i < (b + 1) * 15; ++i)
        ASSERT_EQ(yv[static_cast<size_t>(i)], keep ? xv[static_cast<size_t>(i)] / (1 - p) : 0.0)
            << "sample " << b;
    }
    EXPECT_GT(kept, 0);
    EXPECT_LT(kept, 64);
  }
}

TEST(DropPath, KeepsOneMinusPOfTheSamplesAndPreservesTheMean) {
  // K samples, each row the same v: the fraction kept and the mean over the
  // samples, within 5 standard errors (Bernoulli(1 - p): sqrt(p (1 - p) / K);
  // the scaled mask s: variance p / (1 - p), so |v| sqrt(p / ((1 - p) K))).
  const int64_t K = 100000;
  const double p = 0.3;
  const std::vector<double> v = {1.0, -2.0, 0.5, 3.0};
  std::vector<double> rows;
  for (int64_t k = 0; k < K; ++k) rows.insert(rows.end(), v.begin(), v.end());
  Generator g(3);
  Tensor y = drop_path(Tensor::from_vector(rows, {K, 4}), p, true, &g);
  const auto yv = y.to_vector<double>();
  int64_t kept = 0;
  for (int64_t k = 0; k < K; ++k) kept += yv[static_cast<size_t>(4 * k)] != 0;
  EXPECT_NEAR(static_cast<double>(kept) / K, 1 - p, 5 * std::sqrt(p * (1 - p) / K));
  const auto mean = ops::mean(y, {0}).to_vector<double>();
  for (size_t j = 0; j < v.size(); ++j)
    EXPECT_NEAR(mean[j], v[j], 5 * std::abs(v[j]) * std::sqrt(p / ((1 - p) * K))) << "column " << j;
}

TEST(DropPath, IsTheIdentityInEvalModeOrAtZeroAndDrawsNothing) {
  Generator g(4);
  Tensor x = leaf64({5, 2, 3}, 5);
  EXPECT_TRUE(drop_path(x, 0.5, false, &g).same(x));
  EXPECT_TRUE(drop_path(x, 0.0, true, &g).same(x));
  EXPECT_EQ(g.offset(), 0u);
  expect_error([&] { drop_path(x, 1.0, true, &g); }, {"drop_path", "[0, 1)", "got 1"});
  expect_error([&] { drop_path(x, -0.1, false, &g); }, {"drop_path", "[0, 1)"});
}

TEST(DropPath, GradientsAreTheMasksScale) {
  // The same mask in every evaluation: the generator is put back first.
  Generator g(7);
  const GeneratorState start = g.state();
  auto fn = [&](const std::vector<Tensor>& in) {
    g.set_state(start);
    return drop_path(in[0], 0.4, true, &g);
  };
  Tensor x = leaf64({6, 2, 3}, 8);
  const auto y = fn({x.detach()}).to_vector<double>();
  int64_t kept = 0;
  for (int64_t b = 0; b < 6; ++b) kept += y[static_cast<size_t>(6 * b)] != 0;
  ASSERT_GT(kept, 0);  // the fixed mask keeps some samples and drops others
  ASSERT_LT(kept, 6);
  EXPECT_GRADCHECK(fn, {x});
}

TEST(DropPath, AShardDrawsItsRowsOfTheGlobalMask) {
  const int64_t B = 8;
  Tensor x = leaf64({B, 3, 2}, 9).detach();
  Generator global(10);
  Tensor full = drop_path(x, 0.5, true, &global);
  for (uint64_t index : {0u, 1u}) {
    Generator shard(10);
    shard.set_batch_shard({index, 2});
    const int64_t lo = static_cast<int64_t>(index) * B / 2;
    Tensor part = drop_path(x.slice0(lo, lo + B / 2), 0.5, true, &shard);
    expect_close(part, full.slice0(lo, lo + B / 2), 0);
    EXPECT_EQ(shard.state(), global.state());  // both advanced by the global request
  }
}

// ---- in stacks ----

StackConfig dp_config(int64_t depth, double drop_path, Mechanism kind = Mechanism::softmax) {
  StackConfig sc;
  sc.depth = depth;
  sc.drop_path = drop_path;
  AttentionConfig& a = sc.block.attention;
  a.kind = kind;
  a.dim = 12;
  a.heads = 3;
  a.dtype = DType::f64;
  a.seq_len = 8;
  a.k = 4;
  a.local_window = 4;
  sc.block.ff.mult = 2;
  return sc;
}

// Adds cross-attention on a (B, 7, 10) context and the axial pair: every kind
// of branch drop path applies to.
void add_every_branch(StackConfig& sc) {
  sc.block.cross_attention = true;
  sc.block.cross = sc.block.attention;
  sc.block.context_dim = 10;
  sc.block.attend_axially = true;
}

TEST(DropPathStack, RatesRiseLinearlyOverDepth) {
  Generator g(11);
  Stack five(dp_config(5, 0.4), &g);
  for (int64_t l = 0; l < 5; ++l)
    EXPECT_DOUBLE_EQ(five.blocks[static_cast<size_t>(l)]->config.drop_path, 0.4 * l / 4.0);
  EXPECT_EQ(five.blocks[4]->config.drop_path, 0.4);
  Stack one(dp_config(1, 0.4), &g);
  EXPECT_EQ(one.blocks[0]->config.drop_path, 0.0);  // torch.linspace(0, r, 1) = [0]
  expect_error([] { Stack s(dp_config(2, 1.0)); }, {"StackConfig.drop_path", "[0, 1)"});
  expect_error([] { Stack s(dp_config(2, -0.5)); }, {"StackConfig.drop_path", "[0, 1)"});
  StackConfig per_block = dp_config(2, 0.0);
  per_block.block.drop_path = 0.1;
  expect_error([&] { Stack s(per_block); }, {"block.drop_path", "set StackConfig.drop_path"});
  BlockConfig bad = per_block.block;
  bad.drop_path = 1.5;
  expect_error([&] { Block b(bad, 0); }, {"BlockConfig.drop_path", "[0, 1)"});
}

TEST(DropPathStack, EvalModeIsTheStackWithoutDropPath) {
  for (bool reversible : {false, true}) {
    SCOPED_TRACE(reversible ? "reversible" : "plain");
    StackConfig with = dp_config(3, 0.6), without = dp_config(3, 0.0);
    add_every_branch(with);
    add_every_branch(without);
    with.reversible = without.reversible = reversible;
    Generator init1(12), init2(12), drop(13);
    Stack a(with, &init1), b(without, &init2);
    a.set_generator(&drop);
    Tensor x = leaf64({4, 8, 12}, 14).detach(), ctx = leaf64({4, 7, 10}, 15).detach();
    const Tensor reference = b.forward(x, Tensor(), ctx);
    // Training (no dropout configured): only drop path tells the two apart.
    EXPECT_GT(max_abs_diff(a.forward(x, Tensor(), ctx), reference), 1e-3);
    a.eval();
    const uint64_t offset = drop.offset();
    expect_close(a.forward(x, Tensor(), ctx), reference, 0);
    EXPECT_EQ(drop.offset(), offset);
  }
}

// Loss, input, context and every parameter gradient of sum(forward(x, ctx)^2),
// the generator seeded first.
using Forward = std::function<Tensor(const Tensor& x, const Tensor& ctx)>;
std::vector<Tensor> grads_of(Stack& stack, const Forward& forward, const Tensor& x,
                             const Tensor& ctx, Generator& drop, uint64_t seed) {
  stack.zero_grad();
  drop.manual_seed(seed);
  Tensor xin = x.detach(), cin = ctx.detach();
  xin.set_requires_grad(true);
  cin.set_requires_grad(true);
  Tensor loss = ops::sum(ops::square(forward(xin, cin)));
  autograd::backward(loss);
  std::vector<Tensor> out{loss.detach(), xin.grad(), cin.grad()};
  for (auto& [name, p] : stack.named_parameters()) out.push_back(p.grad());
  return out;
}

// grads_of the stack's own forward, with `mask` on x (B, N, D) and ctx.
std::vector<Tensor> forward_grads(Stack& stack, const Tensor& x, const Tensor& ctx,
                                  const Tensor& mask, Generator& drop, uint64_t seed) {
  return grads_of(
      stack, [&](const Tensor& in, const Tensor& c) { return stack.forward(in, mask, c); }, x, ctx,
      drop, seed);
}

TEST(DropPathStack, CheckpointLevelsReplayTheForwardsMasks) {
  for (bool post_norm : {false, true}) {
    SCOPED_TRACE(post_norm ? "post-norm" : "pre-norm");
    StackConfig sc = dp_config(3, 0.6);
    add_every_branch(sc);
    sc.block.post_norm = post_norm;
    sc.block.attend_axially = !post_norm;  // a pre-norm option
    sc.block.attention.attn_dropout = post_norm ? 0.0 : 0.2;
    Generator init(16), drop(17);
    Stack c0(sc, &init);
    c0.set_generator(&drop);
    Tensor x = leaf64({4, 8, 12}, 18), ctx = leaf64({4, 7, 10}, 19);
    Tensor mask = padded_mask(4, 8, 2);
    auto plain = forward_grads(c0, x, ctx, mask, drop, 20);
    for (CheckpointLevel level : {CheckpointLevel::C1, CheckpointLevel::C2}) {
      StackConfig s2 = sc;
      s2.checkpoint = level;
      Generator init2(16);
      Stack ck(s2, &init2);
      ck.set_generator(&drop);
      expect_all_close(forward_grads(ck, x, ctx, mask, drop, 20), plain, 1e-12);
    }
  }
}

TEST(DropPathStack, ReversibleGivesTheGradientsOfThePlainCouplings) {
  StackConfig sc = dp_config(3, 0.6);
  add_every_branch(sc);
  sc.reversible = true;
  sc.block.attention.attn_dropout = 0.2;
  sc.block.ff.dropout = 0.1;
  Generator init(21), drop(22);
  Stack stack(sc, &init);
  stack.set_generator(&drop);
  Tensor x = leaf64({4, 8, 12}, 23), ctx = leaf64({4, 7, 10}, 24);
  Tensor mask = padded_mask(4, 8, 3);
  auto rev = forward_grads(stack, x, ctx, mask, drop, 25);
  // y1 = x1 + dp(f(x2)), y2 = x2 + dp(g(y1)) per coupling (the axial pair its
  // own), run as recorded ops drawing from `drop` in the forward's order.
  auto couplings = [&](const Tensor& in, const Tensor& c) {
    Tensor x1 = in, x2 = in;
    for (auto& b : stack.blocks) {
      auto dp = [&](const Tensor& t) { return drop_path(t, b->config.drop_path, true, &drop); };
      x1 = x1 + dp(b->attention_branch(x2, mask, c, Tensor()));
      x2 = x2 + dp(b->ff_branch(x1));
      x1 = x1 + dp(b->axial_branch(x2, mask));
      x2 = x2 + dp(b->axial_ff_branch(x1));
    }
    return stack.norm->forward(x1 + x2);
  };
  expect_all_close(rev, grads_of(stack, couplings, x, ctx, drop, 25), 1e-10);
}

TEST(DropPathStack, AShardOfTheBatchGetsItsRowsOfTheFullBatchOutput) {
  // Only drop path draws; softmax attention is per sample, so the shard's
  // output is the full batch's rows when its masks are.
  const int64_t B = 8;
  Generator init1(26), init2(26), global(27), shard(27);
  shard.set_batch_shard({1, 2});
  Stack full(dp_config(3, 0.6), &init1), half(dp_config(3, 0.6), &init2);
  full.set_generator(&global);
  half.set_generator(&shard);
  Tensor x = leaf64({B, 8, 12}, 28).detach();
  Tensor y = full.forward(x);
  expect_close(half.forward(x.slice0(B / 2, B)), y.slice0(B / 2, B), 1e-12);
  EXPECT_EQ(shard.state(), global.state());
}

}  // namespace
}  // namespace forge::nn
