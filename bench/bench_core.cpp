// Core benchmark (a program, not a test): our f32 matmul against a direct
// cblas_sgemm call on the same matrices, the bf16 GEMM (oneDNN) against
// sgemm on the shapes of the ViTs, and elementwise bandwidth against memcpy.
// Prints a Markdown table; `--csv` prints CSV instead.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/threading.h"
#include "ops/autocast.h"
#include "ops/blas.h"
#include "ops/ops.h"

namespace {

using forge::Tensor;

// Median seconds per call over enough repetitions to fill ~`budget` seconds.
double time_median(const std::function<void()>& fn, double budget = 0.6) {
  fn();  // warm-up: page faults, BLAS buffers
  std::vector<double> samples;
  const auto start = std::chrono::steady_clock::now();
  while (
      samples.size() < 5 ||
      (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < budget &&
       samples.size() < 200)) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const bool csv = argc > 1 && std::string(argv[1]) == "--csv";
  forge::NoGradGuard no_grad;
  std::printf(csv ? "kind,size,forge,reference,ratio\n"
                  : "threads: %d\n\n| GEMM f32 (n x n x n) | attnforge GFLOP/s | cblas_sgemm "
                    "GFLOP/s | ratio |\n"
                    "|---|---|---|---|\n",
              forge::num_threads());
  for (int64_t n : {256, 512, 1024, 2048}) {
    Tensor a = Tensor::randn({n, n}), b = Tensor::randn({n, n});
    Tensor c = Tensor::empty({n, n});
    const double flops = 2.0 * static_cast<double>(n * n * n);
    const int in = static_cast<int>(n);
    double ours = 0, ref = 0;
    // Alternate the two a few times so drifting clocks hit both alike.
    for (int round = 0; round < 3; ++round) {
      ours += time_median([&] { Tensor r = forge::ops::matmul(a, b); });
      ref += time_median([&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, in, in, in, 1.0f, a.data<float>(),
                    in, b.data<float>(), in, 0.0f, c.data<float>(), in);
      });
    }
    const double g_ours = 3 * flops / ours / 1e9, g_ref = 3 * flops / ref / 1e9;
    std::printf(csv ? "gemm,%lld,%.1f,%.1f,%.3f\n" : "| %lld | %.1f | %.1f | %.3f |\n",
                static_cast<long long>(n), g_ours, g_ref, g_ours / g_ref);
  }

  // bf16 (precision: bf16 on the CPU) against f32, row-major a [m, k] b [k, n]:
  // ops::gemm on operands already in bf16, and matmul under autocast, which
  // also converts both operands and allocates the result.
  if (!csv) {
    std::printf(
        "\n| GEMM m x k x n | sgemm GFLOP/s | bf16 gemm GFLOP/s | bf16 matmul (autocast) GFLOP/s "
        "|\n|---|---|---|---|\n");
  }
  struct Shape3 {
    int64_t m, k, n;
  };
  for (const Shape3 g : {Shape3{17, 24, 17}, Shape3{64, 64, 128}, Shape3{1088, 96, 288},
                         Shape3{1088, 96, 192}, Shape3{1088, 192, 96},
                         Shape3{3152, 384, 1152}, Shape3{8192, 768, 768}, Shape3{2048, 2048, 2048}}) {
    const Tensor a = Tensor::randn({g.m, g.k}), b = Tensor::randn({g.k, g.n});
    const Tensor a16 = a.to(forge::DType::bf16), b16 = b.to(forge::DType::bf16);
    Tensor c = Tensor::empty({g.m, g.n});
    const double flops = 2.0 * static_cast<double>(g.m * g.n * g.k);
    double f32 = 0, bf16 = 0, autocast = 0;
    for (int round = 0; round < 3; ++round) {
      f32 += time_median([&] {
        forge::ops::gemm(false, false, g.m, g.n, g.k, 1.0f, a.data<float>(), b.data<float>(), 0.0f,
                         c.data<float>());
      });
      bf16 += time_median([&] {
        forge::ops::gemm(false, false, g.m, g.n, g.k, 1.0f, a16.data<forge::BF16>(),
                         b16.data<forge::BF16>(), 0.0f, c.data<float>());
      });
      autocast += time_median([&] {
        forge::ops::AutocastGuard guard(forge::DType::bf16);
        Tensor r = forge::ops::matmul(a, b);
      });
    }
    const auto rate = [&](double t) { return 3 * flops / t / 1e9; };
    std::printf(csv ? "gemm_bf16,%lldx%lldx%lld,%.1f,%.1f,%.1f\n" : "| %lld x %lld x %lld | %.1f | %.1f | %.1f |\n",
                static_cast<long long>(g.m), static_cast<long long>(g.k),
                static_cast<long long>(g.n), rate(f32), rate(bf16), rate(autocast));
  }

  if (!csv) {
    std::printf(
        "\n| elementwise f32, 16M elements | attnforge GB/s | memcpy GB/s | ratio "
        "|\n|---|---|---|---|\n");
  }
  const int64_t n = 1 << 24;
  Tensor x = Tensor::randn({n}), y = Tensor::randn({n});
  const Tensor positive = forge::ops::add(forge::ops::abs(x), 0.01);  // log's domain
  std::vector<float> dst(static_cast<size_t>(n));
  const double bytes2 = 2.0 * 4 * static_cast<double>(n), bytes3 = 3.0 * 4 * static_cast<double>(n);
  const double copy =
      time_median([&] { std::memcpy(dst.data(), x.data<float>(), 4 * static_cast<size_t>(n)); });
  const double copy_gbs = bytes2 / copy / 1e9;
  struct Case {
    const char* name;
    double bytes;
    std::function<void()> fn;
  };
  const std::vector<Case> cases = {
      {"add (x + y)", bytes3, [&] { Tensor r = forge::ops::add(x, y); }},
      {"mul by scalar", bytes2, [&] { Tensor r = forge::ops::mul(x, 2.0); }},
      {"exp", bytes2, [&] { Tensor r = forge::ops::exp(x); }},
      {"log", bytes2, [&] { Tensor r = forge::ops::log(positive); }},
      {"tanh", bytes2, [&] { Tensor r = forge::ops::tanh(x); }},
      {"sigmoid", bytes2, [&] { Tensor r = forge::ops::sigmoid(x); }},
      {"gelu", bytes2, [&] { Tensor r = forge::ops::gelu(x); }},
      {"gelu tanh", bytes2, [&] { Tensor r = forge::ops::gelu(x, forge::ops::GeluApprox::tanh); }},
  };
  for (const Case& c : cases) {
    const double gbs = c.bytes / time_median(c.fn) / 1e9;
    std::printf(csv ? "elementwise,%s,%.1f,%.1f,%.3f\n" : "| %s | %.1f | %.1f | %.3f |\n", c.name,
                gbs, copy_gbs, gbs / copy_gbs);
  }
  return 0;
}
