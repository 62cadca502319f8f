// The models against the reference libraries' own formulas (issue 16): each
// test builds one configuration with our modules and compares its float64
// forward and the gradients of sum(out * seed) with a composite of ops written
// from the reference's code (performer-pytorch, linear-attention-transformer,
// local-attention, timm) on the module's parameter tensors, to 1e-10. Each also
// checks that the behaviour before the option (kept by name where it is still
// an option) is a different function, so the test fails without the option.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "tests/nn/nn_test_util.h"
#include "tests/test_util.h"

namespace forge::nn {
namespace {

using namespace forge::testing;

constexpr double kTol = 1e-10;

// Runs `ours` and `reference` and expects the same value and the same
// gradients of sum(out * seed) (one random seed for both) for every leaf.
// Returns the reference's value.
Tensor expect_same_function(const std::function<Tensor()>& ours,
                            const std::function<Tensor()>& reference, std::vector<Tensor> leaves) {
  std::vector<std::vector<Tensor>> runs;
  for (const auto* fn : {&ours, &reference}) {
    for (Tensor& t : leaves) t.zero_grad();
    Tensor out = (*fn)();
    autograd::backward({out}, {leaf64(out.shape(), 99).detach()});
    runs.push_back({out.detach()});
    for (Tensor& t : leaves) runs.back().push_back(t.grad());
  }
  expect_close(runs[0][0], runs[1][0], kTol);
  for (size_t i = 1; i < runs[0].size(); ++i) {
    SCOPED_TRACE("gradient of leaf " + std::to_string(i - 1));
    EXPECT_TRUE(runs[0][i].defined() && runs[1][i].defined());
    if (runs[0][i].defined() && runs[1][i].defined()) expect_close(runs[0][i], runs[1][i], kTol);
  }
  return runs[1][0];
}

// ---- the references' formulas on ops ----

// u8 (n, m): true where key j (at key_pos[j]) comes after query i (at q0 + i).
Tensor later_keys(int64_t n, int64_t m, const std::vector<int64_t>& key_pos, int64_t q0) {
  std::vector<uint8_t> a(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) a[static_cast<size_t>(i * m + j)] = key_pos[j] > q0 + i;
  return Tensor::from_vector(a, {n, m});
}

std::vector<int64_t> iota(int64_t start, int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) v[static_cast<size_t>(j)] = start + j;
  return v;
}

// Fixed sinusoids (n, D): row t = cat(sin(t f), cos(t f)), f_i = 10000^(-2i/D)
// (performer-pytorch's and linear-attention-transformer's FixedPositionalEmbedding).
Tensor sinusoid_rows(int64_t n, int64_t D) {
  std::vector<double> e(static_cast<size_t>(n * D));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double angle = static_cast<double>(t) * std::pow(10000.0, -2.0 * i / D);
      e[static_cast<size_t>(t * D + i)] = std::sin(angle);
      e[static_cast<size_t>(t * D + D / 2 + i)] = std::cos(angle);
    }
  return Tensor::from_vector(e, {n, D});
}

// Rotary positions: each pair (a, b) of features turns by t 10000^(-2i/d):
// interleaved pairs (2i, 2i+1) as performer's apply_rotary_pos_emb
// (rotate_every_two), halves (i, i + d/2) as local-attention's (rotate_half).
// x (..., n, d) at positions p0.. -> x cos + (x R) sin, R the signed
// permutation that maps (x_a, x_b) to (-x_b, x_a).
enum class Pairs { interleaved, halves };
Tensor rotary_ref(const Tensor& x, int64_t p0, Pairs pairs) {
  const int64_t n = x.size(-2), d = x.size(-1), half = d / 2;
  std::vector<double> c(static_cast<size_t>(n * d)), s(c.size()), R(static_cast<size_t>(d * d));
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = pairs == Pairs::interleaved ? 2 * i : i;
    const int64_t b = pairs == Pairs::interleaved ? 2 * i + 1 : i + half;
    R[static_cast<size_t>(b * d + a)] = -1;
    R[static_cast<size_t>(a * d + b)] = 1;
    for (int64_t t = 0; t < n; ++t) {
      const double angle = static_cast<double>(p0 + t) * std::pow(10000.0, -2.0 * i / d);
      for (int64_t e : {a, b}) {
        c[static_cast<size_t>(t * d + e)] = std::cos(angle);
        s[static_cast<size_t>(t * d + e)] = std::sin(angle);
      }
    }
  }
  return x * Tensor::from_vector(c, {n, d}) +
         ops::matmul(x, Tensor::from_vector(R, {d, d})) * Tensor::from_vector(s, {n, d});
}

