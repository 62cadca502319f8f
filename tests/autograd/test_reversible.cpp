// reversible_sequence: same outputs and gradients as the plain composition of
// its couplings (dropout masks included), and peak memory that does not grow
// with depth.
#include <gtest/gtest.h>

#include <iostream>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/reversible.h"
#include "core/allocator.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using autograd::Coupling;

// One half of a coupling, x (B, N, D) -> (B, N, D) through a hidden (B, N, H):
// linear(dropout(gelu(linear(x) + c)), with c = context[0] (N, H) when given.
struct Mlp {
  Tensor w1, b1, w2, b2;  // (H, D), (H), (D, H), (D)
  double p = 0;
  Generator* gen = nullptr;

  Tensor operator()(const Tensor& x, const std::vector<Tensor>& context) const {
    Tensor h = ops::linear(x, w1, b1);
    if (!context.empty()) h = ops::add(h, context[0]);
    return ops::linear(ops::dropout(ops::gelu(h), p, p > 0, gen), w2, b2);
  }
};

Tensor param(const Shape& shape, uint64_t seed, DType dtype) {
  Tensor t = testing::leaf64(shape, seed, -0.5, 0.5).detach().to(dtype);
  return t.set_requires_grad(true);
}

Mlp make_mlp(int64_t D, int64_t H, uint64_t seed, DType dtype, double p, Generator* gen) {
  return {param({H, D}, seed, dtype),
          param({H}, seed + 1, dtype),
          param({D, H}, seed + 2, dtype),
          param({D}, seed + 3, dtype),
          p,
          gen};
}

std::vector<Coupling> make_blocks(int depth, int64_t D, int64_t H, DType dtype = DType::f64,
                                  double p = 0, Generator* gen = nullptr) {
  std::vector<Coupling> blocks;
  for (int k = 0; k < depth; ++k) {
    Mlp f = make_mlp(D, H, 100 + 10 * k, dtype, p, gen);
    Mlp g = make_mlp(D, H, 105 + 10 * k, dtype, p, gen);
    blocks.push_back({f, g, {f.w1, f.b1, f.w2, f.b2, g.w1, g.b1, g.w2, g.b2}});
  }
  return blocks;
}

// The reference: the couplings composed with ops, every activation recorded.
std::vector<Tensor> plain_sequence(const std::vector<Coupling>& blocks, Tensor x1, Tensor x2,
                                   const std::vector<Tensor>& context) {
  for (const Coupling& b : blocks) {
    x1 = ops::add(x1, b.f(x2, context));
    x2 = ops::add(x2, b.g(x1, context));
  }
  return {x1, x2};
}

using Sequence = std::function<std::vector<Tensor>(const std::vector<Coupling>&, const Tensor&,
                                                   const Tensor&, const std::vector<Tensor>&)>;

const Sequence kPlain = plain_sequence;
Sequence reversible(Generator* gen = nullptr) {
  return [gen](const std::vector<Coupling>& blocks, const Tensor& x1, const Tensor& x2,
               const std::vector<Tensor>& context) {
    return autograd::reversible_sequence(blocks, x1, x2, context, gen);
  };
}

// Runs `seq` on fresh copies of inputs = {x1, x2, context...} and back-propagates
// `seeds` (one per output; an undefined seed leaves that output unused).
// Returns the outputs, then the gradients of the inputs and of every parameter.
std::vector<Tensor> outputs_and_grads(const Sequence& seq, const std::vector<Coupling>& blocks,
                                      const std::vector<Tensor>& inputs,
                                      const std::vector<Tensor>& seeds) {
  std::vector<Tensor> xs;
  for (const Tensor& t : inputs) xs.push_back(t.detach().clone().set_requires_grad(true));
  for (const Coupling& b : blocks) {
    for (Tensor p : b.params) p.zero_grad();
  }
  const std::vector<Tensor> context(xs.begin() + 2, xs.end());
  std::vector<Tensor> ys = seq(blocks, xs[0], xs[1], context);
  std::vector<Tensor> roots, root_seeds;
  for (size_t i = 0; i < ys.size(); ++i) {
    if (seeds[i].defined()) {
      roots.push_back(ys[i]);
      root_seeds.push_back(seeds[i]);
    }
  }
  autograd::backward(roots, root_seeds);
  std::vector<Tensor> result = ys;
  for (const Tensor& x : xs) result.push_back(x.grad());
  for (const Coupling& b : blocks) {
    for (const Tensor& p : b.params) result.push_back(p.grad());
  }
  return result;
}

