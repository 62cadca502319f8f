// Models: every mechanism through every model (forward, backward, a finite
// gradient on every parameter), causality of the language model, recurrent
// generation against full recomputation, state-dict round trips, the ViT
// parameter counts of timm, tied and factorized embeddings, the dual encoder,
// encoder-decoder generation, ImageEfficientAttention gradients and config errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <set>
#include <string>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "tests/nn/nn_test_util.h"
#include "tests/test_util.h"

namespace forge::nn {
namespace {

using namespace forge::testing;

constexpr int64_t kLen = 8;  // the sequence length (and max_len) of the tiny models

enum class ModelKind {
  vit,
  classifier_tokens,
  classifier_vectors,
  language_model,
  encoder_decoder
};

constexpr NameTable<ModelKind, 5> kModelKindNames{
    "model kind",
    {"vit", "classifier_tokens", "classifier_vectors", "language_model", "encoder_decoder"}};

bool has_causal_form(Mechanism m) {
  return m == Mechanism::softmax || m == Mechanism::local || m == Mechanism::efficient ||
         m == Mechanism::linear || m == Mechanism::favor;
}

// Two heads of d = 4 on D = 8, options small enough for length kLen.
AttentionConfig tiny_attention(Mechanism kind) {
  return AttentionConfig{
      .kind = kind, .heads = 2, .local_window = 4, .bucket_size = 2, .nb_features = 8, .k = 4};
}

StackConfig tiny_stack(Mechanism kind) {
  StackConfig s;
  s.depth = 2;
  s.block.attention = tiny_attention(kind);
  s.block.ff.mult = 2;
  return s;
}

LanguageModelConfig tiny_lm(Mechanism kind, DType dtype = DType::f32) {
  return LanguageModelConfig{
      .vocab_size = 11, .max_len = kLen, .dim = 8, .stack = tiny_stack(kind), .dtype = dtype};
}

SequenceClassifierConfig tiny_classifier(Mechanism kind) {
  return SequenceClassifierConfig{
      .vocab_size = 11, .max_len = kLen, .dim = 8, .classes = 3, .stack = tiny_stack(kind)};
}

// (B, N) u8: row b has lengths[b] real tokens, then padding.
Tensor length_mask(const std::vector<int64_t>& lengths, int64_t N) {
  std::vector<uint8_t> m;
  for (int64_t len : lengths)
    for (int64_t i = 0; i < N; ++i) m.push_back(i < len ? 1 : 0);
  return Tensor::from_vector(m, {static_cast<int64_t>(lengths.size()), N});
}

void expect_finite_grads(const Module& model) {
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name << " received no gradient";
    for (double g : p.grad().to_vector<double>())
      ASSERT_TRUE(std::isfinite(g)) << name << " has a non-finite gradient";
  }
}

// ---- every mechanism through every model ----

using MechanismAndModel = std::tuple<Mechanism, ModelKind>;

class ModelsEveryMechanism : public ::testing::TestWithParam<MechanismAndModel> {};

TEST_P(ModelsEveryMechanism, ForwardBackwardGivesEveryParameterAFiniteGradient) {
  const auto [mech, kind] = GetParam();
  Generator g(1);
  std::shared_ptr<Module> model;
  Tensor out;
  switch (kind) {
    case ModelKind::vit: {
      ViTConfig c = tiny_vit_config();
      c.stack = tiny_stack(mech);
      auto vit = std::make_shared<ViT>(c, &g);
      out = vit->forward(Tensor::randn({2, 2, 8, 8}, DType::f32, &g));
      EXPECT_EQ(out.shape(), (Shape{2, 3}));
      model = vit;
      break;
    }
    case ModelKind::classifier_tokens: {
      auto clf = std::make_shared<SequenceClassifier>(tiny_classifier(mech), &g);
      out = clf->forward(random_ids(2, kLen, 11, 2), length_mask({kLen, 5}, kLen));
      EXPECT_EQ(out.shape(), (Shape{2, 3}));
      model = clf;
      break;
    }
    case ModelKind::classifier_vectors: {
      SequenceClassifierConfig c = tiny_classifier(mech);
      c.vocab_size = 0;
      c.input_dim = 3;
      c.pool = Pool::mean;
      c.positional = PositionalKind::sinusoidal;
      auto clf = std::make_shared<SequenceClassifier>(c, &g);
      // Shorter than max_len: any length up to the maximum at call time.
      out = clf->forward(Tensor::randn({2, 6, 3}, DType::f32, &g), length_mask({6, 4}, 6));
      EXPECT_EQ(out.shape(), (Shape{2, 3}));
      model = clf;
      break;
    }
    case ModelKind::language_model: {
      if (!has_causal_form(mech)) {
        expect_error([&] { LanguageModel lm(tiny_lm(mech), &g); }, {"has no causal form"});
        return;
      }
      auto lm = std::make_shared<LanguageModel>(tiny_lm(mech), &g);
      out = lm->forward(random_ids(2, kLen, 11, 3), length_mask({kLen, 6}, kLen));
      EXPECT_EQ(out.shape(), (Shape{2, kLen, 11}));
      model = lm;
      break;
    }
    case ModelKind::encoder_decoder: {
      EncoderDecoderConfig c;
      c.encoder = tiny_lm(mech);
      c.decoder = tiny_lm(mech);
      if (!has_causal_form(mech)) {
        expect_error([&] { EncoderDecoder ed(c, &g); }, {"EncoderDecoderConfig.decoder"});
        c.decoder.stack.block.attention = tiny_attention(Mechanism::softmax);
      }
      // The decoder's context attention uses the mechanism too (local is self-attention only).
      c.decoder.stack.block.cross =
          tiny_attention(mech == Mechanism::local ? Mechanism::softmax : mech);
      auto ed = std::make_shared<EncoderDecoder>(c, &g);
      out = ed->forward(random_ids(2, kLen, 11, 4), random_ids(2, 6, 11, 5),
                        length_mask({kLen, 5}, kLen), length_mask({6, 6}, 6));
      EXPECT_EQ(out.shape(), (Shape{2, 6, 11}));
      model = ed;
      break;
    }
  }
  autograd::backward(ops::sum(ops::square(out)));
  expect_finite_grads(*model);
}

INSTANTIATE_TEST_SUITE_P(
    Models, ModelsEveryMechanism,
    ::testing::Combine(::testing::Values(Mechanism::softmax, Mechanism::local, Mechanism::efficient,
                                         Mechanism::linear, Mechanism::taylor_linear,
                                         Mechanism::linformer, Mechanism::favor,
                                         Mechanism::taylorshift),
                       ::testing::Values(ModelKind::vit, ModelKind::classifier_tokens,
                                         ModelKind::classifier_vectors, ModelKind::language_model,
                                         ModelKind::encoder_decoder)),
    [](const ::testing::TestParamInfo<MechanismAndModel>& info) {
      return std::string(mechanism_name(std::get<0>(info.param))) + "_" +
             name_of(kModelKindNames, std::get<1>(info.param));
    });

// ---- causality and generation ----

// The causal configurations: each causal mechanism, efficient with and without buckets.
std::vector<std::pair<std::string, AttentionConfig>> causal_variants() {
  std::vector<std::pair<std::string, AttentionConfig>> out;
  for (Mechanism m : {Mechanism::softmax, Mechanism::local, Mechanism::efficient, Mechanism::linear,
                      Mechanism::favor})
    out.emplace_back(mechanism_name(m), tiny_attention(m));
  AttentionConfig e1 = tiny_attention(Mechanism::efficient);
  e1.bucket_size = 1;
  out.emplace_back("efficient/bucket_size=1", e1);
  AttentionConfig mixed = tiny_attention(Mechanism::favor);
  mixed.n_local_heads = 1;  // one local head beside one favor head
  out.emplace_back("favor+local head", mixed);
  return out;
}

TEST(ModelsLanguageModel, CausalModelLeaksNothingFromLaterTokens) {
  for (const auto& [name, attention] : causal_variants()) {
    SCOPED_TRACE(name);
    Generator g(7);
    LanguageModelConfig c = tiny_lm(Mechanism::softmax, DType::f64);
    c.stack.block.attention = attention;
    LanguageModel lm(c, &g);
    lm.eval();
    const Tensor a = random_ids(2, kLen, 11, 8);
    const Tensor logits_a = lm.forward(a);
    for (int64_t i : {0, 2, 5}) {
      auto ids = a.to_vector<int64_t>();
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t j = i + 1; j < kLen; ++j) ids[b * kLen + j] = (ids[b * kLen + j] + 3) % 11;
      const Tensor logits_b = lm.forward(Tensor::from_vector(ids, {2, kLen}));
      EXPECT_EQ(
          max_abs_diff(ops::narrow(logits_a, 1, 0, i + 1), ops::narrow(logits_b, 1, 0, i + 1)), 0.0)
          << "positions <= " << i << " changed";
      EXPECT_GT(
          max_abs_diff(ops::narrow(logits_a, 1, i + 1, 1), ops::narrow(logits_b, 1, i + 1, 1)), 0.0)
          << "the later tokens changed nothing at all";
    }
  }
}

