// ops::matmul on the GPU against cuBLAS called directly on the same device
// buffers (same shapes, dtype and compute type, the same handle and stream),
// so the ratio is what our op adds: argument checks, the output allocation,
// the dispatch. Each repetition is timed with CUDA events on the device's
// stream; the table gives the median after a warm-up.
//
//   bench_cuda_matmul [--reps 20] [--warmup 5]
//
// Shapes: square 4096 in f32 (TF32 off and on) and bf16; the linear layers of
// ViT-S/16 at batch 128 (128 x 197 = 25216 tokens; 384 -> 1152, 384 -> 1536,
// 1536 -> 384) in bf16; and the attention products of that model,
// [B H, N, d] = [768, 197, 64]: S = Q K^T and O = P V, in bf16.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda_context.h"
#include "core/tensor.h"
#include "ops/linalg/handles_cuda.h"
#include "ops/linalg/matmul.h"

using namespace forge;

namespace {

// c = op(a) op(b) per batch, a (batch, n, k) [(batch, k, n) with ta], b
// (batch, k, m) [(batch, m, k) with tb].
struct Case {
  std::string name;
  int64_t batch, n, k, m;
  bool ta, tb;
  DType dtype;
  bool tf32;
};

cudaDataType_t cuda_type(DType t) {
  return t == DType::f32 ? CUDA_R_32F : t == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
}

// The median over `reps` of one call's device time, after `warmup` calls.
double median_ms(const std::function<void()>& call, int reps, int warmup) {
  const cudaStream_t s = cuda::stream(0);
  cudaEvent_t start = nullptr, stop = nullptr;
  FORGE_CUDA_CHECK(cudaEventCreate(&start));
  FORGE_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) call();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    FORGE_CUDA_CHECK(cudaEventRecord(start, s));
    call();
    FORGE_CUDA_CHECK(cudaEventRecord(stop, s));
    FORGE_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    FORGE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  FORGE_CUDA_CHECK(cudaEventDestroy(start));
  FORGE_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void run(const Case& c, int reps, int warmup) {
  const Device dev = Device::cuda(0);
  Generator gen(0);
  const Shape a_shape = {c.batch, c.ta ? c.k : c.n, c.ta ? c.n : c.k};
  const Shape b_shape = {c.batch, c.tb ? c.m : c.k, c.tb ? c.k : c.m};
  // One batch is given as plain matrices, as a linear layer's operands are.
  const auto shaped = [&](const Shape& s) {
    return c.batch == 1 ? Shape(s.begin() + 1, s.end()) : s;
  };
  const Tensor a = Tensor::randn(shaped(a_shape), DType::f32, &gen).to(dev).to(c.dtype);
  const Tensor b = Tensor::randn(shaped(b_shape), DType::f32, &gen).to(dev).to(c.dtype);
  const Tensor out = Tensor::empty({c.batch, c.n, c.m}, c.dtype, dev);

  ops::set_allow_tf32(c.tf32);
  const double ours = median_ms([&] { ops::matmul(a, b, c.ta, c.tb); }, reps, warmup);

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  const cublasHandle_t h = cuda::cublas_handle(0);
  const cublasComputeType_t compute =
      c.dtype == DType::f32 && c.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t t = cuda_type(c.dtype);
  const int n = static_cast<int>(c.n), m = static_cast<int>(c.m), k = static_cast<int>(c.k);
  const int lda = c.ta ? n : k, ldb = c.tb ? k : m;
  const cublasOperation_t op_a = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const double direct = median_ms(
      [&] {
        if (c.batch == 1) {
          FORGE_CUBLAS_CHECK(cublasGemmEx(
              h, op_b, op_a, m, n, k, &alpha, b.raw_device_data(), t, ldb, a.raw_device_data(), t,
              lda, &beta, out.raw_device_data(), t, m, compute, CUBLAS_GEMM_DEFAULT));
        } else {
          FORGE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
              h, op_b, op_a, m, n, k, &alpha, b.raw_device_data(), t, ldb, c.k * c.m,
              a.raw_device_data(), t, lda, c.n * c.k, &beta, out.raw_device_data(), t, m, c.n * c.m,
              static_cast<int>(c.batch), compute, CUBLAS_GEMM_DEFAULT));
        }
      },
      reps, warmup);
  ops::set_allow_tf32(false);

  const double flop = 2.0 * static_cast<double>(c.batch * c.n * c.m * c.k);
  const std::string dtype = std::string(dtype_name(c.dtype)) +
                            (c.dtype == DType::f32 ? (c.tf32 ? " tf32" : " fp32") : "");
  std::printf("%-34s %-9s %9.3f %9.3f %6.2f %9.1f %9.1f\n", c.name.c_str(), dtype.c_str(), ours,
              direct, ours / direct, flop / (ours * 1e9), flop / (direct * 1e9));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, warmup = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string opt = argv[i];
    if (opt == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else if (opt == "--warmup") {
      warmup = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "bench_cuda_matmul: unknown option %s\n", opt.c_str());
      return 2;
    }
  }
  if (reps <= 0 || warmup < 0) {
    std::fprintf(stderr, "bench_cuda_matmul: expected --reps > 0 and --warmup >= 0\n");
    return 2;
  }
  if (cuda_device_count() == 0) {
    std::fprintf(stderr,
                 "bench_cuda_matmul: no CUDA device visible; it measures GPU GEMMs, run it on a "
                 "machine with a GPU\n");
    return 1;
  }
  const int64_t tokens = 128 * 197, bh = 128 * 6, N = 197, d = 64;
  const std::vector<Case> cases = {
      {"square 4096", 1, 4096, 4096, 4096, false, false, DType::f32, false},
      {"square 4096", 1, 4096, 4096, 4096, false, false, DType::f32, true},
      {"square 4096", 1, 4096, 4096, 4096, false, false, DType::bf16, false},
      {"ViT-S qkv   25216x384 -> 1152", 1, tokens, 384, 1152, false, true, DType::bf16, false},
      {"ViT-S fc1   25216x384 -> 1536", 1, tokens, 384, 1536, false, true, DType::bf16, false},
      {"ViT-S fc2   25216x1536 -> 384", 1, tokens, 1536, 384, false, true, DType::bf16, false},
      {"ViT-S fc1 dW = dy^T x, k 25216", 1, 1536, tokens, 384, true, false, DType::bf16, false},
      {"attn S = Q K^T [768,197,64]", bh, N, d, N, false, true, DType::bf16, false},
      {"attn O = P V   [768,197,197]", bh, N, N, d, false, false, DType::bf16, false},
  };
  std::printf("%-34s %-9s %9s %9s %6s %9s %9s\n", "shape", "dtype", "ours ms", "cuBLAS ms", "ratio",
              "ours TF/s", "cuBLAS TF/s");
  for (const Case& c : cases) run(c, reps, warmup);
  return 0;
}
