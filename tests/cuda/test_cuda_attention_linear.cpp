// The linear-attention family on the GPU (linear, efficient, taylor_linear:
// feature maps around the shared core of linear_core_cuda.h) against the CPU
// ops: the output and the gradients of q, k and v in f32, f64, bf16 and f16;
// with key padding masks, cross lengths (M != N, keys longer than the core's
// 256-row partial reductions, and shorter than one tile), causal (linear;
// efficient with buckets of 1, 3, 16, 64 and 100), lengths that leave a
// partial last chunk, head dims 64, 128 and small odd ones, one query and one
// key; no causal leak on the GPU; bit-identical repeated gradients (no
// atomics); peak GPU memory linear in N up to 65536.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ops/attention/attention.h"
#include "tests/cuda/cuda_attention_test_util.h"

namespace forge {
namespace {

using ops::attention::efficient;
using ops::attention::EfficientOptions;
using ops::attention::linear;
using ops::attention::LinearOptions;
using ops::attention::taylor_linear;
using namespace testing;

struct Config {
  const char* name;
  int64_t B, H, N, M, d, dv;
  bool mask;
};

// Self-attention shapes (N == M, so causal too): several 64-row tiles with a
// partial last one, head dims 64 and 128, small odd dims, a length of 600
// (several partial states of 256 rows, ten causal chunks), one position.
const std::vector<Config>& self_configs() {
  static const std::vector<Config> cs = {
      {"d64", 2, 3, 150, 150, 64, 64, false},        {"d64+mask", 2, 3, 150, 150, 64, 64, true},
      {"d128+mask", 1, 2, 200, 200, 128, 128, true}, {"odd+mask", 2, 2, 67, 67, 5, 7, true},
      {"long+mask", 1, 2, 600, 600, 32, 48, true},   {"one", 1, 1, 1, 1, 3, 2, false},
  };
  return cs;
}

// Cross lengths (non-causal only): keys longer than a 256-row partial state,
// and queries longer than it with keys shorter than one tile.
const std::vector<Config>& cross_configs() {
  static const std::vector<Config> cs = {
      {"cross+mask", 2, 2, 100, 333, 64, 64, true},
      {"cross_short_keys+mask", 2, 2, 300, 45, 5, 7, true},
  };
  return cs;
}

// {q, k, v, mask} on the CPU in `dtype` (f32 or f64), requiring grad; the
// mask (undefined without one) pads the last 5 keys of batch 0 and the last
// 30 of batch 1.
std::vector<Tensor> make_inputs(const Config& c, DType dtype, uint64_t seed = 61) {
  std::vector<Tensor> in = {uniform({c.B, c.H, c.N, c.d}, seed, dtype),
                            uniform({c.B, c.H, c.M, c.d}, seed + 1, dtype),
                            uniform({c.B, c.H, c.M, c.dv}, seed + 2, dtype), Tensor()};
  if (c.mask) {
    std::vector<int64_t> pad = {5, 30};
    pad.resize(static_cast<size_t>(c.B));
    in[3] = testing::padding_mask(c.B, c.M, pad);
  }
  return in;
}

struct Precision {
  DType dtype;
  double tol;
};

// f32 and f64 agree with the CPU up to summation order; bf16 / f16 round the
// output and the gradients once (the CPU reference sees the rounded inputs).
const std::vector<Precision>& precisions() {
  static const std::vector<Precision> ps = {
      {DType::f32, 1e-4}, {DType::f64, 1e-9}, {DType::bf16, 3e-2}, {DType::f16, 1e-2}};
  return ps;
}

void expect_matches_cpu(const AttentionFn& fn, const std::vector<Config>& configs,
                        const std::string& what) {
  for (const Precision& p : precisions())
    for (const Config& c : configs) {
      const DType ref = p.dtype == DType::f64 ? DType::f64 : DType::f32;
      testing::expect_cuda_matches_cpu(fn, make_inputs(c, ref), p.dtype, p.tol,
                                       what + "/" + c.name + " " + dtype_name(p.dtype));
    }
}

AttentionFn linear_fn(bool causal) {
  return [causal](const std::vector<Tensor>& in) {
    LinearOptions o;
    o.causal = causal;
    return linear(in[0], in[1], in[2], in[3], o);
  };
}

AttentionFn efficient_fn(bool causal, int64_t bucket) {
  return [causal, bucket](const std::vector<Tensor>& in) {
    EfficientOptions o;
    o.causal = causal;
    o.bucket_size = bucket;
    return efficient(in[0], in[1], in[2], in[3], o);
  };
}

AttentionFn taylor_fn() {
  return [](const std::vector<Tensor>& in) { return taylor_linear(in[0], in[1], in[2], in[3]); };
}

// fn(q, k, v) without a mask, for the leak and memory checks.
QkvFn qkv(const AttentionFn& fn) {
  return [fn](const Tensor& q, const Tensor& k, const Tensor& v) {
    return fn({q, k, v, Tensor()});
  };
}

// ---- against the CPU ----

TEST(CudaAttentionLinear, LinearMatchesCpu) {
  FORGE_REQUIRE_CUDA();
  expect_matches_cpu(linear_fn(false), self_configs(), "linear");
  expect_matches_cpu(linear_fn(false), cross_configs(), "linear");
}

TEST(CudaAttentionLinear, LinearCausalMatchesCpu) {
  FORGE_REQUIRE_CUDA();
  expect_matches_cpu(linear_fn(true), self_configs(), "linear causal");
}

TEST(CudaAttentionLinear, LinearEpsZeroAndLargeEpsMatchCpu) {
  FORGE_REQUIRE_CUDA();
  for (double eps : {0.0, 0.5}) {
    const AttentionFn fn = [eps](const std::vector<Tensor>& in) {
      LinearOptions o;
      o.causal = true;
      o.eps = eps;
      return linear(in[0], in[1], in[2], in[3], o);
    };
    testing::expect_cuda_matches_cpu(fn, make_inputs(self_configs()[1], DType::f32), DType::f32,
                                     1e-4, "linear causal eps " + std::to_string(eps));
  }
}

TEST(CudaAttentionLinear, EfficientMatchesCpu) {
  FORGE_REQUIRE_CUDA();
  expect_matches_cpu(efficient_fn(false, 64), self_configs(), "efficient");
  expect_matches_cpu(efficient_fn(false, 64), cross_configs(), "efficient");
}

TEST(CudaAttentionLinear, EfficientWithAFullyPaddedBatchMatchesCpu) {
  FORGE_REQUIRE_CUDA();
  // Batch 1 pads every key: its key softmax columns are 0, and so is its output.
  const Config c{"all_padded", 2, 2, 70, 90, 16, 8, false};
  std::vector<Tensor> in = make_inputs(c, DType::f32);
  in[3] = testing::padding_mask(c.B, c.M, {3, c.M});
  testing::expect_cuda_matches_cpu(efficient_fn(false, 64), in, DType::f32, 1e-4,
                                   "efficient/all_padded");
  testing::expect_cuda_matches_cpu(linear_fn(false), in, DType::f32, 1e-4, "linear/all_padded");
}

TEST(CudaAttentionLinear, EfficientCausalMatchesCpu) {
  FORGE_REQUIRE_CUDA();
  // Buckets of 1 (the full prefix), several buckets per 64-position chunk (3:
  // chunks of 63, a partial last one; 16), one bucket per chunk (64), and
  // buckets longer than a tile (100: two row tiles per chunk, one partial).
  expect_matches_cpu(efficient_fn(true, 1), self_configs(), "efficient causal s=1");
  const std::vector<std::pair<int64_t, Config>> bucketed = {
      {3, {"s3", 2, 2, 99, 99, 5, 7, true}},
      {16, {"s16", 2, 3, 160, 160, 64, 64, true}},
      {16, {"s16+d128", 1, 2, 80, 80, 128, 128, false}},
      {64, {"s64", 2, 2, 192, 192, 64, 64, true}},
      {100, {"s100", 1, 2, 300, 300, 32, 40, true}},
  };
  for (const auto& [bucket, c] : bucketed)
    expect_matches_cpu(efficient_fn(true, bucket), {c}, "efficient causal");
}

TEST(CudaAttentionLinear, TaylorLinearMatchesCpu) {
  FORGE_REQUIRE_CUDA();
  expect_matches_cpu(taylor_fn(), self_configs(), "taylor_linear");
  expect_matches_cpu(taylor_fn(), cross_configs(), "taylor_linear");
}

// ---- causality ----

TEST(CudaAttentionLinear, CausalFormsDoNotLeakOnTheGpu) {
  FORGE_REQUIRE_CUDA();
  struct Case {
    QkvFn fn;
    int64_t N;
    const char* name;
  };
  const std::vector<Case> cases = {
      {qkv(linear_fn(true)), 150, "linear"},
      {qkv(efficient_fn(true, 1)), 150, "efficient s=1"},
      {qkv(efficient_fn(true, 3)), 99, "efficient s=3"},
      {qkv(efficient_fn(true, 16)), 160, "efficient s=16"},
      {qkv(efficient_fn(true, 64)), 192, "efficient s=64"},
  };
  for (const Case& c : cases)
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dtype));
      const Tensor q = uniform({2, 2, c.N, 32}, 71, DType::f32, -1, 1, false);
      const Tensor k = uniform({2, 2, c.N, 32}, 72, DType::f32, -1, 1, false);
      const Tensor v = uniform({2, 2, c.N, 24}, 73, DType::f32, -1, 1, false);
      testing::expect_no_causal_leak_cuda(c.fn, q, k, v, dtype);
    }
}