// softmax(q k^T / sqrt d) v on (B, h, N, d).
Tensor softmax_ref(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const int64_t N = q.size(2);
  Tensor S = ops::matmul(q, k, false, true) * (1.0 / std::sqrt(double(q.size(-1))));
  if (causal)
    S = ops::masked_fill(S, later_keys(N, N, iota(0, N), 0),
                         -std::numeric_limits<double>::infinity());
  return ops::matmul(ops::softmax(S), v);
}

// performer-pytorch's FastAttention with the softmax kernel: softmax_kernel
// (query max over its features, key max over all keys and features, both
// detached), then linear_attention or causal_linear_attention (k cumsum + 1e-6).
Tensor favor_ref(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& W, bool causal) {
  const double c = std::pow(double(q.size(-1)), -0.25), r = std::pow(double(W.size(0)), -0.5);
  const auto dash = [&](const Tensor& x) { return ops::matmul(x * c, W, false, true); };
  const auto diag = [&](const Tensor& x) {
    return ops::sum(ops::square(x), {-1}, true) * (c * c / 2);
  };
  const Tensor qd = dash(q), kd = dash(k);  // (B, h, N, m)
  const Tensor phi_q = (ops::exp(qd - diag(q) - ops::max(qd, {-1}, true).detach()) + 1e-4) * r;
  const Tensor phi_k = (ops::exp(kd - diag(k) - ops::max(kd, {-1, -2}, true).detach()) + 1e-4) * r;
  if (!causal) {
    const Tensor den =
        ops::matmul(phi_q, ops::sum(phi_k, {-2}, true), false, true);  // (B, h, N, 1)
    return ops::matmul(phi_q, ops::matmul(phi_k, v, true, false)) / den;
  }
  const int64_t N = q.size(2);
  const Tensor A = ops::masked_fill(ops::matmul(phi_q, phi_k, false, true),
                                    later_keys(N, N, iota(0, N), 0), 0.0);
  const Tensor den = ops::sum(phi_q * (ops::cumsum(phi_k, 2) + 1e-6), {-1}, true);
  return ops::matmul(A, v) / den;
}

// local-attention's LocalAttention.forward (window w, look_backward 1,
// look_forward 0 when causal else 1; N % w == 0) with its rotary relative
// positions (rel_pos_emb_config): in every window's frame the queries sit at
// (lb + lf) w + 0..w-1 and the keys of window b + o at (o + lb) w + 0..w-1.
// Windows outside the sequence are left out (the reference masks their keys).
Tensor local_ref(const Tensor& q, const Tensor& k, const Tensor& v, int64_t w, bool causal) {
  const int64_t N = q.size(2), windows = N / w, lb = 1, lf = causal ? 0 : 1;
  std::vector<Tensor> outs;
  for (int64_t b = 0; b < windows; ++b) {
    const Tensor qb =
        rotary_ref(ops::narrow(q, 2, b * w, w) * (1.0 / std::sqrt(double(q.size(-1)))),
                   (lb + lf) * w, Pairs::halves);
    std::vector<Tensor> ks, vs;
    std::vector<int64_t> key_pos;
    for (int64_t o = -lb; o <= lf; ++o) {
      if (b + o < 0 || b + o >= windows) continue;
      ks.push_back(rotary_ref(ops::narrow(k, 2, (b + o) * w, w), (o + lb) * w, Pairs::halves));
      vs.push_back(ops::narrow(v, 2, (b + o) * w, w));
      for (int64_t j : iota((b + o) * w, w)) key_pos.push_back(j);
    }
    Tensor S = ops::matmul(qb, ops::cat(ks, 2), false, true);
    if (causal)
      S = ops::masked_fill(S, later_keys(w, static_cast<int64_t>(key_pos.size()), key_pos, b * w),
                           -std::numeric_limits<double>::infinity());
    outs.push_back(ops::matmul(ops::softmax(S), ops::cat(vs, 2)));
  }
  return ops::cat(outs, 2);
}

