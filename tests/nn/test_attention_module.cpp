// MultiHeadAttention and ProjectionBank: every mechanism through the module
// against the op it wraps, local/global head mixing (local heads first or last,
// with local-attention's rotary), per-head checkpointing,
// Linformer sharing counts, Performer redraws, TaylorShift's switch point,
// attention maps, and recurrent decoding against the full causal op.
#include <gtest/gtest.h>

#include <set>

#include "autograd/engine.h"
#include "nn/attention.h"
#include "nn/transformer.h"
#include "ops/ops.h"
#include "tests/nn/nn_test_util.h"
#include "tests/test_util.h"

namespace forge::nn {
namespace {

namespace att = ops::attention;
using namespace forge::testing;

AttentionConfig config(Mechanism kind, int64_t D = 12, int64_t H = 3, bool causal = false) {
  return AttentionConfig{.kind = kind,
                         .dim = D,
                         .heads = H,
                         .causal = causal,
                         .local_window = 4,
                         .bucket_size = 1,
                         .nb_features = 8,
                         .seq_len = 16,
                         .k = 5,
                         .dtype = DType::f64};
}

// (B, N, H d) -> (B, H, N, d) with the module's projection of heads [h0, h1).
Tensor heads_of(const Linear& lin, const Tensor& x, int64_t H, int64_t d) {
  Tensor t = ops::linear(x, lin.weight, lin.bias);
  return ops::transpose(ops::reshape(t, {x.size(0), x.size(1), H, d}), 1, 2);
}

Tensor merge(MultiHeadAttention& m, const Tensor& o) {
  Tensor t = ops::transpose(o, 1, 2);
  return m.to_out->forward(ops::reshape(t, {t.size(0), t.size(1), -1}));
}

TEST(AttentionModule, LocalHeadsThenGlobalHeadsEqualTheOpsOnTheirSlices) {
  Generator g(1);
  AttentionConfig c = config(Mechanism::favor, 12, 3);
  c.n_local_heads = 1;
  MultiHeadAttention m(c, false, 0, nullptr, 0, &g);
  Tensor x = leaf64({2, 9, 12}, 2);
  Tensor mask = padded_mask(2, 9, 3);
  const int64_t d = 4;
  Tensor q = heads_of(*m.to_q, x, 3, d), k = heads_of(*m.to_k, x, 3, d),
         v = heads_of(*m.to_v, x, 3, d);
  auto part = [](const Tensor& t, int64_t h0, int64_t n) { return ops::narrow(t, 1, h0, n); };
  Tensor local = att::local(part(q, 0, 1), part(k, 0, 1), part(v, 0, 1), mask, {.window = 4});
  Tensor global =
      att::favor(part(q, 1, 2), part(k, 1, 2), part(v, 1, 2), m.projection_matrix, mask);
  expect_close(m.forward(x, mask), merge(m, ops::cat({local, global}, 1)), 1e-12);
}

TEST(AttentionModule, LocalHeadsLastWithLocalRotaryEqualTheOpsOnTheirSlices) {
  // performer-pytorch's order: global heads [0, 2), then the local head 2, which
  // turns q (at i + look_forward w) and k (at j) by local-attention's rotary;
  // the layer rotary turns the global heads only, and tau is theirs, in order.
  for (Mechanism mech : {Mechanism::favor, Mechanism::taylorshift}) {
    for (bool causal : {false, true}) {
      if (causal && mech == Mechanism::taylorshift) continue;
      SCOPED_TRACE(std::string(mechanism_name(mech)) + (causal ? " causal" : ""));
      Generator g(20);
      AttentionConfig c = config(mech, 12, 3, causal);
      c.n_local_heads = 1;
      c.local_heads_at = LocalHeadsAt::last;
      c.local_rotary = true;
      MultiHeadAttention m(c, false, 0, nullptr, 0, &g);
      auto rotary = std::make_shared<RotaryEmbedding>(16, 4, DType::f64);
      m.set_rotary(rotary);
      if (m.tau.defined()) m.tau.copy_from(Tensor::from_vector<double>({0.5, 2.0}));
      Tensor x = leaf64({2, 9, 12}, 21);
      Tensor mask = padded_mask(2, 9, 3);
      Tensor q = heads_of(*m.to_q, x, 3, 4), k = heads_of(*m.to_k, x, 3, 4),
             v = heads_of(*m.to_v, x, 3, 4);
      auto part = [](const Tensor& t, int64_t h0, int64_t n) { return ops::narrow(t, 1, h0, n); };
      const Tensor gq = rotary->rotate(part(q, 0, 2)), gk = rotary->rotate(part(k, 0, 2));
      Tensor global =
          mech == Mechanism::favor
              ? att::favor(gq, gk, part(v, 0, 2), m.projection_matrix, mask, {.causal = causal})
              : att::taylorshift(gq, gk, part(v, 0, 2), m.tau, mask);
      Tensor local = att::local(rotate_half_split(part(q, 2, 1), causal ? 0 : 4),
                                rotate_half_split(part(k, 2, 1)), part(v, 2, 1), mask,
                                {.window = 4, .causal = causal});
      expect_close(m.forward(x, mask), merge(m, ops::cat({global, local}, 1)), 1e-12);
      std::vector<Tensor> inputs{leaf64({1, 6, 12}, 22), m.to_q->weight, m.to_k->weight};
      if (m.tau.defined()) inputs.push_back(m.tau);
      EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return m.forward(in[0]); }, inputs);
    }
  }
  EXPECT_EQ(enum_from_name(kLocalHeadsAtNames, "last"), LocalHeadsAt::last);
  EXPECT_STREQ(name_of(kLocalHeadsAtNames, LocalHeadsAt::first), "first");
  EXPECT_THROW(enum_from_name(kLocalHeadsAtNames, "middle"), Error);
  AttentionConfig odd = config(Mechanism::favor, 12, 4);
  odd.head_dim = 3;
  odd.n_local_heads = 1;
  odd.local_rotary = true;
  EXPECT_THROW(MultiHeadAttention{odd}, Error);
}

