// Blocks and stacks: C1/C2 give C0's values, gradients and dropout masks with a
// lower peak; reversible layers give the gradients of the same couplings run
// plainly and keep their peak flat in depth; recurrent decoding through a
// whole stack; post-norm, ReZero, ScaleNorm, token shift, cross-attention; the
// reversible output (sum or mean), norm_eps in every norm, the final norm's kind.
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "nn/models.h"
#include "nn/transformer.h"
#include "ops/ops.h"
#include "tests/nn/nn_test_util.h"
#include "tests/test_util.h"

namespace forge::nn {
namespace {

namespace att = ops::attention;
using namespace forge::testing;

StackConfig stack_config(Mechanism kind, int64_t depth, DType dtype = DType::f64, int64_t D = 12,
                         int64_t H = 3) {
  StackConfig sc;
  sc.depth = depth;
  AttentionConfig& a = sc.block.attention;
  a.kind = kind;
  a.dim = D;
  a.heads = H;
  a.dtype = dtype;
  a.seq_len = 16;
  a.k = 6;
  a.nb_features = 8;
  a.local_window = 4;
  a.bucket_size = 1;
  sc.block.ff.mult = 2;
  return sc;
}

// Loss, input gradient and every parameter gradient of one step.
std::vector<Tensor> step_grads(Stack& stack, const Tensor& x, const Tensor& mask, Generator& drop,
                               uint64_t seed) {
  stack.zero_grad();
  drop.manual_seed(seed);
  Tensor xin = x.detach();
  xin.set_requires_grad(true);
  Tensor loss = ops::sum(ops::square(stack.forward(xin, mask)));
  autograd::backward(loss);
  std::vector<Tensor> out{loss.detach(), xin.grad()};
  for (auto& [name, p] : stack.named_parameters()) out.push_back(p.grad());
  return out;
}

TEST(Transformer, CheckpointLevelsGiveTheSameLossGradientsAndDropoutMasks) {
  for (Mechanism kind : {Mechanism::softmax, Mechanism::linformer, Mechanism::favor}) {
    SCOPED_TRACE(mechanism_name(kind));
    StackConfig sc = stack_config(kind, 2);
    sc.block.attention.attn_dropout = kind == Mechanism::favor ? 0.0 : 0.25;
    sc.block.attention.output_dropout = 0.1;
    sc.block.attention.n_local_heads = 1;
    sc.block.ff.dropout = 0.2;
    Generator init(1), drop(2);
    Stack stack(sc, &init);
    stack.set_generator(&drop);
    Tensor x = leaf64({2, 8, 12}, 3);
    Tensor mask = padded_mask(2, 8, 2);
    auto c0 = step_grads(stack, x, mask, drop, 4);
    for (CheckpointLevel level : {CheckpointLevel::C1, CheckpointLevel::C2}) {
      Generator init2(1);
      StackConfig s2 = sc;
      s2.checkpoint = level;
      Stack ck(s2, &init2);
      ck.set_generator(&drop);
      expect_all_close(step_grads(ck, x, mask, drop, 4), c0, 1e-12);
    }
  }
}

TEST(Transformer, CheckpointedLayersTrainWhenTheInputNeedsNoGradient) {
  // Vectors straight from a dataset need no gradient; the checkpointed branches
  // must still record (their weights do) and match C0.
  std::vector<std::vector<Tensor>> grads;
  for (int level = 0; level < 3; ++level) {
    StackConfig sc = stack_config(Mechanism::softmax, 2);
    sc.checkpoint = static_cast<CheckpointLevel>(level);
    Generator g(20);
    Stack stack(sc, &g);
    autograd::backward(ops::sum(ops::square(stack.forward(leaf64({2, 6, 12}, 21).detach()))));
    grads.emplace_back();
    for (auto& p : stack.parameters()) {
      ASSERT_TRUE(p.grad().defined());
      grads.back().push_back(p.grad());
    }
  }
  expect_all_close(grads[1], grads[0], 1e-12);
  expect_all_close(grads[2], grads[0], 1e-12);
}

// Peak bytes of one forward + backward, above what was held before it.
int64_t step_peak(Stack& stack, const Tensor& x) {
  stack.zero_grad();
  empty_cache();
  const int64_t before = memory_stats().current;
  reset_peak_memory();
  {
    Tensor loss = ops::sum(ops::square(stack.forward(x)));
    autograd::backward(loss);
  }
  return memory_stats().peak - before;
}

TEST(Transformer, CheckpointLevelsLowerThePeakInOrder) {
  // Linformer with k close to N: each head's projections and N x k
  // probabilities dominate, so C1 (block inputs only) < C0 and C2 (one head's
  // intermediates at a time) < C1.
  StackConfig sc = stack_config(Mechanism::linformer, 4, DType::f32, 64, 8);
  sc.block.attention.seq_len = 256;
  sc.block.attention.k = 128;
  sc.block.ff.mult = 1;
  sc.sharing = LinformerSharing::layerwise;  // weights and their gradients stay small
  int64_t peaks[3];
  for (int level = 0; level < 3; ++level) {
    StackConfig s = sc;
    s.checkpoint = static_cast<CheckpointLevel>(level);
    Generator g(5);
    Stack stack(s, &g);
    peaks[level] = step_peak(stack, Tensor::randn({2, 256, 64}, DType::f32, &g));
  }
  // Measured: C0 6.2 MB, C1 3.1 MB, C2 2.5 MB.
  EXPECT_LT(peaks[1], peaks[0]) << "C1 " << peaks[1] << " C0 " << peaks[0];
  EXPECT_LT(peaks[2], peaks[1]) << "C2 " << peaks[2] << " C1 " << peaks[1];
}

// The couplings of a reversible stack run as ordinary recorded ops.
Tensor plain_couplings(Stack& stack, const Tensor& x, const Tensor& mask) {
  Tensor x1 = x, x2 = x;
  for (auto& b : stack.blocks) {
    x1 = x1 + b->attention_branch(x2, mask, Tensor(), Tensor());
    x2 = x2 + b->ff_branch(x1);
  }
  return stack.norm->forward(x1 + x2);
}

TEST(Transformer, ReversibleGivesTheGradientsAndMasksOfThePlainCouplings) {
  for (Mechanism kind : {Mechanism::softmax, Mechanism::favor, Mechanism::taylorshift}) {
    SCOPED_TRACE(mechanism_name(kind));
    StackConfig sc = stack_config(kind, 3);
    sc.reversible = true;
    sc.block.attention.attn_dropout = kind == Mechanism::softmax ? 0.2 : 0.0;
    sc.block.ff.dropout = 0.3;
    sc.block.shift_tokens = true;
    Generator init(6), drop(7);
    Stack stack(sc, &init);
    stack.set_generator(&drop);
    Tensor x = leaf64({2, 8, 12}, 8);
    Tensor mask = padded_mask(2, 8, 3);
    auto rev = step_grads(stack, x, mask, drop, 9);
    const auto after_rev = drop.state();
    stack.zero_grad();
    drop.manual_seed(9);
    Tensor xin = x.detach();
    xin.set_requires_grad(true);
    Tensor loss = ops::sum(ops::square(plain_couplings(stack, xin, mask)));
    EXPECT_EQ(drop.state().offset, after_rev.offset);  // the replays put the generator back
    autograd::backward(loss);
    std::vector<Tensor> plain{loss.detach(), xin.grad()};
    for (auto& [name, p] : stack.named_parameters()) plain.push_back(p.grad());
    expect_all_close(rev, plain, 1e-10);
  }
}

TEST(Transformer, ReversiblePeakDoesNotGrowWithDepth) {
  // Activations (B N D f32 = 1 MiB each, several per block) dwarf the weights.
  auto peak = [](int64_t depth, bool reversible) {
    StackConfig sc = stack_config(Mechanism::linear, depth, DType::f32, 32, 4);
    sc.reversible = reversible;
    Generator g(10);
    Stack stack(sc, &g);
    Tensor x = Tensor::randn({8, 1024, 32}, DType::f32, &g);
    x.set_requires_grad(true);
    int64_t param_bytes = 0;
    for (auto& p : stack.parameters()) param_bytes += p.numel() * 4;
    return std::pair{step_peak(stack, x), param_bytes};
  };
  auto [rev2, w2] = peak(2, true);
  auto [rev8, w8] = peak(8, true);
  auto [plain2, pw2] = peak(2, false);
  auto [plain8, pw8] = peak(8, false);
  const int64_t activation = 8 * 1024 * 32 * 4;
  // Reversible: only the extra blocks' gradients (= their weights' bytes) are new.
  EXPECT_LE(rev8 - rev2, (w8 - w2) + activation / 8) << "depth 2 " << rev2 << " depth 8 " << rev8;
  // Plain: each extra block keeps several activations.
  EXPECT_GE(plain8 - plain2, 6 * 3 * activation) << "depth 2 " << plain2 << " depth 8 " << plain8;
}

TEST(Transformer, StackStepEqualsTheCausalForward) {
  for (NormKind norm : {NormKind::layer, NormKind::scale, NormKind::rezero}) {
    SCOPED_TRACE(name_of(kNormNames, norm));
    StackConfig sc = stack_config(Mechanism::favor, 2, DType::f64);
    sc.block.attention.causal = true;
    sc.block.norm = norm;
    sc.block.shift_tokens = true;
    sc.layer_attention = {sc.block.attention, sc.block.attention};
    sc.layer_attention[1].kind = Mechanism::linear;  // a mechanism per layer
    Generator g(11);
    Stack stack(sc, &g);
    for (auto& [name, p] : stack.named_parameters())  // ReZero's g starts at 0: wake it up
      if (name.find("rezero") != std::string::npos) p.fill(0.7);
    stack.set_rotary(std::make_shared<RotaryEmbedding>(16, 4, DType::f64));
    stack.eval();
    ASSERT_TRUE(stack.supports_recurrent());
    Tensor x = leaf64({2, 9, 12}, 12).detach();
    Tensor full = stack.forward(x);
    auto states = stack.initial_state();
    for (int64_t i = 0; i < 9; ++i)
      expect_close(stack.step(ops::narrow(x, 1, i, 1), states), ops::narrow(full, 1, i, 1), 1e-11);
  }
}

TEST(Transformer, ReZeroStartsAsTheIdentityAndPostNormRuns) {
  StackConfig sc = stack_config(Mechanism::softmax, 2);
  sc.block.norm = NormKind::rezero;
  sc.final_norm = false;
  Generator g(13);
  Stack rz(sc, &g);
  Tensor x = leaf64({1, 5, 12}, 14);
  expect_close(rz.forward(x), x, 0);

  StackConfig post = stack_config(Mechanism::linformer, 2);
  post.block.post_norm = true;
  post.block.attention.seq_len = 6;
  post.block.attention.k = 3;
  post.sharing = LinformerSharing::kv;
  Stack pn(post, &g);
  EXPECT_FALSE(pn.norm);  // post-norm blocks end normalised already
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return pn.forward(in[0]); },
                   {leaf64({1, 6, 12}, 15), pn.bank->E(1, 0).weight});
}