// (B, N, H d) -> (B, H, N, d) and back.
Tensor split_heads(const Tensor& t, int64_t H) {
  return ops::transpose(ops::reshape(t, {t.size(0), t.size(1), H, t.size(2) / H}), 1, 2);
}
Tensor merge_heads(const Tensor& o) {
  const Tensor t = ops::transpose(o, 1, 2);
  return ops::reshape(t, {t.size(0), t.size(1), -1});
}

// What a reference model does around its attention.
struct Reference {
  bool causal = false;
  bool sinusoids = false;     // pos_emb: fixed sinusoids added to the token embeddings
  bool layer_rotary = false;  // layer_pos_emb: interleaved rotary on the global heads
  bool favor = false;         // the global heads: FAVOR+ (softmax kernel), else softmax
  int64_t local_heads = 0;    // the last heads: LocalAttention with rel_pos_emb_config
  int64_t window = 0;
  NormKind norm = NormKind::layer;  // PreLayerNorm (eps 1e-5), PreScaleNorm (eps 1e-5), ReZero
};

// performer-pytorch's Attention.forward on m's parameters: q, k, v split into
// the global heads [0, gh) and the local ones [gh, H), concatenated in that order.
Tensor attention_ref(MultiHeadAttention& m, const Tensor& x, const Reference& r) {
  const int64_t H = m.config.heads, gh = H - r.local_heads;
  const Tensor q = split_heads(ops::linear(x, m.to_q->weight, m.to_q->bias), H);
  const Tensor k = split_heads(ops::linear(x, m.to_k->weight, m.to_k->bias), H);
  const Tensor v = split_heads(ops::linear(x, m.to_v->weight, m.to_v->bias), H);
  std::vector<Tensor> outs;
  if (gh > 0) {
    Tensor gq = ops::narrow(q, 1, 0, gh), gk = ops::narrow(k, 1, 0, gh);
    const Tensor gv = ops::narrow(v, 1, 0, gh);
    if (r.layer_rotary) {
      gq = rotary_ref(gq, 0, Pairs::interleaved);
      gk = rotary_ref(gk, 0, Pairs::interleaved);
    }
    outs.push_back(r.favor ? favor_ref(gq, gk, gv, m.projection_matrix, r.causal)
                           : softmax_ref(gq, gk, gv, r.causal));
  }
  if (r.local_heads > 0) {
    const auto part = [&](const Tensor& t) { return ops::narrow(t, 1, gh, r.local_heads); };
    outs.push_back(local_ref(part(q), part(k), part(v), r.window, r.causal));
  }
  return ops::linear(merge_heads(ops::cat(outs, 1)), m.to_out->weight, m.to_out->bias);
}

Tensor ff_ref(FeedForward& ff, const Tensor& x) {
  return ops::linear(ops::gelu(ops::linear(x, ff.w1->weight, ff.w1->bias)), ff.w2->weight,
                     ff.w2->bias);
}

