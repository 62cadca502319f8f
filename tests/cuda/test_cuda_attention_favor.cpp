// Performer FAVOR+ on the GPU (favor_cuda.cu) against the CPU op: the output
// and the gradients of q, k and v in f32, f64 and bf16 for every map and
// option: the softmax map non-causal, causal with the prefix stabiliser (its
// own chunkwise scan) and with the global one, the relu map non-causal and
// causal, no_projection non-causal and causal; key padding masks (padding at
// the end, inside the sequence, at the start of a causal sequence, and a
// batch with every key padded); cross lengths M != N; lengths that leave a
// partial last tile / chunk; head dims 64 (m = int(d ln d) = 266), 128
// (m = 621) and small odd ones. Also: no causal leak on the GPU, peak GPU
// memory linear in N up to 65536, and W on another device or dtype refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "ops/attention/attention.h"
#include "tests/cuda/cuda_attention_test_util.h"

namespace forge {
namespace {

using ops::attention::favor;
using ops::attention::FavorKernel;
using ops::attention::FavorOptions;
using ops::attention::FavorStabilizer;
using namespace testing;

struct Config {
  const char* name;
  int64_t B, H, N, M, d, dv, m;
};

// Self-attention shapes (N == M, so causal too): a small odd d and m over
// three chunks with a partial last one, d = 64 with m = int(64 ln 64) = 266
// (five feature tiles, the last partial), d = 128 with m = int(128 ln 128) =
// 621, and a single position.
const std::vector<Config>& self_configs() {
  static const std::vector<Config> cs = {
      {"odd", 2, 2, 150, 150, 5, 7, 9},
      {"d64", 1, 2, 130, 130, 64, 64, 266},
      {"d128", 1, 1, 100, 100, 128, 128, 621},
      {"one", 1, 1, 1, 1, 3, 2, 4},
  };
  return cs;
}

// Cross lengths (non-causal only): more keys than queries and fewer.
const std::vector<Config>& cross_configs() {
  static const std::vector<Config> cs = {
      {"cross_long_keys", 2, 2, 70, 150, 16, 12, 33},
      {"cross_short_keys", 2, 1, 150, 45, 5, 7, 9},
  };
  return cs;
}

struct Setting {
  const char* name;
  FavorOptions opt;
};

const std::vector<Setting>& noncausal_settings() {
  static const std::vector<Setting> ss = {
      {"softmax", {FavorKernel::softmax, false, FavorStabilizer::prefix}},
      {"relu", {FavorKernel::relu, false, FavorStabilizer::prefix}},
      {"no_projection", {FavorKernel::no_projection, false, FavorStabilizer::prefix}},
  };
  return ss;
}

const std::vector<Setting>& causal_settings() {
  static const std::vector<Setting> ss = {
      {"softmax causal prefix", {FavorKernel::softmax, true, FavorStabilizer::prefix}},
      {"softmax causal global", {FavorKernel::softmax, true, FavorStabilizer::global}},
      {"relu causal", {FavorKernel::relu, true, FavorStabilizer::prefix}},
      {"no_projection causal", {FavorKernel::no_projection, true, FavorStabilizer::prefix}},
  };
  return ss;
}

enum class Padding { none, mixed, all_of_batch1 };

// {q, k, v, W, mask} on the CPU in `dtype` (f32 or f64): q, k, v require grad;
// the keys grow in scale along the sequence, so that the prefix stabiliser
// rises inside and across chunks; W [m, d] is undefined for no_projection.
// Padding::mixed pads batch 0's last 3 keys and one in the middle, and batch
// 1's first 5 (a causal query there may see no real key); all_of_batch1 pads
// every key of batch 1.
std::vector<Tensor> make_inputs(const Config& c, const Setting& s, Padding padding, DType dtype) {
  Tensor k = uniform({c.B, c.H, c.M, c.d}, 32, DType::f64, -1, 1, false);
  double* p = k.data<double>();
  for (int64_t t = 0; t < k.numel(); ++t)
    p[t] *= 0.3 + 1.2 * static_cast<double>((t / c.d) % c.M) / static_cast<double>(c.M);
  k = k.to(dtype);
  k.set_requires_grad(true);
  std::vector<Tensor> in = {uniform({c.B, c.H, c.N, c.d}, 31, dtype), k,
                            uniform({c.B, c.H, c.M, c.dv}, 33, dtype), Tensor(), Tensor()};
  if (s.opt.kernel != FavorKernel::no_projection) {
    Generator g(34);
    in[3] = ops::attention::gaussian_orthogonal_random_matrix(c.m, c.d, 0, dtype, &g);
  }
  if (padding != Padding::none) {
    Tensor mask = Tensor::ones({c.B, c.M}, DType::boolean);
    bool* mp = mask.data<bool>();
    if (padding == Padding::mixed) {
      for (int64_t j = std::max<int64_t>(0, c.M - 3); j < c.M; ++j) mp[j] = false;
      mp[c.M / 2] = false;
      if (c.B > 1)
        for (int64_t j = 0; j < std::min<int64_t>(5, c.M); ++j) mp[c.M + j] = false;
    } else if (c.B > 1) {
      for (int64_t j = 0; j < c.M; ++j) mp[c.M + j] = false;
    }
    in[4] = mask;
  }
  return in;
}

AttentionFn favor_fn(const FavorOptions& opt) {
  return [opt](const std::vector<Tensor>& in) {
    return favor(in[0], in[1], in[2], in[3], in[4], opt);
  };
}

struct Precision {
  DType dtype;
  double tol;
};

// f32 and f64 agree with the CPU up to summation order; bf16 rounds the output
// and the gradients once (the CPU reference sees the rounded inputs and W).
const std::vector<Precision>& precisions() {
  static const std::vector<Precision> ps = {
      {DType::f32, 2e-4}, {DType::f64, 1e-9}, {DType::bf16, 3e-2}};
  return ps;
}

void expect_matches_cpu(const std::vector<Setting>& settings, const std::vector<Config>& configs,
                        Padding padding) {
  for (const Precision& pr : precisions())
    for (const Setting& s : settings)
      for (const Config& c : configs) {
        const DType ref = pr.dtype == DType::f64 ? DType::f64 : DType::f32;
        const std::string what = std::string(s.name) + "/" + c.name +
                                 (padding == Padding::none    ? ""
                                  : padding == Padding::mixed ? "+mask"
                                                              : "+all_padded") +
                                 " " + dtype_name(pr.dtype);
        testing::expect_cuda_matches_cpu(favor_fn(s.opt), make_inputs(c, s, padding, ref), pr.dtype,
                                         pr.tol, what);
      }
}

// ---- against the CPU ----

TEST(CudaAttentionFavor, NonCausalMatchesCpu) {
  FORGE_REQUIRE_CUDA();
  expect_matches_cpu(noncausal_settings(), self_configs(), Padding::none);
  expect_matches_cpu(noncausal_settings(), self_configs(), Padding::mixed);
}

TEST(CudaAttentionFavor, CrossLengthsMatchCpu) {
  FORGE_REQUIRE_CUDA();
  expect_matches_cpu(noncausal_settings(), cross_configs(), Padding::none);
  expect_matches_cpu(noncausal_settings(), cross_configs(), Padding::mixed);
}

TEST(CudaAttentionFavor, CausalMatchesCpu) {
  FORGE_REQUIRE_CUDA();
  expect_matches_cpu(causal_settings(), self_configs(), Padding::none);
  expect_matches_cpu(causal_settings(), self_configs(), Padding::mixed);
}

// A batch whose keys are all padded: non-causal its outputs are 0 (the CPU's
// den = 1), causal its normaliser is the 1e-6 term alone; every gradient there is 0.
TEST(CudaAttentionFavor, FullyPaddedBatchMatchesCpu) {
  FORGE_REQUIRE_CUDA();
  const std::vector<Config> configs = {self_configs()[0]};
  expect_matches_cpu(noncausal_settings(), configs, Padding::all_of_batch1);
  expect_matches_cpu(causal_settings(), configs, Padding::all_of_batch1);
}

// ---- causality ----

// The prefix stabiliser, the relu map and causal no_projection leak nothing
// (the global stabiliser leaks by design and is left out). Several chunks,
// the last partial.
TEST(CudaAttentionFavor, CausalFormsDoNotLeakOnTheGpu) {
  FORGE_REQUIRE_CUDA();
  const int64_t B = 2, H = 2, N = 150, d = 8, dv = 6, m = 16;
  Generator g(5);
  const Tensor W = ops::attention::gaussian_orthogonal_random_matrix(m, d, 0, DType::f32, &g);
  const Tensor q = uniform({B, H, N, d}, 41, DType::f32, -1, 1, false),
               k = uniform({B, H, N, d}, 42, DType::f32, -1, 1, false),
               v = uniform({B, H, N, dv}, 43, DType::f32, -1, 1, false);
  for (FavorKernel kernel : {FavorKernel::softmax, FavorKernel::relu, FavorKernel::no_projection})
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(kernel == FavorKernel::softmax ? "softmax prefix"
                               : kernel == FavorKernel::relu  ? "relu"
                                                              : "no_projection") +
                   " " + dtype_name(dtype));
      const FavorOptions opt{kernel, true, FavorStabilizer::prefix};
      testing::expect_no_causal_leak_cuda(
          [&](const Tensor& a, const Tensor& b, const Tensor& c) {
            const Tensor Wd =
                kernel == FavorKernel::no_projection ? Tensor() : W.to(a.device()).to(a.dtype());
            return favor(a, b, c, Wd, Tensor(), opt);
          },
          q, k, v, dtype);
    }
}

