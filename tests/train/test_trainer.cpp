// The trainer end to end on small Fashion-MNIST runs: a tiny recipe learns;
// an interrupted and resumed run ends bit-identical to an uninterrupted one;
// a diverging run stops with a clear message and keeps its checkpoints; bad
// resumes change nothing on disk; eval reproduces the last evaluation.
//
// Fashion-MNIST comes from the Debian package dataset-fashion-mnist, which
// scripts/install-deps.sh installs (make test runs it first).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/safetensors.h"
#include "core/version.h"
#include "data/image_io.h"
#include "ops/attention/attention.h"
#include "ops/blas_core.h"
#include "tests/test_util.h"
#include "tests/train/train_test_util.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/model.h"
#include "train/trainer.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using namespace forge::testing;

// A small ViT on a slice of Fashion-MNIST; every stochastic part switched on
// (dropout, augmentation, mixup, loader workers, Performer redraws) so resume
// has to restore all of them.
Recipe tiny_recipe() {
  Recipe r = Recipe::from_yaml(R"(
name: tiny
seed: 3
threads: 2
model:
  type: vit
  image_size: 28
  patch_size: 7
  dim: 32
  depth: 2
  heads: 2
  mlp_ratio: 2
  dropout: 0.1
  attention:
    kind: softmax
data:
  dataset: fashion_mnist
  limit_train: 2048
  limit_eval: 256
  workers: 2
optimizer:
  name: adamw
  lr: 3.0e-3
  clip_grad_norm: 1.0
schedule:
  kind: cosine
  warmup_steps: 5
loop:
  epochs: 3
  batch_size: 32
  log_every: 8
checkpoint:
  keep_last: 2
)",
                               "tiny.yaml");
  return r;
}

// The tiny recipe cut to `steps` steps (no epochs), with a warmup of 1 step.
Recipe steps_recipe(int64_t steps) {
  Recipe r = tiny_recipe();
  r.set("loop.epochs=0");
  r.set("loop.steps=" + std::to_string(steps));
  r.set("schedule.warmup_steps=1");
  return r;
}

// A short run with a checkpoint every 2 steps.
Recipe short_recipe(int64_t steps) {
  Recipe r = steps_recipe(steps);
  r.set("checkpoint.every=2");
  return r;
}

// The tiny recipe on the CPU for `steps` steps (no epochs), logging every 2.
Recipe cpu_recipe(int64_t steps) {
  Recipe r = tiny_recipe();
  r.set("device=cpu");
  r.set("loop.epochs=0");
  r.set("loop.steps=" + std::to_string(steps));
  r.set("loop.log_every=2");
  return r;
}

// The deterministic fields of every metrics record (timings left out).
std::vector<std::string> deterministic_metrics(const std::string& run_dir) {
  std::vector<std::string> out;
  for (const json::Value& rec : read_metrics((fs::path(run_dir) / "metrics.jsonl").string())) {
    json::Value keep;
    for (const auto& [k, v] : rec.as_object())
      if (k != "samples_per_s" && k != "tokens_per_s" && k != "step_time_ms" && k != "seconds" &&
          k != "peak_memory_mb")
        keep[k] = v;
    out.push_back(json::dump(keep));
  }
  return out;
}

std::map<std::string, Tensor> final_weights(const std::string& run_dir) {
  CheckpointManager m(run_dir, 2, 1, "eval_accuracy", "max", [](const std::string&) {});
  return read_checkpoint(*m.latest()).model;
}

void expect_bit_equal(const std::map<std::string, Tensor>& a,
                      const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    ASSERT_EQ(t.nbytes(), u.nbytes()) << name;
    EXPECT_EQ(std::memcmp(t.raw_data(), u.raw_data(), t.nbytes()), 0) << name << " differs";
  }
}

TEST(Trainer, DeviceCudaWithoutAGpuIsAClearErrorAndCreatesNoRun) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible; this covers machines without one";
  Recipe r = tiny_recipe();
  r.set("device=cuda");
  const std::string dir = fresh_dir("no_gpu");
  forge::testing::expect_error([&] { train(r, quiet(dir)); }, {"device: cuda", "auto"});
  EXPECT_FALSE(fs::exists(dir)) << "checked before the run directory is made";
  fs::remove_all(dir);
}

TEST(Trainer, Fp16OnTheCpuRunsAsFp32AndSaysSo) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible; device auto would use it";
  Recipe r = tiny_recipe();
  r.set("device=auto");
  r.set("precision=fp16");
  r.set("loop.epochs=0");
  r.set("loop.steps=6");
  const std::string dir = fresh_dir("fp16_cpu");
  const TrainResult result = train(r, quiet(dir));
  EXPECT_EQ(result.steps, 6);
  const std::string log = forge::testing::read_file(fs::path(dir) / "train.log");
  EXPECT_NE(log.find("on the CPU this run is fp32"), std::string::npos) << log;
  EXPECT_NE(log.find("on cpu"), std::string::npos) << log;
  fs::remove_all(dir);
}

