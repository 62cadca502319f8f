// Training on the GPU: a few steps of a ViT give the same losses on the CPU
// and the GPU (f32); bf16 and fp16 mixed precision train; the recipe's
// `device` and `precision`; and checkpoints move between devices (a run saved
// on the GPU resumes and evaluates on the CPU and vice versa).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "autograd/engine.h"
#include "nn/models.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/nn/nn_test_util.h"
#include "tests/train/train_test_util.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using namespace testing;

// Losses of `steps` AdamW steps of the same ViT on the same batches, on
// `device`, with autocast `precision` (f32: off) and loss scaling for f16.
std::vector<double> train_losses(Device device, DType precision, int steps) {
  Generator gen(5);
  nn::ViT model(mnist_vit_config(), &gen);
  model.to(device);
  optim::AdamW opt(optim::param_groups(model, 0.05, true), 3e-3);
  optim::GradScaler scaler(optim::GradScalerOptions{.enabled = precision == DType::f16});
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    Generator data(100);  // one batch, seen every step: the loss must fall
    const Tensor x = Tensor::randn({16, 1, 28, 28}, DType::f32, &data).to(device);
    std::vector<int64_t> y(16);
    for (int i = 0; i < 16; ++i) y[static_cast<size_t>(i)] = (i * 7) % 10;
    const Tensor labels = Tensor::from_vector(y, {16}).to(device);
    Tensor loss;
    {
      ops::AutocastGuard autocast(precision);
      loss = ops::cross_entropy(model.forward(x), labels);
    }
    losses.push_back(loss.item());
    autograd::backward(scaler.enabled() ? scaler.scale(loss) : loss);
    if (scaler.enabled()) {
      scaler.step(opt);
      scaler.update();
    } else {
      opt.step();
    }
    model.zero_grad();
  }
  return losses;
}

TEST(CudaTraining, AFewStepsGiveTheSameLossesOnCpuAndGpu) {
  FORGE_REQUIRE_CUDA();
  const auto cpu = train_losses(Device::cpu(), DType::f32, 5);
  const auto cuda = train_losses(gpu(), DType::f32, 5);
  ASSERT_EQ(cpu.size(), cuda.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(cuda[i], cpu[i], 1e-4 * std::abs(cpu[i])) << i;
  EXPECT_LT(cpu.back(), cpu.front());
}

TEST(CudaTraining, MixedPrecisionStaysCloseToF32AndLearns) {
  FORGE_REQUIRE_CUDA();
  const auto f32 = train_losses(gpu(), DType::f32, 8);
  for (DType low : {DType::bf16, DType::f16}) {
    const auto mixed = train_losses(gpu(), low, 8);
    // The first loss sees the same weights: only the GEMMs' rounding differs.
    EXPECT_NEAR(mixed[0], f32[0], 3e-2 * f32[0]) << dtype_name(low);
    for (double l : mixed) EXPECT_TRUE(std::isfinite(l)) << dtype_name(low);
    EXPECT_LT(mixed.back(), mixed.front()) << dtype_name(low) << " did not learn";
  }
}

TEST(CudaTraining, ModuleToMovesEveryTensorAndKeepsTies) {
  FORGE_REQUIRE_CUDA();
  Generator gen(1);
  nn::ViT model(mnist_vit_config(), &gen);
  const auto before = model.state_dict();
  model.to(gpu());
  EXPECT_EQ(model.device(), gpu());
  for (const auto& [name, t] : model.state_dict()) {
    EXPECT_EQ(t.device(), gpu()) << name;
    EXPECT_EQ(t.to(Device::cpu()).to_vector<float>(), before.at(name).to_vector<float>()) << name;
  }
  for (const auto& [name, p] : model.named_parameters()) EXPECT_TRUE(p.requires_grad()) << name;
  model.to(Device::cpu());
  EXPECT_EQ(model.device(), Device::cpu());
}

// ---- the trainer: recipes, devices and checkpoints ----

// A Fashion-MNIST-shaped data directory (plain IDX files) of synthetic 28x28
// images: class c is a bright band on rows 2c .. 2c + 5 over noise. The GPU
// machine has no Debian dataset package, so these tests bring their own data.
std::string synthetic_fashion_mnist() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("synthetic_fmnist");
    fs::create_directories(d);
    const auto u32 = [](std::string& s, uint32_t v) {
      for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>(v >> shift));
    };
    Generator gen(11);
    for (const auto& [prefix, n] : {std::pair<std::string, uint32_t>{"train", 512},
                                    std::pair<std::string, uint32_t>{"t10k", 128}}) {
      std::string images, labels;
      for (uint32_t v : {0x00000803u, n, 28u, 28u}) u32(images, v);
      for (uint32_t v : {0x00000801u, n}) u32(labels, v);
      const std::vector<float> noise =
          Tensor::rand({static_cast<int64_t>(n) * 28 * 28}, DType::f32, &gen).to_vector<float>();
      for (uint32_t i = 0; i < n; ++i) {
        const uint32_t c = i % 10;
        labels.push_back(static_cast<char>(c));
        for (uint32_t p = 0; p < 28 * 28; ++p) {
          const bool band = p / 28 >= 2 * c && p / 28 < 2 * c + 6;
          images.push_back(static_cast<char>(
              static_cast<uint8_t>((band ? 160.0f : 0.0f) + 80.0f * noise[i * 28 * 28 + p])));
        }
      }
      testing::write_file(fs::path(d) / (prefix + "-images-idx3-ubyte"), images);
      testing::write_file(fs::path(d) / (prefix + "-labels-idx1-ubyte"), labels);
    }
    return d;
  }();
  return dir;
}

