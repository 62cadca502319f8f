// Decoding on the GPU (issue 30): a language model of linear, efficient or
// favor heads on a GPU keeps its recurrent state on the device with
// GenerateOptions::state_on_gpu (AttentionState::with_ops) and draws the tokens the CPU draws for
// the same weights and seed, greedy and sampled, and the tokens of its own full recomputation; a
// model with softmax or local heads on a GPU recomputes.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "nn/models.h"
#include "tests/cuda/cuda_test_util.h"

namespace forge::nn {
namespace {

namespace att = ops::attention;

LanguageModelConfig lm_config(Mechanism kind, const std::function<void(AttentionConfig&)>& set) {
  AttentionConfig a{.kind = kind,
                    .dim = 32,
                    .heads = 4,
                    .causal = true,
                    .bucket_size = 1,
                    .nb_features = 16,
                    .dtype = DType::f64};
  if (set) set(a);
  LanguageModelConfig c{
      .vocab_size = 17, .max_len = 64, .dim = 32, .positional = PositionalKind::learned};
  c.stack.depth = 2;
  c.stack.block.attention = a;
  c.stack.block.ff.mult = 2;
  c.dtype = DType::f64;
  return c;
}

Tensor prime_ids() {
  return Tensor::from_vector<int64_t>({1, 5, 9, 3, 2, 7, 11, 4}, {2, 4});
}

TEST(CudaGeneration, LinearFamilyStateOnTheGpuDrawsTheCpuTokens) {
  FORGE_REQUIRE_CUDA();
  struct Case {
    std::string name;
    Mechanism kind;
    std::function<void(AttentionConfig&)> set;
  };
  const std::vector<Case> cases = {
      {"linear", Mechanism::linear, {}},
      {"efficient", Mechanism::efficient, {}},
      {"efficient bucket 4", Mechanism::efficient, [](AttentionConfig& a) { a.bucket_size = 4; }},
      {"favor softmax kernel", Mechanism::favor, {}},
      {"favor relu", Mechanism::favor,
       [](AttentionConfig& a) { a.favor_kernel = att::FavorKernel::relu; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const LanguageModelConfig config = lm_config(c.kind, c.set);
    Generator g1(21), g2(21);
    LanguageModel cpu(config, &g1), gpu(config, &g2);
    cpu.fix_projections();
    gpu.fix_projections();
    gpu.to(testing::gpu());
    ASSERT_TRUE(gpu.stack().recurrent_with_ops());
    const auto tokens = [](LanguageModel& lm, const GenerateOptions& o) {
      return lm.generate(prime_ids(), 30, o).to_vector<int64_t>();
    };
    EXPECT_EQ(tokens(gpu, {.greedy = true, .state_on_gpu = true}), tokens(cpu, {.greedy = true}));
    Generator a(5), b(5), d(5);
    const auto sampled = tokens(gpu, {.temperature = 0.9, .state_on_gpu = true, .gen = &a});
    EXPECT_EQ(sampled, tokens(cpu, {.temperature = 0.9, .gen = &b}));
    EXPECT_EQ(sampled, tokens(gpu, {.temperature = 0.9, .use_recurrent_state = false, .gen = &d}));
  }
}

TEST(CudaGeneration, SoftmaxAndLocalHeadsOnTheGpuRecompute) {
  FORGE_REQUIRE_CUDA();
  for (const bool local_heads : {false, true}) {
    const LanguageModelConfig config =
        lm_config(local_heads ? Mechanism::linear : Mechanism::softmax,
                  [&](AttentionConfig& a) { a.n_local_heads = local_heads ? 2 : 0; });
    Generator g1(22), g2(22);
    LanguageModel cpu(config, &g1), gpu(config, &g2);
    gpu.to(testing::gpu());
    EXPECT_FALSE(gpu.stack().recurrent_with_ops());
    EXPECT_EQ(gpu.generate(prime_ids(), 20, {.greedy = true}).to_vector<int64_t>(),
              cpu.generate(prime_ids(), 20, {.greedy = true}).to_vector<int64_t>());
  }
}

}  // namespace
}  // namespace forge::nn
