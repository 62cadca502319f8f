// softmax and local attention on the GPU (the tiled kernels of
// ops/attention/flash_cuda.cu) against the CPU ops: the output and the
// gradients of q, k, v in f32, f64, bf16 (and f16), with causality, key
// padding masks (a batch with every key masked gives 0 rows, no NaN), cross
// lengths N != M, N and M that leave partial tiles, head dims 64, 128, 256 and
// odd small ones, scale, dropout (the same Philox draws: the dropped entries
// are exactly the CPU's), local's band options with N not a multiple of the
// window; no causal leak on the GPU; peak GPU memory linear in N; the head-dim
// limit.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/attention/attention.h"
#include "tests/cuda/cuda_attention_test_util.h"

namespace forge {
namespace {

using ops::attention::LocalOptions;
using ops::attention::SoftmaxOptions;
using namespace testing;

// softmax with `o`; dropout draws from a generator seeded afresh on every call,
// so the CPU and the GPU evaluation draw the same stream.
AttentionFn softmax_fn(SoftmaxOptions o, uint64_t seed = 7) {
  return [o, seed](const std::vector<Tensor>& in) {
    Generator gen(seed);
    SoftmaxOptions with_gen = o;
    with_gen.gen = &gen;
    return ops::attention::softmax(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor(), with_gen);
  };
}

AttentionFn local_fn(LocalOptions o, uint64_t seed = 7) {
  return [o, seed](const std::vector<Tensor>& in) {
    Generator gen(seed);
    LocalOptions with_gen = o;
    with_gen.gen = &gen;
    return ops::attention::local(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor(), with_gen);
  };
}

SoftmaxOptions softmax_options(bool causal, double dropout = 0, double scale = 0) {
  SoftmaxOptions o;
  o.causal = causal;
  o.dropout = dropout;
  o.scale = scale;
  return o;
}

LocalOptions local_options(int64_t window, int64_t look_backward, int64_t look_forward, bool causal,
                           double dropout = 0) {
  return LocalOptions{.window = window,
                      .look_backward = look_backward,
                      .look_forward = look_forward,
                      .causal = causal,
                      .dropout = dropout};
}

const DType kDtypes[] = {DType::f32, DType::f64, DType::bf16};

std::string name(const std::string& what, DType dtype) {
  return what + " (" + dtype_name(dtype) + ")";
}

// ---- softmax ----

TEST(CudaAttentionSoftmax, MatchesCpuOnPartialTilesAndHeadDims) {
  FORGE_REQUIRE_CUDA();
  struct Case {
    const char* what;
    int64_t B, H, N, M, d, dv;
  };
  // N, M not multiples of 16, 32 or 64; d = dv = 64, 128, odd small widths
  // (not multiples of 8: the element-wise loads), the widest head (small tiles).
  const Case shapes[] = {
      {"d64", 2, 3, 200, 200, 64, 64},      {"d128", 1, 2, 130, 130, 128, 128},
      {"d24,dv40", 2, 2, 77, 77, 24, 40},   {"d20,dv12", 1, 3, 50, 50, 20, 12},
      {"d3,dv5", 2, 1, 9, 9, 3, 5},         {"d256", 1, 2, 70, 70, 256, 256},
      {"d64,dv256", 1, 1, 40, 40, 64, 256}, {"one query, one key", 1, 1, 1, 1, 16, 16},
  };
  for (const Case& s : shapes)
    for (DType dt : kDtypes)
      expect_cuda_matches_cpu(
          softmax_fn(softmax_options(false)), qkv_inputs(s.B, s.H, s.N, s.M, s.d, s.dv, dt, 11), dt,
          testing::attention_tolerance(dt), name(std::string("softmax ") + s.what, dt));
}

TEST(CudaAttentionSoftmax, MatchesCpuCausalAndScaled) {
  FORGE_REQUIRE_CUDA();
  for (DType dt : kDtypes) {
    expect_cuda_matches_cpu(softmax_fn(softmax_options(true)),
                            qkv_inputs(2, 2, 150, 150, 64, 64, dt, 21), dt,
                            testing::attention_tolerance(dt), name("softmax causal", dt));
    expect_cuda_matches_cpu(softmax_fn(softmax_options(true)),
                            qkv_inputs(1, 2, 97, 97, 24, 40, dt, 22), dt,
                            testing::attention_tolerance(dt), name("softmax causal d24,dv40", dt));
    expect_cuda_matches_cpu(softmax_fn(softmax_options(false, 0, 1.0)),
                            qkv_inputs(2, 2, 100, 100, 32, 32, dt, 23), dt,
                            testing::attention_tolerance(dt), name("softmax scale 1", dt));
  }
}

TEST(CudaAttentionSoftmax, MatchesCpuWithCrossLengths) {
  FORGE_REQUIRE_CUDA();
  for (DType dt : kDtypes) {
    expect_cuda_matches_cpu(softmax_fn(softmax_options(false)),
                            qkv_inputs(2, 2, 70, 190, 64, 48, dt, 31), dt,
                            testing::attention_tolerance(dt), name("softmax N 70, M 190", dt));
    expect_cuda_matches_cpu(softmax_fn(softmax_options(false)),
                            qkv_inputs(2, 2, 190, 33, 64, 64, dt, 32), dt,
                            testing::attention_tolerance(dt), name("softmax N 190, M 33", dt));
    expect_cuda_matches_cpu(softmax_fn(softmax_options(false)),
                            qkv_inputs(1, 3, 1, 65, 16, 8, dt, 33), dt,
                            testing::attention_tolerance(dt), name("softmax N 1, M 65", dt));
  }
}

TEST(CudaAttentionSoftmax, MatchesCpuWithKeyPaddingMask) {
  FORGE_REQUIRE_CUDA();
  // Batch 0: the last 37 keys and key 3 padded; batch 1: every key padded.
  const Tensor mask =
      key_mask(2, 150, [](int64_t b, int64_t j) { return b == 0 && j != 3 && j < 113; });
  for (DType dt : kDtypes) {
    expect_cuda_matches_cpu(softmax_fn(softmax_options(false)),
                            qkv_inputs(2, 2, 150, 150, 64, 64, dt, 41, mask), dt,
                            testing::attention_tolerance(dt), name("softmax mask", dt));
    expect_cuda_matches_cpu(softmax_fn(softmax_options(true)),
                            qkv_inputs(2, 2, 150, 150, 64, 64, dt, 42, mask), dt,
                            testing::attention_tolerance(dt), name("softmax causal+mask", dt));
    expect_cuda_matches_cpu(softmax_fn(softmax_options(false)),
                            qkv_inputs(2, 1, 80, 150, 24, 40, dt, 43, mask), dt,
                            testing::attention_tolerance(dt), name("softmax cross+mask", dt));
  }
}

TEST(CudaAttentionSoftmax, RowsWithEveryKeyMaskedAreZeroWithZeroGradient) {
  FORGE_REQUIRE_CUDA();
  const Tensor mask = key_mask(2, 90, [](int64_t b, int64_t j) { return b == 0 && j % 3 != 1; });
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<Tensor> in = qkv_inputs(2, 2, 70, 90, 32, 32, dt, 51);
    std::vector<Tensor> g;
    for (const Tensor& t : in) {
      Tensor x = t.detach().to(gpu()).to(dt);
      x.set_requires_grad(true);
      g.push_back(x);
    }
    const Tensor o = ops::attention::softmax(g[0], g[1], g[2], mask.to(gpu()));
    autograd::backward(ops::sum(o));
    const std::vector<double> out = testing::host_f32(o).to_vector<double>();
    const std::vector<double> dq = testing::host_f32(g[0].grad()).to_vector<double>();
    const size_t half = out.size() / 2, half_q = dq.size() / 2;  // batch 1 is the second half
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_FALSE(std::isnan(out[i])) << name("output element " + std::to_string(i), dt);
      if (i >= half) {
        ASSERT_EQ(out[i], 0.0) << name("batch 1 output " + std::to_string(i), dt);
      }
    }
    for (size_t i = 0; i < dq.size(); ++i) {
      ASSERT_FALSE(std::isnan(dq[i])) << name("dq element " + std::to_string(i), dt);
      if (i >= half_q) {
        ASSERT_EQ(dq[i], 0.0) << name("batch 1 dq " + std::to_string(i), dt);
      }
    }
  }
}

