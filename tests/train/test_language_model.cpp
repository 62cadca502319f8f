// Language models and encoder-decoders from recipes, end to end: a byte-level
// LM learns and reports bits per byte, resumes bit-exactly, evaluates from its
// checkpoint and generates from it deterministically; the copy task trains an
// encoder-decoder that generates; bad text data is a clear error that creates
// no run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numbers>
#include <string>

#include "tests/test_util.h"
#include "tests/train/train_test_util.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/generate.h"
#include "train/metrics.h"
#include "train/model.h"
#include "train/recipe.h"
#include "train/trainer.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using namespace forge::testing;

// A corpus with structure a small model picks up in a few hundred steps:
// repeated words in a fixed order, with counters.
std::string corpus_text() {
  std::string s;
  for (int i = 0; i < 600; ++i)
    s += "the cat sat on the mat. the dog ate the hat. " + std::to_string(i % 10) + "\n";
  return s;
}

Recipe lm_recipe(const fs::path& corpus) {
  Recipe r = Recipe::from_yaml(R"(
name: lm
seed: 5
threads: 2
model:
  type: language_model
  dim: 32
  depth: 2
  heads: 2
  mlp_ratio: 2
  dropout: 0.1
  positional: rotary
  attention:
    kind: linear
data:
  dataset: lm_text
  split_fractions: [0.9, 1.0, 1.0]
  seq_len: 32
  train_split: train
  eval_split: valid
  workers: 2
optimizer:
  name: adamw
  lr: 1.0e-2
  clip_grad_norm: 1.0
schedule:
  kind: cosine
  warmup_steps: 10
loop:
  steps: 120
  batch_size: 16
  eval_every: 60
  log_every: 20
checkpoint:
  keep_last: 2
)",
                               "lm.yaml");
  r.set("data.root=" + corpus.string());
  return r;
}

struct Corpus {
  forge::testing::TempDir tmp;
  fs::path file = tmp.path() / "corpus.txt";
  Corpus() { forge::testing::write_file(file, corpus_text()); }
};

std::map<std::string, Tensor> final_weights(const fs::path& run) {
  CheckpointManager m(run.string(), 2, 1, "eval_loss", "min", [](const std::string&) {});
  return read_checkpoint(*m.latest()).model;
}

TEST(LanguageModelRecipe, LearnsAndReportsBitsPerByte) {
  const Corpus c;
  const fs::path dir = fresh_dir("learns");
  const TrainResult t = train(lm_recipe(c.file), quiet(dir));
  EXPECT_EQ(t.steps, 120);
  std::vector<double> train_loss;
  const json::Value* last_eval = nullptr;
  const auto records = read_metrics((dir / "metrics.jsonl").string());
  for (const auto& rec : records) {
    if (rec.at("split").as_string() == "train")
      train_loss.push_back(rec.at("loss").as_double());
    else
      last_eval = &rec;
    // Bits per byte and perplexity are the loss (nats per byte) seen two ways.
    const double loss = rec.at("loss").as_double();
    EXPECT_NEAR(rec.at("bits_per_byte").as_double(), loss / std::numbers::ln2, 1e-12);
    EXPECT_NEAR(rec.at("perplexity").as_double(), std::exp(loss), 1e-9);
  }
  ASSERT_GE(train_loss.size(), 4u);
  EXPECT_LT(train_loss.back(), 0.6 * train_loss.front()) << "the loss did not fall";
  ASSERT_NE(last_eval, nullptr);
  // The evaluation is one sequential pass over the validation bytes: every byte
  // but the first is a target once (10% of the corpus).
  const int64_t valid_bytes =
      static_cast<int64_t>(corpus_text().size()) -
      static_cast<int64_t>(std::floor(0.9 * static_cast<double>(corpus_text().size())));
  EXPECT_EQ(last_eval->at("tokens").as_int(), valid_bytes - 1);
  EXPECT_LT(last_eval->at("bits_per_byte").as_double(), 3.0) << "8 bits is knowing nothing";
  // The best checkpoint is the lowest evaluation loss.
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "best"));

  // eval from the checkpoint gives the same figures.
  const EvalResult e = evaluate_checkpoint(t.last_checkpoint, "", {});
  EXPECT_NEAR(e.loss, t.eval_loss, 1e-12);
  ASSERT_TRUE(e.bits_per_byte.has_value());
  EXPECT_NEAR(*e.bits_per_byte, t.eval_loss / std::numbers::ln2, 1e-12);
  EXPECT_EQ(e.predictions, valid_bytes - 1);
  fs::remove_all(dir);
}

