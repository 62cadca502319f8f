// The optimizers', clipping's and the gradient scaler's kernels (see
// optim/update_cuda.h). The update kernels compute in the parameter's type T
// (f32 or f64) in the order of the CPU loops they mirror, which are quoted in
// the comments of sgd.cpp, adam.cpp and lamb.cpp.
#include <climits>
#include <cmath>
#include <limits>

#include "core/cuda_kernels.cuh"
#include "optim/update_cuda.h"

namespace forge::cuda::optim {
namespace {

// Runs body(T{}) with T the storage type of an optimizer's parameter dtype
// (f32 or f64; optim/optimizer.h admits no other).
template <typename F>
void dispatch_param(DType dtype, const char* op, F&& body) {
  if (dtype == DType::f32) return body(float{});
  if (dtype == DType::f64) return body(double{});
  fail_dtype(op, dtype);
}

// Blocks of a reduction over n elements; partial sums are kept per block.
unsigned reduce_grid(int64_t n, int device) {
  return grid_for(n, device);
}

// Sum of partial[0, blocks) in f64 by one block: thread t adds partials t,
// t + blockDim.x, ... in order, then the block sums the threads' values.
__device__ double sum_partials(const double* partial, int blocks, double* shared) {
  double s = 0;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) s += partial[b];
  return block_sum(s, shared);
}

// ---- SGD ----

// p, grad, buf: (n). Mirrors sgd.cpp's loop.
template <typename T>
__global__ void sgd_kernel(T* p, const T* grad, T* buf, int64_t n, bool first, T lr, T wd,
                           T momentum, T one_minus_dampening, bool nesterov) {
  FORGE_GRID_STRIDE(i, n) {
    const T pi = p[i];
    T g = grad[i];
    if (wd != T(0)) g = g + wd * pi;
    if (buf) {
      const T b = first ? g : buf[i] * momentum + one_minus_dampening * g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    p[i] = pi + (-lr) * g;
  }
}

// ---- Adam / AdamW ----

// p, grad, m, v: (n). AdamW's decay pass and adam.cpp's update loop fused: the
// decayed p is what the update reads and adds to.
template <typename T>
__global__ void adam_kernel(T* p, const T* grad, T* m, T* v, int64_t n, bool decay, T keep, T l2,
                            T beta1, T one_minus_beta1, T beta2, T one_minus_beta2,
                            T bias_correction2_sqrt, T eps, T step_size) {
  FORGE_GRID_STRIDE(i, n) {
    T pi = p[i];
    if (decay) pi = pi * keep;
    T g = grad[i];
    if (l2 != T(0)) g = g + l2 * pi;
    const T mi = m[i] * beta1 + one_minus_beta1 * g;
    const T vi = v[i] * beta2 + one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const T denom = sqrt_of(vi) / bias_correction2_sqrt + eps;
    p[i] = pi + (-step_size) * (mi / denom);
  }
}

// ---- Adam / AdamW over many tensors ----

// The tensors of one launch, in the kernel's parameters (under 4 KiB for f64).
template <typename T>
struct AdamTable {
  T* p[kAdamTensorsPerLaunch];
  const T* grad[kAdamTensorsPerLaunch];
  T* m[kAdamTensorsPerLaunch];
  T* v[kAdamTensorsPerLaunch];
  int64_t n[kAdamTensorsPerLaunch];
  T keep[kAdamTensorsPerLaunch], l2[kAdamTensorsPerLaunch];
  T bias_correction2_sqrt[kAdamTensorsPerLaunch], step_size[kAdamTensorsPerLaunch];
  bool decay[kAdamTensorsPerLaunch];
  int first_block[kAdamTensorsPerLaunch + 1];  // tensor t owns blocks [first_block[t], first_block[t + 1])
  int count;
  T beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
};
constexpr int64_t kAdamChunk = 8 * kThreads;  // elements per block

// Block b updates chunk b - first_block[t] of tensor t with adam_kernel's
// arithmetic.
template <typename T>
__global__ void __launch_bounds__(kThreads) adam_many_kernel(const __grid_constant__ AdamTable<T> a) {
  int t = 0;
  while (t + 1 < a.count && static_cast<int>(blockIdx.x) >= a.first_block[t + 1]) ++t;
  const int64_t begin = static_cast<int64_t>(blockIdx.x - a.first_block[t]) * kAdamChunk;
  const int64_t end = min(a.n[t], begin + kAdamChunk);
  T* p = a.p[t];
  const T* grad = a.grad[t];
  T* m = a.m[t];
  T* v = a.v[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    T pi = p[i];
    if (a.decay[t]) pi = pi * a.keep[t];
    T g = grad[i];
    if (a.l2[t] != T(0)) g = g + a.l2[t] * pi;
    const T mi = m[i] * a.beta1 + a.one_minus_beta1 * g;
    const T vi = v[i] * a.beta2 + a.one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const T denom = sqrt_of(vi) / a.bias_correction2_sqrt[t] + a.eps;
    p[i] = pi + (-a.step_size[t]) * (mi / denom);
  }
}

// ---- LAMB ----

// w, grad, m, v, r: (n); partial: (2 gridDim.x), the block's sum of w^2 at
// [blockIdx.x] and of r^2 at [gridDim.x + blockIdx.x]. Mirrors lamb.cpp's
// first loop; w is not written here, so its norm is the one before the step.
template <typename T>
__global__ void lamb_moments_kernel(const T* w, const T* grad, T* m, T* v, T* r, int64_t n, T beta1,
                                    T one_minus_beta1, T beta2, T one_minus_beta2, T bc1, T bc2,
                                    T eps, T wd, double* partial) {
  __shared__ double shared[kWarp];
  double w_sq = 0, r_sq = 0;
  FORGE_GRID_STRIDE(i, n) {
    const T g = grad[i];
    const T mi = m[i] * beta1 + one_minus_beta1 * g;
    const T vi = v[i] * beta2 + one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const T wi = w[i];
    const T ri = (mi / bc1) / (sqrt_of(vi / bc2) + eps) + wd * wi;
    r[i] = ri;
    const double wd_i = static_cast<double>(wi), rd_i = static_cast<double>(ri);
    w_sq += wd_i * wd_i;
    r_sq += rd_i * rd_i;
  }
  w_sq = block_sum(w_sq, shared);
  r_sq = block_sum(r_sq, shared);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = w_sq;
    partial[gridDim.x + blockIdx.x] = r_sq;
  }
}

// One block: the norms from the partials (2 blocks of them), the trust ratio
// as lamb.cpp forms it, and *step = -lr trust rounded to T (stored as a double,
// exactly).
template <typename T>
__global__ void lamb_trust_kernel(const double* partial, int blocks, double lr, double* step) {
  __shared__ double shared[kWarp];
  const double w_sq = sum_partials(partial, blocks, shared);
  const double r_sq = sum_partials(partial + blocks, blocks, shared);
  if (threadIdx.x == 0) {
    const double w_norm = sqrt(w_sq), r_norm = sqrt(r_sq);
    const double trust = w_norm > 0 && r_norm > 0 ? w_norm / r_norm : 1.0;
    *step = static_cast<double>(static_cast<T>(-lr * trust));
  }
}

// w, r: (n); w = w + step * r with the step lamb_trust_kernel left on the device.
template <typename T>
__global__ void lamb_apply_kernel(T* w, const T* r, int64_t n, const double* step) {
  const T s = static_cast<T>(*step);
  FORGE_GRID_STRIDE(i, n) w[i] = w[i] + s * r[i];
}

// ---- norms and scaling (any floating dtype) ----

// x: (n); partial: (gridDim.x), each block's sum of x^2 in f64.
template <typename T>
__global__ void sum_of_squares_kernel(const T* x, int64_t n, double* partial) {
  __shared__ double shared[kWarp];
  double s = 0;
  FORGE_GRID_STRIDE(i, n) {
    const double v = static_cast<double>(to_acc<acc_t<T>>(x[i]));
    s += v * v;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block: *out = the sum of partial[0, blocks).
__global__ void sum_partials_kernel(const double* partial, int blocks, double* out) {
  __shared__ double shared[kWarp];
  const double s = sum_partials(partial, blocks, shared);
  if (threadIdx.x == 0) *out = s;
}

// src, dst: (n); dst = src * c in the accumulation type, rounded once.
template <typename T>
__global__ void scale_kernel(const T* src, T* dst, int64_t n, acc_t<T> c) {
  FORGE_GRID_STRIDE(i, n) dst[i] = from_acc<T>(to_acc<acc_t<T>>(src[i]) * c);
}

// As scale_kernel, and *found_inf = 1 where an input or output is not finite
// (every writer stores the same value, so the race is benign).
template <typename T>
__global__ void unscale_kernel(const T* src, T* dst, int64_t n, acc_t<T> c, float* found_inf) {
  FORGE_GRID_STRIDE(i, n) {
    const acc_t<T> x = to_acc<acc_t<T>>(src[i]);
    const T y = from_acc<T>(x * c);
    dst[i] = y;
    if (!isfinite(x) || !isfinite(to_acc<acc_t<T>>(y))) *found_inf = 1.0f;
  }
}

}  // namespace

int64_t reduce_scratch_size(int device) {
  // The most blocks grid_for gives on this device (its cap), twice for LAMB's
  // two sums, and one more for LAMB's step.
  const int64_t most = reduce_grid(std::numeric_limits<int64_t>::max() / 2, device);
  return 2 * most + 1;
}

void sgd_update(DType dtype, int device, void* p, const void* grad, void* buf, int64_t n,
                bool first, const SgdCoefficients& c) {
  if (n == 0) return;
  DeviceGuard guard(device);
  dispatch_param(dtype, "SGD", [&](auto zero) {
    using T = decltype(zero);
    sgd_kernel<T><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<T*>(p), static_cast<const T*>(grad), static_cast<T*>(buf), n, first,
        static_cast<T>(c.lr), static_cast<T>(c.weight_decay), static_cast<T>(c.momentum),
        static_cast<T>(c.one_minus_dampening), c.nesterov);
    FORGE_CUDA_CHECK_LAUNCH("sgd_update");
  });
}

void adam_update(DType dtype, int device, void* p, const void* grad, void* m, void* v, int64_t n,
                 const AdamCoefficients& c) {
  if (n == 0) return;
  DeviceGuard guard(device);
  dispatch_param(dtype, "Adam", [&](auto zero) {
    using T = decltype(zero);
    adam_kernel<T><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<T*>(p), static_cast<const T*>(grad), static_cast<T*>(m), static_cast<T*>(v), n,
        c.decay, static_cast<T>(c.keep), static_cast<T>(c.l2), static_cast<T>(c.beta1),
        static_cast<T>(c.one_minus_beta1), static_cast<T>(c.beta2),
        static_cast<T>(c.one_minus_beta2), static_cast<T>(c.bias_correction2_sqrt),
        static_cast<T>(c.eps), static_cast<T>(c.step_size));
    FORGE_CUDA_CHECK_LAUNCH("adam_update");
  });
}