TEST(ModelsLanguageModel, RecurrentGenerateEqualsRecomputation) {
  // The recurrent mechanisms, plus linear with rotary positions, token shift
  // and a factorized embedding, and favor with rotary_only (the per-token
  // offsets and states of each).
  std::vector<std::pair<std::string, LanguageModelConfig>> variants;
  for (const auto& [name, attention] : causal_variants()) {
    if (attention.kind == Mechanism::softmax || attention.kind == Mechanism::local ||
        attention.n_local_heads > 0)
      continue;
    LanguageModelConfig c = tiny_lm(Mechanism::softmax, DType::f64);
    c.stack.block.attention = attention;
    variants.emplace_back(name, c);
  }
  LanguageModelConfig rotary = tiny_lm(Mechanism::linear, DType::f64);
  rotary.positional = PositionalKind::rotary;
  rotary.stack.block.shift_tokens = true;
  rotary.emb_dim = 4;
  variants.emplace_back("linear/rotary+shift_tokens+emb_dim", rotary);
  LanguageModelConfig rotary_only = tiny_lm(Mechanism::favor, DType::f64);
  rotary_only.positional = PositionalKind::rotary_only;
  variants.emplace_back("favor/rotary_only", rotary_only);
  LanguageModelConfig per_layer = tiny_lm(Mechanism::linear, DType::f64);
  per_layer.stack.layer_attention = {tiny_attention(Mechanism::favor),
                                     tiny_attention(Mechanism::efficient)};
  variants.emplace_back("favor then efficient (per layer)", per_layer);
  for (auto& [name, c] : variants) {
    SCOPED_TRACE(name);
    c.max_len = 12;
    Generator g(9);
    LanguageModel lm(c, &g);
    ASSERT_TRUE(lm.stack().supports_recurrent());
    const Tensor prime = random_ids(2, 3, 11, 10);
    GenerateOptions recurrent{.greedy = true}, full{.greedy = true, .use_recurrent_state = false};
    const Tensor greedy = lm.generate(prime, 8, recurrent);
    EXPECT_EQ(greedy.shape(), (Shape{2, 11}));
    EXPECT_EQ(greedy.to_vector<int64_t>(), lm.generate(prime, 8, full).to_vector<int64_t>());
    Generator s1(11), s2(11);
    const GenerateOptions sample_rec{.temperature = 0.7, .top_k = 6, .gen = &s1};
    const GenerateOptions sample_full{
        .temperature = 0.7, .top_k = 6, .use_recurrent_state = false, .gen = &s2};
    const auto sampled = lm.generate(prime, 8, sample_rec).to_vector<int64_t>();
    EXPECT_EQ(sampled, lm.generate(prime, 8, sample_full).to_vector<int64_t>());
    EXPECT_GT(std::set<int64_t>(sampled.begin() + 3, sampled.begin() + 11).size(), 1u)
        << "sampling drew one token throughout";
    EXPECT_TRUE(lm.is_training()) << "generate must restore the training mode";
  }
}

