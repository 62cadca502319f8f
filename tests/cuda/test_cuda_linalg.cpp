// matmul, linear and patch_embed on the GPU against the CPU ops: every
// transpose combination and batch broadcast pattern, outputs and every
// gradient; f32 (TF32 off: to f32 rounding), f64, bf16 and f16 (the CPU
// reference sees the same rounded inputs), autocast (f32 in and out, bf16 /
// f16 GEMMs) and TF32 (looser).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "autograd/engine.h"
#include "ops/autocast.h"
#include "ops/linalg/conv.h"
#include "ops/ops.h"
#include "tests/cuda/cuda_test_util.h"

namespace forge {
namespace {

using namespace testing;

// |got - want| <= tol * max |want| everywhere (want on the CPU; got on any
// device, any floating dtype), compared in f64.
void expect_near(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": no tensor";
  ASSERT_EQ(got.shape(), want.shape()) << what;
  Tensor h = got.to(Device::cpu());
  if (h.dtype() != DType::f64) h = h.to(DType::f32);
  const auto g = h.to_vector<double>(), w = want.to_vector<double>();
  double scale = 0, worst = 0;
  size_t at = 0;
  for (double v : w) scale = std::max(scale, std::abs(v));
  if (scale == 0) scale = 1;
  for (size_t i = 0; i < g.size(); ++i) {
    const double d = std::abs(g[i] - w[i]);
    if (!(d <= worst)) {  // also catches NaN
      worst = d;
      at = i;
    }
  }
  EXPECT_LE(worst, tol * scale) << what << ": worst at flat index " << at << ", got " << g[at]
                                << ", expected " << w[at] << " (scale " << scale << ")";
}

// Random inputs on the CPU: f64 for f64, else f32 rounded through `dtype`, so
// the CPU reference computes on exactly the values the GPU gets.
Tensor host_input(const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  if (dtype == DType::f64) return Tensor::randn(shape, DType::f64, &gen);
  const Tensor t = Tensor::randn(shape, DType::f32, &gen);
  return dtype == DType::f32 ? t : round_through(t, dtype);
}

// A leaf requiring grad: a copy of the host tensor, on the CPU or (in dtype) on the GPU.
Tensor leaf(const Tensor& host, DType dtype, bool on_gpu) {
  Tensor t = on_gpu ? host.to(dtype).to(gpu()) : host.clone();
  t.set_requires_grad(true);
  return t;
}

// Sets the TF32 switch for a scope, and turns it off again.
class Tf32Scope {
 public:
  explicit Tf32Scope(bool on) { ops::set_allow_tf32(on); }
  ~Tf32Scope() { ops::set_allow_tf32(false); }
  Tf32Scope(const Tf32Scope&) = delete;
  Tf32Scope& operator=(const Tf32Scope&) = delete;
};

// ---- matmul ----

struct MatmulCase {
  Shape a_batch, b_batch;
  bool ta, tb;
  int64_t n = 5, k = 7, m = 3;
};

std::string describe(const MatmulCase& c) {
  return "a batch " + shape_str(c.a_batch) + (c.ta ? " (ta)" : "") + ", b batch " +
         shape_str(c.b_batch) + (c.tb ? " (tb)" : "") + ", n k m " + std::to_string(c.n) + " " +
         std::to_string(c.k) + " " + std::to_string(c.m);
}

// Every batch pattern the GPU path distinguishes, each with all four
// transpose combinations.
std::vector<MatmulCase> matmul_cases() {
  const std::vector<std::pair<Shape, Shape>> batches = {
      {{}, {}},          // one GEMM
      {{3}, {}},         // shared b: folded into rows (stride 0 when a is transposed)
      {{}, {3}},         // shared a: stride 0
      {{3}, {3}},        // dense batches
      {{1}, {4}},        // a size-1 batch: stride 0
      {{2, 1}, {3}},     // both broadcast: both materialised
      {{2, 3}, {3}},     // b repeated over the outer dim: materialised
      {{2, 1}, {1, 3}},  // an outer product of batches
  };
  std::vector<MatmulCase> out;
  for (const auto& [ab, bb] : batches)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) out.push_back({ab, bb, ta, tb});
  // Sizes past one tile, with odd edges, for the tensor-core kernels.
  out.push_back({{3}, {}, false, true, 130, 257, 67});
  out.push_back({{2}, {2}, true, false, 67, 130, 257});
  return out;
}

// The same matmul forward and backward (seeded with the same dc) on the CPU
// and on the GPU in `dtype`; outputs and both gradients within tol.
void check_matmul(const MatmulCase& c, DType dtype, double tol) {
  Shape a_shape = c.a_batch, b_shape = c.b_batch;
  a_shape.insert(a_shape.end(), {c.ta ? c.k : c.n, c.ta ? c.n : c.k});
  b_shape.insert(b_shape.end(), {c.tb ? c.m : c.k, c.tb ? c.k : c.m});
  const Tensor a_h = host_input(a_shape, dtype, 1), b_h = host_input(b_shape, dtype, 2);
  Tensor a = leaf(a_h, dtype, false), b = leaf(b_h, dtype, false);
  const Tensor want = ops::matmul(a, b, c.ta, c.tb);
  const Tensor dc = host_input(want.shape(), dtype, 3);
  autograd::backward({want}, {dc});

  Tensor ag = leaf(a_h, dtype, true), bg = leaf(b_h, dtype, true);
  const Tensor got = ops::matmul(ag, bg, c.ta, c.tb);
  EXPECT_EQ(got.dtype(), dtype);
  EXPECT_EQ(got.device(), gpu());
  autograd::backward({got}, {dc.to(dtype).to(gpu())});
  const std::string what = describe(c) + ", " + dtype_name(dtype);
  expect_near(got, want, tol, what + ": c");
  expect_near(ag.grad(), a.grad(), tol, what + ": da");
  expect_near(bg.grad(), b.grad(), tol, what + ": db");
}

TEST(CudaMatmul, EveryTransposeAndBatchPatternMatchesTheCpu) {
  FORGE_REQUIRE_CUDA();
  for (const MatmulCase& c : matmul_cases())
    for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16})
      check_matmul(c, dt, tolerance(dt));
}

