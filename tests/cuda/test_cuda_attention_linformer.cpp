// linformer on the GPU against the CPU op: the output and all seven gradients
// (q, k, v, E, F, bE, bF) in f32, f64, bf16 and f16, with and without biases,
// with a key padding mask, with inputs shorter than E, F (their first M
// columns), with dropout (the same Philox draws: f32 agrees to rounding), with
// N and kdim that leave partial tiles, kdim = 256 and head dim 128; the device
// and dtype errors; peak GPU memory linear in N.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/attention/attention.h"
#include "tests/cuda/cuda_attention_test_util.h"

namespace forge {
namespace {

using ops::attention::linformer;
using ops::attention::LinformerOptions;
using namespace testing;

struct Config {
  const char* name;
  int64_t B, H, N, M, Mmax, kdim, d, dv;
  bool bias, mask;
  double dropout;
};

// Several query tiles with a partial last one (N = 150, 200, 130), keys
// shorter than E, F, small odd and large kdim.
const std::vector<Config>& configs() {
  static const std::vector<Config> cs = {
      {"plain", 2, 3, 150, 97, 97, 7, 32, 24, false, false, 0},
      {"bias+mask", 2, 3, 150, 97, 97, 7, 32, 24, true, true, 0},
      {"short+mask", 2, 3, 150, 97, 130, 7, 32, 24, true, true, 0},
      {"short+mask+dropout", 2, 3, 150, 97, 130, 7, 32, 24, true, true, 0.25},
      {"kdim256+short+mask+dropout", 1, 2, 200, 300, 320, 256, 64, 64, true, true, 0.1},
      {"d128+no_bias", 1, 2, 130, 65, 65, 33, 128, 128, false, true, 0},
      {"one_query_one_key", 1, 1, 1, 1, 3, 5, 8, 8, true, false, 0},
  };
  return cs;
}

// {q, k, v, E, F, bE, bF, mask} on the CPU in `dtype` (bE, bF, mask undefined
// when the config has none). Batch 0 pads its last 5 keys, batch 1 its last 30.
std::vector<Tensor> make_inputs(const Config& c, DType dtype) {
  std::vector<Tensor> in = {uniform({c.B, c.H, c.N, c.d}, 81, dtype),
                            uniform({c.B, c.H, c.M, c.d}, 82, dtype),
                            uniform({c.B, c.H, c.M, c.dv}, 83, dtype),
                            uniform({c.kdim, c.Mmax}, 84, dtype, -0.3, 0.3),
                            uniform({c.kdim, c.Mmax}, 85, dtype, -0.3, 0.3),
                            c.bias ? uniform({c.kdim}, 86, dtype) : Tensor(),
                            c.bias ? uniform({c.kdim}, 87, dtype) : Tensor(),
                            Tensor()};
  if (c.mask) {
    std::vector<int64_t> pad = {5, 30};
    pad.resize(static_cast<size_t>(c.B));
    in[7] = testing::padding_mask(c.B, c.M, pad);
  }
  return in;
}

// The op on in = make_inputs(...) on either device; every call restarts the
// same generator state, so the CPU and GPU runs draw the same dropout.
testing::AttentionFn op_of(const Config& c) {
  return [c, gen = std::make_shared<Generator>(5)](const std::vector<Tensor>& in) {
    gen->set_state({91, 17});
    return linformer(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7],
                     LinformerOptions{c.dropout, gen.get()});
  };
}

void expect_every_config_matches_cpu(DType dtype, double tol) {
  const DType ref = dtype == DType::f64 ? DType::f64 : DType::f32;
  for (const Config& c : configs())
    testing::expect_cuda_matches_cpu(op_of(c), make_inputs(c, ref), dtype, tol,
                                     std::string("linformer/") + c.name + " " + dtype_name(dtype));
}

TEST(CudaAttentionLinformer, Float32MatchesCpu) {
  FORGE_REQUIRE_CUDA();
  expect_every_config_matches_cpu(DType::f32, 1e-4);
}

TEST(CudaAttentionLinformer, Float64MatchesCpu) {
  FORGE_REQUIRE_CUDA();
  expect_every_config_matches_cpu(DType::f64, 1e-9);
}

TEST(CudaAttentionLinformer, Bfloat16MatchesCpu) {
  FORGE_REQUIRE_CUDA();
  expect_every_config_matches_cpu(DType::bf16, 3e-2);
}

TEST(CudaAttentionLinformer, Float16MatchesCpu) {
  FORGE_REQUIRE_CUDA();
  expect_every_config_matches_cpu(DType::f16, 1e-2);
}

// Dropout really drops on the GPU (p = 0.5 changes the output) and reserves
// B H N kdim draws of the generator, as on the CPU (Generator::reserve counts
// Philox blocks of four draws).
TEST(CudaAttentionLinformer, DropoutDropsAndReservesTheCpuDraws) {
  FORGE_REQUIRE_CUDA();
  const Config c = configs()[3];
  std::vector<Tensor> in = make_inputs(c, DType::f32);
  for (Tensor& t : in)
    if (t.defined()) t = t.detach().to(gpu());
  Generator g(3);
  const Tensor plain = linformer(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7]);
  const Tensor dropped =
      linformer(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], LinformerOptions{0.5, &g});
  EXPECT_EQ(g.offset(), static_cast<uint64_t>((c.B * c.H * c.N * c.kdim + 3) / 4));
  EXPECT_GT(testing::scaled_diff(dropped, plain), 1e-2);
}

