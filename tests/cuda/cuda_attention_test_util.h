// Shared by the GPU attention tests: a CUDA op against the CPU op on the same
// inputs (forward and every gradient), the causal-leak check on the GPU, and
// peak GPU memory from the allocator's counters.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "ops/attention/attention.h"
#include "ops/ops.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/ops/attention/attention_test_util.h"

namespace forge::testing {

// An attention op under test: its inputs (q, k, v, then the op's other tensors:
// masks, learnable tensors, projections), all on one device -> o.
using AttentionFn = std::function<Tensor(const std::vector<Tensor>& in)>;

// The CPU dtype a reference runs in for GPU dtype `dtype`: f64 for f64, f32 otherwise.
inline DType cpu_dtype(DType dtype) {
  return dtype == DType::f64 ? DType::f64 : DType::f32;
}

// q [B, H, N, d], k [B, H, M, d], v [B, H, M, dv] on the CPU in cpu_dtype(dtype),
// uniform in [-1, 1), requiring grad; then the mask when given.
inline std::vector<Tensor> qkv_inputs(int64_t B, int64_t H, int64_t N, int64_t M, int64_t d,
                                      int64_t dv, DType dtype, uint64_t seed,
                                      const Tensor& mask = Tensor()) {
  std::vector<Tensor> in = {uniform({B, H, N, d}, seed, cpu_dtype(dtype)),
                            uniform({B, H, M, d}, seed + 1, cpu_dtype(dtype)),
                            uniform({B, H, M, dv}, seed + 2, cpu_dtype(dtype))};
  if (mask.defined()) in.push_back(mask);
  return in;
}

// A [B, M] bool key padding mask: batch b keeps key j iff keep(b, j).
inline Tensor key_mask(int64_t B, int64_t M, const std::function<bool(int64_t, int64_t)>& keep) {
  Tensor m = Tensor::ones({B, M}, DType::boolean);
  bool* p = m.data<bool>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < M; ++j) p[b * M + j] = keep(b, j);
  return m;
}

// Max |a - b| relative to max(1, max |b|): the comparison of a GPU result with
// the CPU reference.
inline double scaled_diff(const Tensor& got, const Tensor& want) {
  const auto x = host_f32(got).to_vector<double>(), y = host_f32(want).to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double diff = 0, scale = 1;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (std::isnan(x[i]) != std::isnan(y[i])) return INFINITY;
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return diff / scale;
}

// Tolerance of an attention op's GPU result against the CPU op (scaled_diff):
// f32 agrees up to summation order, f64 nearly exactly, bf16 / f16 to their
// rounding of the inputs' products.
inline double attention_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1e-9;
    case DType::bf16:
      return 3e-2;
    case DType::f16:
      return 1e-2;
    default:
      return 1e-4;
  }
}

// Runs fn on the CPU on `cpu_in` (f32 or f64; bf16 / f16 cases get their
// floating inputs rounded through `dtype` first, so both sides see the same
// values) and on the GPU on the same inputs converted to `dtype` (floating
// ones; bool / u8 keep theirs). Compares the output, then back-propagates the
// same random output gradient on both sides and compares the gradient of
// every input that requires grad. `tol` bounds scaled_diff.
inline void expect_cuda_matches_cpu(const AttentionFn& fn, const std::vector<Tensor>& cpu_in,
                                    DType dtype, double tol, const std::string& what) {
  const bool half = dtype == DType::bf16 || dtype == DType::f16;
  std::vector<Tensor> ref_in, gpu_in;
  for (const Tensor& t : cpu_in) {
    if (!t.defined()) {
      ref_in.emplace_back();
      gpu_in.emplace_back();
      continue;
    }
    const bool floating = is_floating(t.dtype());
    Tensor r = t.detach();
    if (floating && half) r = round_through(r.to(DType::f32), dtype);
    Tensor g = t.detach().to(gpu());
    if (floating) g = g.to(dtype);
    if (t.requires_grad()) {
      r.set_requires_grad(true);
      g.set_requires_grad(true);
    }
    ref_in.push_back(r);
    gpu_in.push_back(g);
  }
  const Tensor want = fn(ref_in);
  const Tensor got = fn(gpu_in);
  ASSERT_TRUE(got.device().is_cuda()) << what;
  ASSERT_EQ(got.dtype(), dtype) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_LE(scaled_diff(got, want), tol) << what << ": forward";
  if (!want.requires_grad()) return;
  const Tensor seed_cpu = uniform(want.shape(), 99, want.dtype(), -1, 1, false);
  autograd::backward({want}, {seed_cpu});
  autograd::backward({got}, {seed_cpu.to(gpu()).to(dtype)});
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    if (!ref_in[i].defined() || !ref_in[i].requires_grad()) continue;
    ASSERT_TRUE(gpu_in[i].grad().defined()) << what << ": no gradient for input " << i;
    EXPECT_LE(scaled_diff(gpu_in[i].grad(), ref_in[i].grad()), tol)
        << what << ": gradient of input " << i;
  }
}

// The GPU op leaks nothing from the future: overwriting q, k and v at the
// positions after i leaves the output rows 0..i bit-identical. q, k, v are CPU
// tensors; fn(q, k, v) gets them on the GPU in `dtype`.
inline void expect_no_causal_leak_cuda(
    const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& fn, const Tensor& q,
    const Tensor& k, const Tensor& v, DType dtype) {
  auto on_gpu = [&](const Tensor& t) { return t.detach().to(gpu()).to(dtype); };
  expect_no_causal_leak(
      [&](const Tensor& a, const Tensor& b, const Tensor& c) {
        return host_f32(fn(on_gpu(a), on_gpu(b), on_gpu(c)));
      },
      q.detach().to(DType::f32), k.detach().to(DType::f32), v.detach().to(DType::f32));
}

