// One training step (forward, cross-entropy, backward, AdamW update) of a ViT
// on random images, for the comparison with the same model in plain PyTorch
// (bench/torch_train_step.py runs both in one process tree).
//
//   bench_train_step [--model tiny|p4|s16] [--device cpu|cuda] [--precision fp32|bf16|fp16]
//                  [--batch 128] [--steps 30] [--warmup 5] [--flash-engine tiled|mma|cudnn]
//                  [--multi-tensor on|off]
// (--flash-engine: the GPU softmax attention kernels, ops::attention::set_flash_engine;
// --multi-tensor: AdamW's GPU update in launches of many tensors, optim::set_multi_tensor)
// tiny: the default recipe's ViT (recipes/vit/fmnist_tiny.yaml: 28x28x1
// images, 7x7 patches, width 96, depth 6, 4 heads, feed-forward 192).
// p4: the default recipe's ViT before issue 18 (4x4 patches, width 64, depth
// 4, 4 heads, feed-forward 128), the model of that step timings.
// s16: ViT-S/16 (224x224x3, 16x16 patches, width 384, depth 12, 6 heads,
// feed-forward 1536, 1000 classes), as timm's vit_small_patch16_224.
// bf16 / fp16: autocast with f32 master weights (fp16 with loss scaling), as
// the trainer's `precision`. On a GPU each step ends with a device
// synchronisation, so the time is the step's whole device time.
// Prints one CSV line: ours,batch,median_ms,images_per_s,peak_mb
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "bench/bench_args.h"
#include "core/allocator.h"
#include "nn/models.h"
#include "ops/attention/attention.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"

using namespace forge;

namespace {

int run(int argc, char** argv) {
  int64_t B = 128, steps = 30, warmup = 5;
  std::string model_name = "tiny", device_name = "cpu", precision = "fp32", attention = "softmax";
  bench::parse_bench_args(
      argc, argv,
      {{"--batch", &B},
       {"--steps", &steps},
       {"--warmup", &warmup},
       {"--model", &model_name},
       {"--device", &device_name},
       {"--precision", &precision},
       {"--attention", &attention},
       {"--flash-engine",
        [](const std::string& v) {
          FORGE_CHECK(v == "tiled" || v == "mma" || v == "cudnn",
                      "--flash-engine must be tiled, mma or cudnn, got {}", v);
          ops::attention::set_flash_engine(v == "tiled" ? cuda::FlashEngine::tiled
                                           : v == "mma" ? cuda::FlashEngine::mma
                                                        : cuda::FlashEngine::cudnn);
        }},
       {"--multi-tensor", [](const std::string& v) {
          FORGE_CHECK(v == "on" || v == "off", "--multi-tensor must be on or off, got {}", v);
          optim::set_multi_tensor(v == "on");
        }}});
  if ((model_name != "tiny" && model_name != "p4" && model_name != "s16" &&
       model_name != "listops") ||
      (attention != "softmax" && attention != "favor" && attention != "taylorshift") ||
      (device_name != "cpu" && device_name != "cuda") ||
      (precision != "fp32" && precision != "bf16" && precision != "fp16") || B <= 0 || steps <= 0) {
    std::fprintf(
        stderr, "bench_train_step: bad arguments (see the comment at the top of train_step.cpp)\n");
    return 2;
  }
  if (device_name == "cuda" && cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_train_step: --device cuda, but no CUDA device is visible\n");
    return 1;
  }
  const Device device = device_name == "cuda" ? Device::cuda(0) : Device::cpu();
  const DType autocast = precision == "bf16"   ? DType::bf16
                         : precision == "fp16" ? DType::f16
                                               : DType::f32;

  const nn::Mechanism kind = attention == "favor"         ? nn::Mechanism::favor
                             : attention == "taylorshift" ? nn::Mechanism::taylorshift
                                                          : nn::Mechanism::softmax;
  Generator gen(0);
  std::unique_ptr<nn::Module> model;
  std::function<Tensor()> forward;
  int64_t classes = 0;
  Tensor x;
  if (model_name == "listops") {
    constexpr int64_t kTokens = 2000;
    nn::SequenceClassifierConfig c;
    c.vocab_size = 16;  // data/listops.h kListOpsVocabSize
    c.max_len = kTokens;
    c.dim = 512;
    c.classes = classes = 10;
    c.stack.depth = 4;
    c.stack.block.attention.heads = 8;
    c.stack.block.attention.kind = kind;
    c.stack.block.ff.hidden = 1024;
    auto* m = new nn::SequenceClassifier(c, &gen);
    model.reset(m);
    std::vector<int64_t> ids(static_cast<size_t>(B * kTokens));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1 + static_cast<int64_t>(i * 7919 % 15);
    x = Tensor::from_vector(ids, {B, kTokens});
    forward = [m, &x] { return m->forward(x); };
  } else {
    nn::ViTConfig c;
    if (model_name == "tiny" || model_name == "p4") {
      const bool p4 = model_name == "p4";
      c.image_size = 28;
      c.patch_size = p4 ? 4 : 7;
      c.channels = 1;
      c.classes = 10;
      c.dim = p4 ? 64 : 96;
      c.depth = p4 ? 4 : 6;
      c.heads = 4;
      c.mlp_ratio = 2;
    } else {
      c = nn::ViTConfig::preset("S", 224, 16, 1000);
    }
    c.stack.block.attention.kind = kind;
    classes = c.classes;
    auto* m = new nn::ViT(c, &gen);
    model.reset(m);
    x = Tensor::randn({B, c.channels, c.image_size, c.image_size}, DType::f32, &gen);
    forward = [m, &x] { return m->forward(x); };
  }
  model->to(device);
  model->set_generator(&gen);
  x = x.to(device);
  optim::AdamW opt(optim::param_groups(*model, 0.05, true), 2e-3);
  optim::GradScaler scaler(optim::GradScalerOptions{.enabled = precision == "fp16"});
  std::vector<int64_t> labels(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) labels[static_cast<size_t>(i)] = i % classes;
  const Tensor y = Tensor::from_vector(labels, {B}).to(device);

  std::vector<double> ms;
  cuda_synchronize(device);
  reset_peak_memory(device);
  const int64_t base = memory_stats(device).current;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor loss;
    {
      ops::AutocastGuard guard(autocast);
      loss = ops::cross_entropy(forward(), y);
    }
    autograd::backward(scaler.enabled() ? scaler.scale(loss) : loss);
    if (scaler.enabled()) {
      scaler.step(opt);
      scaler.update();
    } else {
      opt.step();
    }
    model->zero_grad();
    cuda_synchronize(device);
    const double t =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  std::printf("ours,%ld,%.2f,%.0f,%.1f\n", static_cast<long>(B), median,
              1000.0 * static_cast<double>(B) / median,
              static_cast<double>(memory_stats(device).peak - base) / (1 << 20));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::bench_main("bench_train_step", argc, argv, run);
}