TEST(ModelsLanguageModel, TrainingForwardsTickTheFeatureRedraw) {
  Generator g(13);
  LanguageModelConfig c = tiny_lm(Mechanism::favor);
  c.stack.block.attention.feature_redraw_interval = 1;  // redraw on every second tick
  LanguageModel lm(c, &g);
  const Tensor& W = lm.stack().blocks[0]->attn->projection_matrix;
  const Tensor ids = random_ids(1, 4, 11, 1);
  const auto forward_changes_W = [&] {
    const Tensor before = W.clone();
    lm.forward(ids);
    lm.forward(ids);
    return max_abs_diff(before, W) > 0;
  };
  EXPECT_TRUE(forward_changes_W());
  lm.eval();
  EXPECT_FALSE(forward_changes_W()) << "eval forwards must not redraw";
  lm.train();
  lm.fix_projections();
  EXPECT_FALSE(forward_changes_W()) << "fixed projections must not redraw";
}

TEST(ModelsLanguageModel, GenerateStopsAtEosAndIsSeeded) {
  Generator g(12);
  LanguageModel lm(tiny_lm(Mechanism::linear), &g);
  const Tensor prime = random_ids(3, 2, 11, 13);
  Generator a(5), b(5), c(6);
  const auto run = [&](Generator& gen, int64_t eos) {
    return lm.generate(prime, 6, {.filter_thres = 0.5, .eos = eos, .gen = &gen});
  };
  const Tensor first = run(a, -1);
  EXPECT_EQ(first.shape(), (Shape{3, 8}));
  EXPECT_EQ(first.to_vector<int64_t>(), run(b, -1).to_vector<int64_t>());
  EXPECT_NE(first.to_vector<int64_t>(), run(c, -1).to_vector<int64_t>());
  // With eos = the token row 0 drew first, row 0 ends there and repeats eos.
  const auto t = first.to_vector<int64_t>();
  const int64_t eos = t[2];
  Generator d(5);
  const Tensor stopped = run(d, eos);
  const auto s = stopped.to_vector<int64_t>();
  const int64_t L = stopped.size(1);
  EXPECT_LE(L, 8);
  for (int64_t j = 2; j < L; ++j) EXPECT_EQ(s[j], eos) << "row 0, position " << j;
  for (int64_t r = 0; r < 3; ++r) {  // every row: tokens up to its first eos as before, then eos
    bool ended = false;
    for (int64_t j = 2; j < L; ++j) {
      EXPECT_EQ(s[r * L + j], ended ? eos : t[r * 8 + j]) << "row " << r << ", position " << j;
      ended = ended || s[r * L + j] == eos;
    }
  }
}