// The reference's wrapper around a branch fn: PreLayerNorm / PreScaleNorm
// norm the input; ReZero scales the output by g.
Tensor branch_ref(SublayerNorm& n, NormKind kind, const Tensor& x,
                  const std::function<Tensor(const Tensor&)>& fn) {
  switch (kind) {
    case NormKind::layer:
      return fn(ops::layer_norm(x, 1, n.layer_norm->weight, n.layer_norm->bias, 1e-5));
    case NormKind::scale:
      return fn(x / ops::clamp(ops::sqrt(ops::sum(ops::square(x), {-1}, true)), 1e-5) *
                n.scale_norm->g);
    case NormKind::rezero:
      return fn(x) * n.rezero->g;
  }
  return Tensor();
}

// PerformerLM.forward on lm's parameters: token_emb (+ pos_emb), the blocks,
// self.norm = nn.LayerNorm(dim), to_out.
Tensor performer_lm_ref(LanguageModel& lm, const Tensor& ids, const Reference& r) {
  Tensor x = ops::embedding(lm.token_emb->weight, ids);
  if (r.sinusoids) x = x + sinusoid_rows(ids.size(1), lm.config.dim);
  for (const auto& blk : lm.stack().blocks) {
    x = x + branch_ref(*blk->attn_norm, r.norm, x,
                       [&](const Tensor& h) { return attention_ref(*blk->attn, h, r); });
    x = x +
        branch_ref(*blk->ff_norm, r.norm, x, [&](const Tensor& h) { return ff_ref(*blk->ff, h); });
  }
  const LayerNorm& norm = *lm.stack().norm->layer_norm;
  x = ops::layer_norm(x, 1, norm.weight, norm.bias, 1e-5);
  return ops::linear(x, lm.to_logits->weight, lm.to_logits->bias);
}

// A small f64 PerformerLM-like model: D 16, 2 layers, feed-forward x2.
LanguageModelConfig small_lm(bool causal, int64_t heads, int64_t head_dim) {
  LanguageModelConfig c{
      .vocab_size = 11, .max_len = 12, .dim = 16, .causal = causal, .dtype = DType::f64};
  c.stack.depth = 2;
  c.stack.block.ff.mult = 2;
  c.stack.block.attention.heads = heads;
  c.stack.block.attention.head_dim = head_dim;
  return c;
}

// ---- 1. rotary positions ----

TEST(ReferenceFidelity, RotaryAddsTheSinusoidsAsPerformerLM) {
  // PerformerLM(rotary_position_emb=True) (and linear-attention-transformer's
  // use_rotary_emb): x = token_emb + FixedPositionalEmbedding, and every layer
  // turns q, k by layer_pos_emb. rotary_only: the layer rotary alone.
  const Tensor ids = random_ids(2, 10, 11, 1);
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    const Reference ref{.causal = causal, .sinusoids = true, .layer_rotary = true};
    LanguageModelConfig c = small_lm(causal, 2, 8);
    c.positional = PositionalKind::rotary;
    Generator g(2);
    LanguageModel lm(c, &g);
    const Tensor want =
        expect_same_function([&] { return lm.forward(ids); },
                             [&] { return performer_lm_ref(lm, ids, ref); }, lm.parameters());
    c.positional = PositionalKind::rotary_only;  // what rotary was before
    Generator g2(2);
    LanguageModel pure(c, &g2);
    Reference no_sinusoids = ref;
    no_sinusoids.sinusoids = false;
    const Tensor got = expect_same_function(
        [&] { return pure.forward(ids); },
        [&] { return performer_lm_ref(pure, ids, no_sinusoids); }, pure.parameters());
    EXPECT_GT(max_abs_diff(got, want), 1e-3);
  }
}

// ---- 2. reversible output ----