// precision: bf16 on the CPU: the GEMMs in bf16 where the CPU has AVX512-BF16
// or AMX (the losses follow the fp32 run's closely, not exactly, and repeat
// exactly in a second run), a clear error before anything is written where
// it has neither.
TEST(Trainer, Bf16OnTheCpuComputesTheGemmsInBf16OrRefuses) {
  Recipe r = cpu_recipe(6);
  const blas::CpuFeatures f = blas::cpu_features();
  if (!f.bf16()) {
    r.set("precision=bf16");
    const std::string dir = fresh_dir("bf16_refused");
    forge::testing::expect_error([&] { train(r, quiet(dir)); },
                                 {"precision: bf16", "AVX512-BF16 or AMX", "precision: fp32"});
    EXPECT_FALSE(fs::exists(dir)) << "checked before the run directory is made";
    GTEST_SKIP() << "this CPU has neither AVX512-BF16 nor AMX: the refusal was checked";
  }
  const auto losses = [&](const std::string& precision) {
    r.set("precision=" + precision);
    const std::string dir = fresh_dir("bf16_cpu_" + precision);
    EXPECT_EQ(train(r, quiet(dir)).steps, 6);
    const std::vector<double> out = testing::train_losses(dir);
    const std::string log = forge::testing::read_file(fs::path(dir) / "train.log");
    EXPECT_EQ(log.find("in bf16 with f32 accumulation") != std::string::npos, precision == "bf16")
        << log;
    fs::remove_all(dir);
    return out;
  };
  const std::vector<double> bf16 = losses("bf16"), fp32 = losses("fp32");
  EXPECT_EQ(losses("bf16"), bf16) << "a second bf16 run on as many threads differs";
  ASSERT_EQ(bf16.size(), fp32.size());
  ASSERT_FALSE(bf16.empty());
  bool differs = false;
  for (size_t i = 0; i < bf16.size(); ++i) {
    EXPECT_NEAR(bf16[i], fp32[i], 0.02 * fp32[i]) << "step record " << i;
    differs = differs || bf16[i] != fp32[i];
  }
  EXPECT_TRUE(differs) << "the bf16 run equals the fp32 one: its GEMMs did not run in bf16";
}

// model.attention.backend picks the GPU attention kernels for the process
// (ops::attention::set_flash_engine, set_linear_engine); the CPU kernels ignore it, so a
// CPU run is the same with either, to the last digit; a bad value names the choices.
TEST(Trainer, AttentionBackendPicksTheGpuKernelsAndTheCpuIgnoresIt) {
  Recipe r = cpu_recipe(4);
  const auto losses = [&](const std::string& backend) {
    r.set("model.attention.backend=" + backend);
    const std::string dir = fresh_dir("backend_" + backend);
    EXPECT_EQ(train(r, quiet(dir)).steps, 4);
    const std::vector<double> out = testing::train_losses(dir);
    fs::remove_all(dir);
    return out;
  };
  const std::vector<double> tiled = losses("tiled");
  EXPECT_EQ(ops::attention::flash_engine(), cuda::FlashEngine::tiled);
  EXPECT_EQ(ops::attention::linear_engine(), cuda::LinearEngine::fma);
  EXPECT_EQ(losses("cudnn"), tiled);
  EXPECT_EQ(ops::attention::flash_engine(), cuda::FlashEngine::cudnn);
  EXPECT_EQ(ops::attention::linear_engine(), cuda::LinearEngine::mma);
  EXPECT_EQ(losses("mma"), tiled);
  EXPECT_EQ(ops::attention::flash_engine(), cuda::FlashEngine::mma);
  EXPECT_EQ(ops::attention::linear_engine(), cuda::LinearEngine::mma);
  EXPECT_EQ(losses("tiled"), tiled);
  EXPECT_EQ(ops::attention::linear_engine(), cuda::LinearEngine::fma);
  forge::testing::expect_error([&] { r.set("model.attention.backend=fast"); },
                               {"model.attention.backend", "tiled", "mma", "cudnn"});
}

