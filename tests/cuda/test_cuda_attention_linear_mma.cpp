// The tensor-core core of the linear family (cuda::LinearEngine::mma, issue
// 30: ops/attention/linear_core_mma_cuda.cu), forward and backward, against
// the CPU ops and against the fma core: linear (elu + 1 fused into the tiles,
// key padding masks with a batch whose keys are all padding) and efficient
// (precomputed features, un-normalised) in bf16 and f16, with feature / value
// dims 64 and 128 (and 64 / 128 mixed), partial tiles, cross lengths, one
// query, and lengths cut into many partial states; runs bit-identical when
// repeated; and every case it does not take (f32, causal, other dims,
// taylor_linear's d + 1 features) bit-identical to the fma core.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "ops/attention/attention.h"
#include "tests/cuda/cuda_attention_test_util.h"

namespace forge {
namespace {

using cuda::LinearEngine;
using namespace testing;

AttentionFn linear_fn(bool causal = false) {
  return [causal](const std::vector<Tensor>& in) {
    ops::attention::LinearOptions o;
    o.causal = causal;
    return ops::attention::linear(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor(), o);
  };
}

AttentionFn efficient_fn(bool causal = false) {
  return [causal](const std::vector<Tensor>& in) {
    ops::attention::EfficientOptions o;
    o.causal = causal;
    o.bucket_size = 1;
    return ops::attention::efficient(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor(), o);
  };
}

AttentionFn taylor_linear_fn() {
  return [](const std::vector<Tensor>& in) {
    return ops::attention::taylor_linear(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor());
  };
}

struct Case {
  std::string what;
  AttentionFn fn;
  std::vector<Tensor> in;
};

std::vector<Tensor> inputs(int64_t B, int64_t H, int64_t N, int64_t M, int64_t d, int64_t dv,
                           uint64_t seed, const Tensor& mask = Tensor()) {
  return testing::qkv_inputs(B, H, N, M, d, dv, DType::f64, seed, mask);
}

// Every case the mma core takes, for feature dim d and value dim dv.
std::vector<Case> mma_cases(int64_t d, int64_t dv) {
  // Batch 0: key 3 and the last 37 keys padded; batch 1: every key padded.
  const Tensor mask =
      testing::key_mask(2, 150, [](int64_t b, int64_t j) { return b == 0 && j != 3 && j < 113; });
  const Tensor long_mask = testing::key_mask(1, 1000, [](int64_t, int64_t j) { return j < 990; });
  std::vector<Case> cs;
  for (const auto& [name, fn] :
       {std::pair<std::string, AttentionFn>{"linear", linear_fn()},
        std::pair<std::string, AttentionFn>{"efficient", efficient_fn()}}) {
    cs.push_back({name + " N = M = 200", fn, inputs(2, 3, 200, 200, d, dv, 11)});
    cs.push_back({name + " N 70, M 190", fn, inputs(2, 2, 70, 190, d, dv, 31)});
    cs.push_back({name + " N 1, M 65", fn, inputs(1, 3, 1, 65, d, dv, 33)});
    cs.push_back({name + " mask", fn, inputs(2, 2, 150, 150, d, dv, 41, mask)});
    cs.push_back({name + " cross+mask", fn, inputs(2, 1, 80, 150, d, dv, 43, mask)});
    // 1000 rows of one batch-head: 16 partial states of 64 rows.
    cs.push_back(
        {name + " N = M = 1000 + mask", fn, inputs(1, 1, 1000, 1000, d, dv, 44, long_mask)});
  }
  return cs;
}

std::string label(const std::string& what, int64_t d, int64_t dv, DType dt) {
  return what + ", d " + std::to_string(d) + ", dv " + std::to_string(dv) + " (" + dtype_name(dt) +
         ")";
}

const std::pair<int64_t, int64_t> kDims[] = {{64, 64}, {128, 128}, {64, 128}, {128, 64}};

TEST(CudaLinearMma, MatchesCpuForwardAndGradients) {
  FORGE_REQUIRE_CUDA();
  const EngineScope mma(LinearEngine::mma);
  for (const auto& [d, dv] : kDims)
    for (DType dt : {DType::bf16, DType::f16})
      for (const Case& c : mma_cases(d, dv))
        expect_cuda_matches_cpu(c.fn, c.in, dt, testing::attention_tolerance(dt),
                                label(c.what, d, dv, dt));
}

TEST(CudaLinearMma, AgreesWithTheFmaCoreAndRepeatsBitIdentically) {
  FORGE_REQUIRE_CUDA();
  for (const auto& [d, dv] : kDims)
    for (DType dt : {DType::bf16, DType::f16})
      for (const Case& c : mma_cases(d, dv)) {
        const std::string what = label(c.what, d, dv, dt);
        const auto fma = gpu_run(c.fn, c.in, dt, LinearEngine::fma);
        const auto a = gpu_run(c.fn, c.in, dt, LinearEngine::mma);
        const auto b = gpu_run(c.fn, c.in, dt, LinearEngine::mma);
        expect_engine_agrees_and_repeats(fma, a, b, dt, what);
      }
}

// f32, causality, other dims and taylor_linear (d + 1 features) stay on the
// fma core: the engine switch changes nothing there, forward or backward.
TEST(CudaLinearMma, CasesItDoesNotTakeRunTheFmaCore) {
  FORGE_REQUIRE_CUDA();
  expect_engines_identical<LinearEngine>(
      {
          {"linear f32 d 64", linear_fn(), inputs(2, 2, 100, 100, 64, 64, 61), DType::f32},
          {"linear bf16 causal", linear_fn(true), inputs(2, 2, 100, 100, 64, 64, 62), DType::bf16},
          {"efficient bf16 causal", efficient_fn(true), inputs(2, 2, 100, 100, 64, 64, 63),
           DType::bf16},
          {"linear bf16 d 96", linear_fn(), inputs(2, 2, 100, 100, 96, 96, 64), DType::bf16},
          {"linear bf16 d 64, dv 32", linear_fn(), inputs(2, 2, 100, 100, 64, 32, 65), DType::bf16},
          {"taylor_linear bf16 d 64", taylor_linear_fn(), inputs(2, 2, 100, 100, 64, 64, 66),
           DType::bf16},
      },
      LinearEngine::fma, LinearEngine::mma);
}

// The fused linear forward + backward holds no feature tensor: at N = 16384
// (B 1, H 8, d = dv = 64, bf16) its peak GPU memory is below the fma path's
// by more than half of the latter's f32 phi(q), phi(k) and their gradients
// (4 x 32 MiB).
TEST(CudaLinearMma, FusedLinearHoldsNoFeatureTensors) {
  FORGE_REQUIRE_CUDA();
  const auto peak = [](LinearEngine e) {
    const EngineScope scope(e);
    return testing::cuda_attention_peak_bytes(
        [](const Tensor& q, const Tensor& k, const Tensor& v) {
          return ops::attention::linear(q, k, v);
        },
        16384, 8, 64, DType::bf16);
  };
  const int64_t fma = peak(LinearEngine::fma), mma = peak(LinearEngine::mma);
  EXPECT_LT(mma, fma - (int64_t{64} << 20)) << "mma " << mma << " bytes, fma " << fma;
}

}  // namespace
}  // namespace forge
