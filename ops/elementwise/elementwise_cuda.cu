// The elementwise ops on the GPU (see elementwise_cuda.h): one grid-stride
// kernel per op, the op a template parameter. Broadcasting operands are read
// through per-operand strides over the merged output dims, with 32-bit index
// arithmetic wherever every index fits. (sum_to's GPU passes are the
// reduction op's kernel, ops/reduce/reduce_cuda.cu.)
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda_kernels.cuh"
#include "ops/elementwise/elementwise_cuda.h"
#include "ops/elementwise/gelu_constants.h"

namespace forge::cuda {

namespace {

using namespace ops::gelu_constants;  // the CPU ops' constants

// An enum value as a type, so that a runtime op can pick a kernel template.
template <auto V>
using Tag = std::integral_constant<decltype(V), V>;

// ---- broadcast indexing ----

// Element offsets of output index i in each of K operands. I is uint32_t when
// every index is below 2^31 (cheaper division), else int64_t. The outermost dim
// needs no modulo, so the flat case (ndim 1) is one multiply per operand.
template <typename I, int K>
__device__ __forceinline__ void broadcast_offsets(I i, const Broadcast<K>& b, I (&off)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) off[k] = 0;
#pragma unroll
  for (int d = kMaxElementwiseDims - 1; d > 0; --d) {
    if (d < b.ndim) {
      const I size = static_cast<I>(b.sizes[d]);
      const I c = i % size;
      i /= size;
#pragma unroll
      for (int k = 0; k < K; ++k) off[k] += c * static_cast<I>(b.strides[k][d]);
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) off[k] += i * static_cast<I>(b.strides[k][0]);
}

// Runs f with a value of the index type for n elements (see broadcast_offsets).
template <typename F>
void with_index_type(int64_t n, F&& f) {
  if (n <= INT32_MAX) {
    f(uint32_t{0});
  } else {
    f(int64_t{0});
  }
}

// ---- binary ops ----

template <BinaryOp Op, typename A>
__device__ __forceinline__ A binary_value(A x, A y) {
  if constexpr (Op == BinaryOp::add) {
    return x + y;
  } else if constexpr (Op == BinaryOp::sub) {
    return x - y;
  } else if constexpr (Op == BinaryOp::mul) {
    return x * y;
  } else {
    return x / y;
  }
}

template <BinaryOp Op, typename T, typename I>
__global__ void binary_kernel(const T* a, const T* b, T* out, int64_t n, Broadcast<2> bc) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(i, n) {
    I off[2];
    broadcast_offsets(static_cast<I>(i), bc, off);
    out[i] = from_acc<T>(binary_value<Op>(to_acc<A>(a[off[0]]), to_acc<A>(b[off[1]])));
  }
}

template <typename F>
void with_binary_op(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::add:
      return f(Tag<BinaryOp::add>{});
    case BinaryOp::sub:
      return f(Tag<BinaryOp::sub>{});
    case BinaryOp::mul:
      return f(Tag<BinaryOp::mul>{});
    case BinaryOp::div:
      return f(Tag<BinaryOp::div>{});
  }
  fail("elementwise: unknown binary op");
}

// ---- unary ops and their derivatives ----

// Phi(x) with erfc, as on the CPU: the far negative tail keeps its precision.
template <typename A>
__device__ __forceinline__ A normal_cdf(A x) {
  return A(0.5) * erfc(-x * A(kInvSqrt2));
}

// exp of a non-positive argument only: no overflow at either end.
template <typename A>
__device__ __forceinline__ A sigmoid_of(A x) {
  if (x >= A(0)) return A(1) / (A(1) + exp(-x));
  const A e = exp(x);
  return e / (A(1) + e);
}

// The tanh of GPT-2's gelu: tanh(sqrt(2/pi) (x + 0.044715 x^3)).
template <typename A>
__device__ __forceinline__ A gelu_tanh_inner(A x) {
  return tanh(A(kSqrt2OverPi) * (x + A(kGeluCubic) * x * x * x));
}

