// DeiT's training pipeline end to end (recipes/vit/imagefolder_tiny.yaml: a
// generated image folder, RandAugment, random erasing, repeated augmentation,
// mixup / cutmix, stochastic depth, an EMA of the weights): the shipped recipe
// learns and reports the EMA's accuracy beside the raw weights'; a stopped
// and resumed run ends with bit-identical weights and EMA; the EMA in a
// checkpoint is the average of the weights of every step (recomputed here from
// per-step checkpoints); ema.select_best picks the best checkpoint by the
// EMA's accuracy; eval, predict and export take the EMA with --ema;
// layer_decay scales the lower layers' updates.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/safetensors.h"
#include "tests/test_util.h"
#include "tests/train/train_test_util.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/metrics.h"
#include "train/predict.h"
#include "train/trainer.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using forge::testing::quiet;

Recipe tiny_imagefolder() {
  Recipe r =
      Recipe::from_file(std::string(FORGE_SOURCE_DIR) + "/recipes/vit/imagefolder_tiny.yaml");
  r.set("threads=2");
  return r;
}

// Every checkpoint of a run by step.
std::map<int64_t, Checkpoint> checkpoints(const std::string& run) {
  std::map<int64_t, Checkpoint> out;
  for (const auto& e : fs::directory_iterator(fs::path(run) / "checkpoints")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    out.emplace(std::stoll(name.substr(5)), read_checkpoint(e.path().string()));
  }
  return out;
}

// The "ema." entries of a checkpoint's optimizer tensors, under the model's names.
std::map<std::string, Tensor> ema_of(const Checkpoint& c) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : c.optimizer)
    if (name.rfind("ema.", 0) == 0) out.emplace(name.substr(4), t);
  return out;
}

void expect_bit_equal(const std::map<std::string, Tensor>& a,
                      const std::map<std::string, Tensor>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << what << " " << name;
    EXPECT_EQ(std::memcmp(t.raw_data(), u.raw_data(), t.nbytes()), 0) << what << " " << name;
  }
}

TEST(DeitPipeline, TheTinyImageFolderRecipeLearnsAndReportsItsEma) {
  const testing::TempDir tmp;
  const TrainResult t = train(tiny_imagefolder(), quiet(tmp.file("run")));
  EXPECT_EQ(t.status, TrainResult::Status::finished);
  // 4 classes (chance 25%), with every augmentation on: 89.6% (86 of 96) on the
  // 2-core AMD EPYC.
  EXPECT_GT(t.eval_accuracy, 0.8);
  ASSERT_TRUE(t.ema_eval_accuracy.has_value());
  EXPECT_GT(*t.ema_eval_accuracy, 0.8);
  int evals = 0;
  for (const json::Value& rec : read_metrics(tmp.file("run/metrics.jsonl"))) {
    if (rec.at("split").as_string() != "eval") continue;
    ++evals;
    EXPECT_NE(rec.find("ema_accuracy"), nullptr) << json::dump(rec);
    EXPECT_NE(rec.find("ema_loss"), nullptr) << json::dump(rec);
  }
  EXPECT_EQ(evals, 30);  // one per epoch
  // The checkpoint carries the EMA of every parameter.
  const Checkpoint c = read_checkpoint(t.last_checkpoint);
  const auto ema = ema_of(c);
  EXPECT_EQ(ema.size(), c.model.size());
}

Recipe short_run(int64_t steps) {
  Recipe r = tiny_imagefolder();
  r.set("loop.epochs=0");
  r.set("loop.steps=" + std::to_string(steps));
  r.set("loop.eval_every=6");
  r.set("checkpoint.every=3");
  r.set("checkpoint.keep_last=100");
  return r;
}

TEST(DeitPipeline, AStoppedAndResumedRunEndsWithTheSameWeightsAndEma) {
  const testing::TempDir tmp;
  const std::string a = tmp.file("whole"), b = tmp.file("resumed");
  Recipe r = short_run(14);
  r.set("model.checkpoint=C1");  // drop path replayed by the recomputation
  train(r, quiet(a));
  EXPECT_EQ(train(r, testing::stopping_at(b, 7)).steps, 7);
  EXPECT_EQ(train(r, testing::resuming(b)).steps, 14);
  const Checkpoint ca = checkpoints(a).at(14), cb = checkpoints(b).at(14);
  expect_bit_equal(ca.model, cb.model, "weights");
  expect_bit_equal(ema_of(ca), ema_of(cb), "EMA");
  expect_bit_equal(ca.optimizer, cb.optimizer, "optimizer state");
}