TEST(Trainer, TinyRecipeLearns) {
  const std::string dir = fresh_dir("learns");
  const TrainResult r = train(tiny_recipe(), quiet(dir));
  EXPECT_EQ(r.status, TrainResult::Status::finished);
  EXPECT_EQ(r.steps, 3 * (2048 / 32));
  const std::vector<double> train_loss = testing::train_losses(dir);
  ASSERT_GE(train_loss.size(), 4u);
  EXPECT_LT(train_loss.back(), 0.8 * train_loss.front()) << "the loss did not fall";
  EXPECT_GT(r.eval_accuracy, 0.5) << "10 classes: chance is 0.1";
  EXPECT_TRUE(fs::exists(fs::path(dir) / "curves.svg"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "recipe.yaml"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "train.log"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoints" / "latest"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoints" / "best"));
  // The recipe travels in the checkpoint, with the sizes the data and the
  // model's defaults decided written in.
  Recipe resolved = tiny_recipe();
  for (const char* s : {"model.classes=10", "model.channels=1", "model.head_dim=16",
                        "model.mlp_dim=64", "model.norm_eps=1e-6"})
    resolved.set(s);
  const Checkpoint c = read_checkpoint(r.last_checkpoint);
  EXPECT_EQ(c.recipe_yaml, resolved.to_yaml());
  // And the model card: the input's normalisation and the class names, in
  // model.safetensors and in state.json, with the version that wrote it.
  const json::Value& in = c.card.at("input");
  EXPECT_EQ(in.at("kind").as_string(), "image");
  EXPECT_EQ(in.at("mean").as_array().at(0).as_double(), 0.286);
  EXPECT_EQ(in.at("std").as_array().at(0).as_double(), 0.353);
  EXPECT_EQ(c.card.at("classes").as_array().at(9).as_string(), "Ankle boot");
  EXPECT_EQ(json::dump(c.state.at("card")), json::dump(c.card));
  EXPECT_EQ(c.state.at("attnforge").at("version").as_string(), forge::version());
  EXPECT_EQ(forge::testing::read_file(fs::path(dir) / "recipe.yaml"), resolved.to_yaml());
  fs::remove_all(dir);
}

TEST(Trainer, InterruptedAndResumedRunIsBitIdenticalToAnUninterruptedOne) {
  Recipe r = tiny_recipe();
  r.set("model.attention.kind=favor");  // redraws every 5 steps from the model's generator
  r.set("model.attention.nb_features=16");
  r.set("model.attention.feature_redraw_interval=5");
  r.set("data.random_crop_padding=2");
  r.set("data.mixup_alpha=0.4");
  r.set("loop.epochs=0");
  r.set("loop.steps=40");
  r.set("loop.eval_every=16");
  r.set("checkpoint.every=10");

  const std::string a = fresh_dir("uninterrupted"), b = fresh_dir("resumed");
  train(r, quiet(a));

  const TrainResult first = train(r, testing::stopping_at(b, 23));  // mid-window, mid-epoch
  EXPECT_EQ(first.status, TrainResult::Status::interrupted);
  EXPECT_EQ(first.steps, 23);
  const TrainResult second =
      train(Recipe::from_file((fs::path(b) / "recipe.yaml").string()), testing::resuming(b));
  EXPECT_EQ(second.status, TrainResult::Status::finished);
  EXPECT_EQ(second.steps, 40);

  expect_bit_equal(final_weights(a), final_weights(b));
  EXPECT_EQ(deterministic_metrics(a), deterministic_metrics(b));
  // The whole weights file, not only its tensors: nothing in it depends on time.
  const auto model_file = [](const std::string& run) {
    CheckpointManager m(run, 2, 1, "eval_accuracy", "max", [](const std::string&) {});
    return forge::testing::read_file(fs::path(*m.latest()) / "model.safetensors");
  };
  EXPECT_EQ(model_file(a), model_file(b));
  fs::remove_all(a);
  fs::remove_all(b);
}

// The tiny recipe at a learning rate that makes it diverge within a few steps.
Recipe diverging_recipe() {
  Recipe r = tiny_recipe();
  r.set("optimizer.lr=1e6");
  r.set("optimizer.clip_grad_norm=0");
  r.set("schedule.kind=constant");
  r.set("schedule.warmup_steps=0");
  return r;
}

TEST(Trainer, DivergingRunStopsWithAClearMessageAndKeepsItsCheckpoints) {
  Recipe r = diverging_recipe();
  r.set("checkpoint.every=1");
  r.set("loop.eval_every=1");
  r.set("data.limit_eval=32");
  const std::string dir = fresh_dir("diverges");
  std::map<std::string, std::string> before;
  try {
    TrainOptions o = quiet(dir);
    // Snapshot the run directory before each step: the failing step must not touch it.
    o.stop_requested = [&](int64_t) {
      before = snapshot((fs::path(dir) / "checkpoints").string());
      return false;
    };
    train(r, o);
    FAIL() << "a run at lr 1e6 did not diverge";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(m.find("the loss is") != std::string::npos ||
                m.find("the gradient norm is") != std::string::npos)
        << m;
    EXPECT_NE(m.find("--check-nan"), std::string::npos) << m;
    // Both paths (the loss and the gradient norm) name the place and the checkpoint.
    EXPECT_NE(m.find("(epoch 0, batch "), std::string::npos) << m;
    EXPECT_NE(m.find("The last good checkpoint is " + dir), std::string::npos) << m;
  }
  EXPECT_EQ(snapshot((fs::path(dir) / "checkpoints").string()), before);
  fs::remove_all(dir);
}