TEST(CudaAttentionLinformer, ProjectionsOnAnotherDeviceOrDtypeAreErrors) {
  FORGE_REQUIRE_CUDA();
  const Config c = configs()[1];
  std::vector<Tensor> in = make_inputs(c, DType::f32);
  std::vector<Tensor> d;
  for (const Tensor& t : in) d.push_back(t.defined() ? t.detach().to(gpu()) : Tensor());
  testing::expect_error([&] { linformer(d[0], d[1], d[2], in[3], d[4], d[5], d[6], d[7]); },
                        {"linformer", "E", "cpu", "cuda:0"});
  testing::expect_error([&] { linformer(d[0], d[1], d[2], d[3], d[4], in[5], d[6], d[7]); },
                        {"linformer", "bias_E", "cpu", "cuda:0"});
  testing::expect_error(
      [&] { linformer(d[0], d[1], d[2], d[3], d[4].to(DType::bf16), d[5], d[6], d[7]); },
      {"linformer", "F", "bf16", "f32"});
  testing::expect_error([&] { linformer(d[0], d[1], d[2], d[3], d[4], d[5], d[6], in[7]); },
                        {"linformer", "key_padding_mask", "cpu", "cuda:0"});
}

// Forward + backward with kdim fixed: E, F are the first N columns of
// [kdim, 65536] matrices made once on the GPU, so every tensor the op makes
// grows with N and nothing is N x N.
TEST(CudaAttentionLinformer, MemoryIsLinearInN) {
  FORGE_REQUIRE_CUDA();
  const int64_t kdim = 128, Nmax = 65536;
  const Tensor E = uniform({kdim, Nmax}, 88, DType::f32, -0.01, 0.01, false).to(gpu());
  const Tensor F = uniform({kdim, Nmax}, 89, DType::f32, -0.01, 0.01, false).to(gpu());
  testing::expect_linear_memory_cuda(
      [&](const Tensor& q, const Tensor& k, const Tensor& v) {
        const int64_t N = k.size(2);
        Tensor En = ops::narrow(E, 1, 0, N), Fn = ops::narrow(F, 1, 0, N);
        Tensor bE = Tensor::zeros({kdim}, q.dtype(), q.device()),
               bF = Tensor::zeros({kdim}, q.dtype(), q.device());
        for (Tensor* t : {&En, &Fn, &bE, &bF}) t->set_requires_grad(true);
        return linformer(q, k, v, En, Fn, bE, bF);
      },
      2, 64, DType::f32, "linformer");
}

}  // namespace
}  // namespace forge