TEST(CudaMatmul, Tf32IsCloseToTheCpu) {
  FORGE_REQUIRE_CUDA();
  const Tf32Scope tf32(true);
  EXPECT_TRUE(ops::allow_tf32());
  // TF32 rounds the inputs to 10 mantissa bits: about bf16's error / 8.
  for (const MatmulCase& c : matmul_cases()) check_matmul(c, DType::f32, 5e-3);
}

TEST(CudaMatmul, Tf32IsOffByDefault) {
  FORGE_REQUIRE_CUDA();
  EXPECT_FALSE(ops::allow_tf32());
}

// Autocast: f32 operands, bf16 / f16 GEMMs, f32 result and f32 gradients for
// the f32 leaves. Against the CPU on the rounded inputs (and rounded dc for the
// operand gradients) the only difference is the order of f32 sums; against the
// unrounded f32 product, the error of the rounding.
TEST(CudaMatmul, AutocastComputesInLowPrecisionAndReturnsF32) {
  FORGE_REQUIRE_CUDA();
  const std::vector<MatmulCase> cases = {
      {{4}, {}, false, true, 33, 65, 17},  // activations x weight^T
      {{3}, {3}, false, false, 20, 40, 30},
      {{3}, {3}, true, true, 20, 40, 30},
      {{2, 1}, {3}, false, true, 9, 16, 12},
  };
  for (DType low : {DType::bf16, DType::f16}) {
    for (const MatmulCase& c : cases) {
      Shape a_shape = c.a_batch, b_shape = c.b_batch;
      a_shape.insert(a_shape.end(), {c.ta ? c.k : c.n, c.ta ? c.n : c.k});
      b_shape.insert(b_shape.end(), {c.tb ? c.m : c.k, c.tb ? c.k : c.m});
      const Tensor a_h = host_input(a_shape, DType::f32, 4),
                   b_h = host_input(b_shape, DType::f32, 5);
      Tensor ag = leaf(a_h, DType::f32, true), bg = leaf(b_h, DType::f32, true);
      Tensor got;
      {
        ops::AutocastGuard autocast(low);
        got = ops::matmul(ag, bg, c.ta, c.tb);
      }
      ASSERT_EQ(got.dtype(), DType::f32);
      const Tensor dc = host_input(got.shape(), DType::f32, 6);
      autograd::backward({got}, {dc.to(gpu())});
      ASSERT_EQ(ag.grad().dtype(), DType::f32);
      ASSERT_EQ(bg.grad().dtype(), DType::f32);

      const std::string what = describe(c) + ", autocast " + dtype_name(low);
      Tensor a = leaf(round_through(a_h, low), DType::f32, false),
             b = leaf(round_through(b_h, low), DType::f32, false);
      const Tensor rounded = ops::matmul(a, b, c.ta, c.tb);
      autograd::backward({rounded}, {round_through(dc, low)});
      expect_near(got, rounded, 1e-5, what + ": c against rounded inputs");
      expect_near(ag.grad(), a.grad(), 1e-5, what + ": da against rounded inputs");
      expect_near(bg.grad(), b.grad(), 1e-5, what + ": db against rounded inputs");

      Tensor a32 = leaf(a_h, DType::f32, false), b32 = leaf(b_h, DType::f32, false);
      const Tensor exact = ops::matmul(a32, b32, c.ta, c.tb);
      autograd::backward({exact}, {dc});
      expect_near(got, exact, tolerance(low), what + ": c against f32");
      expect_near(ag.grad(), a32.grad(), tolerance(low), what + ": da against f32");
      expect_near(bg.grad(), b32.grad(), tolerance(low), what + ": db against f32");
    }
  }
}