void expect_matches_plain(int depth, bool with_context, bool use_y1 = true) {
  SCOPED_TRACE("depth " + std::to_string(depth) + (with_context ? ", context" : ""));
  const int64_t B = 2, N = 3, D = 4, H = 5;
  std::vector<Coupling> blocks = make_blocks(depth, D, H);
  std::vector<Tensor> inputs = {testing::leaf64({B, N, D}, 1), testing::leaf64({B, N, D}, 2)};
  if (with_context) inputs.push_back(testing::leaf64({N, H}, 3));
  const std::vector<Tensor> seeds = {use_y1 ? testing::leaf64({B, N, D}, 4).detach() : Tensor(),
                                     testing::leaf64({B, N, D}, 5).detach()};

  const auto plain = outputs_and_grads(kPlain, blocks, inputs, seeds);
  const auto rev = outputs_and_grads(reversible(), blocks, inputs, seeds);
  ASSERT_EQ(plain.size(), rev.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    SCOPED_TRACE(i < 2 ? "output " + std::to_string(i) : "gradient " + std::to_string(i - 2));
    testing::expect_close(rev[i], plain[i], 1e-10);
  }
}

TEST(ReversibleSequence, MatchesPlainCompositionDepth1) {
  expect_matches_plain(1, false);
}

TEST(ReversibleSequence, MatchesPlainCompositionDepth3) {
  expect_matches_plain(3, false);
}

TEST(ReversibleSequence, MatchesPlainCompositionWithContext) {
  expect_matches_plain(3, true);
}

TEST(ReversibleSequence, UnusedOutputCountsAsZeroGradient) {
  expect_matches_plain(2, true, /*use_y1=*/false);
}

TEST(ReversibleSequence, OneTensorForBothHalves) {
  // Reformer's (x1, x2) = (x, x): x's gradient is the sum over both edges.
  std::vector<Coupling> blocks = make_blocks(2, 4, 5);
  Tensor x = testing::leaf64({2, 4}, 1);
  const std::vector<Tensor> seeds = {testing::leaf64({2, 4}, 2).detach(),
                                     testing::leaf64({2, 4}, 3).detach()};
  autograd::backward(plain_sequence(blocks, x, x, {}), seeds);
  const Tensor plain = x.grad();
  x.zero_grad();
  autograd::backward(autograd::reversible_sequence(blocks, x, x), seeds);
  testing::expect_close(x.grad(), plain, 1e-10);
}

TEST(ReversibleSequence, IsOneNode) {
  std::vector<Coupling> blocks = make_blocks(3, 4, 5);
  Tensor x1 = testing::leaf64({2, 4}, 1), x2 = testing::leaf64({2, 4}, 2);
  auto ys = autograd::reversible_sequence(blocks, x1, x2);
  ASSERT_TRUE(ys[0].grad_fn());
  EXPECT_EQ(ys[0].grad_fn(), ys[1].grad_fn());
  EXPECT_EQ(ys[0].grad_fn()->name, "reversible_sequence");
  EXPECT_EQ(ys[0].grad_fn()->next.size(), 2u + 3u * 8u);  // x1, x2, 8 parameters per block
}

TEST(ReversibleSequence, DropoutMasksAreReplayed) {
  const int64_t B = 2, N = 3, D = 4, H = 6;
  Generator gen(7);
  std::vector<Coupling> blocks = make_blocks(3, D, H, DType::f64, 0.3, &gen);
  const std::vector<Tensor> inputs = {testing::leaf64({B, N, D}, 1), testing::leaf64({B, N, D}, 2),
                                      testing::leaf64({N, H}, 3)};
  const std::vector<Tensor> seeds = {testing::leaf64({B, N, D}, 4).detach(),
                                     testing::leaf64({B, N, D}, 5).detach()};

  const auto plain = outputs_and_grads(kPlain, blocks, inputs, seeds);
  const GeneratorState after_plain = gen.state();
  EXPECT_NE(after_plain, (GeneratorState{7, 0}));  // the masks did draw
  gen.manual_seed(7);
  const auto rev = outputs_and_grads(reversible(&gen), blocks, inputs, seeds);
  EXPECT_EQ(gen.state(), after_plain);  // the replays put the generator back
  // Same masks in the forward: identical outputs, bit for bit.
  EXPECT_EQ(rev[0].to_vector<double>(), plain[0].to_vector<double>());
  EXPECT_EQ(rev[1].to_vector<double>(), plain[1].to_vector<double>());
  for (size_t i = 2; i < plain.size(); ++i) {
    SCOPED_TRACE("gradient " + std::to_string(i - 2));
    testing::expect_close(rev[i], plain[i], 1e-10);
  }
}