TEST(AttentionModule, EveryMechanismRunsSelfAndCrossWithGradients) {
  for (int kind = 0; kind <= static_cast<int>(Mechanism::taylorshift); ++kind) {
    const auto mech = static_cast<Mechanism>(kind);
    SCOPED_TRACE(mechanism_name(mech));
    Generator g(3);
    AttentionConfig c = config(mech);
    auto bank =
        std::make_shared<ProjectionBank>(LinformerSharing::none, 1, 3, 16, 5, 0, DType::f64, &g);
    MultiHeadAttention self(c, false, 0, bank, 0, &g);
    Tensor x = leaf64({2, 8, 12}, 4);
    Tensor y = self.forward(x, padded_mask(2, 8, 2));
    EXPECT_EQ(y.shape(), (Shape{2, 8, 12}));
    autograd::backward(ops::sum(ops::square(y)));
    EXPECT_TRUE(x.grad().defined());
    for (auto& [name, p] : self.named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
    if (mech == Mechanism::local || mech == Mechanism::linformer) continue;  // self-attention only
    MultiHeadAttention cross(c, true, 7, bank, 0, &g);
    Tensor ctx = leaf64({2, 11, 7}, 5);
    Tensor z = cross.forward(x, Tensor(), ctx, padded_mask(2, 11, 4));
    autograd::backward(ops::sum(z));
    EXPECT_TRUE(ctx.grad().defined());
  }
}

TEST(AttentionModule, GradcheckThroughTheModule) {
  for (Mechanism mech : {Mechanism::softmax, Mechanism::linear, Mechanism::taylorshift,
                         Mechanism::linformer, Mechanism::efficient}) {
    SCOPED_TRACE(mechanism_name(mech));
    Generator g(6);
    AttentionConfig c = config(mech, 6, 2);
    c.seq_len = 5;
    c.k = 3;
    auto bank =
        std::make_shared<ProjectionBank>(LinformerSharing::headwise, 1, 2, 5, 3, 0, DType::f64, &g);
    MultiHeadAttention m(c, false, 0, bank, 0, &g);
    std::vector<Tensor> inputs{leaf64({1, 5, 6}, 7), m.to_q->weight, m.to_out->weight};
    if (m.tau.defined()) inputs.push_back(m.tau);
    if (mech == Mechanism::linformer) inputs.push_back(bank->E(0, 0).weight);
    EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return m.forward(in[0]); }, inputs);
  }
}