// Forward + backward of fn on GPU inputs of [1, H, N, d] in `dtype`: the peak
// GPU bytes allocated beyond those inputs.
inline int64_t cuda_attention_peak_bytes(
    const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& fn, int64_t N,
    int64_t H, int64_t d, DType dtype) {
  auto input = [&](uint64_t seed) {
    Tensor t = uniform({1, H, N, d}, seed, DType::f32, -1, 1, false).to(gpu()).to(dtype);
    t.set_requires_grad(true);
    return t;
  };
  Tensor q = input(1), k = input(2), v = input(3);
  const int64_t base = memory_stats(gpu()).current;
  reset_peak_memory(gpu());
  {
    Tensor o = fn(q, k, v);
    autograd::backward(ops::sum(o));
  }
  return memory_stats(gpu()).peak - base;
}

// Peak GPU memory of fn grows linearly in N: from N = 4096 to 16384 to 65536
// (x 4 each) the peak grows by at most 4.5x per step, well below the 16x of an
// N x N buffer.
inline void expect_linear_memory_cuda(
    const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& fn, int64_t H,
    int64_t d, DType dtype, const std::string& what) {
  const int64_t p1 = cuda_attention_peak_bytes(fn, 4096, H, d, dtype);
  const int64_t p2 = cuda_attention_peak_bytes(fn, 16384, H, d, dtype);
  const int64_t p3 = cuda_attention_peak_bytes(fn, 65536, H, d, dtype);
  std::cout << "[ " << what << " ] peak GPU bytes N=4096: " << p1 << ", 16384: " << p2
            << ", 65536: " << p3 << "\n";
  EXPECT_GT(p1, 0) << what;
  EXPECT_LE(static_cast<double>(p2), 4.5 * static_cast<double>(p1)) << what;
  EXPECT_LE(static_cast<double>(p3), 4.5 * static_cast<double>(p2)) << what;
}

// Sets the process's GPU attention engine (cuda::FlashEngine: softmax, local,
// linformer; cuda::LinearEngine: the linear family's core) for a scope.
template <typename E>
class EngineScope {
 public:
  explicit EngineScope(E e) : before_(get()) { set(e); }
  ~EngineScope() { set(before_); }
  EngineScope(const EngineScope&) = delete;
  EngineScope& operator=(const EngineScope&) = delete;

 private:
  static E get() {
    if constexpr (std::is_same_v<E, cuda::FlashEngine>)
      return ops::attention::flash_engine();
    else
      return ops::attention::linear_engine();
  }
  static void set(E e) {
    if constexpr (std::is_same_v<E, cuda::FlashEngine>)
      ops::attention::set_flash_engine(e);
    else
      ops::attention::set_linear_engine(e);
  }
  E before_;
};

// The GPU output of fn on `in` (CPU inputs, moved and cast to `dtype`) under
// `engine`, then the gradients of q, k, v for a fixed output gradient:
// {o, dq, dk, dv}, named by kOutputNames.
template <typename E>
std::vector<Tensor> gpu_run(const AttentionFn& fn, const std::vector<Tensor>& in, DType dtype,
                            E engine) {
  const EngineScope scope(engine);
  std::vector<Tensor> g;
  for (size_t i = 0; i < in.size(); ++i) {
    Tensor x = in[i].detach().to(gpu());
    if (is_floating(x.dtype())) x = x.to(dtype);
    if (i < 3) x.set_requires_grad(true);
    g.push_back(x);
  }
  const Tensor o = fn(g);
  autograd::backward({o}, {uniform(o.shape(), 99, DType::f32, -1, 1, false).to(gpu()).to(dtype)});
  return {o, g[0].grad(), g[1].grad(), g[2].grad()};
}
inline const char* const kOutputNames[] = {"o", "dq", "dk", "dv"};

// A case an engine does not take (its dtype, causality, dims, options): the
// engine switch must change nothing there.
struct EngineFallbackCase {
  std::string what;
  AttentionFn fn;
  std::vector<Tensor> in;
  DType dtype;
};

// Every case's output and gradients are bit-identical under engines a and b.
template <typename E>
void expect_engines_identical(const std::vector<EngineFallbackCase>& cases, E a, E b) {
  for (const EngineFallbackCase& c : cases) {
    const std::vector<Tensor> ra = gpu_run(c.fn, c.in, c.dtype, a);
    const std::vector<Tensor> rb = gpu_run(c.fn, c.in, c.dtype, b);
    for (size_t i = 0; i < 4; ++i)
      EXPECT_EQ(host_f32(ra[i]).to_vector<float>(), host_f32(rb[i]).to_vector<float>())
          << c.what << ": " << kOutputNames[i];
  }
}

// Two runs `a` and `b` of an engine under test ({o, dq, dk, dv} of gpu_run)
// against a reference engine's `ref`: every output within the dtype's
// tolerance, and the first `repeated` outputs bit-identical between the runs.
inline void expect_engine_agrees_and_repeats(const std::vector<Tensor>& ref,
                                             const std::vector<Tensor>& a,
                                             const std::vector<Tensor>& b, DType dtype,
                                             const std::string& what, size_t repeated = 4) {
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_LE(scaled_diff(a[i], ref[i]), attention_tolerance(dtype))
        << what << ": " << kOutputNames[i];
    if (i < repeated) {
      EXPECT_EQ(host_f32(a[i]).to_vector<float>(), host_f32(b[i]).to_vector<float>())
          << what << ": " << kOutputNames[i] << " differs between two runs";
    }
  }
}

}  // namespace forge::testing