// ---- state dicts ----

template <typename M, typename Config, typename Fn>
void expect_round_trip(const Config& config, const std::string& file, Fn&& run) {
  Generator g1(1), g2(2);
  M a(config, &g1), b(config, &g2);
  a.eval();
  b.eval();
  const Tensor before = run(b);
  const std::string path = (std::filesystem::temp_directory_path() / file).string();
  a.save(path);
  EXPECT_TRUE(b.load(path).ok());
  std::filesystem::remove(path);
  EXPECT_GT(max_abs_diff(before, run(b)), 0.0);
  EXPECT_EQ(max_abs_diff(run(a), run(b)), 0.0);
}

TEST(ModelsStateDict, SafetensorsRoundTripGivesTheSameOutputs) {
  LanguageModelConfig lm = tiny_lm(Mechanism::favor);  // a buffer (the features) too
  lm.positional = PositionalKind::rotary;
  lm.emb_dim = 4;
  const Tensor ids = random_ids(2, kLen, 11, 14);
  expect_round_trip<LanguageModel>(lm, "forge_models_lm.safetensors",
                                   [&](LanguageModel& m) { return m.forward(ids); });
  ViTConfig vit{.image_size = 8,
                .patch_size = 4,
                .channels = 1,
                .classes = 2,
                .dim = 8,
                .depth = 1,
                .heads = 2};
  Generator g(15);
  const Tensor images = Tensor::randn({2, 1, 8, 8}, DType::f32, &g);
  expect_round_trip<ViT>(vit, "forge_models_vit.safetensors",
                         [&](ViT& m) { return m.forward(images); });
}