TEST(AttentionModule, PerHeadCheckpointingGivesTheSameValuesAndGradients) {
  for (Mechanism mech : {Mechanism::softmax, Mechanism::linformer, Mechanism::favor}) {
    SCOPED_TRACE(mechanism_name(mech));
    Generator g(8);
    AttentionConfig c = config(mech);
    c.attn_dropout = mech == Mechanism::favor ? 0.0 : 0.2;
    c.n_local_heads = 1;
    auto bank =
        std::make_shared<ProjectionBank>(LinformerSharing::none, 1, 3, 16, 5, 0, DType::f64, &g);
    MultiHeadAttention m(c, false, 0, bank, 0, &g);
    Generator drop(9);
    m.set_generator(&drop);
    auto run = [&](bool per_head) {
      m.set_checkpoint_heads(per_head);
      m.zero_grad();
      drop.manual_seed(10);
      Tensor x = leaf64({2, 8, 12}, 11);
      Tensor y = m.forward(x, padded_mask(2, 8, 3));
      autograd::backward(ops::sum(ops::square(y)));
      std::vector<Tensor> out{y.detach(), x.grad()};
      for (auto& [name, p] : m.named_parameters()) out.push_back(p.grad());
      if (mech == Mechanism::linformer) out.push_back(bank->E(0, 2).weight.grad());
      return out;
    };
    auto plain = run(false);
    bank->zero_grad();
    auto ckpt = run(true);
    ASSERT_EQ(plain.size(), ckpt.size());
    for (size_t i = 0; i < plain.size(); ++i) expect_close(ckpt[i], plain[i], 1e-12);
  }
}

TEST(AttentionModule, SharingModesCreateTheStatedNumberOfMatrices) {
  // 12 layers x 12 heads: none 288, headwise 24, kv 12, layerwise 1.
  const std::pair<LinformerSharing, int64_t> cases[] = {{LinformerSharing::none, 288},
                                                        {LinformerSharing::headwise, 24},
                                                        {LinformerSharing::kv, 12},
                                                        {LinformerSharing::layerwise, 1}};
  for (auto [sharing, expected] : cases) {
    SCOPED_TRACE(name_of(kSharingNames, sharing));
    StackConfig sc;
    sc.depth = 12;
    sc.block.attention = config(Mechanism::linformer, 24, 12);
    sc.block.attention.dtype = DType::f32;
    sc.block.attention.seq_len = 8;
    sc.block.attention.k = 4;
    sc.block.ff.mult = 1;
    sc.sharing = sharing;
    Stack stack(sc);
    ASSERT_TRUE(stack.bank);
    EXPECT_EQ(stack.bank->distinct(), expected);
    // The matrices the layers actually use, E and F, by identity.
    std::set<const void*> used;
    for (int64_t l = 0; l < 12; ++l)
      for (int64_t h = 0; h < 12; ++h) {
        used.insert(&stack.bank->E(l, h).weight.impl());
        used.insert(&stack.bank->F(l, h).weight.impl());
      }
    EXPECT_EQ(static_cast<int64_t>(used.size()), expected);
    int64_t bank_params = 0;
    for (auto& [name, p] : stack.named_parameters())
      if (name.rfind("projections.", 0) == 0) ++bank_params;
    EXPECT_EQ(bank_params, 2 * expected);  // weight and bias each
    if (sharing == LinformerSharing::kv) {
      EXPECT_EQ(&stack.bank->E(3, 5), &stack.bank->F(3, 5));
    }
  }
}

TEST(AttentionModule, KReducedByLayer) {
  ProjectionBank bank(LinformerSharing::headwise, 4, 2, 32, 10, 4);
  EXPECT_EQ(bank.k_of_layer(0), 10);
  EXPECT_EQ(bank.k_of_layer(1), 6);
  EXPECT_EQ(bank.k_of_layer(2), 2);
  EXPECT_EQ(bank.k_of_layer(3), 1);  // minimum 1
  EXPECT_EQ(bank.E(2, 1).weight.shape(), (Shape{2, 32}));
  EXPECT_THROW(ProjectionBank(LinformerSharing::layerwise, 4, 2, 32, 10, 4), Error);
}

TEST(AttentionModule, FavorRedrawsEveryIntervalFromTheModuleGeneratorUnlessFixed) {
  AttentionConfig c = config(Mechanism::favor);
  c.feature_redraw_interval = 2;
  Generator init(12), run(13);
  MultiHeadAttention m(c, false, 0, nullptr, 0, &init);
  m.set_generator(&run);
  Tensor first = m.projection_matrix.clone();
  m.tick_redraw();  // calls 0 -> 1
  m.tick_redraw();  // 1 -> 2
  expect_close(m.projection_matrix, first, 0);
  m.tick_redraw();  // due: redraw from `run`, counter back to 0
  EXPECT_GT(max_abs_diff(m.projection_matrix, first), 0.1);
  Generator again(13);
  expect_close(m.projection_matrix,
               att::gaussian_orthogonal_random_matrix(8, 4, 0, DType::f64, &again), 0);
  EXPECT_EQ(m.calls_since_last_redraw.item<int64_t>(), 0);
  Tensor second = m.projection_matrix.clone();
  m.eval();
  for (int i = 0; i < 5; ++i) m.tick_redraw();  // no redraws in eval mode
  m.train();
  m.fix_projections();
  for (int i = 0; i < 5; ++i) m.tick_redraw();
  expect_close(m.projection_matrix, second, 0);
  EXPECT_TRUE(m.state_dict().count("projection_matrix"));
  EXPECT_TRUE(m.state_dict().count("calls_since_last_redraw"));
}