TEST(LanguageModelRecipe, InterruptedAndResumedRunIsBitIdentical) {
  const Corpus c;
  Recipe r = lm_recipe(c.file);
  r.set("loop.steps=30");
  r.set("loop.eval_every=12");
  r.set("checkpoint.every=10");
  const fs::path a = fresh_dir("uninterrupted"), b = fresh_dir("resumed");
  train(r, quiet(a));
  EXPECT_EQ(train(r, testing::stopping_at(b, 17)).status, TrainResult::Status::interrupted);
  EXPECT_EQ(train(Recipe::from_file((b / "recipe.yaml").string()), testing::resuming(b)).steps, 30);
  const auto wa = final_weights(a), wb = final_weights(b);
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, t] : wa)
    EXPECT_EQ(std::memcmp(t.raw_data(), wb.at(name).raw_data(), t.nbytes()), 0) << name;
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(LanguageModelRecipe, BadTextDataIsAClearErrorAndCreatesNoRun) {
  const forge::testing::TempDir tmp;
  const auto refused = [&](const std::string& root, std::vector<std::string> words,
                           const std::string& extra = "") {
    Recipe r = lm_recipe(root);
    if (!extra.empty()) r.set(extra);
    const fs::path dir = fresh_dir("bad");
    forge::testing::expect_error([&] { train(r, quiet(dir)); }, words);
    EXPECT_FALSE(fs::exists(dir)) << "nothing is written for refused data";
  };
  forge::testing::write_file(tmp.path() / "empty.txt", "");
  refused((tmp.path() / "empty.txt").string(), {"empty.txt", "empty"});
  refused((tmp.path() / "missing.txt").string(), {"missing.txt"});
  forge::testing::write_file(tmp.path() / "short.txt", std::string(200, 'a'));
  // 200 bytes: valid is 20 bytes, fewer than a window of 32 + 1.
  refused((tmp.path() / "short.txt").string(), {"short.txt", "valid", "seq_len"});
  forge::testing::write_file(tmp.path() / "broken.txt.gz",
                             std::string("\x1f\x8b\x08\x00garbage", 12));
  refused((tmp.path() / "broken.txt.gz").string(), {"broken.txt.gz"});
  // A classifier on next-token data, and split points given two ways.
  const Corpus c;
  refused(c.file.string(), {"model.type vit", "language_model"}, "model.type=vit");
  refused(c.file.string(), {"split_bytes", "split_fractions"}, "data.split_bytes=[10, 20, 30]");
}

TEST(Generate, ContinuesAPromptDeterministicallyForASeedAndStreams) {
  const Corpus c;
  Recipe r = lm_recipe(c.file);
  r.set("loop.steps=40");
  const fs::path dir = fresh_dir("generate");
  train(r, quiet(dir));

  GenerateRequest q;
  q.checkpoint = dir.string();  // a run directory: its latest checkpoint
  q.prompt = "the cat ";
  q.length = 64;
  q.seed = 7;
  std::vector<std::string> pieces;
  const GenerateResult g = generate(q, [&](std::string_view s) { pieces.emplace_back(s); });
  EXPECT_EQ(g.prompt_tokens, 8);
  EXPECT_EQ(g.generated, 64);
  ASSERT_EQ(pieces.size(), 64u) << "one piece per byte, as it is drawn";
  std::string once;
  for (const auto& p : pieces) once += p;
  std::string again;
  generate(q, [&](std::string_view s) { again += s; });
  EXPECT_EQ(once, again) << "a seed gives one output";
  q.seed = 8;
  std::string other;
  generate(q, [&](std::string_view s) { other += s; });
  EXPECT_NE(once, other);

  // 8 + 64 tokens exceed the 32 positions: the state is rebuilt from the last
  // 16 tokens at 33, 50 and 67 tokens; exact_window recomputes the last 32
  // tokens for every token instead; within the positions, the state alone.
  EXPECT_TRUE(g.recurrent);
  EXPECT_EQ(g.rebuilds, 3);
  EXPECT_EQ(g.positions, 32);
  q.exact_window = true;
  const GenerateResult exact = generate(q, [](std::string_view) {});
  EXPECT_FALSE(exact.recurrent);
  EXPECT_EQ(exact.how(), "the last 32 tokens recomputed for every token: --exact-window");
  q.exact_window = false;
  q.greedy = true;
  q.length = 20;
  std::string recurrent;
  const GenerateResult within = generate(q, [&](std::string_view s) { recurrent += s; });
  EXPECT_TRUE(within.recurrent);
  EXPECT_EQ(within.rebuilds, 0);
  EXPECT_EQ(within.how(), "decoding state");
  EXPECT_EQ(recurrent.size(), 20u);

  q.prompt.clear();
  forge::testing::expect_error([&] { generate(q, [](std::string_view) {}); }, {"prompt"});
  q.checkpoint = (dir / "nowhere").string();
  forge::testing::expect_error([&] { generate(q, [](std::string_view) {}); }, {"nowhere"});
  fs::remove_all(dir);
}