// ---- ViT ----

TEST(ModelsViT, ParameterCountsMatchTimm) {
  // timm's vit_{tiny,small,base}_patch16_224: qkv with bias, pos_embed over 196
  // patches + CLS, a 1000-class head. Ti and S are built whole; B (86.6M
  // parameters, seconds of initialisation) as depth 1 plus 11 more of its block.
  EXPECT_EQ(ViT(ViTConfig::preset("Ti")).num_parameters(), 5717416);
  EXPECT_EQ(ViT(ViTConfig::preset("S")).num_parameters(), 22050664);
  ViTConfig b = ViTConfig::preset("B");
  EXPECT_EQ(b.dim, 768);
  EXPECT_EQ(b.heads, 12);
  EXPECT_EQ(b.depth, 12);
  b.depth = 1;
  ViT one_block(b);
  EXPECT_EQ(one_block.num_parameters() + 11 * one_block.stack().blocks[0]->num_parameters(),
            86567656);
  const ViTConfig s = ViTConfig::preset("S", 32, 4, 10);
  EXPECT_EQ(s.dim, 384);
  EXPECT_EQ(s.image_size, 32);
  EXPECT_EQ(s.patch_size, 4);
  EXPECT_EQ(s.classes, 10);
}

TEST(ModelsViT, MeanPoolingHasNoClsTokenAndTimmInit) {
  ViTConfig c{.image_size = 8,
              .patch_size = 2,
              .channels = 1,
              .classes = 4,
              .dim = 64,
              .depth = 1,
              .heads = 4,
              .pool = Pool::mean};
  Generator g(3);
  ViT vit(c, &g);
  EXPECT_FALSE(vit.cls_token.defined());
  EXPECT_EQ(vit.pos_embed.shape(), (Shape{1, 16, 64}));
  // timm: Linear weights trunc_normal(std .02), biases 0.
  const auto w = vit.head->weight.to_vector<double>();
  double ss = 0;
  for (double x : w) ss += x * x;
  EXPECT_NEAR(std::sqrt(ss / static_cast<double>(w.size())), 0.02, 0.004);
  expect_close(vit.head->bias, Tensor::zeros({4}), 0.0);
  expect_close(vit.stack().blocks[0]->attn->to_q->bias, Tensor::zeros({64}), 0.0);
  EXPECT_EQ(vit.forward(Tensor::randn({3, 1, 8, 8}, DType::f32, &g)).shape(), (Shape{3, 4}));
  // Linformer's E/F keep their Xavier init (std sqrt(2 / (16 + 16)) = .25), not timm's .02.
  c.stack.block.attention.kind = Mechanism::linformer;
  c.stack.block.attention.k = 16;
  ViT lin(c, &g);
  const auto e = lin.stack().bank->E(0, 0).weight.to_vector<double>();
  ss = 0;
  for (double x : e) ss += x * x;
  EXPECT_GT(std::sqrt(ss / static_cast<double>(e.size())), 0.15);
}

// ---- embeddings ----

TEST(ModelsLanguageModel, TiedEmbeddingIsOneParameter) {
  Generator g(4);
  LanguageModelConfig c = tiny_lm(Mechanism::linear);
  LanguageModel untied(c, &g);
  c.tie_embedding = true;
  LanguageModel tied(c, &g);
  EXPECT_TRUE(tied.to_logits->weight.same(tied.token_emb->weight));
  int64_t listed = 0;
  for (const auto& [name, _] : tied.named_parameters()) {
    EXPECT_NE(name, "to_logits.weight");
    listed += name == "token_emb.weight";
  }
  EXPECT_EQ(listed, 1);
  EXPECT_EQ(tied.state_dict().count("to_logits.weight"), 1u);  // each name in the state dict
  EXPECT_EQ(untied.num_parameters() - tied.num_parameters(), 11 * 8 + 11);  // weight + bias
  // Both uses of the one tensor reach its gradient.
  autograd::backward(ops::sum(ops::square(tied.forward(random_ids(2, 5, 11, 1)))));
  expect_finite_grads(tied);
}

