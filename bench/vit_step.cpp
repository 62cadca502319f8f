// One training step (forward, cross-entropy, backward, AdamW update) of the
// default recipe's ViT (recipes/vit/fmnist_tiny.yaml: 28x28x1 images, 4x4
// patches, width 64, depth 4, 4 heads, feed-forward 128) on random images, for
// the comparison with the same model in PyTorch (bench/torch_vit_step.py).
//
//   bench_vit_step [--batch 128] [--steps 30] [--warmup 5]
// Prints one CSV line: ours,batch,median_ms,images_per_s,peak_mb
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "optim/adam.h"

using namespace forge;

int main(int argc, char** argv) {
  int64_t B = 128, steps = 30, warmup = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (a == "--batch") B = v;
    else if (a == "--steps") steps = v;
    else if (a == "--warmup") warmup = v;
    else {
      std::fprintf(stderr, "bench_vit_step: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  nn::ViTConfig c;
  c.image_size = 28;
  c.patch_size = 4;
  c.channels = 1;
  c.classes = 10;
  c.dim = 64;
  c.depth = 4;
  c.heads = 4;
  c.mlp_ratio = 2;
  Generator gen(0);
  nn::ViT model(c, &gen);
  model.set_generator(&gen);
  optim::AdamW opt(optim::param_groups(model, 0.05, true), 2e-3);
  const Tensor x = Tensor::randn({B, 1, 28, 28}, DType::f32, &gen);
  std::vector<int64_t> labels(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) labels[static_cast<size_t>(i)] = i % 10;
  const Tensor y = Tensor::from_vector(labels, {B});

  std::vector<double> ms;
  reset_peak_memory();
  const int64_t base = memory_stats().current;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor loss = ops::cross_entropy(model.forward(x), y);
    autograd::backward(loss);
    opt.step();
    model.zero_grad();
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  std::printf("ours,%ld,%.2f,%.0f,%.1f\n", static_cast<long>(B), median, 1000.0 * static_cast<double>(B) / median,
              static_cast<double>(memory_stats().peak - base) / (1 << 20));
  return 0;
}
