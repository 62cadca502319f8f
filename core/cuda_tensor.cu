// fill and dtype conversion of tensors on a GPU (see core/cuda_tensor.h).
// Floats round to nearest even, as on the CPU; float -> integer truncates
// toward zero as a C++ cast; anything -> bool is "non-zero".
#include "core/cuda_kernels.cuh"
#include "core/cuda_tensor.h"

namespace forge::cuda {

namespace {

// Every storage type, with `elem_t` bound to its device type.
#define FORGE_CUDA_ALL_CASE(dt, T, ...) \
  case ::forge::DType::dt: {            \
    using elem_t = T;                   \
    return __VA_ARGS__();               \
  }
#define FORGE_CUDA_DISPATCH_ALL(dtype, op_name, ...)                                       \
  [&] {                                                                                    \
    switch (dtype) {                                                                       \
      FORGE_CUDA_ALL_CASE(f32, float, __VA_ARGS__)                                         \
      FORGE_CUDA_ALL_CASE(f64, double, __VA_ARGS__)                                        \
      FORGE_CUDA_ALL_CASE(bf16, __nv_bfloat16, __VA_ARGS__)                                \
      FORGE_CUDA_ALL_CASE(f16, __half, __VA_ARGS__)                                        \
      FORGE_CUDA_ALL_CASE(i32, int32_t, __VA_ARGS__)                                       \
      FORGE_CUDA_ALL_CASE(i64, int64_t, __VA_ARGS__)                                       \
      FORGE_CUDA_ALL_CASE(u8, uint8_t, __VA_ARGS__)                                        \
      FORGE_CUDA_ALL_CASE(boolean, bool, __VA_ARGS__)                                      \
    }                                                                                      \
    ::forge::cuda::fail_dtype(op_name, dtype);                                             \
  }()

// Any element to double and back, the bridge of every conversion.
template <typename T>
__device__ __forceinline__ double as_double(T v) {
  return static_cast<double>(v);
}
template <>
__device__ __forceinline__ double as_double<__nv_bfloat16>(__nv_bfloat16 v) {
  return static_cast<double>(__bfloat162float(v));
}
template <>
__device__ __forceinline__ double as_double<__half>(__half v) {
  return static_cast<double>(__half2float(v));
}

template <typename T>
__global__ void fill_kernel(T* p, int64_t n, T v) {
  FORGE_GRID_STRIDE(i, n) p[i] = v;
}

template <typename S, typename D>
__global__ void convert_kernel(const S* src, D* dst, int64_t n) {
  FORGE_GRID_STRIDE(i, n)
    dst[i] = from_double<D>(as_double(src[i]));
}

// A float -> float conversion through f32 where exact (bf16 / f16 <-> f32).
template <>
__global__ void convert_kernel<float, __nv_bfloat16>(const float* src, __nv_bfloat16* dst,
                                                     int64_t n) {
  FORGE_GRID_STRIDE(i, n)
    dst[i] = __float2bfloat16_rn(src[i]);
}
template <>
__global__ void convert_kernel<float, __half>(const float* src, __half* dst, int64_t n) {
  FORGE_GRID_STRIDE(i, n)
    dst[i] = __float2half_rn(src[i]);
}

template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t n) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(i, n) out[i] = from_acc<T>(to_acc<A>(a[i]) + to_acc<A>(b[i]));
}

}  // namespace

void add(DType dtype, const void* a, const void* b, void* out, int64_t n, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "gradient accumulation", [&] {
    add_kernel<scalar_t><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(a), static_cast<const scalar_t*>(b),
        static_cast<scalar_t*>(out), n);
    FORGE_CUDA_CHECK_LAUNCH("add");
  });
}

void fill(DType dtype, int device, void* p, int64_t n, double value) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_ALL(dtype, "fill", [&] {
    // The value is rounded on the host exactly as a conversion kernel would.
    const elem_t v = from_double<elem_t>(value);
    fill_kernel<<<grid_for(n, device), kThreads, 0, stream(device)>>>(static_cast<elem_t*>(p), n,
                                                                       v);
    FORGE_CUDA_CHECK_LAUNCH("fill");
  });
}

void convert(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_ALL(src_dtype, "to", [&] {
    using S = elem_t;
    FORGE_CUDA_DISPATCH_ALL(dst_dtype, "to", [&] {
      convert_kernel<S, elem_t><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
          static_cast<const S*>(src), static_cast<elem_t*>(dst), n);
      FORGE_CUDA_CHECK_LAUNCH("convert");
    });
  });
}

}  // namespace forge::cuda