TEST(ReferenceFidelity, ReversibleOutputIsTheMeanOrTheSumOfTheHalves) {
  // linear-attention-transformer's LinearAttentionTransformer(reversible=True)
  // on vectors: x -> (x, x), y1 = x1 + f(x2), y2 = x2 + g(y1) per layer
  // (f = PreNorm(SelfAttention) with linear_attn, g = PreNorm(FeedForward)),
  // out = mean of the halves; performer-pytorch's ReversibleSequence sums them.
  StackConfig sc;
  sc.depth = 2;
  sc.reversible = true;
  sc.final_norm = false;  // the stack alone; the models put their norm after it
  sc.block.attention.kind = Mechanism::efficient;
  sc.block.attention.dim = 8;
  sc.block.attention.heads = 2;
  sc.block.attention.dtype = DType::f64;
  sc.block.ff.mult = 2;
  const Tensor x = leaf64({2, 6, 8}, 3);
  std::vector<Tensor> outputs;
  for (ReversibleOutput output : {ReversibleOutput::mean, ReversibleOutput::sum}) {
    SCOPED_TRACE(name_of(kReversibleOutputNames, output));
    sc.reversible_output = output;
    Generator g(4);
    Stack stack(sc, &g);
    // linear_attn: q softmax over features times d^-1/2, k softmax over positions.
    const auto linear_attn = [](MultiHeadAttention& m, const Tensor& h) {
      const auto heads = [&](Linear& lin) { return split_heads(ops::linear(h, lin.weight), 2); };
      const Tensor q = ops::softmax(heads(*m.to_q), -1) * (1.0 / 2.0);
      const Tensor k = ops::softmax(heads(*m.to_k), 2);
      const Tensor o = ops::matmul(q, ops::matmul(k, heads(*m.to_v), true, false));
      return ops::linear(merge_heads(o), m.to_out->weight, m.to_out->bias);
    };
    const auto reference = [&] {
      Tensor y1 = x, y2 = x;
      for (const auto& blk : stack.blocks) {
        y1 = y1 + branch_ref(*blk->attn_norm, NormKind::layer, y2,
                             [&](const Tensor& h) { return linear_attn(*blk->attn, h); });
        y2 = y2 + branch_ref(*blk->ff_norm, NormKind::layer, y1,
                             [&](const Tensor& h) { return ff_ref(*blk->ff, h); });
      }
      return output == ReversibleOutput::mean ? (y1 + y2) * 0.5 : y1 + y2;
    };
    std::vector<Tensor> leaves = stack.parameters();
    leaves.push_back(x);
    outputs.push_back(expect_same_function([&] { return stack.forward(x); }, reference, leaves));
  }
  EXPECT_GT(max_abs_diff(outputs[0], outputs[1]), 1e-3);  // the sum (before) is not the mean
}

// ---- 3. LayerNorm epsilon ----