TEST(AttentionModule, TaylorShiftN0SwitchesFormsWithTheSameResult) {
  Generator g(14);
  MultiHeadAttention m(config(Mechanism::taylorshift), false, 0, nullptr, 0, &g);
  Tensor x = leaf64({2, 9, 12}, 15);
  m.set_n0(-1);
  Tensor efficient = m.forward(x);
  m.set_n0(1 << 30);
  expect_close(m.forward(x), efficient, 1e-12);
}

TEST(AttentionModule, AttentionMapsReproduceTheOutput) {
  // o = P v per head, so merge(maps @ v) must equal forward for every mechanism
  // that has a map (linformer: maps @ (F v + bF)).
  for (Mechanism mech :
       {Mechanism::softmax, Mechanism::local, Mechanism::taylorshift, Mechanism::linformer}) {
    for (bool causal : {false, true}) {
      if (causal && (mech == Mechanism::taylorshift || mech == Mechanism::linformer)) continue;
      SCOPED_TRACE(std::string(mechanism_name(mech)) + (causal ? " causal" : ""));
      Generator g(16);
      AttentionConfig c = config(mech, 12, 3, causal);
      auto bank =
          std::make_shared<ProjectionBank>(LinformerSharing::none, 1, 3, 16, 5, 0, DType::f64, &g);
      MultiHeadAttention m(c, false, 0, bank, 0, &g);
      if (m.tau.defined()) m.tau.copy_from(Tensor::from_vector<double>({0.5, 1.0, 2.0}));
      ASSERT_TRUE(m.has_attention_maps());
      Tensor x = leaf64({2, 10, 12}, 17);
      Tensor mask = padded_mask(2, 10, 3);
      Tensor maps = m.attention_maps(x, mask);
      Tensor v = heads_of(*m.to_v, x, 3, 4);
      if (mech == Mechanism::linformer) {
        EXPECT_EQ(maps.shape(), (Shape{2, 3, 10, 5}));
        std::vector<Tensor> vs;
        Tensor vz = ops::mul(v, ops::reshape(mask.to(DType::f64), {2, 1, 10, 1}));
        for (int64_t h = 0; h < 3; ++h) {
          Linear& F = bank->F(0, h);
          vs.push_back(ops::matmul(ops::narrow(F.weight, 1, 0, 10), ops::narrow(vz, 1, h, 1)) +
                       ops::reshape(F.bias, {-1, 1}));
        }
        v = ops::cat(vs, 1);
      } else {
        EXPECT_EQ(maps.shape(), (Shape{2, 3, 10, 10}));
        // (B, H, N) row sums: 1, except local's padded queries (batch 1, i >= 7), 0.
        auto rows = ops::sum(maps, {-1}).to_vector<double>();
        for (size_t t = 0; t < rows.size(); ++t) {
          const bool padded_query = t >= 30 && t % 10 >= 7;
          EXPECT_NEAR(rows[t], mech == Mechanism::local && padded_query ? 0.0 : 1.0, 1e-12);
        }
      }
      expect_close(merge(m, ops::matmul(maps, v)), m.forward(x, mask), 1e-10);
    }
  }
  // The local heads last with their rotary, beside taylorshift heads (tau in order).
  Generator g(23);
  AttentionConfig c = config(Mechanism::taylorshift, 12, 3);
  c.n_local_heads = 1;
  c.local_heads_at = LocalHeadsAt::last;
  c.local_rotary = true;
  MultiHeadAttention mixed(c, false, 0, nullptr, 0, &g);
  mixed.tau.copy_from(Tensor::from_vector<double>({0.5, 2.0}));
  Tensor x = leaf64({2, 10, 12}, 24);
  Tensor mask = padded_mask(2, 10, 3);
  expect_close(
      merge(mixed, ops::matmul(mixed.attention_maps(x, mask), heads_of(*mixed.to_v, x, 3, 4))),
      mixed.forward(x, mask), 1e-10);
  MultiHeadAttention favor(config(Mechanism::favor), false, 0, nullptr, 0, nullptr);
  EXPECT_FALSE(favor.has_attention_maps());
  EXPECT_THROW(favor.attention_maps(Tensor::zeros({1, 4, 12}, DType::f64)), Error);
}