TEST(CudaAttentionSoftmax, MatchesCpuWithDropout) {
  FORGE_REQUIRE_CUDA();
  const Tensor mask = key_mask(2, 130, [](int64_t b, int64_t j) { return j < 130 - 9 * b; });
  for (DType dt : kDtypes) {
    expect_cuda_matches_cpu(softmax_fn(softmax_options(false, 0.2)),
                            qkv_inputs(2, 2, 130, 130, 64, 64, dt, 61), dt,
                            testing::attention_tolerance(dt), name("softmax dropout", dt));
    expect_cuda_matches_cpu(softmax_fn(softmax_options(true, 0.3, 0.5)),
                            qkv_inputs(2, 2, 130, 130, 24, 40, dt, 62, mask), dt,
                            testing::attention_tolerance(dt),
                            name("softmax causal+mask+dropout+scale", dt));
    expect_cuda_matches_cpu(softmax_fn(softmax_options(false, 0.1)),
                            qkv_inputs(1, 3, 45, 101, 32, 16, dt, 63), dt,
                            testing::attention_tolerance(dt), name("softmax cross+dropout", dt));
  }
}

// o = dropout(P) v with v = the identity (dv = M): o[i, j] = P[i, j] z[i, j],
// and every P > 0, so the zeros of o are exactly the dropped entries; they
// must be the CPU's, entry for entry.
TEST(CudaAttentionSoftmax, DropsExactlyTheCpuEntries) {
  FORGE_REQUIRE_CUDA();
  constexpr int64_t B = 2, H = 2, N = 37, M = 70;
  Tensor v = Tensor::zeros({B, H, M, M});
  float* vp = v.data<float>();
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t j = 0; j < M; ++j) vp[(bh * M + j) * M + j] = 1.0f;
  const Tensor q = uniform({B, H, N, 16}, 71, DType::f32, -1, 1, false);
  const Tensor k = uniform({B, H, M, 16}, 72, DType::f32, -1, 1, false);
  const AttentionFn fn = softmax_fn(softmax_options(false, 0.35), 73);
  const std::vector<float> want = fn({q, k, v}).to_vector<float>();
  const std::vector<float> got =
      testing::host_f32(fn({q.to(gpu()), k.to(gpu()), v.to(gpu())})).to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  int64_t dropped = 0;
  for (size_t e = 0; e < want.size(); ++e) {
    ASSERT_EQ(got[e] == 0.0f, want[e] == 0.0f) << "entry " << e;
    dropped += want[e] == 0.0f;
  }
  EXPECT_GT(dropped, 0);
}