template <UnaryOp Op, typename A>
__device__ __forceinline__ A unary_value(A v, A p0, A p1) {
  if constexpr (Op == UnaryOp::neg) {
    return -v;
  } else if constexpr (Op == UnaryOp::exp) {
    return exp(v);
  } else if constexpr (Op == UnaryOp::log) {
    return log(v);
  } else if constexpr (Op == UnaryOp::sqrt) {
    return sqrt(v);
  } else if constexpr (Op == UnaryOp::rsqrt) {
    return A(1) / sqrt(v);  // correctly rounded, as on the CPU (rsqrt() is not)
  } else if constexpr (Op == UnaryOp::pow) {
    return pow(v, p0);
  } else if constexpr (Op == UnaryOp::abs) {
    return fabs(v);
  } else if constexpr (Op == UnaryOp::square) {
    return v * v;
  } else if constexpr (Op == UnaryOp::clamp) {
    // min(max(v, lo), hi) with std::min / std::max's comparisons: NaN stays NaN.
    const A above = v < p0 ? p0 : v;
    return p1 < above ? p1 : above;
  } else if constexpr (Op == UnaryOp::relu) {
    return v > A(0) ? v : A(0);
  } else if constexpr (Op == UnaryOp::gelu) {
    return v * normal_cdf(v);
  } else if constexpr (Op == UnaryOp::gelu_tanh) {
    return A(0.5) * v * (A(1) + gelu_tanh_inner(v));
  } else if constexpr (Op == UnaryOp::elu) {
    return v > A(0) ? v : p0 * expm1(v);
  } else if constexpr (Op == UnaryOp::silu) {
    return v * sigmoid_of(v);
  } else if constexpr (Op == UnaryOp::sigmoid) {
    return sigmoid_of(v);
  } else if constexpr (Op == UnaryOp::tanh) {
    return tanh(v);
  } else if constexpr (Op == UnaryOp::add_scalar) {
    return v + p0;
  } else {
    static_assert(Op == UnaryOp::mul_scalar);
    return v * p0;
  }
}

// f'(s) for dx = g * f'(s); the formulas of the CPU backward passes.
template <UnaryGrad G, typename A>
__device__ __forceinline__ A unary_derivative(A s, A p0, A p1) {
  if constexpr (G == UnaryGrad::exp_of_y) {
    return s;
  } else if constexpr (G == UnaryGrad::log) {
    return A(1) / s;
  } else if constexpr (G == UnaryGrad::sqrt_of_y) {
    return A(0.5) / s;  // 1 / (2 sqrt(x))
  } else if constexpr (G == UnaryGrad::rsqrt_of_y) {
    return A(-0.5) * s * s * s;  // -x^(-3/2) / 2
  } else if constexpr (G == UnaryGrad::pow) {
    return p0 == A(0) ? A(0) : p0 * pow(s, p1);  // exponent 0: a constant, gradient 0
  } else if constexpr (G == UnaryGrad::abs) {
    return s > A(0) ? A(1) : (s < A(0) ? A(-1) : A(0));
  } else if constexpr (G == UnaryGrad::square) {
    return A(2) * s;
  } else if constexpr (G == UnaryGrad::clamp) {
    return s >= p0 && s <= p1 ? A(1) : A(0);
  } else if constexpr (G == UnaryGrad::relu) {
    return s > A(0) ? A(1) : A(0);
  } else if constexpr (G == UnaryGrad::gelu) {
    return normal_cdf(s) + s * A(kInvSqrt2Pi) * exp(A(-0.5) * s * s);  // Phi(x) + x phi(x)
  } else if constexpr (G == UnaryGrad::gelu_tanh) {
    const A t = gelu_tanh_inner(s);
    return A(0.5) * (A(1) + t) +
           A(0.5) * s * (A(1) - t * t) * A(kSqrt2OverPi) * (A(1) + A(3 * kGeluCubic) * s * s);
  } else if constexpr (G == UnaryGrad::elu) {
    return s > A(0) ? A(1) : p0 * exp(s);
  } else if constexpr (G == UnaryGrad::silu) {
    const A sg = sigmoid_of(s);
    return sg * (A(1) + s * (A(1) - sg));  // s + x s (1 - s) for s = sigmoid(x)
  } else if constexpr (G == UnaryGrad::sigmoid_of_y) {
    return s * (A(1) - s);
  } else {
    static_assert(G == UnaryGrad::tanh_of_y);
    return A(1) - s * s;
  }
}

template <UnaryOp Op, typename T>
__global__ void unary_kernel(const T* x, T* y, int64_t n, acc_t<T> p0, acc_t<T> p1) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(i, n) y[i] = from_acc<T>(unary_value<Op>(to_acc<A>(x[i]), p0, p1));
}