TEST(DeitPipeline, TheEmaIsTheAverageOfEveryStepsWeights) {
  const testing::TempDir tmp;
  Recipe r = short_run(6);
  r.set("checkpoint.every=1");
  r.set("ema.decay=0.75");
  r.set("ema.warmup=false");
  train(r, quiet(tmp.file("run")));
  const auto all = checkpoints(tmp.file("run"));
  ASSERT_EQ(all.size(), 6u);
  // timm's schedule: update 1 copies the weights, then ema = 0.75 ema + 0.25 w.
  std::map<std::string, std::vector<double>> expected;
  for (const auto& [step, c] : all)
    for (const auto& [name, w] : c.model) {
      const std::vector<double> v = w.to(DType::f64).to_vector<double>();
      auto& e = expected[name];
      if (step == 1) {
        e = v;
      } else {
        for (size_t i = 0; i < v.size(); ++i) e[i] = 0.75 * e[i] + 0.25 * v[i];
      }
    }
  int64_t checked = 0;
  for (const auto& [name, t] : ema_of(all.rbegin()->second)) {
    const std::vector<double> got = t.to(DType::f64).to_vector<double>();
    const std::vector<double>& want = expected.at(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < got.size(); ++i, ++checked)
      ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << name << "[" << i << "]";
  }
  EXPECT_GT(checked, 10000);
}

TEST(DeitPipeline, SelectBestByTheEmaUsesItsAccuracy) {
  const testing::TempDir tmp;
  Recipe r = short_run(12);
  r.set("loop.eval_every=3");
  r.set("ema.select_best=true");
  train(r, quiet(tmp.file("run")));
  double best_ema = -1;
  std::map<int64_t, double> ema_at;
  for (const json::Value& rec : read_metrics(tmp.file("run/metrics.jsonl")))
    if (rec.at("split").as_string() == "eval") {
      ema_at[rec.at("step").as_int()] = rec.at("ema_accuracy").as_double();
      best_ema = std::max(best_ema, rec.at("ema_accuracy").as_double());
    }
  ASSERT_EQ(ema_at.size(), 4u);
  const CheckpointRef best = resolve_checkpoint(tmp.file("run/checkpoints/best"), "test");
  ASSERT_TRUE(best.step.has_value());
  EXPECT_EQ(ema_at.at(*best.step), best_ema);
  // The best checkpoint's metric is the EMA's accuracy.
  const Checkpoint c = read_checkpoint(best.dir);
  const json::Value& m = c.state.at("checkpoint_metric");
  EXPECT_EQ(m.at("name").as_string(), "eval_ema_accuracy");
  EXPECT_EQ(m.at("value").as_double(), best_ema);
}

TEST(DeitPipeline, EvalPredictAndExportTakeTheEmaOnRequest) {
  const testing::TempDir tmp;
  const std::string run = tmp.file("run");
  const TrainResult t = train(short_run(12), quiet(run));
  ASSERT_TRUE(t.ema_eval_accuracy.has_value());
  // eval --ema reproduces the training's last EMA evaluation, eval without it the weights'.
  const EvalResult raw = evaluate_checkpoint(run, "", {});
  const EvalResult ema = evaluate_checkpoint(run, "", {}, true);
  EXPECT_EQ(raw.accuracy, t.eval_accuracy);
  EXPECT_EQ(ema.accuracy, *t.ema_eval_accuracy);
  EXPECT_EQ(ema.to_json().at("weights").as_string(), "ema");
  EXPECT_EQ(raw.to_json().find("weights"), nullptr);
  // predict's model holds the EMA's tensors.
  const Checkpoint c = read_checkpoint(t.last_checkpoint);
  const auto averaged = ema_of(c);
  const Classifier m = load_classifier(run, {}, "predict", true);
  expect_bit_equal(m.task->module().state_dict(), averaged, "predict --ema");
  // export --ema writes them.
  ExportRequest q;
  q.checkpoint = run;
  q.out_dir = tmp.file("exported");
  q.ema = true;
  export_checkpoint(q);
  expect_bit_equal(safetensors::load(tmp.file("exported/model.safetensors")).tensors, averaged,
                   "export --ema");
  // A run without an EMA says so.
  Recipe plain = short_run(3);
  plain.set("ema.decay=0");
  train(plain, quiet(tmp.file("plain")));
  testing::expect_error([&] { evaluate_checkpoint(tmp.file("plain"), "", {}, true); },
                        {"eval --ema", "no moving average", "ema.decay"});
}

TEST(DeitPipeline, LayerDecaySlowsTheLowerLayers) {
  const testing::TempDir tmp;
  // How far each tensor moved from its initial value, with and without decay.
  const auto moved = [&](const std::string& name, double decay) {
    Recipe r = short_run(3);
    r.set("optimizer.layer_decay=" + std::to_string(decay));
    r.set("checkpoint.every=1");
    r.set("model.drop_path=0");
    const std::string run = tmp.file(name);
    train(r, quiet(run));
    const auto all = checkpoints(run);
    std::map<std::string, double> out;
    for (const auto& [k, w] : all.at(3).model) {
      const auto a = all.at(1).model.at(k).to(DType::f64).to_vector<double>();
      const auto b = w.to(DType::f64).to_vector<double>();
      double d = 0;
      for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
      out[k] = d;
    }
    return out;
  };
  const auto plain = moved("plain", 1.0), decayed = moved("decayed", 0.1);
  // The head keeps the schedule's lr; the patch embedding (5 layers below it
  // with depth 4: stem, 4 blocks (the last with the final norm), head) barely moves.
  EXPECT_GT(decayed.at("head.weight"), 0.2 * plain.at("head.weight"));
  EXPECT_LT(decayed.at("patch_embed.proj.weight"), 1e-3 * plain.at("patch_embed.proj.weight"));
}

}  // namespace
}  // namespace forge::train