TEST(CudaAttentionSoftmax, Float16MatchesCpu) {
  FORGE_REQUIRE_CUDA();
  const Tensor mask = key_mask(2, 100, [](int64_t b, int64_t j) { return j < 100 - 20 * b; });
  expect_cuda_matches_cpu(softmax_fn(softmax_options(true, 0.1)),
                          qkv_inputs(2, 2, 100, 100, 64, 64, DType::f16, 81, mask), DType::f16,
                          testing::attention_tolerance(DType::f16),
                          "softmax causal+mask+dropout (f16)");
}

TEST(CudaAttentionSoftmax, CausalLeaksNothingOnTheGpu) {
  FORGE_REQUIRE_CUDA();
  const Tensor q = uniform({2, 2, 100, 32}, 91, DType::f32, -1, 1, false);
  const Tensor k = uniform({2, 2, 100, 32}, 92, DType::f32, -1, 1, false);
  const Tensor v = uniform({2, 2, 100, 32}, 93, DType::f32, -1, 1, false);
  for (DType dt : {DType::f32, DType::bf16})
    testing::expect_no_causal_leak_cuda(
        [](const Tensor& a, const Tensor& b, const Tensor& c) {
          return ops::attention::softmax(a, b, c, Tensor(), softmax_options(true));
        },
        q, k, v, dt);
}