TEST(EncoderDecoderRecipe, CopyTaskTrainsAndGeneratesFromASource) {
  Recipe r = Recipe::from_yaml(R"(
name: copy
seed: 1
threads: 2
model:
  type: encoder_decoder
  dim: 32
  encoder_depth: 1
  decoder_depth: 1
  heads: 2
  mlp_ratio: 2
  positional: learned
  attention:
    kind: softmax
data:
  dataset: copy
  copy_length: 6
  copy_vocab: 8
  generate_train: 256
  generate_eval: 32
  workers: 0
optimizer:
  name: adam
  lr: 3.0e-3
  weight_decay: 0.0
schedule:
  kind: constant
loop:
  steps: 150
  batch_size: 32
  eval_every: 75
  log_every: 25
)",
                               "copy.yaml");
  const fs::path dir = fresh_dir("copy");
  const TrainResult t = train(r, quiet(dir));
  EXPECT_EQ(t.steps, 150);
  // 6 random tokens of 6 kinds, then their copy: chance is 1/6 per token.
  EXPECT_GT(t.eval_accuracy, 0.45);

  GenerateRequest q;
  q.checkpoint = dir.string();
  q.source = "2 3 4 5 6 7";
  q.length = 12;
  q.greedy = true;
  std::string out;
  const GenerateResult g = generate(q, [&](std::string_view s) { out += s; });
  EXPECT_EQ(g.generated, 12);
  EXPECT_EQ(g.prompt_tokens, 1) << "the start token";
  // Twelve token ids separated by spaces.
  EXPECT_EQ(std::count(out.begin(), out.end(), ' '), 11) << out;
  q.source = "2 3 99";
  forge::testing::expect_error([&] { generate(q, [](std::string_view) {}); }, {"99", "[0, 8)"});
  q.source = "2 3 4 5 6 7 2";  // 7 tokens for an encoder of 6 positions
  forge::testing::expect_error([&] { generate(q, [](std::string_view) {}); },
                               {"7 tokens", "6 positions"});
  q.source.clear();
  forge::testing::expect_error([&] { generate(q, [](std::string_view) {}); }, {"--source"});
  fs::remove_all(dir);
}

// performer's copy recipe: the decoder's cross-attention uses the recipe's
// mechanism (FAVOR+, not causal), and no attention output has a bias.
TEST(EncoderDecoderRecipe, CrossAttentionFollowsTheRecipe) {
  Recipe r = Recipe::from_file(
      (fs::path(FORGE_SOURCE_DIR) / "recipes/seq2seq/copy_performer_reference.yaml").string());
  r.set("model.dim=64");
  Generator gen(0);
  const auto task = build_model(r, next_token_shape(r), DType::f32, &gen);
  bool cross_favor = false, out_bias = false;
  for (const auto& [name, t] : task->module().state_dict()) {
    cross_favor = cross_favor || name.find("cross_attn.projection_matrix") != std::string::npos;
    out_bias = out_bias || name.find("to_out.bias") != std::string::npos;
  }
  EXPECT_TRUE(cross_favor) << "the cross-attention is FAVOR+ as the self-attention";
  EXPECT_FALSE(out_bias) << "model.out_bias: false";
}

// The shipped CPU demo, as shipped but for its length: on Debian's fortunes
// (scripts/install-deps.sh installs the package) its loss falls within 40 of
// its 1200 steps. One thread: ctest runs the test binaries side by side.
TEST(ShippedDemo, FortunesTinyLossFalls) {
  Recipe r =
      Recipe::from_file((fs::path(FORGE_SOURCE_DIR) / "recipes/lm/fortunes_tiny.yaml").string());
  for (const char* s : {"loop.steps=40", "loop.log_every=10", "loop.eval_every=40",
                        "data.limit_eval=2", "schedule.warmup_steps=10", "threads=1"})
    r.set(s);
  const fs::path dir = fresh_dir("fortunes");
  const TrainResult t = train(r, quiet(dir));
  EXPECT_EQ(t.steps, 40);
  const std::vector<double> loss = testing::train_losses(dir);
  ASSERT_EQ(loss.size(), 4u);
  EXPECT_LT(loss.back(), 0.75 * loss.front()) << "from " << loss.front() << " to " << loss.back();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace forge::train