TEST(ReferenceFidelity, ViTNormsUseTimmsEpsilon) {
  // timm's VisionTransformer (TaylorShift's ViT): every LayerNorm has eps 1e-6.
  ViTConfig c = tiny_vit_config(DType::f64);
  const Tensor images = leaf64({2, 2, 8, 8}, 5, -0.2, 0.2);
  const auto timm_vit = [&](ViT& vit) {
    const auto ln = [](SublayerNorm& n, const Tensor& x) {
      return ops::layer_norm(x, 1, n.layer_norm->weight, n.layer_norm->bias, 1e-6);
    };
    const Tensor& w = vit.patch_embed->proj->weight;
    Tensor x = ops::patch_embed(images, w, vit.patch_embed->proj->bias, 4);  // (B, 4, D)
    x = ops::cat({ops::expand(vit.cls_token, {2, 1, 8}), x}, 1) + vit.pos_embed;
    for (const auto& blk : vit.stack().blocks) {
      x = x + attention_ref(*blk->attn, ln(*blk->attn_norm, x), {});
      x = x + ff_ref(*blk->ff, ln(*blk->ff_norm, x));
    }
    x = ln(*vit.stack().norm, x);
    return ops::linear(ops::reshape(ops::narrow(x, 1, 0, 1), {2, 8}), vit.head->weight,
                       vit.head->bias);
  };
  std::vector<Tensor> outputs;
  for (double eps : {1e-6, 1e-5}) {  // the default, then the previous hard-coded value
    ViTConfig e = c;
    ASSERT_EQ(e.norm_eps, 1e-6);
    e.norm_eps = eps;
    Generator g(6);
    ViT vit(e, &g);
    std::vector<Tensor> leaves = vit.parameters();
    leaves.push_back(images);
    if (eps == 1e-6) {
      outputs.push_back(expect_same_function([&] { return vit.forward(images); },
                                             [&] { return timm_vit(vit); }, leaves));
    } else {
      outputs.push_back(vit.forward(images).detach());
    }
  }
  EXPECT_GT(max_abs_diff(outputs[0], outputs[1]), 1e-8);
  // Every norm of each model's stack takes the model's norm_eps: 1e-6 for the
  // TaylorShift Transformer (a timm ViT), 1e-5 for the language models.
  SequenceClassifierConfig sc;
  sc.vocab_size = 5;
  sc.max_len = 8;
  sc.dim = 8;
  sc.stack.depth = 2;
  sc.stack.block.attention.heads = 2;
  SequenceClassifier clf(sc);
  LanguageModel lm(small_lm(true, 2, 8));
  for (auto [model, eps] : {std::pair<Module*, double>{&clf, 1e-6}, {&lm, 1e-5}}) {
    int64_t norms = 0;
    for_each_module<LayerNorm>(*model, [&, eps = eps](const std::string& name, LayerNorm& n) {
      EXPECT_EQ(n.eps, eps) << name;
      ++norms;
    });
    EXPECT_EQ(norms, 2 * 2 + 1);  // two per block and the final one
  }
}

// ---- 4. local heads in the Performer ----

TEST(ReferenceFidelity, PerformerLocalHeadsComeLastWithLocalAttentionsRotary) {
  // PerformerLM(local_attn_heads=2, local_window_size=4, rotary_position_emb=True):
  // heads [0, 2) FAVOR+ with the layer rotary, heads [2, 4) LocalAttention(
  // autopad, look_forward = not causal, rel_pos_emb_config = (dim_head, 2)).
  const Tensor ids = random_ids(2, 12, 11, 7);
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    LanguageModelConfig c = small_lm(causal, 4, 8);
    c.positional = PositionalKind::rotary;
    AttentionConfig& a = c.stack.block.attention;
    a.kind = Mechanism::favor;
    a.favor_stabilizer = ops::attention::FavorStabilizer::global;  // the reference's
    a.nb_features = 10;
    a.n_local_heads = 2;
    a.local_window = 4;
    a.local_heads_at = LocalHeadsAt::last;
    a.local_rotary = true;
    Generator g(8);
    LanguageModel lm(c, &g);
    lm.fix_projections();
    const Reference ref{.causal = causal,
                        .sinusoids = true,
                        .layer_rotary = true,
                        .favor = true,
                        .local_heads = 2,
                        .window = 4};
    const Tensor want =
        expect_same_function([&] { return lm.forward(ids); },
                             [&] { return performer_lm_ref(lm, ids, ref); }, lm.parameters());
    // Before: the local heads first, without their relative positions.
    for (auto [at, rel] : {std::pair{LocalHeadsAt::first, false},
                           {LocalHeadsAt::last, false},
                           {LocalHeadsAt::first, true}}) {
      a.local_heads_at = at;
      a.local_rotary = rel;
      Generator g2(8);
      LanguageModel other(c, &g2);
      EXPECT_GT(max_abs_diff(other.forward(ids), want), 1e-6)
          << name_of(kLocalHeadsAtNames, at) << (rel ? " with" : " without") << " local rotary";
    }
  }
}

// ---- 5. the final norm of ScaleNorm / ReZero models ----