TEST(CudaMatmul, ZeroInnerDimGivesZerosAndDevicesMustMatch) {
  FORGE_REQUIRE_CUDA();
  const Tensor c = ops::matmul(Tensor::ones({2, 0}).to(gpu()), Tensor::ones({0, 3}).to(gpu()));
  expect_near(c, Tensor::zeros({2, 3}), 0, "k = 0");
  testing::expect_error(
      [] {
        ops::matmul(Tensor::ones({2, 3}), Tensor::ones({3, 2}).to(gpu()));
      },
      {"cpu", "cuda:0"});
}

// ---- linear ----

struct LinearCase {
  Shape x;
  int64_t out;
  bool bias;
};

// linear forward and backward on the CPU and the GPU; the GPU one runs under
// autocast `low` when it is bf16 / f16 (inputs f32), else in dtype. The CPU
// sees the inputs the GPU's GEMM sees (rounded through `low` under autocast);
// the bias gradient is compared with the CPU's from the unrounded dy, which is
// what the GPU sums.
void check_linear(const LinearCase& c, DType dtype, DType low, double tol) {
  const bool autocast = low != DType::f32;
  const int64_t in = c.x.back();
  const Tensor x_h = host_input(c.x, dtype, 7), w_h = host_input({c.out, in}, dtype, 8),
               b_h = host_input({c.out}, dtype, 9);
  const auto rounded = [&](const Tensor& t) { return autocast ? round_through(t, low) : t; };

  Tensor xg = leaf(x_h, dtype, true), wg = leaf(w_h, dtype, true), bg = leaf(b_h, dtype, true);
  Tensor got;
  {
    ops::AutocastGuard guard(autocast ? low : DType::f32);
    got = ops::linear(xg, wg, c.bias ? bg : Tensor());
  }
  EXPECT_EQ(got.dtype(), dtype);
  Shape y_shape = c.x;
  y_shape.back() = c.out;
  ASSERT_EQ(got.shape(), y_shape);
  const Tensor dy = host_input(y_shape, dtype, 10);
  autograd::backward({got}, {dy.to(dtype).to(gpu())});

  Tensor x = leaf(rounded(x_h), dtype, false), w = leaf(rounded(w_h), dtype, false),
         b = leaf(b_h, dtype, false);
  const Tensor want = ops::linear(x, w, c.bias ? b : Tensor());
  autograd::backward({want}, {rounded(dy)});
  const std::string what = "linear x " + shape_str(c.x) + " out " + std::to_string(c.out) +
                           (c.bias ? " with bias, " : ", ") + dtype_name(dtype) +
                           (autocast ? std::string(" autocast ") + dtype_name(low) : "");
  expect_near(got, want, tol, what + ": y");
  expect_near(xg.grad(), x.grad(), tol, what + ": dx");
  expect_near(wg.grad(), w.grad(), tol, what + ": dw");
  if (c.bias) {
    EXPECT_EQ(bg.grad().dtype(), dtype);
    // dy (..., out) summed over every dim but the last.
    std::vector<int64_t> rows(static_cast<size_t>(dy.dim() - 1));
    std::iota(rows.begin(), rows.end(), 0);
    expect_near(bg.grad(), rows.empty() ? dy : ops::sum(dy, rows), tol, what + ": db");
  } else {
    EXPECT_FALSE(bg.grad().defined());
  }
}