TEST(ModelsLanguageModel, FactorizedEmbeddingShapes) {
  Generator g(5);
  LanguageModelConfig c = tiny_lm(Mechanism::softmax);
  c.emb_dim = 4;
  LanguageModel lm(c, &g);
  const auto sd = lm.state_dict();
  EXPECT_EQ(sd.at("token_emb.weight").shape(), (Shape{11, 4}));
  EXPECT_EQ(sd.at("project_in.weight").shape(), (Shape{8, 4}));
  EXPECT_EQ(sd.at("project_out.weight").shape(), (Shape{4, 8}));
  EXPECT_EQ(sd.at("to_logits.weight").shape(), (Shape{11, 4}));
  EXPECT_EQ(lm.forward(random_ids(2, 5, 11, 2)).shape(), (Shape{2, 5, 11}));
  c.tie_embedding = true;
  LanguageModel tied(c, &g);
  EXPECT_TRUE(tied.to_logits->weight.same(tied.token_emb->weight));
  // Non-causal (MLM-style) and the other positional kinds build and run.
  for (PositionalKind p : {PositionalKind::none, PositionalKind::sinusoidal, PositionalKind::rotary,
                           PositionalKind::rotary_only, PositionalKind::axial}) {
    SCOPED_TRACE(name_of(kPositionalNames, p));
    EXPECT_EQ(enum_from_name(kPositionalNames, name_of(kPositionalNames, p)), p);
    LanguageModelConfig m = tiny_lm(Mechanism::taylor_linear);
    m.causal = false;
    m.positional = p;
    m.axial_shape = {2, 4};
    LanguageModel mlm(m, &g);
    EXPECT_EQ(mlm.forward(random_ids(2, kLen, 11, 3)).shape(), (Shape{2, kLen, 11}));
  }
}

// ---- classifier ----

TEST(ModelsSequenceClassifier, DualEncoderClassifiesThePairFeatures) {
  Generator g(6);
  SequenceClassifierConfig c = tiny_classifier(Mechanism::efficient);
  c.dual_encoder = true;
  c.mlp_dim = 5;
  SequenceClassifier clf(c, &g);
  const Tensor a = random_ids(2, kLen, 11, 1), b = random_ids(2, 6, 11, 2);
  const Tensor ma = length_mask({kLen, 3}, kLen), mb = length_mask({6, 6}, 6);
  const Tensor logits = clf.forward_pair(a, ma, b, mb);
  EXPECT_EQ(logits.shape(), (Shape{2, 3}));
  const Tensor u = clf.encode(a, ma), v = clf.encode(b, mb);
  const Tensor ref =
      clf.head->forward(ops::relu(clf.mlp->forward(ops::cat({u, v, u * v, u - v}, -1))));
  EXPECT_EQ(max_abs_diff(logits, ref), 0.0);
  autograd::backward(ops::sum(ops::square(logits)));
  expect_finite_grads(clf);
  expect_error([&] { clf.forward(a, ma); }, {"forward_pair"});
  SequenceClassifier single(tiny_classifier(Mechanism::efficient), &g);
  expect_error([&] { single.forward_pair(a, ma, b, mb); }, {"dual_encoder"});
}