template <UnaryGrad G, typename T>
__global__ void unary_backward_kernel(const T* g, const T* s, T* dx, int64_t n, acc_t<T> p0,
                                      acc_t<T> p1) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(i, n) {
    dx[i] = from_acc<T>(to_acc<A>(g[i]) * unary_derivative<G>(to_acc<A>(s[i]), p0, p1));
  }
}

template <typename F>
void with_unary_op(UnaryOp op, F&& f) {
  switch (op) {
    case UnaryOp::neg:
      return f(Tag<UnaryOp::neg>{});
    case UnaryOp::exp:
      return f(Tag<UnaryOp::exp>{});
    case UnaryOp::log:
      return f(Tag<UnaryOp::log>{});
    case UnaryOp::sqrt:
      return f(Tag<UnaryOp::sqrt>{});
    case UnaryOp::rsqrt:
      return f(Tag<UnaryOp::rsqrt>{});
    case UnaryOp::pow:
      return f(Tag<UnaryOp::pow>{});
    case UnaryOp::abs:
      return f(Tag<UnaryOp::abs>{});
    case UnaryOp::square:
      return f(Tag<UnaryOp::square>{});
    case UnaryOp::clamp:
      return f(Tag<UnaryOp::clamp>{});
    case UnaryOp::relu:
      return f(Tag<UnaryOp::relu>{});
    case UnaryOp::gelu:
      return f(Tag<UnaryOp::gelu>{});
    case UnaryOp::gelu_tanh:
      return f(Tag<UnaryOp::gelu_tanh>{});
    case UnaryOp::elu:
      return f(Tag<UnaryOp::elu>{});
    case UnaryOp::silu:
      return f(Tag<UnaryOp::silu>{});
    case UnaryOp::sigmoid:
      return f(Tag<UnaryOp::sigmoid>{});
    case UnaryOp::tanh:
      return f(Tag<UnaryOp::tanh>{});
    case UnaryOp::add_scalar:
      return f(Tag<UnaryOp::add_scalar>{});
    case UnaryOp::mul_scalar:
      return f(Tag<UnaryOp::mul_scalar>{});
  }
  fail("elementwise: unknown unary op");
}

template <typename F>
void with_unary_grad(UnaryGrad grad, F&& f) {
  switch (grad) {
    case UnaryGrad::exp_of_y:
      return f(Tag<UnaryGrad::exp_of_y>{});
    case UnaryGrad::log:
      return f(Tag<UnaryGrad::log>{});
    case UnaryGrad::sqrt_of_y:
      return f(Tag<UnaryGrad::sqrt_of_y>{});
    case UnaryGrad::rsqrt_of_y:
      return f(Tag<UnaryGrad::rsqrt_of_y>{});
    case UnaryGrad::pow:
      return f(Tag<UnaryGrad::pow>{});
    case UnaryGrad::abs:
      return f(Tag<UnaryGrad::abs>{});
    case UnaryGrad::square:
      return f(Tag<UnaryGrad::square>{});
    case UnaryGrad::clamp:
      return f(Tag<UnaryGrad::clamp>{});
    case UnaryGrad::relu:
      return f(Tag<UnaryGrad::relu>{});
    case UnaryGrad::gelu:
      return f(Tag<UnaryGrad::gelu>{});
    case UnaryGrad::gelu_tanh:
      return f(Tag<UnaryGrad::gelu_tanh>{});
    case UnaryGrad::elu:
      return f(Tag<UnaryGrad::elu>{});
    case UnaryGrad::silu:
      return f(Tag<UnaryGrad::silu>{});
    case UnaryGrad::sigmoid_of_y:
      return f(Tag<UnaryGrad::sigmoid_of_y>{});
    case UnaryGrad::tanh_of_y:
      return f(Tag<UnaryGrad::tanh_of_y>{});
  }
  fail("elementwise: unknown unary derivative");
}

// ---- copies and selection ----

template <typename T, typename I>
__global__ void expand_kernel(const T* x, T* out, int64_t n, Broadcast<1> bc) {
  FORGE_GRID_STRIDE(i, n) {
    I off[1];
    broadcast_offsets(static_cast<I>(i), bc, off);
    out[i] = x[off[0]];
  }
}