// Before the first checkpoint, the stop says there is none (it claimed one).
TEST(Trainer, DivergingBeforeTheFirstCheckpointSaysThereIsNone) {
  const Recipe r = diverging_recipe();
  const std::string dir = fresh_dir("diverges_early");
  testing::expect_error([&] { train(r, quiet(dir)); }, {"No checkpoint was written yet", "step "});
  EXPECT_FALSE(fs::exists(fs::path(dir) / "checkpoints" / "latest"));
  fs::remove_all(dir);
}

TEST(Trainer, RefusesToTrainIntoAnExistingRun) {
  const Recipe r = steps_recipe(2);
  const std::string dir = fresh_dir("exists");
  train(r, quiet(dir));
  const auto before = snapshot(dir);
  try {
    train(r, quiet(dir));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already holds a run"), std::string::npos) << e.what();
  }
  EXPECT_EQ(snapshot(dir), before);
  fs::remove_all(dir);
}

TEST(Trainer, ResumeWithAnotherModelShapeIsAnErrorAndChangesNothing) {
  const std::string dir = fresh_dir("shape");
  train(short_recipe(4), quiet(dir));
  auto before = snapshot(dir);
  Recipe other = Recipe::from_file((fs::path(dir) / "recipe.yaml").string());
  other.set("model.dim=48");
  other.set("loop.steps=8");
  try {
    train(other, testing::resuming(dir));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
  // Not even train.log: the log reaches the run directory only once a resume
  // has passed every check.
  EXPECT_EQ(snapshot(dir), before);
  fs::remove_all(dir);
}

TEST(Trainer, ResumeRefusesADamagedLatestCheckpointAndChangesNothing) {
  Recipe r = short_recipe(6);
  r.set("checkpoint.keep_last=3");
  const std::string dir = fresh_dir("damaged");
  train(r, testing::stopping_at(dir, 4));
  const fs::path ckpts = fs::path(dir) / "checkpoints";
  const fs::path latest = ckpts / CheckpointManager::name_of(4);
  // Truncate the latest checkpoint's weights, as a damaged disk would.
  const std::string model = testing::read_file(latest / "model.safetensors");
  testing::write_file(latest / "model.safetensors", model.substr(0, model.size() / 2));
  auto before = snapshot(dir);
  const TrainOptions resume = testing::resuming(dir);
  try {
    train(r, resume);
    FAIL() << "resumed from a damaged checkpoint";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("is damaged"), std::string::npos) << m;
    EXPECT_NE(m.find("step-00000004"), std::string::npos) << m;
    EXPECT_NE(m.find("model.safetensors"), std::string::npos) << m;
  }
  EXPECT_EQ(snapshot(dir), before);
  // Moved aside by the user: the run continues from step 2 and finishes.
  fs::rename(latest, fs::path(dir) / "damaged-step-4");
  const TrainResult t = train(r, resume);
  EXPECT_EQ(t.status, TrainResult::Status::finished);
  EXPECT_EQ(t.steps, 6);
  fs::remove_all(dir);
}

// A warmup longer than the run (a short trial of a long recipe) is cut to the
// run's length with a warning, not refused.
TEST(Trainer, AWarmupLongerThanTheRunIsCutToIt) {
  Recipe r = short_recipe(4);
  r.set("schedule.warmup_steps=40");
  const std::string dir = fresh_dir("warmup_cut");
  EXPECT_EQ(train(r, quiet(dir)).steps, 4);
  const std::string log = forge::testing::read_file(fs::path(dir) / "train.log");
  EXPECT_NE(log.find("warmup of 40 steps, longer than this run's 4 steps: the warmup is cut to 4"),
            std::string::npos)
      << log;
  fs::remove_all(dir);
}

// Each check a recipe can fail runs before anything is written: a failed start
// leaves no directory behind, or, when the directory was there, leaves it as it
// was; the fixed recipe then trains into the same place.
TEST(RunLifecycle, AFailedStartNeverBlocksItsDirectory) {
  const testing::TempDir tmp;
  const std::vector<std::pair<std::string, std::vector<std::string>>> bad = {
      {"optimizer.freeze=[nothing]", {"optimizer.freeze", "nothing"}},  // no such parameter
      {"data.root=" + (tmp.path() / "no_such_data").string(), {"no_such_data"}},
      {"model.heads=5", {"model.heads"}},            // 32 is not divisible by 5
      {"model.patch_size=5", {"model.patch_size"}},  // 28 is not divisible by 5
      {"loop.batch_size=4096", {"batch"}},           // more than the 2048 examples: no batch
  };
  for (const auto& [assignment, parts] : bad) {
    SCOPED_TRACE(assignment);
    Recipe r = short_recipe(4);
    r.set(assignment);
    const std::string dir = (tmp.path() / "run").string();
    testing::expect_error([&] { train(r, quiet(dir)); }, parts);
    EXPECT_FALSE(fs::exists(dir)) << "a failed start left its directory behind";
    fs::create_directories(dir);
    testing::expect_error([&] { train(r, quiet(dir)); }, parts);
    EXPECT_TRUE(fs::is_empty(dir)) << "a failed start wrote into an existing directory";
    const TrainResult t = train(short_recipe(4), quiet(dir));
    EXPECT_EQ(t.steps, 4);
    fs::remove_all(dir);
  }
}