void adam_update_many(DType dtype, int device, const std::vector<AdamTensor>& tensors) {
  if (tensors.empty()) return;
  DeviceGuard guard(device);
  dispatch_param(dtype, "Adam (many tensors)", [&](auto zero) {
    using T = decltype(zero);
    const AdamCoefficients& c0 = tensors.front().c;
    AdamTable<T> a{};
    a.beta1 = static_cast<T>(c0.beta1);
    a.one_minus_beta1 = static_cast<T>(c0.one_minus_beta1);
    a.beta2 = static_cast<T>(c0.beta2);
    a.one_minus_beta2 = static_cast<T>(c0.one_minus_beta2);
    a.eps = static_cast<T>(c0.eps);
    int64_t blocks = 0;
    const auto launch = [&] {
      if (a.count == 0) return;
      a.first_block[a.count] = static_cast<int>(blocks);
      if (blocks > 0) {
        adam_many_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream(device)>>>(a);
        FORGE_CUDA_CHECK_LAUNCH("adam_update_many");
      }
      a.count = 0;
      blocks = 0;
    };
    for (const AdamTensor& x : tensors) {
      if (x.c.beta1 != c0.beta1 || x.c.beta2 != c0.beta2 || x.c.eps != c0.eps)
        fail("adam_update_many: the tensors of one call must share beta1, beta2 and eps");
      const int64_t chunks = (x.n + kAdamChunk - 1) / kAdamChunk;
      if (a.count == kAdamTensorsPerLaunch || blocks + chunks > INT_MAX) launch();
      const int t = a.count++;
      a.p[t] = static_cast<T*>(x.p);
      a.grad[t] = static_cast<const T*>(x.grad);
      a.m[t] = static_cast<T*>(x.m);
      a.v[t] = static_cast<T*>(x.v);
      a.n[t] = x.n;
      a.decay[t] = x.c.decay;
      a.keep[t] = static_cast<T>(x.c.keep);
      a.l2[t] = static_cast<T>(x.c.l2);
      a.bias_correction2_sqrt[t] = static_cast<T>(x.c.bias_correction2_sqrt);
      a.step_size[t] = static_cast<T>(x.c.step_size);
      a.first_block[t] = static_cast<int>(blocks);
      blocks += chunks;
    }
    launch();
  });
}