const std::vector<LinearCase> kLinearCases = {
    {{4, 6, 10}, 7, true}, {{4, 6, 10}, 7, false}, {{10}, 7, true},
    {{3, 130}, 70, true},  {{2, 0, 5}, 3, true},   {{2, 4}, 3, true},
};

TEST(CudaLinear, MatchesTheCpuInEveryDtype) {
  FORGE_REQUIRE_CUDA();
  for (const LinearCase& c : kLinearCases)
    for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16})
      check_linear(c, dt, DType::f32, tolerance(dt));
}

TEST(CudaLinear, AutocastGivesF32OutputsAndGradients) {
  FORGE_REQUIRE_CUDA();
  for (const LinearCase& c : kLinearCases)
    for (DType low : {DType::bf16, DType::f16}) check_linear(c, DType::f32, low, 1e-5);
}

TEST(CudaLinear, ZeroInputFeaturesGiveTheBias) {
  FORGE_REQUIRE_CUDA();
  const Tensor b = Tensor::from_vector<float>({1, 2, 3});
  const Tensor y =
      ops::linear(Tensor::ones({2, 0}).to(gpu()), Tensor::ones({3, 0}).to(gpu()), b.to(gpu()));
  expect_near(y, Tensor::from_vector<float>({1, 2, 3, 1, 2, 3}, {2, 3}), 0, "in = 0");
}

// ---- patch_embed ----

struct PatchCase {
  int64_t B, C, H, W, D, p;
};