// A run killed before its first checkpoint leaves its recipe, log and metrics
// (and perhaps a half-written checkpoint): --resume starts it from the
// beginning and ends bit-identical to an uninterrupted run. A new start into
// it is refused (it would replace that history), naming the files; one killed
// before it wrote its log (recipe.yaml, temporary files) a new start takes over.
TEST(RunLifecycle, ARunKilledBeforeItsFirstCheckpointStartsAgain) {
  const testing::TempDir tmp;
  const std::string ref = (tmp.path() / "ref").string();
  train(short_recipe(6), quiet(ref));
  for (const bool logged : {true, false}) {
    SCOPED_TRACE(logged ? "--resume of a logged start" : "a new start over an unlogged one");
    const fs::path dir = tmp.path() / (logged ? "resumed" : "restarted");
    fs::create_directories(dir / "checkpoints" / "step-00000002.tmp-12345");
    testing::write_file(dir / "checkpoints" / "step-00000002.tmp-12345" / "model.safetensors",
                        "half");
    testing::write_file(dir / "recipe.yaml", short_recipe(6).to_yaml());
    testing::write_file(dir / "recipe.yaml.tmp-12345", "rec");  // a killed atomic write
    if (logged) {
      testing::write_file(dir / "train.log", "[00:00:00] info run directory: x\n");
      testing::write_file(dir / "metrics.jsonl",
                          "{\"step\": 1, \"split\": \"train\", \"loss\": 2.3}\n");
      const auto before = snapshot(dir);
      testing::expect_error([&] { train(short_recipe(6), quiet(dir.string())); },
                            {dir.string(), "history of an earlier start", "metrics.jsonl (",
                             "train.log (", "--resume"});
      EXPECT_EQ(snapshot(dir), before) << "a refused start changed the directory";
    }
    TrainOptions o = quiet(dir.string());
    o.resume = logged;
    const TrainResult t = train(short_recipe(6), o);
    EXPECT_EQ(t.status, TrainResult::Status::finished);
    EXPECT_EQ(t.steps, 6);
    expect_bit_equal(final_weights(ref), final_weights(dir.string()));
    EXPECT_EQ(deterministic_metrics(ref), deterministic_metrics(dir.string()));
    EXPECT_FALSE(fs::exists(dir / "checkpoints" / "step-00000002.tmp-12345"));
    EXPECT_FALSE(fs::exists(dir / "recipe.yaml.tmp-12345"));
  }
  // A directory holding something that is not a run is not taken over.
  const fs::path foreign = tmp.path() / "foreign";
  fs::create_directories(foreign);
  testing::write_file(foreign / "thesis.tex", "keep me");
  testing::expect_error([&] { train(short_recipe(2), quiet(foreign.string())); },
                        {foreign.string(), "thesis.tex", "not empty"});
  EXPECT_EQ(snapshot(foreign).size(), 1u);
}

// state.json is read whole and checked (against its directory and the recipe)
// before anything in the run changes; each refusal names the file and the key.
TEST(RunLifecycle, ABadStateIsRefusedBeforeAnythingChanges) {
  const testing::TempDir tmp;
  const std::string dir = (tmp.path() / "run").string();
  train(short_recipe(8), testing::stopping_at(dir, 4));
  const std::string latest =
      (fs::path(dir) / "checkpoints" / CheckpointManager::name_of(4)).string();
  const Checkpoint good = read_checkpoint(latest);
  const std::vector<std::pair<std::function<void(json::Value&)>, std::vector<std::string>>> cases =
      {
          {[](json::Value& s) { s["step"] = -5; }, {"\"step\""}},
          {[](json::Value& s) { s["step"] = "abc"; }, {"\"step\"", "string"}},
          {[](json::Value& s) { s["loader"]["batch"] = 100000; }, {"\"loader.batch\""}},
          {[](json::Value& s) { s["step"] = 2; }, {"\"step\" is 2", "step 4"}},
          {[](json::Value& s) { s["generator"] = "lost"; }, {"\"generator\""}},
      };
  for (const auto& [damage, parts] : cases) {
    Checkpoint c = good;
    damage(c.state);
    write_checkpoint(latest, c);  // with valid checksums: only the values are wrong
    const auto before = snapshot(dir);
    Recipe longer = short_recipe(8);
    longer.set("loop.log_every=2");  // a --set given with the refused resume
    std::vector<std::string> want = parts;
    want.push_back((fs::path(latest) / "state.json").string());
    testing::expect_error([&] { train(longer, testing::resuming(dir)); }, want);
    EXPECT_EQ(snapshot(dir), before) << "a refused resume changed the run directory";
  }
  write_checkpoint(latest, good);
  EXPECT_EQ(train(short_recipe(8), testing::resuming(dir)).steps, 8);
}