// ---- determinism ----

TEST(CudaAttentionLinear, GradientsAreBitIdenticalAcrossRuns) {
  FORGE_REQUIRE_CUDA();
  const Config c = self_configs()[4];  // 600 positions: several partial and chunk states
  const std::vector<std::pair<AttentionFn, const char*>> fns = {
      {linear_fn(false), "linear"},
      {linear_fn(true), "linear causal"},
      {efficient_fn(false, 64), "efficient"},
      {efficient_fn(true, 1), "efficient causal"},
      {taylor_fn(), "taylor_linear"}};
  for (const auto& [fn, name] : fns) {
    std::vector<std::string> first;
    for (int run = 0; run < 2; ++run) {
      std::vector<Tensor> in = make_inputs(c, DType::f32);
      for (int i = 0; i < 3; ++i) {
        in[static_cast<size_t>(i)] = in[static_cast<size_t>(i)].detach().to(gpu());
        in[static_cast<size_t>(i)].set_requires_grad(true);
      }
      in[3] = in[3].to(gpu());
      autograd::backward(ops::sum(fn(in)));
      for (int i = 0; i < 3; ++i) {
        const auto b = bytes_of(in[static_cast<size_t>(i)].grad());
        if (run == 0)
          first.push_back(b);
        else
          EXPECT_TRUE(b == first[static_cast<size_t>(i)]) << name << ": gradient of input " << i;
      }
    }
  }
}

// ---- memory ----

TEST(CudaAttentionLinear, PeakMemoryIsLinearInN) {
  FORGE_REQUIRE_CUDA();
  const std::vector<std::pair<QkvFn, const char*>> fns = {
      {qkv(linear_fn(false)), "linear"},
      {qkv(linear_fn(true)), "linear causal"},
      {qkv(efficient_fn(false, 64)), "efficient"},
      {qkv(efficient_fn(true, 1)), "efficient causal s=1"},
      {qkv(efficient_fn(true, 64)), "efficient causal s=64"},
      {qkv(taylor_fn()), "taylor_linear"}};
  for (const auto& [fn, name] : fns)
    for (DType dtype : {DType::f32, DType::bf16})
      testing::expect_linear_memory_cuda(fn, 2, 64, dtype,
                                         std::string(name) + " " + dtype_name(dtype));
}

}  // namespace
}  // namespace forge