TEST(Transformer, TokenShiftIsAPreNormOption) {
  // A post-norm block has no branch input to shift (linear-attention-transformer
  // shifts the normalised input of each pre-norm branch): refused, not ignored.
  StackConfig sc = stack_config(Mechanism::softmax, 1);
  sc.block.post_norm = true;
  sc.block.shift_tokens = true;
  Generator g(13);
  forge::testing::expect_error([&] { Stack s(sc, &g); },
                               {"shift_tokens is a pre-norm option", "post_norm"});
}

TEST(Transformer, CrossAttentionBlocksPassGradientsToTheContext) {
  for (Mechanism cross : {Mechanism::softmax, Mechanism::linformer, Mechanism::favor}) {
    SCOPED_TRACE(mechanism_name(cross));
    StackConfig sc = stack_config(Mechanism::linear, 2);
    sc.block.attention.causal = true;
    sc.block.cross_attention = true;
    sc.block.cross = sc.block.attention;
    sc.block.cross.causal = false;
    sc.block.cross.kind = cross;
    // (the softmax kernel's stop-grad maxima need a looser gradcheck; see docs/ATTENTION.md)
    sc.block.cross.favor_kernel = att::FavorKernel::relu;
    sc.block.cross.seq_len = 7;  // linformer: the fixed context length
    sc.block.cross.k = 3;
    sc.block.context_dim = 10;
    for (bool reversible : {false, true}) {
      sc.reversible = reversible;
      Generator g(16);
      Stack stack(sc, &g);
      EXPECT_EQ(cross == Mechanism::linformer, stack.context_bank != nullptr);
      EXPECT_GRADCHECK(
          [&](const std::vector<Tensor>& in) {
            return stack.forward(in[0], Tensor(), in[1], padded_mask(2, 7, 2));
          },
          {leaf64({2, 5, 12}, 17), leaf64({2, 7, 10}, 18)});
    }
  }
}