// A run whose checkpoints/ was deleted keeps its history: a new start into
// it is refused, naming the files, and changes nothing.
TEST(RunLifecycle, ANewStartNeverTruncatesARunsHistory) {
  const testing::TempDir tmp;
  const fs::path dir = tmp.path() / "run";
  train(short_recipe(6), quiet(dir.string()));
  fs::remove_all(dir / "checkpoints");
  const auto before = snapshot(dir);
  ASSERT_TRUE(before.count("metrics.jsonl"));
  testing::expect_error([&] { train(short_recipe(2), quiet(dir.string())); },
                        {"history of an earlier start", "metrics.jsonl (", "metrics.csv (",
                         "train.log (", "events.out.tfevents.", "--out DIR"});
  EXPECT_EQ(snapshot(dir), before) << "a refused start changed the run's history";
}

// A resume that fails on the run's own files (a torn metrics line, a file in
// the way that cannot be written) fails before anything is written: every
// file of the run is as it was, recipe.yaml included, although the resume
// came with a --set.
TEST(RunLifecycle, AFailedResumeLeavesEveryFileOfTheRunAsItWas) {
  const testing::TempDir tmp;
  const fs::path dir = tmp.path() / "run";
  train(short_recipe(8), testing::stopping_at(dir.string(), 4));
  const auto event_file = [&] {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) return e.path();
    return fs::path();
  };
  // A file replaced by a directory, which nothing can write in its place.
  const auto blocked = [](const fs::path& file) {
    return [file] {
      fs::remove(file);
      fs::create_directories(file / "in_the_way");
    };
  };
  const std::vector<std::tuple<std::string, std::function<void()>, std::vector<std::string>>>
      cases = {
          {"a torn metrics line",
           [&] {
             std::ofstream(dir / "metrics.jsonl", std::ios::app) << "{\"step\": 5, \"loss\": \n";
           },
           {(dir / "metrics.jsonl").string()}},
          {"metrics.csv", blocked(dir / "metrics.csv"), {(dir / "metrics.csv").string()}},
          {"train.log", blocked(dir / "train.log"), {(dir / "train.log").string()}},
          {"the event file", blocked(event_file()), {"events.out.tfevents."}},
      };
  const auto good = snapshot(dir);
  for (const auto& [what, damage, parts] : cases) {
    SCOPED_TRACE(what);
    fs::remove_all(dir);
    for (const auto& [name, bytes] : good) {
      fs::create_directories((dir / name).parent_path());
      testing::write_file(dir / name, bytes);
    }
    damage();
    const auto before = snapshot(dir);
    Recipe changed = short_recipe(8);
    changed.set("optimizer.lr=0.0001");  // a --set given with the failing resume
    testing::expect_error([&] { train(changed, testing::resuming(dir.string())); }, parts);
    EXPECT_EQ(snapshot(dir), before) << "a failed resume changed the run directory";
  }
}

// A stop during an evaluation does not wait for it, and writes no checkpoint
// that would miss it: the resume redoes the steps since the last checkpoint
// and ends exactly where an uninterrupted run does.
TEST(RunLifecycle, AStopDuringAnEvaluationAbandonsItAndResumesExactly) {
  const testing::TempDir tmp;
  Recipe r = short_recipe(12);
  r.set("loop.eval_every=6");
  r.set("checkpoint.every=4");
  r.set("data.limit_eval=128");
  r.set("loop.eval_batch_size=32");
  const std::string a = (tmp.path() / "a").string(), b = (tmp.path() / "b").string();
  train(r, quiet(a));
  TrainOptions stop = quiet(b);
  int polls_at_6 = 0;
  stop.stop_requested = [&](int64_t step) {
    return step == 6 && ++polls_at_6 == 2;
  };  // 2nd eval batch
  const TrainResult first = train(r, stop);
  EXPECT_EQ(first.status, TrainResult::Status::interrupted);
  EXPECT_EQ(first.steps, 6);
  CheckpointManager m(b, 2, 1, "eval_accuracy", "max", [](const std::string&) {});
  EXPECT_EQ(*m.latest(), (fs::path(b) / "checkpoints" / CheckpointManager::name_of(4)).string());
  EXPECT_EQ(train(r, testing::resuming(b)).steps, 12);
  expect_bit_equal(final_weights(a), final_weights(b));
  EXPECT_EQ(deterministic_metrics(a), deterministic_metrics(b));
}