TEST(ModelsSequenceClassifier, PaddingDoesNotChangeTheResult) {
  // Mean pooling over real tokens and masked keys: a padded batch element
  // classifies as its unpadded prefix.
  Generator g(8);
  SequenceClassifierConfig c = tiny_classifier(Mechanism::softmax);
  c.pool = Pool::mean;
  c.dtype = DType::f64;
  SequenceClassifier clf(c, &g);
  clf.eval();
  const Tensor ids = random_ids(1, kLen, 11, 3);
  const Tensor padded = clf.forward(ids, length_mask({5}, kLen));
  const Tensor prefix = clf.forward(ops::narrow(ids, 1, 0, 5));
  EXPECT_LE(max_abs_diff(padded, prefix), 1e-12);
}

// ---- encoder-decoder ----

TEST(ModelsEncoderDecoder, GenerateShapeDeterminismAndRecurrence) {
  Generator g(10);
  EncoderDecoderConfig c;
  c.encoder = tiny_lm(Mechanism::linformer);
  c.decoder = tiny_lm(Mechanism::linear);
  c.decoder.max_len = 12;
  c.decoder.stack.block.cross = tiny_attention(Mechanism::linformer);  // fixed context length
  c.dtype = DType::f64;
  EncoderDecoder ed(c, &g);
  EXPECT_EQ(ed.config.decoder.stack.block.cross.seq_len, kLen);
  const Tensor src = random_ids(2, 6, 11, 1), start = random_ids(2, 1, 11, 2);
  const Tensor src_mask = length_mask({6, 4}, 6);
  EXPECT_EQ(ed.encode(src, src_mask).shape(), (Shape{2, 6, 8}));
  Generator a(3), b(3);
  const Tensor out = ed.generate(src, start, 7, {.gen = &a}, src_mask);
  EXPECT_EQ(out.shape(), (Shape{2, 8}));
  EXPECT_EQ(out.to_vector<int64_t>(),
            ed.generate(src, start, 7, {.gen = &b}, src_mask).to_vector<int64_t>());
  EXPECT_EQ(ed.generate(src, start, 7, {.greedy = true}, src_mask).to_vector<int64_t>(),
            ed.generate(src, start, 7, {.greedy = true, .use_recurrent_state = false}, src_mask)
                .to_vector<int64_t>());
}

// ---- ImageEfficientAttention ----

TEST(ModelsImageEfficientAttention, MatchesTheReferenceAndGradchecks) {
  Generator g(11);
  ImageEfficientAttention attn(
      {.channels = 2, .heads = 2, .key_dim = 3, .value_dim = 2, .dtype = DType::f64}, &g);
  const Tensor x = leaf64({2, 2, 2, 3}, 12);
  const Tensor y = attn.forward(x);
  EXPECT_EQ(y.shape(), x.shape());
  // linear-attention-transformer's ImageLinearAttention, from primitive ops.
  {
    NoGradGuard no_grad;
    const Tensor px = ops::reshape(ops::permute(x, {0, 2, 3, 1}), {2, 6, 2});
    const auto heads = [&](Linear& l, int64_t d) {
      return ops::permute(ops::reshape(l.forward(px), {2, 6, 2, d}), {0, 2, 1, 3});
    };
    const double s = std::pow(3.0, -0.25);
    const Tensor q = ops::softmax(heads(*attn.to_q, 3) * s, -1);           // over features
    const Tensor k = ops::softmax(heads(*attn.to_k, 3) * s, 2);            // over pixels
    const Tensor ctx = ops::matmul(k, heads(*attn.to_v, 2), true, false);  // (B, h, dk, dv)
    const Tensor o = ops::reshape(ops::permute(ops::matmul(q, ctx), {0, 2, 1, 3}), {2, 6, 4});
    const Tensor ref =
        ops::permute(ops::reshape(attn.to_out->forward(o), {2, 2, 3, 2}), {0, 3, 1, 2});
    expect_close(y, ref, 1e-12);
  }
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        attn.to_q->weight = in[1];
        attn.to_k->weight = in[2];
        attn.to_v->bias = in[3];
        attn.to_out->weight = in[4];
        return attn.forward(in[0]);
      },
      {x, attn.to_q->weight, attn.to_k->weight, attn.to_v->bias, attn.to_out->weight});
}

// ---- configuration errors ----