TEST(CudaAttentionSoftmax, PeakMemoryIsLinearInN) {
  FORGE_REQUIRE_CUDA();
  testing::expect_linear_memory_cuda(
      [](const Tensor& q, const Tensor& k, const Tensor& v) {
        return ops::attention::softmax(q, k, v, Tensor(), softmax_options(true));
      },
      2, 64, DType::bf16, "softmax causal bf16");
}

TEST(CudaAttentionSoftmax, HeadsWiderThan256AreAnError) {
  FORGE_REQUIRE_CUDA();
  const Tensor q = Tensor::zeros({1, 1, 4, 300}, DType::f32, gpu());
  const Tensor v = Tensor::zeros({1, 1, 4, 8}, DType::f32, gpu());
  try {
    ops::attention::softmax(q, q, v);
    ADD_FAILURE() << "no error for d = 300";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("on a GPU the head dims must be <= 256, got d = 300"),
              std::string::npos)
        << e.what();
  }
}

// ---- local ----

struct LocalCase {
  const char* what;
  int64_t N, window, look_backward, look_forward;
  bool causal;
  double dropout;
};

// Windows that do not divide N, windows smaller and larger than the kernels'
// tiles, every look-around, causal with and without look_forward, dropout.
const LocalCase kLocalCases[] = {
    {"default w16", 100, 16, 1, -1, false, 0},
    {"w8 lb0 lf0", 70, 8, 0, 0, false, 0},
    {"w5 lb2 lf2", 93, 5, 2, 2, false, 0},
    {"w64 lb1 lf1 (tile-sized)", 200, 64, 1, 1, false, 0},
    {"w100 N 70 (one window)", 70, 100, 1, 1, false, 0},
    {"causal w32 lb2", 150, 32, 2, -1, true, 0},
    {"causal w24 lb1 lf2", 110, 24, 1, 2, true, 0},
    {"causal w7 lb3 lf0", 61, 7, 3, 0, true, 0},
    {"dropout w16 lb1 lf1", 100, 16, 1, 1, false, 0.25},
    {"causal+dropout w12 lb2", 90, 12, 2, -1, true, 0.3},
};

TEST(CudaAttentionLocal, MatchesCpuForEveryBandOption) {
  FORGE_REQUIRE_CUDA();
  for (const LocalCase& c : kLocalCases)
    for (DType dt : kDtypes)
      expect_cuda_matches_cpu(
          local_fn(local_options(c.window, c.look_backward, c.look_forward, c.causal, c.dropout)),
          qkv_inputs(2, 2, c.N, c.N, 32, 32, dt, 101), dt, testing::attention_tolerance(dt),
          name(std::string("local ") + c.what, dt));
}

TEST(CudaAttentionLocal, MatchesCpuOnHeadDims) {
  FORGE_REQUIRE_CUDA();
  for (DType dt : kDtypes) {
    expect_cuda_matches_cpu(local_fn(local_options(16, 1, -1, false)),
                            qkv_inputs(1, 2, 90, 90, 64, 64, dt, 111), dt,
                            testing::attention_tolerance(dt), name("local d64", dt));
    expect_cuda_matches_cpu(local_fn(local_options(32, 1, -1, true)),
                            qkv_inputs(1, 2, 90, 90, 128, 128, dt, 112), dt,
                            testing::attention_tolerance(dt), name("local causal d128", dt));
    expect_cuda_matches_cpu(local_fn(local_options(10, 1, 1, false, 0.2)),
                            qkv_inputs(2, 1, 57, 57, 24, 40, dt, 113), dt,
                            testing::attention_tolerance(dt), name("local dropout d24,dv40", dt));
  }
}