void lamb_update(DType dtype, int device, void* w, const void* grad, void* m, void* v, void* r,
                 double* scratch, int64_t n, const LambCoefficients& c) {
  if (n == 0) return;
  DeviceGuard guard(device);
  const unsigned blocks = reduce_grid(n, device);
  double* step = scratch + 2 * static_cast<int64_t>(blocks);
  dispatch_param(dtype, "LAMB", [&](auto zero) {
    using T = decltype(zero);
    lamb_moments_kernel<T><<<blocks, kThreads, 0, stream(device)>>>(
        static_cast<const T*>(w), static_cast<const T*>(grad), static_cast<T*>(m),
        static_cast<T*>(v), static_cast<T*>(r), n, static_cast<T>(c.beta1),
        static_cast<T>(c.one_minus_beta1), static_cast<T>(c.beta2),
        static_cast<T>(c.one_minus_beta2), static_cast<T>(c.bias_correction1),
        static_cast<T>(c.bias_correction2), static_cast<T>(c.eps), static_cast<T>(c.weight_decay),
        scratch);
    FORGE_CUDA_CHECK_LAUNCH("lamb_moments");
    lamb_trust_kernel<T>
        <<<1, kThreads, 0, stream(device)>>>(scratch, static_cast<int>(blocks), c.lr, step);
    FORGE_CUDA_CHECK_LAUNCH("lamb_trust");
    lamb_apply_kernel<T><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<T*>(w), static_cast<const T*>(r), n, step);
    FORGE_CUDA_CHECK_LAUNCH("lamb_apply");
  });
}