TEST(ReversibleSequence, Gradcheck) {
  std::vector<Coupling> blocks = make_blocks(2, 3, 4);
  auto fn = [&](const std::vector<Tensor>& in) {
    auto ys = autograd::reversible_sequence(blocks, in[0], in[1], {in[2]});
    return ops::cat(ys, 0);
  };
  EXPECT_GRADCHECK(fn, {testing::leaf64({1, 2, 3}, 1), testing::leaf64({1, 2, 3}, 2),
                        testing::leaf64({2, 4}, 3)});
}

TEST(ReversibleSequence, RecordsForDeclaredParametersOnly) {
  std::vector<Coupling> blocks = make_blocks(2, 4, 5);
  Tensor x1 = testing::leaf64({2, 4}, 1).detach(), x2 = testing::leaf64({2, 4}, 2).detach();
  const std::vector<Tensor> seeds = {testing::leaf64({2, 4}, 3).detach(),
                                     testing::leaf64({2, 4}, 4).detach()};
  // Inputs need no gradient but the declared parameters do: the node is recorded
  // and the parameters get the plain run's gradients.
  const auto plain = outputs_and_grads(kPlain, blocks, {x1, x2}, seeds);
  for (const Coupling& b : blocks) {
    for (Tensor p : b.params) p.zero_grad();
  }
  auto ys = autograd::reversible_sequence(blocks, x1, x2);
  ASSERT_TRUE(ys[0].requires_grad());
  autograd::backward(ys, seeds);
  size_t i = 4;  // past the outputs and the gradients of the two inputs
  for (const Coupling& b : blocks) {
    for (const Tensor& p : b.params) testing::expect_close(p.grad(), plain[i++], 1e-10);
  }
  // Undeclared, the captured parameters are invisible to the node: nothing records.
  for (Coupling& b : blocks) b.params.clear();
  EXPECT_FALSE(autograd::reversible_sequence(blocks, x1, x2)[0].requires_grad());
}

TEST(ReversibleSequence, NothingRecordsInNoGradMode) {
  std::vector<Coupling> blocks = make_blocks(2, 4, 5);
  Tensor x1 = testing::leaf64({2, 4}, 1), x2 = testing::leaf64({2, 4}, 2);
  NoGradGuard no_grad;
  auto ys = autograd::reversible_sequence(blocks, x1, x2, {testing::leaf64({2, 5}, 3)});
  for (const Tensor& y : ys) {
    EXPECT_FALSE(y.requires_grad());
    EXPECT_FALSE(y.grad_fn());
  }
}

// Bytes of new allocations at the peak of one forward + backward of `depth`
// blocks (parameters, inputs and seeds made beforehand).
int64_t peak_bytes(const Sequence& seq, int depth) {
  const int64_t B = 32, N = 256, D = 64, H = 64;
  std::vector<Coupling> blocks = make_blocks(depth, D, H, DType::f32);
  Tensor x1 = Tensor::rand({B, N, D}).set_requires_grad(true);
  Tensor x2 = Tensor::rand({B, N, D}).set_requires_grad(true);
  const Tensor seed = Tensor::ones({B, N, D});
  const int64_t base = memory_stats().current;
  reset_peak_memory();
  {
    auto ys = seq(blocks, x1, x2, {});
    autograd::backward(ys, {seed, seed});
  }
  return memory_stats().peak - base;
}

TEST(ReversibleSequence, PeakMemoryDoesNotGrowWithDepth) {
  const int64_t activation = 32 * 256 * 64 * 4;  // one (B, N, D) f32 tensor: 2 MiB
  // Per block: 2 halves x (H x D + H + D x H + D) f32 parameters, and as many gradient bytes.
  const int64_t block_params = 2 * (64 * 64 + 64 + 64 * 64 + 64) * 4;
  const int64_t rev2 = peak_bytes(reversible(), 2), rev8 = peak_bytes(reversible(), 8);
  const int64_t plain2 = peak_bytes(kPlain, 2), plain8 = peak_bytes(kPlain, 8);
  std::cout << "[ reversible ] peak bytes depth 2: " << rev2 << ", depth 8: " << rev8
            << "; plain: " << plain2 << ", " << plain8 << "\n";
  EXPECT_LE(rev8 - rev2, 6 * 2 * block_params + activation / 16);
  // A plain graph keeps at least y1 and y2 of every block for the backward.
  EXPECT_GE(plain8 - plain2, 6 * 2 * activation);
}

}  // namespace
}  // namespace forge