// Padded queries give 0 rows (and no gradient), padded keys are never seen;
// batch 1 has every position padded.
TEST(CudaAttentionLocal, MatchesCpuWithKeyPaddingMask) {
  FORGE_REQUIRE_CUDA();
  const Tensor mask =
      key_mask(2, 75, [](int64_t b, int64_t j) { return b == 0 && j < 70 && j != 20 && j != 21; });
  for (DType dt : kDtypes) {
    expect_cuda_matches_cpu(local_fn(local_options(16, 1, -1, false)),
                            qkv_inputs(2, 2, 75, 75, 32, 32, dt, 121, mask), dt,
                            testing::attention_tolerance(dt), name("local mask", dt));
    expect_cuda_matches_cpu(local_fn(local_options(8, 2, -1, true)),
                            qkv_inputs(2, 2, 75, 75, 32, 32, dt, 122, mask), dt,
                            testing::attention_tolerance(dt), name("local causal+mask", dt));
    expect_cuda_matches_cpu(local_fn(local_options(9, 1, 1, true, 0.25)),
                            qkv_inputs(2, 2, 75, 75, 24, 40, dt, 123, mask), dt,
                            testing::attention_tolerance(dt),
                            name("local causal+mask+dropout lf1", dt));
  }
}

// As for softmax: with v = the identity the zeros of o are the entries
// outside the band and the dropped ones, which must be the CPU's.
TEST(CudaAttentionLocal, DropsExactlyTheCpuEntries) {
  FORGE_REQUIRE_CUDA();
  constexpr int64_t B = 2, H = 2, N = 53;
  Tensor v = Tensor::zeros({B, H, N, N});
  float* vp = v.data<float>();
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t j = 0; j < N; ++j) vp[(bh * N + j) * N + j] = 1.0f;
  const Tensor q = uniform({B, H, N, 16}, 131, DType::f32, -1, 1, false);
  const Tensor k = uniform({B, H, N, 16}, 132, DType::f32, -1, 1, false);
  for (bool causal : {false, true}) {
    const AttentionFn fn = local_fn(local_options(6, 2, 1, causal, 0.35), 133);
    const std::vector<float> want = fn({q, k, v}).to_vector<float>();
    const std::vector<float> got =
        testing::host_f32(fn({q.to(gpu()), k.to(gpu()), v.to(gpu())})).to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t e = 0; e < want.size(); ++e)
      ASSERT_EQ(got[e] == 0.0f, want[e] == 0.0f) << "entry " << e << (causal ? " (causal)" : "");
  }
}

TEST(CudaAttentionLocal, Float16MatchesCpu) {
  FORGE_REQUIRE_CUDA();
  const Tensor mask = key_mask(2, 80, [](int64_t b, int64_t j) { return j < 80 - 11 * b; });
  expect_cuda_matches_cpu(local_fn(local_options(16, 1, -1, true, 0.1)),
                          qkv_inputs(2, 2, 80, 80, 64, 64, DType::f16, 141, mask), DType::f16,
                          testing::attention_tolerance(DType::f16),
                          "local causal+mask+dropout (f16)");
}

TEST(CudaAttentionLocal, CausalLeaksNothingOnTheGpu) {
  FORGE_REQUIRE_CUDA();
  const Tensor q = uniform({2, 2, 100, 32}, 151, DType::f32, -1, 1, false);
  const Tensor k = uniform({2, 2, 100, 32}, 152, DType::f32, -1, 1, false);
  const Tensor v = uniform({2, 2, 100, 32}, 153, DType::f32, -1, 1, false);
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t look_forward : {int64_t{-1}, int64_t{1}})
      testing::expect_no_causal_leak_cuda(
          [look_forward](const Tensor& a, const Tensor& b, const Tensor& c) {
            return ops::attention::local(a, b, c, Tensor(),
                                         local_options(16, 2, look_forward, true));
          },
          q, k, v, dt);
}

TEST(CudaAttentionLocal, PeakMemoryIsLinearInN) {
  FORGE_REQUIRE_CUDA();
  testing::expect_linear_memory_cuda(
      [](const Tensor& q, const Tensor& k, const Tensor& v) {
        return ops::attention::local(q, k, v, Tensor(), local_options(64, 1, -1, false));
      },
      2, 64, DType::f32, "local f32");
}

}  // namespace
}  // namespace forge