TEST(Transformer, AxialFoldingAttendsWithinEachResidueClass) {
  // attend_axially with w = 4: positions r, r + 4, r + 8 form one sequence.
  StackConfig sc = stack_config(Mechanism::efficient, 2);
  sc.block.attend_axially = true;
  Generator g(22);
  Stack stack(sc, &g);
  Block& b = *stack.blocks[0];
  ASSERT_TRUE(b.axial_attn);
  Tensor x = leaf64({2, 12, 12}, 23);
  Tensor mask = padded_mask(2, 12, 3);
  Tensor folded = b.axial_branch(x, mask);
  for (int64_t r = 0; r < 4; ++r) {
    Tensor index = Tensor::from_vector<int64_t>({r, r + 4, r + 8});
    Tensor xs = ops::index_select(x, 1, index);
    Tensor ms = ops::index_select(mask, 1, index);
    Tensor expected = b.axial_attn->forward(b.axial_norm->forward(xs), ms);
    expect_close(ops::index_select(folded, 1, index), expected, 1e-12);
  }
  EXPECT_EQ(stack.attention_layers().size(), 4u);
  // Reversible: the folded pair is one more coupling; gradients flow.
  StackConfig rv = sc;
  rv.reversible = true;
  Stack rev(rv, &g);
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return rev.forward(in[0], mask); },
                   {leaf64({2, 12, 12}, 24)});
  EXPECT_THROW(stack.forward(leaf64({1, 10, 12}, 25)), Error);  // 10 is not a multiple of 4
}