TEST(ReferenceFidelity, ScaleNormAndReZeroModelsEndInALayerNorm) {
  // PerformerLM(use_scalenorm=True) / (use_rezero=True): PreScaleNorm (eps
  // 1e-5) or ReZero around every branch, and self.norm = nn.LayerNorm(dim).
  const Tensor ids = random_ids(2, 9, 11, 9);
  for (NormKind norm : {NormKind::scale, NormKind::rezero}) {
    SCOPED_TRACE(name_of(kNormNames, norm));
    LanguageModelConfig c = small_lm(true, 2, 8);
    c.positional = PositionalKind::rotary;
    c.stack.block.norm = norm;
    // Every g away from its init, so that each branch counts.
    const auto build = [&](const LanguageModelConfig& config) {
      Generator g(10);
      auto lm = std::make_unique<LanguageModel>(config, &g);
      double gain = 0.5;
      for (auto& [name, p] : lm->named_parameters())
        if (name.ends_with(".g")) p.fill(gain += 0.25);
      return lm;
    };
    auto lm = build(c);
    ASSERT_TRUE(lm->stack().norm->layer_norm);
    const Reference ref{.causal = true, .sinusoids = true, .layer_rotary = true, .norm = norm};
    const Tensor want =
        expect_same_function([&] { return lm->forward(ids); },
                             [&] { return performer_lm_ref(*lm, ids, ref); }, lm->parameters());
    if (norm != NormKind::scale) continue;
    c.stack.final_norm_kind = FinalNormKind::block;  // what a ScaleNorm model had before
    auto before = build(c);
    ASSERT_TRUE(before->stack().norm->scale_norm);
    EXPECT_GT(max_abs_diff(before->forward(ids), want), 1e-3);
  }
}

// performer-pytorch's PreShiftTokens with shifts (0, 1) (causal) and
// (-1, 0, 1): the last dim is cut into len(shifts) segments of D / len(shifts)
// features, segment s moves by shifts[s] along N with zeros shifted in
// (F.pad(t, (0, 0, amount, -amount))), the rest stays. A block built with
// token_shifts takes exactly these shifts.
TEST(ReferenceFidelity, PerformerTokenShiftOrder) {
  const auto moved = [](const Tensor& t, int64_t amount) {  // t (B, N, f) -> shifted by amount
    const int64_t N = t.size(1);
    if (amount == 0) return t;
    const Tensor zeros = Tensor::zeros({t.size(0), std::abs(amount), t.size(2)}, t.dtype());
    return amount > 0 ? ops::cat({zeros, ops::narrow(t, 1, 0, N - amount)}, 1)
                      : ops::cat({ops::narrow(t, 1, -amount, N + amount), zeros}, 1);
  };
  for (const std::vector<int64_t>& shifts : {std::vector<int64_t>{0, 1}, {-1, 0, 1}}) {
    SCOPED_TRACE(shifts.size());
    Tensor x = leaf64({2, 6, 7}, 3);  // 7 features: segments of 7 / len(shifts), the rest kept
    TokenShift ours(shifts);
    const int64_t f = 7 / static_cast<int64_t>(shifts.size());
    expect_same_function(
        [&] { return ours.forward(x); },
        [&] {
          std::vector<Tensor> parts;
          for (size_t s = 0; s < shifts.size(); ++s)
            parts.push_back(moved(ops::narrow(x, 2, static_cast<int64_t>(s) * f, f), shifts[s]));
          const int64_t used = f * static_cast<int64_t>(shifts.size());
          if (used < 7) parts.push_back(ops::narrow(x, 2, used, 7 - used));
          return ops::cat(parts, 2);
        },
        {x});
  }
  BlockConfig c;
  c.attention.dim = 8;
  c.attention.heads = 2;
  c.attention.causal = true;
  c.ff.dim = 8;
  c.shift_tokens = true;
  c.token_shifts = {0, 1};
  EXPECT_EQ(Block(c, 0).shift->shifts, (std::vector<int64_t>{0, 1}));
  c.token_shifts = {-1, 0, 1};
  forge::testing::expect_error([&] { Block(c, 0); }, {"token_shifts", "0 or 1", "-1"});
}

}  // namespace
}  // namespace forge::nn