TEST(Trainer, EvalOfTheLastCheckpointReproducesTheLastEvaluation) {
  Recipe r = tiny_recipe();
  r.set("loop.epochs=1");
  const std::string dir = fresh_dir("eval");
  const TrainResult t = train(r, quiet(dir));
  // The run evaluated on data.limit_eval = 256 examples; eval does too when told.
  const EvalResult e = evaluate_checkpoint(t.last_checkpoint, "", {"data.limit_eval=256"});
  EXPECT_EQ(e.accuracy, t.eval_accuracy);
  EXPECT_EQ(e.loss, t.eval_loss);
  EXPECT_EQ(e.examples, 256);
  EXPECT_EQ(e.step, t.steps);
  // Untold, the whole split; the run directory names its latest checkpoint.
  const EvalResult whole = evaluate_checkpoint(dir, "", {});
  EXPECT_EQ(whole.examples, 10000);
  EXPECT_EQ(whole.checkpoint, t.last_checkpoint);
  fs::remove_all(dir);
}

TEST(Trainer, EvaluatesAtTheEndOfEachEpochNotAStepLater) {
  Recipe r = tiny_recipe();
  r.set("data.limit_train=320");  // 10 batches of 32 per epoch
  const std::string dir = fresh_dir("epochs");
  train(r, quiet(dir));
  std::vector<int64_t> eval_steps;
  for (const auto& rec : read_metrics((fs::path(dir) / "metrics.jsonl").string()))
    if (rec.at("split").as_string() == "eval") eval_steps.push_back(rec.at("step").as_int());
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{10, 20, 30}));
  fs::remove_all(dir);
}