void sum_of_squares(DType dtype, int device, const void* x, int64_t n, double* scratch,
                    double* out) {
  DeviceGuard guard(device);
  // n = 0 still runs one block, which writes a zero partial and so *out = 0.
  const unsigned blocks = reduce_grid(n, device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "grad_norm", [&] {
    sum_of_squares_kernel<scalar_t>
        <<<blocks, kThreads, 0, stream(device)>>>(static_cast<const scalar_t*>(x), n, scratch);
    FORGE_CUDA_CHECK_LAUNCH("sum_of_squares");
  });
  sum_partials_kernel<<<1, kThreads, 0, stream(device)>>>(scratch, static_cast<int>(blocks), out);
  FORGE_CUDA_CHECK_LAUNCH("sum_partials");
}

void scale(DType dtype, int device, const void* src, void* dst, int64_t n, double coef) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "clip_grad_norm", [&] {
    scale_kernel<scalar_t><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(src), static_cast<scalar_t*>(dst), n,
        static_cast<acc_type>(coef));
    FORGE_CUDA_CHECK_LAUNCH("scale");
  });
}

void unscale(DType dtype, int device, const void* src, void* dst, int64_t n, double inv_scale,
             float* found_inf) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "GradScaler::unscale", [&] {
    unscale_kernel<scalar_t><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(src), static_cast<scalar_t*>(dst), n,
        static_cast<acc_type>(inv_scale), found_inf);
    FORGE_CUDA_CHECK_LAUNCH("unscale");
  });
}

}  // namespace forge::cuda::optim