// ---- memory ----

TEST(CudaAttentionFavor, PeakMemoryIsLinearInN) {
  FORGE_REQUIRE_CUDA();
  const int64_t H = 2, d = 32, m = 110;  // m = int(32 ln 32)
  Generator g(6);
  const Tensor W = ops::attention::gaussian_orthogonal_random_matrix(m, d, 0, DType::f32, &g);
  const std::vector<Setting> settings = {
      {"softmax", {FavorKernel::softmax, false, FavorStabilizer::prefix}},
      {"softmax causal prefix", {FavorKernel::softmax, true, FavorStabilizer::prefix}},
  };
  for (const Setting& s : settings)
    for (DType dtype : {DType::f32, DType::bf16})
      testing::expect_linear_memory_cuda(
          [&](const Tensor& q, const Tensor& k, const Tensor& v) {
            return favor(q, k, v, W.to(q.device()).to(q.dtype()), Tensor(), s.opt);
          },
          H, d, dtype, std::string(s.name) + " " + dtype_name(dtype));
}

// ---- arguments ----

TEST(CudaAttentionFavor, WOnAnotherDeviceOrDtypeIsRefused) {
  FORGE_REQUIRE_CUDA();
  const Tensor q = Tensor::zeros({1, 1, 4, 8}, DType::f32, gpu());
  Generator g(7);
  const Tensor W = ops::attention::gaussian_orthogonal_random_matrix(16, 8, 0, DType::f32, &g);
  EXPECT_NE(error_of([&] { favor(q, q, q, W); }).find("W must be on q's device cuda:0, got cpu"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { favor(q, q, q, W.to(gpu()).to(DType::bf16)); }).find("W must be a f32 tensor"),
      std::string::npos);
}

}  // namespace
}  // namespace forge