// patch_embed forward and backward (images, weight and bias all requiring
// grad) on the CPU and the GPU, as check_linear: the GPU under autocast `low`
// when it is bf16 / f16. Under autocast the convolution's output is rounded to
// `low` before the bias is added, so y, dx and dw are within `low`'s
// tolerance; db sums the f32 gradient.
void check_patch_embed(const PatchCase& c, DType dtype, DType low, double tol) {
  const bool autocast = low != DType::f32;
  const Tensor x_h = host_input({c.B, c.C, c.H, c.W}, dtype, 11),
               w_h = host_input({c.D, c.C, c.p, c.p}, dtype, 12),
               b_h = host_input({c.D}, dtype, 13);
  const auto rounded = [&](const Tensor& t) { return autocast ? round_through(t, low) : t; };

  Tensor xg = leaf(x_h, dtype, true), wg = leaf(w_h, dtype, true), bg = leaf(b_h, dtype, true);
  Tensor got;
  {
    ops::AutocastGuard guard(autocast ? low : DType::f32);
    got = ops::patch_embed(xg, wg, bg, c.p);
  }
  EXPECT_EQ(got.dtype(), dtype);
  const Tensor dy = host_input(got.shape(), dtype, 14);
  autograd::backward({got}, {dy.to(dtype).to(gpu())});

  Tensor x = leaf(rounded(x_h), dtype, false), w = leaf(rounded(w_h), dtype, false),
         b = leaf(b_h, dtype, false);
  const Tensor want = ops::patch_embed(x, w, b, c.p);
  autograd::backward({want}, {rounded(dy)});
  const std::string what = "patch_embed " + shape_str({c.B, c.C, c.H, c.W}) + " p " +
                           std::to_string(c.p) + " D " + std::to_string(c.D) + ", " +
                           dtype_name(dtype) +
                           (autocast ? std::string(" autocast ") + dtype_name(low) : "");
  const double low_tol = autocast ? tolerance(low) : tol;
  expect_near(got, want, low_tol, what + ": y");
  expect_near(xg.grad(), x.grad(), low_tol, what + ": dx");
  expect_near(wg.grad(), w.grad(), low_tol, what + ": dw");
  EXPECT_EQ(xg.grad().dtype(), dtype);
  EXPECT_EQ(wg.grad().dtype(), dtype);
  EXPECT_EQ(bg.grad().dtype(), dtype);
  expect_near(bg.grad(), ops::sum(dy, {0, 1}), tol, what + ": db");
}

const std::vector<PatchCase> kPatchCases = {
    {2, 3, 8, 12, 5, 4},     // non-square, odd widths
    {4, 3, 32, 32, 64, 16},  // ViT-like: 16x16 patches of RGB
    {3, 1, 28, 28, 32, 7},   // the test ViT's 28x28 grey images
    {2, 4, 6, 6, 8, 1},      // p = 1: a per-pixel linear map
};

TEST(CudaPatchEmbed, MatchesTheCpuInEveryDtype) {
  FORGE_REQUIRE_CUDA();
  for (const PatchCase& c : kPatchCases)
    for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16})
      check_patch_embed(c, dt, DType::f32, tolerance(dt));
}

TEST(CudaPatchEmbed, AutocastGivesF32OutputsAndGradients) {
  FORGE_REQUIRE_CUDA();
  for (const PatchCase& c : kPatchCases)
    for (DType low : {DType::bf16, DType::f16}) check_patch_embed(c, DType::f32, low, 1e-5);
}

TEST(CudaPatchEmbed, Tf32IsCloseToTheCpu) {
  FORGE_REQUIRE_CUDA();
  const Tf32Scope tf32(true);
  for (const PatchCase& c : kPatchCases) check_patch_embed(c, DType::f32, DType::f32, 5e-3);
}

TEST(CudaPatchEmbed, WithoutBiasAndWithImagesNeedingNoGradient) {
  FORGE_REQUIRE_CUDA();
  const Tensor x_h = host_input({2, 3, 8, 8}, DType::f32, 15),
               w_h = host_input({6, 3, 4, 4}, DType::f32, 16);
  Tensor w = leaf(w_h, DType::f32, false), wg = leaf(w_h, DType::f32, true);
  const Tensor want = ops::patch_embed(x_h, w, Tensor(), 4);
  const Tensor got = ops::patch_embed(x_h.to(gpu()), wg, Tensor(), 4);
  expect_near(got, want, 1e-5, "no bias: y");
  const Tensor dy = host_input(want.shape(), DType::f32, 17);
  autograd::backward({want}, {dy});
  autograd::backward({got}, {dy.to(gpu())});
  expect_near(wg.grad(), w.grad(), 1e-5, "no bias: dw");
}

}  // namespace
}  // namespace forge