TEST(Transformer, ReversibleMeanIsHalfTheSum) {
  StackConfig sc = stack_config(Mechanism::softmax, 2);
  sc.reversible = true;
  sc.final_norm = false;
  Generator g1(30), g2(30);
  Stack sum(sc, &g1);
  sc.reversible_output = ReversibleOutput::mean;
  Stack mean(sc, &g2);
  Tensor x = leaf64({2, 5, 12}, 31);
  expect_close(mean.forward(x), sum.forward(x) * 0.5, 1e-14);
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return mean.forward(in[0]); },
                   {leaf64({1, 4, 12}, 32), mean.blocks[1]->ff->w2->bias});
  EXPECT_STREQ(name_of(kReversibleOutputNames, ReversibleOutput::mean), "mean");
}

TEST(Transformer, EveryNormTakesNormEpsAndTheFinalNormItsKind) {
  for (NormKind norm : {NormKind::layer, NormKind::scale}) {
    for (FinalNormKind final_kind : {FinalNormKind::layer, FinalNormKind::block}) {
      SCOPED_TRACE(std::string(name_of(kNormNames, norm)) + " blocks, final " +
                   name_of(kFinalNormKindNames, final_kind));
      StackConfig sc = stack_config(Mechanism::efficient, 2);
      sc.block.norm = norm;
      sc.block.norm_eps = 1e-3;
      sc.final_norm_kind = final_kind;
      sc.block.attend_axially = true;
      sc.block.cross_attention = true;
      sc.block.cross = sc.block.attention;
      Generator g(33);
      Stack stack(sc, &g);
      int64_t layer_norms = 0, scale_norms = 0;
      for_each_module<LayerNorm>(stack, [&](const std::string& name, LayerNorm& n) {
        EXPECT_EQ(n.eps, 1e-3) << name;
        ++layer_norms;
      });
      for_each_module<ScaleNorm>(stack, [&](const std::string& name, ScaleNorm& n) {
        EXPECT_EQ(n.eps, 1e-3) << name;
        ++scale_norms;
      });
      // Five per block (self, cross, feed-forward, axial pair), then the final one.
      const bool scale_final = norm == NormKind::scale && final_kind == FinalNormKind::block;
      EXPECT_EQ(layer_norms, (norm == NormKind::layer ? 10 : 0) + (scale_final ? 0 : 1));
      EXPECT_EQ(scale_norms, (norm == NormKind::scale ? 10 : 0) + (scale_final ? 1 : 0));
      EXPECT_EQ(stack.norm->scale_norm != nullptr, scale_final);
    }
  }
}

TEST(Transformer, ConfigErrorsNameTheField) {
  auto message = [](const StackConfig& sc) { return error_of([&] { Stack s(sc); }); };
  StackConfig sc = stack_config(Mechanism::softmax, 2);
  sc.reversible = true;
  sc.checkpoint = CheckpointLevel::C1;
  EXPECT_NE(message(sc).find("checkpoint must be C0"), std::string::npos);
  sc = stack_config(Mechanism::softmax, 2);
  sc.layer_attention.resize(3, sc.block.attention);
  EXPECT_NE(message(sc).find("layer_attention"), std::string::npos);
  sc = stack_config(Mechanism::softmax, 0);
  EXPECT_NE(message(sc).find("depth must be > 0"), std::string::npos);
  sc = stack_config(Mechanism::softmax, 2);
  sc.block.norm_eps = 0;
  EXPECT_NE(message(sc).find("block.norm_eps must be > 0"), std::string::npos);
  EXPECT_THROW(enum_from_name(kNormNames, "batch"), Error);
  EXPECT_THROW(enum_from_name(kReversibleOutputNames, "max"), Error);
  EXPECT_THROW(enum_from_name(kFinalNormKindNames, "scale"), Error);
}

}  // namespace
}  // namespace forge::nn
