// The tensor-core kernels of softmax and local attention
// (cuda::FlashEngine::mma, issue 29: ops/attention/tile_engine.cuh and the mma
// sections of flash_cuda.cu), forward and backward, against the CPU ops and
// against the tiled kernels: bf16 and f16 with d = dv = 64 and 128 over
// partial tiles, cross lengths, causality, key padding masks (a batch with
// every key masked), local bands; runs bit-identical when repeated; and every
// case the engine does not take (f32, other head dims, dropout) bit-identical
// to the tiled kernels. Then cuda::FlashEngine::cudnn (cuDNN's fused
// attention, sdpa_cudnn_cuda.cpp) against the CPU and the tiled kernels, and
// the cases it leaves to the mma kernels.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "ops/attention/attention.h"
#include "tests/cuda/cuda_attention_test_util.h"

namespace forge {
namespace {

using cuda::FlashEngine;
using ops::attention::LocalOptions;
using ops::attention::SoftmaxOptions;
using namespace testing;

// q, k, v [B, H, len, d] in f64 on the CPU, then the mask when given.
std::vector<Tensor> make_inputs(int64_t B, int64_t H, int64_t N, int64_t M, int64_t d,
                                uint64_t seed, const Tensor& mask = Tensor()) {
  return testing::qkv_inputs(B, H, N, M, d, d, DType::f64, seed, mask);
}

AttentionFn softmax_fn(bool causal, double dropout = 0) {
  return [causal, dropout](const std::vector<Tensor>& in) {
    Generator gen(7);
    SoftmaxOptions o;
    o.causal = causal;
    o.dropout = dropout;
    o.gen = &gen;
    return ops::attention::softmax(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor(), o);
  };
}

AttentionFn local_fn(int64_t window, int64_t back, int64_t forward, bool causal) {
  return [=](const std::vector<Tensor>& in) {
    LocalOptions o{
        .window = window, .look_backward = back, .look_forward = forward, .causal = causal};
    return ops::attention::local(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor(), o);
  };
}

struct Case {
  std::string what;
  AttentionFn fn;
  std::vector<Tensor> in;
};

// Every case the mma engine takes, at head dim d.
std::vector<Case> mma_cases(int64_t d) {
  // Batch 0: key 3 and the last 37 keys padded; batch 1: every key padded.
  const Tensor mask =
      testing::key_mask(2, 150, [](int64_t b, int64_t j) { return b == 0 && j != 3 && j < 113; });
  const Tensor band_mask =
      testing::key_mask(2, 200, [](int64_t b, int64_t j) { return j < 200 - 9 * b; });
  return {
      {"partial tiles N = M = 200", softmax_fn(false), make_inputs(2, 3, 200, 200, d, 11)},
      {"N 70, M 190", softmax_fn(false), make_inputs(2, 2, 70, 190, d, 31)},
      {"N 190, M 33", softmax_fn(false), make_inputs(2, 2, 190, 33, d, 32)},
      {"N 1, M 65", softmax_fn(false), make_inputs(1, 3, 1, 65, d, 33)},
      {"causal N 150", softmax_fn(true), make_inputs(2, 2, 150, 150, d, 21)},
      {"mask", softmax_fn(false), make_inputs(2, 2, 150, 150, d, 41, mask)},
      {"causal+mask", softmax_fn(true), make_inputs(2, 2, 150, 150, d, 42, mask)},
      {"cross+mask", softmax_fn(false), make_inputs(2, 1, 80, 150, d, 43, mask)},
      {"local w64 1/1", local_fn(64, 1, 1, false), make_inputs(2, 2, 200, 200, d, 51)},
      {"local w48 causal", local_fn(48, 1, 0, true), make_inputs(2, 2, 200, 200, d, 52)},
      {"local w32 2/1 mask", local_fn(32, 2, 1, false),
       make_inputs(2, 2, 200, 200, d, 53, band_mask)},
  };
}

TEST(CudaFlashMma, MatchesCpuForwardAndGradients) {
  FORGE_REQUIRE_CUDA();
  const EngineScope mma(FlashEngine::mma);
  for (int64_t d : {64, 128})
    for (DType dt : {DType::bf16, DType::f16})
      for (const Case& c : mma_cases(d))
        expect_cuda_matches_cpu(c.fn, c.in, dt, testing::attention_tolerance(dt),
                                c.what + ", d " + std::to_string(d) + " (" + dtype_name(dt) + ")");
}

TEST(CudaFlashMma, AgreesWithTheTiledKernelsAndRepeatsBitIdentically) {
  FORGE_REQUIRE_CUDA();
  for (int64_t d : {64, 128})
    for (DType dt : {DType::bf16, DType::f16})
      for (const Case& c : mma_cases(d)) {
        const std::string what = c.what + ", d " + std::to_string(d) + " (" + dtype_name(dt) + ")";
        const auto tiled = gpu_run(c.fn, c.in, dt, FlashEngine::tiled);
        const auto a = gpu_run(c.fn, c.in, dt, FlashEngine::mma);
        const auto b = gpu_run(c.fn, c.in, dt, FlashEngine::mma);
        expect_engine_agrees_and_repeats(tiled, a, b, dt, what);
      }
}

// f32, head dims other than 64 / 128, d != dv and dropout stay on the tiled
// kernels: the engine switch changes nothing there, forward or backward.
TEST(CudaFlashMma, CasesItDoesNotTakeRunTheTiledKernels) {
  FORGE_REQUIRE_CUDA();
  expect_engines_identical<FlashEngine>(
      {
          {"f32 d 64", softmax_fn(false), make_inputs(2, 2, 100, 100, 64, 61), DType::f32},
          {"bf16 d 96", softmax_fn(false), make_inputs(2, 2, 100, 100, 96, 62), DType::bf16},
          {"bf16 d 64, dv 128",
           softmax_fn(false),
           {uniform({1, 2, 90, 64}, 63), uniform({1, 2, 90, 64}, 64), uniform({1, 2, 90, 128}, 65)},
           DType::bf16},
          {"bf16 dropout", softmax_fn(false, 0.2), make_inputs(2, 2, 100, 100, 64, 66),
           DType::bf16},
      },
      FlashEngine::tiled, FlashEngine::mma);
}

// ---- FlashEngine::cudnn: cuDNN's fused attention where it takes the case ----

// The cases cuDNN's native SDPA operations take (no mask, band, causality or dropout).
std::vector<Case> cudnn_cases(int64_t d) {
  return {
      {"N = M = 200", softmax_fn(false), make_inputs(2, 3, 200, 200, d, 71)},
      {"N 70, M 190", softmax_fn(false), make_inputs(2, 2, 70, 190, d, 72)},
      {"N = M = 1024", softmax_fn(false), make_inputs(1, 4, 1024, 1024, d, 73)},
  };
}

TEST(CudaFlashCudnn, MatchesCpuForwardAndGradients) {
  FORGE_REQUIRE_CUDA();
  const EngineScope cudnn(FlashEngine::cudnn);
  for (int64_t d : {64, 128})
    for (DType dt : {DType::bf16, DType::f16})
      for (const Case& c : cudnn_cases(d))
        expect_cuda_matches_cpu(c.fn, c.in, dt, testing::attention_tolerance(dt),
                                c.what + ", d " + std::to_string(d) + " (" + dtype_name(dt) + ")");
}

TEST(CudaFlashCudnn, AgreesWithTheTiledKernelsAndRepeatsItsForward) {
  FORGE_REQUIRE_CUDA();
  for (int64_t d : {64, 128})
    for (DType dt : {DType::bf16, DType::f16})
      for (const Case& c : cudnn_cases(d)) {
        const std::string what = c.what + ", d " + std::to_string(d) + " (" + dtype_name(dt) + ")";
        const auto tiled = gpu_run(c.fn, c.in, dt, FlashEngine::tiled);
        const auto a = gpu_run(c.fn, c.in, dt, FlashEngine::cudnn);
        const auto b = gpu_run(c.fn, c.in, dt, FlashEngine::cudnn);
        expect_engine_agrees_and_repeats(tiled, a, b, dt, what, /*repeated=*/1);
      }
}

// Masks, bands and causality are not cuDNN's here: the cudnn engine runs them
// as the mma engine does, bit for bit.
TEST(CudaFlashCudnn, CasesItDoesNotTakeRunAsMma) {
  FORGE_REQUIRE_CUDA();
  for (DType dt : {DType::bf16, DType::f16})
    for (const Case& c : mma_cases(64)) {
      const auto mma = gpu_run(c.fn, c.in, dt, FlashEngine::mma);
      const auto cudnn = gpu_run(c.fn, c.in, dt, FlashEngine::cudnn);
      const bool cudnn_may_take = c.in.size() == 3 && c.what.find("causal") == std::string::npos &&
                                  c.what.find("local") == std::string::npos;
      if (cudnn_may_take) continue;  // the plain cases above
      for (size_t i = 0; i < 4; ++i)
        EXPECT_EQ(testing::host_f32(mma[i]).to_vector<float>(),
                  testing::host_f32(cudnn[i]).to_vector<float>())
            << c.what << " (" << dtype_name(dt) << "): " << kOutputNames[i];
    }
}

}  // namespace
}  // namespace forge
