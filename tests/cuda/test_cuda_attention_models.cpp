// Every attention mechanism inside a model on the GPU: a few AdamW steps of a
// small ViT (non-causal, each mechanism in every layer, and local heads mixed
// with a global mechanism) and of a small causal language model with a
// padding mask give the same losses on the CPU and the GPU in f32, and a bf16
// autocast run learns. The ops themselves are compared with the CPU in the
// test_cuda_attention_*.cpp files; this is the integration through nn/.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "nn/models.h"
#include "ops/attention/attention.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "tests/cuda/cuda_attention_test_util.h"
#include "tests/nn/nn_test_util.h"

namespace forge {
namespace {

using nn::Mechanism;
using testing::gpu;

const std::vector<Mechanism> kAll = {
    Mechanism::softmax,       Mechanism::local,     Mechanism::efficient, Mechanism::linear,
    Mechanism::taylor_linear, Mechanism::linformer, Mechanism::favor,     Mechanism::taylorshift};

// A model and one training batch: the loss of the model on it.
struct Task {
  std::unique_ptr<nn::Module> model;
  std::function<Tensor()> loss;
};

// A ViT on 28x28 images with 7x7 patches: 16 patches + CLS = 17 tokens, 2
// layers of 2 heads of d = 16.
Task vit_task(Mechanism kind, int64_t n_local_heads, Device device) {
  nn::ViTConfig c = testing::mnist_vit_config();
  nn::AttentionConfig& a = c.stack.block.attention;
  a.kind = kind;
  a.n_local_heads = n_local_heads;
  a.local_window = 8;  // 17 tokens: three windows, the last one partial
  a.k = 8;             // linformer
  a.nb_features = 24;  // favor
  Generator gen(5);
  auto model = std::make_unique<nn::ViT>(c, &gen);
  model->to(device);
  Generator data(100);  // one batch, seen every step: the loss must fall
  const Tensor x = Tensor::randn({8, 1, 28, 28}, DType::f32, &data).to(device);
  std::vector<int64_t> y(8);
  for (int i = 0; i < 8; ++i) y[static_cast<size_t>(i)] = (i * 7) % 10;
  const Tensor labels = Tensor::from_vector(y, {8}).to(device);
  nn::ViT* m = model.get();
  return {std::move(model), [m, x, labels] { return ops::cross_entropy(m->forward(x), labels); }};
}

// A causal language model over 32 tokens (2 layers, 2 heads of d = 16); the
// second sequence has its last 5 tokens padded (masked keys, ignored targets).
Task lm_task(Mechanism kind, Device device) {
  constexpr int64_t B = 2, N = 32, V = 40;
  nn::LanguageModelConfig c;
  c.vocab_size = V;
  c.max_len = N;
  c.dim = 32;
  c.stack.depth = 2;
  nn::AttentionConfig& a = c.stack.block.attention;
  a.kind = kind;
  a.heads = 2;
  a.local_window = 8;
  a.bucket_size = 8;  // efficient
  a.nb_features = 24;
  Generator gen(6);
  auto model = std::make_unique<nn::LanguageModel>(c, &gen);
  model->to(device);
  std::vector<int64_t> ids(B * N), targets(B * N);
  std::vector<uint8_t> mask(B * N, 1);
  for (int64_t i = 0; i < B * N; ++i) {
    ids[static_cast<size_t>(i)] = (i * 13 + 7) % V;
    targets[static_cast<size_t>(i)] = (i * 13 + 20) % V;
  }
  for (int64_t j = N - 5; j < N; ++j) {
    mask[static_cast<size_t>(N + j)] = 0;
    targets[static_cast<size_t>(N + j)] = -100;
  }
  const Tensor x = Tensor::from_vector(ids, {B, N}).to(device);
  const Tensor t = Tensor::from_vector(targets, {B * N}).to(device);
  const Tensor m = Tensor::from_vector(mask, {B, N}).to(DType::boolean).to(device);
  nn::LanguageModel* lm = model.get();
  return {std::move(model), [lm, x, t, m] {
            const Tensor logits = lm->forward(x, m);
            return ops::cross_entropy(ops::reshape(logits, {-1, logits.size(-1)}), t,
                                      {.ignore_index = -100});
          }};
}

// The losses of `steps` AdamW steps of a task, under autocast `precision`.
std::vector<double> losses(Task task, int steps, DType precision = DType::f32) {
  optim::AdamW opt(optim::param_groups(*task.model, 0.05, true), 3e-3);
  std::vector<double> out;
  for (int s = 0; s < steps; ++s) {
    Tensor loss;
    {
      ops::AutocastGuard autocast(precision);
      loss = task.loss();
    }
    out.push_back(loss.item());
    autograd::backward(loss);
    opt.step();
    task.model->zero_grad();
  }
  return out;
}

void expect_same_losses(const std::vector<double>& cpu, const std::vector<double>& cuda,
                        const std::string& what) {
  ASSERT_EQ(cpu.size(), cuda.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(cuda[i], cpu[i], 1e-4 * std::abs(cpu[i])) << what << ", step " << i;
  EXPECT_LT(cpu.back(), cpu.front()) << what << " did not learn on the CPU";
}

TEST(CudaAttentionModels, ViTStepsGiveTheSameLossesOnCpuAndGpuForEveryMechanism) {
  FORGE_REQUIRE_CUDA();
  for (Mechanism kind : kAll) {
    const std::string what = std::string("ViT with ") + nn::mechanism_name(kind);
    expect_same_losses(losses(vit_task(kind, 0, Device::cpu()), 4),
                       losses(vit_task(kind, 0, gpu()), 4), what);
  }
}

TEST(CudaAttentionModels, LocalHeadsMixedWithAGlobalMechanismOnTheGpu) {
  FORGE_REQUIRE_CUDA();
  for (Mechanism kind : {Mechanism::favor, Mechanism::linear, Mechanism::taylorshift}) {
    const std::string what = std::string("ViT with 1 local head + ") + nn::mechanism_name(kind);
    expect_same_losses(losses(vit_task(kind, 1, Device::cpu()), 4),
                       losses(vit_task(kind, 1, gpu()), 4), what);
  }
}

TEST(CudaAttentionModels, CausalLanguageModelStepsGiveTheSameLossesOnCpuAndGpu) {
  FORGE_REQUIRE_CUDA();
  for (Mechanism kind : {Mechanism::softmax, Mechanism::local, Mechanism::efficient,
                         Mechanism::linear, Mechanism::favor}) {
    const std::string what = std::string("causal LM with ") + nn::mechanism_name(kind);
    expect_same_losses(losses(lm_task(kind, Device::cpu()), 4), losses(lm_task(kind, gpu()), 4),
                       what);
  }
}

TEST(CudaAttentionModels, Bf16AutocastTrainsEveryMechanismOnTheGpu) {
  FORGE_REQUIRE_CUDA();
  for (Mechanism kind : kAll) {
    const std::string what = std::string("bf16 ViT with ") + nn::mechanism_name(kind);
    const auto f32 = losses(vit_task(kind, 0, gpu()), 6);
    const auto bf16 = losses(vit_task(kind, 0, gpu()), 6, DType::bf16);
    EXPECT_NEAR(bf16[0], f32[0], 3e-2 * f32[0]) << what;
    for (double l : bf16) EXPECT_TRUE(std::isfinite(l)) << what;
    EXPECT_LT(bf16.back(), bf16.front()) << what << " did not learn";
  }
}

// Under autocast, softmax and local attention on f32 GPU tensors compute on
// bf16 copies (tensor cores) and hand back f32 outputs and gradients that
// equal the op run on the bf16-rounded inputs, up to bf16 rounding.
TEST(CudaAttentionModels, SoftmaxAndLocalUnderAutocastComputeInBf16AndReturnF32) {
  FORGE_REQUIRE_CUDA();
  namespace att = ops::attention;
  const std::vector<std::pair<std::string, testing::AttentionFn>> ops_under_test = {
      {"softmax causal",
       [](const std::vector<Tensor>& in) {
         return att::softmax(in[0], in[1], in[2], in[3], {.causal = true});
       }},
      {"local", [](const std::vector<Tensor>& in) {
         return att::local(in[0], in[1], in[2], in[3], {.window = 16});
       }}};
  for (const auto& [what, fn] : ops_under_test) {
    const Tensor mask = testing::padding_mask(2, 80, {0, 7}).to(gpu());
    std::vector<Tensor> in;
    for (uint64_t seed : {1, 2, 3})
      in.push_back(
          testing::round_through(testing::uniform({2, 3, 80, 32}, seed, DType::f32, -1, 1, false),
                                 DType::bf16)
              .to(gpu()));
    for (Tensor& t : in) t.set_requires_grad(true);
    std::vector<Tensor> low;
    for (const Tensor& t : in) low.push_back(t.detach().to(DType::bf16).set_requires_grad(true));
    in.push_back(mask);
    low.push_back(mask);
    Tensor o;
    {
      ops::AutocastGuard autocast(DType::bf16);
      o = fn(in);
    }
    const Tensor want = fn(low);  // the same op on bf16 tensors, no autocast
    ASSERT_EQ(o.dtype(), DType::f32) << what;
    EXPECT_LE(testing::scaled_diff(o, want), 1e-2) << what;
    const Tensor seed = testing::uniform(o.shape(), 9, DType::f32, -1, 1, false).to(gpu());
    autograd::backward({o}, {seed});
    autograd::backward({want}, {seed.to(DType::bf16)});
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(in[static_cast<size_t>(i)].grad().dtype(), DType::f32) << what;
      EXPECT_LE(testing::scaled_diff(in[static_cast<size_t>(i)].grad(),
                                     low[static_cast<size_t>(i)].grad()),
                3e-2)
          << what << ", gradient " << i;
    }
  }
}

}  // namespace
}  // namespace forge