train::Recipe recipe(const std::string& device, const std::string& precision) {
  train::Recipe r = train::Recipe::from_yaml(R"(
name: gpu
seed: 3
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
    dropout: 0.1
data:
  dataset: fashion_mnist
  limit_train: 512
  limit_eval: 128
optimizer:
  name: adamw
  lr: 3.0e-3
  clip_grad_norm: 1.0
loop:
  epochs: 0
  steps: 8
  batch_size: 32
  log_every: 4
  eval_every: 4
checkpoint:
  every: 4
  keep_last: 3
)",
                                             "gpu.yaml");
  r.set("device=" + device);
  r.set("precision=" + precision);
  r.set("data.root=" + synthetic_fashion_mnist());
  return r;
}

TEST(CudaTraining, RecipesTrainOnTheGpuInEveryPrecision) {
  FORGE_REQUIRE_CUDA();
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    const std::string dir = fresh_dir(std::string("precision_") + precision);
    const train::TrainResult r = train::train(recipe("cuda", precision), quiet(dir));
    EXPECT_EQ(r.steps, 8) << precision;
    EXPECT_TRUE(std::isfinite(r.eval_loss)) << precision;
    // Chance is ln 10 = 2.303; on the CPU this run ends near 2.16 after its 8 steps.
    EXPECT_LT(r.eval_loss, 2.25) << precision << ": did not learn the easy synthetic classes";
    const std::string log = testing::read_file(fs::path(dir) / "train.log");
    EXPECT_NE(log.find("on cuda:0"), std::string::npos) << log;
    fs::remove_all(dir);
  }
}

TEST(CudaTraining, ACheckpointSavedOnTheGpuEvaluatesAndResumesOnTheCpu) {
  FORGE_REQUIRE_CUDA();
  // Evaluation of the same checkpoint on both devices agrees.
  const std::string dir = fresh_dir("gpu_to_cpu");
  const train::TrainResult done = train::train(recipe("cuda", "fp32"), quiet(dir));
  const train::EvalResult on_gpu = train::evaluate_checkpoint(done.last_checkpoint, "", {});
  const train::EvalResult on_cpu =
      train::evaluate_checkpoint(done.last_checkpoint, "", {"device=cpu"});
  EXPECT_NEAR(on_cpu.loss, on_gpu.loss, 1e-4 * on_gpu.loss);
  EXPECT_NEAR(on_cpu.accuracy, on_gpu.accuracy, 1.0 / 128 + 1e-9);

  // A run stopped on the GPU at step 4 continues on the CPU to the same end,
  // up to the devices' rounding.
  const std::string split = fresh_dir("gpu_then_cpu");
  train::TrainOptions stop = quiet(split);
  stop.stop_requested = [](int64_t step) { return step == 4; };
  EXPECT_EQ(train::train(recipe("cuda", "fp32"), stop).status,
            train::TrainResult::Status::interrupted);
  train::TrainOptions resume = quiet(split);
  resume.resume = true;
  const train::TrainResult resumed = train::train(recipe("cpu", "fp32"), resume);
  EXPECT_EQ(resumed.steps, 8);
  EXPECT_NEAR(resumed.eval_loss, done.eval_loss, 2e-3 * done.eval_loss);
  fs::remove_all(dir);
  fs::remove_all(split);
}

TEST(CudaTraining, ACheckpointSavedOnTheCpuResumesOnTheGpu) {
  FORGE_REQUIRE_CUDA();
  const std::string whole = fresh_dir("cpu_whole"), split = fresh_dir("cpu_then_gpu");
  const train::TrainResult done = train::train(recipe("cpu", "fp32"), quiet(whole));
  train::TrainOptions stop = quiet(split);
  stop.stop_requested = [](int64_t step) { return step == 4; };
  train::train(recipe("cpu", "fp32"), stop);
  train::TrainOptions resume = quiet(split);
  resume.resume = true;
  const train::TrainResult resumed = train::train(recipe("cuda", "fp32"), resume);
  EXPECT_EQ(resumed.steps, 8);
  EXPECT_NEAR(resumed.eval_loss, done.eval_loss, 2e-3 * done.eval_loss);
  fs::remove_all(whole);
  fs::remove_all(split);
}

}  // namespace
}  // namespace forge
