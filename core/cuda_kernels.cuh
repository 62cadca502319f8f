// What every CUDA kernel file (.cu) shares: element types, the dtype dispatch,
// launch shapes and warp / block reductions.
//
// The convention: a .cu file holds kernels and their launchers, which take
// raw device pointers, sizes, the dtype and the device index (never a Tensor,
// and never fmt, which nvcc cannot compile), and are declared in a plain C++
// header beside it (`*_cuda.h`). The op's .cpp checks arguments, allocates,
// records autograd and calls the launcher under FORGE_IF_CUDA. Launchers issue
// their work on cuda::stream(device) under a DeviceGuard and check every launch. Kernels load any
// floating type into its accumulation type (f32 for f32 / bf16 / f16, f64 for f64), compute there,
// and round once when storing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/allocator.h"
#include "core/cuda_context.h"
#include "core/dtype.h"
#include "core/philox.h"

namespace forge::cuda {

// ---- element types ----

template <typename T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
// The type a kernel computes in for storage type T.
template <typename T>
using acc_t = typename AccOf<T>::type;

template <typename A, typename T>
__device__ __forceinline__ A load(const T* p) {
  return static_cast<A>(*p);
}
template <typename A, typename T>
__device__ __forceinline__ A to_acc(T v) {
  return static_cast<A>(v);
}
template <>
__device__ __forceinline__ float to_acc<float, __nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_acc<float, __half>(__half v) {
  return __half2float(v);
}
template <typename T, typename A>
__device__ __forceinline__ T from_acc(A v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16, float>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_acc<__half, float>(float v) {
  return __float2half_rn(v);
}

// A double (a fill value, a scalar operand) as storage type T, on the host or
// the device: bf16 / f16 round through f32 exactly as the CPU's conversions do.
template <typename T>
__host__ __device__ __forceinline__ T from_double(double v) {
  return static_cast<T>(v);
}
template <>
__host__ __device__ __forceinline__ __nv_bfloat16 from_double<__nv_bfloat16>(double v) {
  return __float2bfloat16_rn(static_cast<float>(v));  // through f32, as the CPU rounds
}
template <>
__host__ __device__ __forceinline__ __half from_double<__half>(double v) {
  return __float2half_rn(static_cast<float>(v));  // through f32, as the CPU rounds
}
template <>
__host__ __device__ __forceinline__ bool from_double<bool>(double v) {
  return v != 0.0;
}

}  // namespace forge::cuda

// Runs the body with `scalar_t` bound to the storage type of a floating dtype
// (f32, f64, bf16 as __nv_bfloat16, f16 as __half) and `acc_type` to the type
// kernels compute in; any other dtype is an error naming the op.
#define FORGE_CUDA_DISPATCH_CASE(dt, T, ...)  \
  case ::forge::DType::dt: {                  \
    using scalar_t = T;                       \
    using acc_type = ::forge::cuda::acc_t<T>; \
    return __VA_ARGS__();                     \
  }
#define FORGE_CUDA_DISPATCH_FLOAT(dtype, op_name, ...)           \
  [&] {                                                          \
    switch (dtype) {                                             \
      FORGE_CUDA_DISPATCH_CASE(f32, float, __VA_ARGS__)          \
      FORGE_CUDA_DISPATCH_CASE(f64, double, __VA_ARGS__)         \
      FORGE_CUDA_DISPATCH_CASE(bf16, __nv_bfloat16, __VA_ARGS__) \
      FORGE_CUDA_DISPATCH_CASE(f16, __half, __VA_ARGS__)         \
      default:                                                   \
        ::forge::cuda::fail_dtype(op_name, dtype);               \
    }                                                            \
  }()

namespace forge::cuda {

// ---- math in the accumulation type (f32 calls the f32 functions) ----

__device__ __forceinline__ float exp_of(float v) {
  return expf(v);
}
__device__ __forceinline__ double exp_of(double v) {
  return ::exp(v);
}
__device__ __forceinline__ float log_of(float v) {
  return logf(v);
}
__device__ __forceinline__ double log_of(double v) {
  return ::log(v);
}
__device__ __forceinline__ float sqrt_of(float v) {
  return sqrtf(v);
}
__device__ __forceinline__ double sqrt_of(double v) {
  return ::sqrt(v);
}

// Device memory from the caching allocator for the length of a scope (a
// launcher's scratch). Freeing it while kernels still use it is safe: the
// device's one stream orders the block's reuse after them.
class Scratch {
 public:
  Scratch(int device, size_t nbytes)
      : alloc_(allocator_for(Device::cuda(device))), nbytes_(nbytes), p_(alloc_.allocate(nbytes)) {}
  ~Scratch() { alloc_.deallocate(p_, nbytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return p_; }
  template <typename A>
  A* as() const {
    return static_cast<A*>(p_);
  }

 private:
  Allocator& alloc_;
  size_t nbytes_;
  void* p_;
};

// ---- launch shapes ----

constexpr int kThreads = 256;  // threads per block of the 1-d kernels
constexpr int kWarp = 32;

// Blocks for a grid-stride loop over n elements: enough to fill the device a
// few times over, never more than the elements need.
inline unsigned grid_for(int64_t n, int device, int threads = kThreads) {
  const int64_t need = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(multiprocessor_count(device)) * 8;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(need, cap)));
}

// A grid-stride loop over [0, n): `for (int64_t i : grid_stride(n))` is not
// expressible, so kernels write FORGE_GRID_STRIDE(i, n) { ... }.
#define FORGE_GRID_STRIDE(i, n)                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- reductions ----

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename A>
__device__ __forceinline__ A warp_max(A v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `shared` holds 32 values; the call synchronises the block.
template <typename A>
__device__ A block_sum(A v, A* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  v = lane < warps ? shared[lane] : A(0);
  return warp_sum(v);
}
template <typename A>
__device__ A block_max(A v, A* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

// out[r] = a[r] . b[r] over rows of `dim` elements (in the accumulation
// type), one warp per row; launch with grid_for(rows * kWarp, device) x kThreads.
template <typename T>
__global__ void row_dot_kernel(const T* a, const T* b, int64_t rows, int64_t dim, acc_t<T>* out) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; r < rows;
       r += warps) {
    A acc = 0;
    for (int64_t c = lane; c < dim; c += kWarp)
      acc += to_acc<A>(a[r * dim + c]) * to_acc<A>(b[r * dim + c]);
    acc = warp_sum(acc);
    if (lane == 0) out[r] = acc;
  }
}

}  // namespace forge::cuda