// Recurrent decoding: stepping token by token equals the full causal forward.
TEST(AttentionModule, RecurrentStepEqualsTheCausalForward) {
  struct Case {
    const char* name;
    Mechanism kind;
    int64_t bucket = 1;
    att::FavorKernel kernel = att::FavorKernel::softmax;
  };
  const Case cases[] = {
      {"linear", Mechanism::linear},
      {"efficient", Mechanism::efficient},
      {"efficient buckets", Mechanism::efficient, 4},
      {"favor softmax", Mechanism::favor},
      {"favor relu", Mechanism::favor, 1, att::FavorKernel::relu},
      {"favor no_projection", Mechanism::favor, 1, att::FavorKernel::no_projection}};
  for (const Case& cs : cases) {
    for (bool rotary : {false, true}) {
      SCOPED_TRACE(std::string(cs.name) + (rotary ? " + rotary" : ""));
      Generator g(18);
      AttentionConfig c = config(cs.kind, 12, 3, true);
      c.bucket_size = cs.bucket;
      c.favor_kernel = cs.kernel;
      MultiHeadAttention m(c, false, 0, nullptr, 0, &g);
      if (rotary) m.set_rotary(std::make_shared<RotaryEmbedding>(32, 4, DType::f64));
      ASSERT_TRUE(m.supports_recurrent());
      Tensor x = leaf64({2, 11, 12}, 19, -2, 2).detach();
      Tensor full = m.forward(x);
      AttentionState state;
      for (int64_t i = 0; i < 11; ++i) {
        Tensor o = m.step(ops::narrow(x, 1, i, 1), state);
        expect_close(o, ops::narrow(full, 1, i, 1), 1e-11);
      }
      EXPECT_EQ(state.pos, 11);
    }
  }
  AttentionConfig global = config(Mechanism::favor, 12, 3, true);
  global.favor_stabilizer = att::FavorStabilizer::global;
  EXPECT_FALSE(MultiHeadAttention(global).supports_recurrent());
  EXPECT_FALSE(MultiHeadAttention(config(Mechanism::softmax), true).supports_recurrent());  // cross
  EXPECT_FALSE(MultiHeadAttention(config(Mechanism::linear)).supports_recurrent());  // not causal
}

TEST(AttentionModule, ClearErrors) {
  EXPECT_NE(error_of([] {
              MultiHeadAttention(config(Mechanism::linformer, 12, 3, true));
            }).find("linformer has no causal form"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              MultiHeadAttention(config(Mechanism::taylorshift, 12, 3, true));
            }).find("taylorshift has no causal form"),
            std::string::npos);
  EXPECT_NE(error_of([] { mechanism_from_name("flash"); }).find("softmax, local"),
            std::string::npos);
  AttentionConfig odd = config(Mechanism::softmax, 10, 3);
  EXPECT_NE(error_of([&] {
              MultiHeadAttention m(odd);
            }).find("attention.dim = 10 is not divisible by attention.heads = 3"),
            std::string::npos);
  odd.head_dim = 4;  // independent of D: fine
  MultiHeadAttention ok(odd);
  EXPECT_EQ(ok.to_q->weight.shape(), (Shape{12, 10}));
  EXPECT_NE(error_of([&] {
              ok.forward(Tensor::zeros({1, 4, 9}, DType::f64));
            }).find("(B, N, 10)"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { MultiHeadAttention(config(Mechanism::linformer)); }).find("ProjectionBank"),
      std::string::npos);
}

// out_bias = false (performer-pytorch's attn_out_bias default): no bias on
// the output projection, and the output is the plain product.
TEST(AttentionModule, OutputProjectionWithoutBias) {
  AttentionConfig c{.dim = 8, .heads = 2, .out_bias = false, .dtype = DType::f64};
  Generator g(3);
  MultiHeadAttention m(c, false, 0, nullptr, 0, &g);
  for (const auto& [name, t] : m.named_parameters()) EXPECT_NE(name, "to_out.bias");
  EXPECT_FALSE(m.to_out->bias.defined());
  const Tensor x = leaf64({2, 5, 8}, 4);
  c.out_bias = true;
  Generator g2(3);
  MultiHeadAttention with_bias(c, false, 0, nullptr, 0, &g2);
  with_bias.to_out->bias = Tensor::zeros({8}, DType::f64);
  expect_close(m.forward(x), with_bias.forward(x), 1e-12);
}

}  // namespace
}  // namespace forge::nn