template <typename T, typename I>
__global__ void where_kernel(const uint8_t* cond, const T* a, const T* b, T* out, int64_t n,
                             Broadcast<3> bc) {
  FORGE_GRID_STRIDE(i, n) {
    I off[3];
    broadcast_offsets(static_cast<I>(i), bc, off);
    out[i] = cond[off[0]] ? a[off[1]] : b[off[2]];
  }
}

template <typename T, typename I>
__global__ void masked_fill_kernel(const T* x, const uint8_t* mask, T value, T* out, int64_t n,
                                   Broadcast<2> bc) {
  FORGE_GRID_STRIDE(i, n) {
    I off[2];
    broadcast_offsets(static_cast<I>(i), bc, off);
    out[i] = mask[off[1]] ? value : x[off[0]];
  }
}

}  // namespace

void binary(BinaryOp op, DType dtype, const void* a, const void* b, void* out, int64_t n,
            const Broadcast<2>& b2, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "elementwise binary op", [&] {
    with_binary_op(op, [&](auto op_tag) {
      with_index_type(n, [&](auto index) {
        binary_kernel<decltype(op_tag)::value, scalar_t, decltype(index)>
            <<<grid_for(n, device), kThreads, 0, stream(device)>>>(
                static_cast<const scalar_t*>(a), static_cast<const scalar_t*>(b),
                static_cast<scalar_t*>(out), n, b2);
        FORGE_CUDA_CHECK_LAUNCH("binary_kernel");
      });
    });
  });
}

void unary(UnaryOp op, double p0, double p1, DType dtype, const void* x, void* y, int64_t n,
           int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "elementwise unary op", [&] {
    with_unary_op(op, [&](auto op_tag) {
      unary_kernel<decltype(op_tag)::value, scalar_t>
          <<<grid_for(n, device), kThreads, 0, stream(device)>>>(
              static_cast<const scalar_t*>(x), static_cast<scalar_t*>(y), n,
              static_cast<acc_type>(p0), static_cast<acc_type>(p1));
      FORGE_CUDA_CHECK_LAUNCH("unary_kernel");
    });
  });
}

void unary_backward(UnaryGrad grad, double p0, double p1, DType dtype, const void* g, const void* s,
                    void* dx, int64_t n, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "elementwise backward", [&] {
    with_unary_grad(grad, [&](auto grad_tag) {
      unary_backward_kernel<decltype(grad_tag)::value, scalar_t>
          <<<grid_for(n, device), kThreads, 0, stream(device)>>>(
              static_cast<const scalar_t*>(g), static_cast<const scalar_t*>(s),
              static_cast<scalar_t*>(dx), n, static_cast<acc_type>(p0), static_cast<acc_type>(p1));
      FORGE_CUDA_CHECK_LAUNCH("unary_backward_kernel");
    });
  });
}

void expand(DType dtype, const void* x, void* out, int64_t n, const Broadcast<1>& b1, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "expand", [&] {
    with_index_type(n, [&](auto index) {
      expand_kernel<scalar_t, decltype(index)>
          <<<grid_for(n, device), kThreads, 0, stream(device)>>>(
              static_cast<const scalar_t*>(x), static_cast<scalar_t*>(out), n, b1);
      FORGE_CUDA_CHECK_LAUNCH("expand_kernel");
    });
  });
}

void where(DType dtype, const uint8_t* cond, const void* a, const void* b, void* out, int64_t n,
           const Broadcast<3>& b3, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "where", [&] {
    with_index_type(n, [&](auto index) {
      where_kernel<scalar_t, decltype(index)><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
          cond, static_cast<const scalar_t*>(a), static_cast<const scalar_t*>(b),
          static_cast<scalar_t*>(out), n, b3);
      FORGE_CUDA_CHECK_LAUNCH("where_kernel");
    });
  });
}

void masked_fill(DType dtype, const void* x, const uint8_t* mask, double value, void* out,
                 int64_t n, const Broadcast<2>& b2, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "masked_fill", [&] {
    with_index_type(n, [&](auto index) {
      masked_fill_kernel<scalar_t, decltype(index)>
          <<<grid_for(n, device), kThreads, 0, stream(device)>>>(
              static_cast<const scalar_t*>(x), mask, from_double<scalar_t>(value),
              static_cast<scalar_t*>(out), n, b2);
      FORGE_CUDA_CHECK_LAUNCH("masked_fill_kernel");
    });
  });
}

}  // namespace forge::cuda