TEST(ModelsConfig, BadConfigsGiveClearErrors) {
  ViTConfig vit = ViTConfig::preset("Ti", 30, 16, 10);
  expect_error([&] { vit.validate(); }, {"ViTConfig.image_size 30 is not divisible"});
  expect_error([] { ViTConfig::preset("L"); }, {"expected Ti, S or B"});
  ViTConfig small{.image_size = 8, .patch_size = 4, .dim = 8, .depth = 1, .heads = 2};
  ViT ok(small);
  const Tensor wrong_size = Tensor::zeros({1, 3, 12, 12});
  expect_error([&] { ok.forward(wrong_size); }, {"expected images (B, 3, 8, 8)"});

  SequenceClassifierConfig clf = tiny_classifier(Mechanism::softmax);
  clf.vocab_size = 0;
  expect_error([&] { SequenceClassifier m(clf); }, {"SequenceClassifierConfig.input_dim"});
  SequenceClassifier tokens(tiny_classifier(Mechanism::softmax));
  expect_error([&] { tokens.forward(random_ids(1, kLen + 1, 11, 1)); }, {"max_len = 8"});
  expect_error([&] { tokens.forward(random_ids(1, 4, 11, 1), length_mask({4}, 5)); },
               {"expected a mask"});

  LanguageModelConfig lm = tiny_lm(Mechanism::taylorshift);
  expect_error([&] { LanguageModel m(lm); }, {"stack.block.attention.kind = taylorshift"});
  lm = tiny_lm(Mechanism::softmax);
  lm.stack.layer_attention = {tiny_attention(Mechanism::linear),
                              tiny_attention(Mechanism::linformer)};
  expect_error([&] { LanguageModel m(lm); }, {"stack.layer_attention[1].kind = linformer"});
  lm = tiny_lm(Mechanism::softmax);
  lm.positional = PositionalKind::axial;
  lm.axial_shape = {2, 3};
  expect_error([&] { LanguageModel m(lm); }, {"covers 6 positions"});
  lm = tiny_lm(Mechanism::softmax);
  lm.norm_eps = 0;
  expect_error([&] { LanguageModel m(lm); }, {"LanguageModelConfig.norm_eps must be > 0"});
  lm = tiny_lm(Mechanism::softmax);
  lm.dim = 9;
  lm.stack.block.attention.head_dim = 4;
  lm.positional = PositionalKind::rotary;
  expect_error([&] { LanguageModel m(lm); }, {"rotary adds sinusoids, so dim must be even"});
  lm.positional = PositionalKind::rotary_only;
  EXPECT_NO_THROW(LanguageModel{lm});
  lm = tiny_lm(Mechanism::softmax);
  lm.tie_embedding = true;
  lm.return_embeddings = true;
  expect_error([&] { LanguageModel m(lm); }, {"tie_embedding"});
  LanguageModel model(tiny_lm(Mechanism::linear));
  const Tensor prime = random_ids(1, 2, 11, 1);
  expect_error([&] { model.generate(prime, 3, {.temperature = 0}); }, {"temperature"});
  // Past max_len the state is rebuilt (Generation.PastTheWindow...); a keep of
  // the whole window leaves no room for a token.
  expect_error([&] { model.generate(prime, kLen, {.rebase_keep = kLen}); }, {"rebase_keep"});
  EXPECT_EQ(model.generate(prime, kLen, {.use_recurrent_state = false}).shape(),
            (Shape{1, 2 + kLen}));  // a sliding window past max_len

  EncoderDecoderConfig ed;
  ed.encoder = tiny_lm(Mechanism::softmax);
  ed.decoder = tiny_lm(Mechanism::softmax);
  ed.decoder.max_len = 0;
  expect_error([&] { EncoderDecoder m(ed); }, {"EncoderDecoderConfig.decoder.max_len"});
  expect_error([] { ImageEfficientAttention m({.channels = 0}); },
               {"ImageEfficientAttentionConfig.channels"});
}

}  // namespace
}  // namespace forge::nn