TEST(Trainer, FrozenParametersDoNotMove) {
  Recipe r = steps_recipe(6);
  r.set("model.attention.kind=linformer");
  r.set("model.attention.k=4");
  r.set("optimizer.freeze=[transformer.projections, head.bias]");
  const std::string dir = fresh_dir("freeze");
  const TrainResult t = train(r, quiet(dir));
  const auto trained = read_checkpoint(t.last_checkpoint).model;
  // The same model freshly built: what the weights were at step 0.
  Generator gen(static_cast<uint64_t>(r.integer("seed")));
  DataShape shape;
  shape.classes = 10;
  shape.channels = 1;
  shape.image_size = 28;
  auto fresh = build_model(r, shape, DType::f32, &gen);
  int frozen = 0, moved = 0;
  for (const auto& [name, t0] : fresh->module().state_dict()) {
    const Tensor& t1 = trained.at(name);
    const bool same = std::memcmp(t0.raw_data(), t1.raw_data(), t0.nbytes()) == 0;
    if (name.rfind("transformer.projections", 0) == 0 || name == "head.bias") {
      EXPECT_TRUE(same) << name << " is frozen but moved";
      ++frozen;
    } else if (!same) {
      ++moved;
    }
  }
  EXPECT_GE(frozen, 3);
  EXPECT_GT(moved, 10);
  r.set("optimizer.freeze=[nothing.like.this]");
  try {
    train(r, quiet(fresh_dir("freeze_bad")));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "optimizer.freeze: no parameter name starts with 'nothing.like.this'"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
  fs::remove_all(fresh_dir("freeze_bad"));
}

TEST(Trainer, AttentionMapsAreWrittenPerLayerAndHead) {
  Recipe r = steps_recipe(2);
  r.set("output.attention_maps=true");
  const std::string dir = fresh_dir("maps");
  train(r, quiet(dir));
  // depth 2 x heads 2; 16 patches + CLS = 17 tokens, drawn in blocks of
  // 512 / 17 = 30 pixels, coloured; the picture beside the class token's row.
  for (int layer = 0; layer < 2; ++layer)
    for (int head = 0; head < 2; ++head) {
      const fs::path png =
          fs::path(dir) / "attention_maps" / fmt::format("layer{:02}_head{:02}.png", layer, head);
      ASSERT_TRUE(fs::exists(png)) << png;
      const data::Image img = data::read_image(png.string());
      EXPECT_EQ(img.height, 17 * 30);
      EXPECT_EQ(img.width, 17 * 30);
      EXPECT_EQ(img.channels, 3);
      // Each map is scaled to its maximum: some cell has the colour map's top (253, 231, 37).
      bool top = false;
      for (size_t i = 0; i + 2 < img.pixels.size(); i += 3)
        top = top || (img.pixels[i] == 253 && img.pixels[i + 1] == 231 && img.pixels[i + 2] == 37);
      EXPECT_TRUE(top) << png;
      EXPECT_TRUE(fs::exists(fs::path(dir) / "attention_maps" /
                             fmt::format("layer{:02}_head{:02}_image.png", layer, head)));
    }
  EXPECT_TRUE(fs::exists(fs::path(dir) / "attention_maps" / "rollout.png"));
  fs::remove_all(dir);
}

// Every shipped recipe trains a few steps end to end, shrunk by --set-style
// overrides, on small data made here (image folders, text files) or by the
// generators (ListOps, Pathfinder), and Fashion-MNIST.
TEST(ShippedRecipes, EveryRecipeTrainsAFewSteps) {
  const testing::TempDir tmp;
  // An image folder with train / val / test splits of 3 classes.
  for (const char* split : {"train", "val", "test"})
    for (int c = 0; c < 3; ++c) {
      const fs::path dir = tmp.path() / "images" / split / fmt::format("class{}", c);
      fs::create_directories(dir);
      for (int i = 0; i < 4; ++i) {
        data::Image img;
        img.height = 30 + i;
        img.width = 36;
        img.channels = 3;
        img.pixels.assign(static_cast<size_t>(img.height * img.width * 3),
                          static_cast<uint8_t>(60 * c + 5 * i));
        data::write_png((dir / fmt::format("{}.png", i)).string(), img);
      }
    }
  // Text classification and document pairs.
  fs::create_directories(tmp.path() / "text");
  fs::create_directories(tmp.path() / "pairs");
  for (const char* split : {"train", "test"}) {
    std::string text, pairs;
    for (int i = 0; i < 16; ++i) {
      text += fmt::format("{}\treview {} says {}\n", i % 2, i, i % 2 ? "good" : "bad");
      pairs += fmt::format("{}\tpaper {}\tpaper {}\n", i % 2, i, i % 2 ? i : i + 1);
    }
    testing::write_file(tmp.path() / "text" / (std::string(split) + ".tsv"), text);
    testing::write_file(tmp.path() / "pairs" / (std::string(split) + ".tsv"), pairs);
  }
  // A text corpus for the language models.
  std::string corpus;
  for (int i = 0; i < 200; ++i) corpus += fmt::format("line {} of a small corpus, {}\n", i, i * i);
  testing::write_file(tmp.path() / "corpus.txt", corpus);
  int count = 0;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(FORGE_SOURCE_DIR) / "recipes")) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    Recipe r = Recipe::from_file(e.path().string());
    for (const char* s :
         {"model.dim=32", "model.depth=1", "model.heads=2", "model.mlp_dim=32", "loop.epochs=0",
          "loop.steps=3", "loop.batch_size=4", "loop.eval_batch_size=8", "loop.accumulation=1",
          "loop.eval_every=0", "schedule.warmup_steps=1", "schedule.warmup_epochs=0",
          "data.limit_train=64", "data.limit_eval=16", "data.generate_train=24",
          "data.generate_eval=8", "threads=2"})
      r.set(s);
    if (r.string("schedule.kind") == "constant") r.set("schedule.warmup_steps=0");
    // bf16 on a CPU without AVX512-BF16 or AMX is refused (checked in
    // Trainer.Bf16OnTheCpuComputesTheGemmsInBf16OrRefuses): fp32 there.
    if (r.string("precision") == "bf16" && !blas::cpu_features().bf16()) r.set("precision=fp32");
    const std::string& kind = r.string("data.dataset");
    if (kind == "image_folder" ||
        (kind == "pixels" && r.string("data.pixel_source") == "image_folder")) {
      r.set("data.synthetic=false");
      r.set("data.root=" + (tmp.path() / "images").string());
    }
    if (kind == "listops" || kind == "pathfinder") r.set("data.synthetic=true");
    if (kind == "image_folder") r.set("model.image_size=32");
    if (kind == "text") r.set("data.root=" + (tmp.path() / "text").string());
    if (kind == "retrieval") r.set("data.root=" + (tmp.path() / "pairs").string());
    if (kind == "listops" || kind == "text" || kind == "retrieval") r.set("data.max_length=256");
    if (r.string("model.attention.kind") == "linformer") r.set("model.attention.k=8");
    if (kind == "lm_text") {
      r.set("data.root=" + (tmp.path() / "corpus.txt").string());
      r.set("data.split_fractions=[0.8, 0.9, 1.0]");
      r.set("data.seq_len=32");
    }
    if (kind == "copy") r.set("data.copy_length=8");
    if (r.string("model.type") == "encoder_decoder")
      for (const char* s : {"model.encoder_depth=1", "model.decoder_depth=1"}) r.set(s);
    if (!r.int_list("model.attention.per_layer_local_heads").empty())
      r.set("model.attention.per_layer_local_heads=[1]");
    const TrainResult t =
        train(r, quiet((tmp.path() / ("run_" + e.path().stem().string())).string()));
    EXPECT_EQ(t.steps, 3);
    EXPECT_TRUE(std::isfinite(t.eval_loss));
    ++count;
  }
  EXPECT_GE(count, 18);
}

}  // namespace
}  // namespace forge::train
