// The one-tensor elementwise ops of elementwise.h: neg, exp, log, sqrt, rsqrt,
// pow, abs, square, clamp, the activations (relu, gelu, elu, silu, sigmoid,
// tanh) and the tensor-scalar add and mul. On the CPU each is one flat loop,
// or a block function over runs of kBlockRun elements that calls
// core/vmath.h's vector functions; its backward is one fused loop, dx = g *
// deriv(s). On a GPU each op runs the kernel of elementwise_cuda.h its enum
// names. The broadcasting ops are elementwise.cpp's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "core/vmath.h"
#include "ops/elementwise/elementwise.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "ops/elementwise/elementwise_internal.h"
#include "ops/elementwise/gelu_constants.h"

namespace forge::ops {

using namespace elementwise_detail;

namespace {

// A unary op on a GPU: its kernel and parameters (see cuda::UnaryOp).
struct GpuUnary {
  cuda::UnaryOp op;
  double p0 = 0, p1 = 0;
};

// The longest run a block function gets at once: its passes over the run
// (e.g. scale, erf, multiply) then stay in L1 / L2 instead of streaming
// a whole thread's share of the tensor through memory once per pass.
constexpr int64_t kBlockRun = 4096;

// y = op(x) on the CPU through a block function: f(x, y, n) computes a
// contiguous run of n elements at once, so that it can call core/vmath.h's
// vector functions; on a GPU the op's kernel.
template <typename F>
Tensor map_block(const Tensor& x, const char* op, int64_t cost, GpuUnary gpu, F f) {
  check_float(x, op, "x");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  FORGE_IF_CUDA(x) {
    cuda::unary(gpu.op, gpu.p0, gpu.p1, x.dtype(), x.raw_device_data(), y.raw_device_data(),
                x.numel(), x.device().index);
    return y;
  }
  FORGE_DISPATCH_FLOAT(x.dtype(), op, [&] {
    const scalar_t* px = x.data<scalar_t>();
    scalar_t* py = y.data<scalar_t>();
    parallel_for(x.numel(), cost, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; o += kBlockRun)
        f(px + o, py + o, std::min(kBlockRun, end - o));
    });
  });
  return y;
}

// y[i] = f(x[i]).
template <typename F>
Tensor map(const Tensor& x, const char* op, int64_t cost, GpuUnary gpu, F f) {
  return map_block(x, op, cost, gpu, [f]<typename T>(const T* v, T* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = f(v[i]);
  });
}

// Calls f(offset, length) over [0, n) in runs of at most kVectorChunk, the
// size of the stack scratch a block function keeps its temporaries in.
constexpr int64_t kVectorChunk = 256;
template <typename F>
void for_chunks(int64_t n, F f) {
  for (int64_t o = 0; o < n; o += kVectorChunk) f(o, std::min(kVectorChunk, n - o));
}

// A unary op's derivative on a GPU (see cuda::UnaryGrad).
struct GpuGrad {
  cuda::UnaryGrad grad;
  double p0 = 0, p1 = 0;
};

// The backward of a unary op in one pass, dx = g * deriv(s), where s is the
// tensor the derivative is cheapest from (the input or the output). On the
// CPU through a block function: deriv(g, s, dx, n) for a contiguous run.
template <typename D>
Tensor chain_block(const Tensor& g, const Tensor& s, const char* op, int64_t cost, GpuGrad gpu,
                   D deriv) {
  FORGE_CHECK(g.shape() == s.shape() && g.dtype() == s.dtype() && g.device() == s.device(),
              "{} backward: gradient {} {} on {} does not match the saved {} {} on {}", op,
              shape_str(g.shape()), dtype_name(g.dtype()), g.device().str(), shape_str(s.shape()),
              dtype_name(s.dtype()), s.device().str());
  Tensor dx = Tensor::empty(g.shape(), g.dtype(), g.device());
  FORGE_IF_CUDA(g) {
    cuda::unary_backward(gpu.grad, gpu.p0, gpu.p1, g.dtype(), g.raw_device_data(),
                         s.raw_device_data(), dx.raw_device_data(), g.numel(), g.device().index);
    return dx;
  }
  FORGE_DISPATCH_FLOAT(g.dtype(), op, [&] {
    const scalar_t* pg = g.data<scalar_t>();
    const scalar_t* ps = s.data<scalar_t>();
    scalar_t* pd = dx.data<scalar_t>();
    parallel_for(g.numel(), cost, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; o += kBlockRun)
        deriv(pg + o, ps + o, pd + o, std::min(kBlockRun, end - o));
    });
  });
  return dx;
}

// Records y = op(x) when x needs grad, with the backward `chain_block(g, saved, deriv)`.
template <typename D>
Tensor record_unary_block(const char* op, const Tensor& x, const Tensor& y, const Tensor& saved,
                          int64_t cost, GpuGrad gpu, D deriv) {
  if (!autograd::needs_grad({x})) return y;
  return autograd::record(op, {x}, y,
                          [op, cost, gpu, deriv, s = saved.detach()](const std::vector<Tensor>& g) {
                            return std::vector<Tensor>{chain_block(g[0], s, op, cost, gpu, deriv)};
                          });
}

// The same with a per-element derivative: dx[i] = g[i] * deriv(s[i]).
template <typename D>
Tensor record_unary(const char* op, const Tensor& x, const Tensor& y, const Tensor& saved,
                    int64_t cost, GpuGrad gpu, D deriv) {
  return record_unary_block(op, x, y, saved, cost, gpu,
                            [deriv]<typename T>(const T* g, const T* s, T* dx, int64_t n) {
                              for (int64_t i = 0; i < n; ++i) dx[i] = g[i] * deriv(s[i]);
                            });
}

}  // namespace

// ---- tensor-scalar ops ----

Tensor add(const Tensor& a, double s) {
  Tensor out = map(a, "add", kCheap, {cuda::UnaryOp::add_scalar, s},
                   [s]<typename T>(T x) -> T { return x + static_cast<T>(s); });
  if (!autograd::needs_grad({a})) return out;
  return autograd::record("add_scalar", {a}, out,
                          [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
}

Tensor mul(const Tensor& a, double s) {
  Tensor out = map(a, "mul", kCheap, {cuda::UnaryOp::mul_scalar, s},
                   [s]<typename T>(T x) -> T { return x * static_cast<T>(s); });
  if (!autograd::needs_grad({a})) return out;
  return autograd::record("mul_scalar", {a}, out, [s](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{mul(g[0], s)};
  });
}

// ---- unary ops ----

Tensor neg(const Tensor& x) {
  Tensor y = map(x, "neg", kCheap, {cuda::UnaryOp::neg}, []<typename T>(T v) -> T { return -v; });
  if (!autograd::needs_grad({x})) return y;
  return autograd::record(
      "neg", {x}, y, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{neg(g[0])}; });
}

Tensor exp(const Tensor& x) {
  Tensor y = map_block(x, "exp", kVectorMath, {cuda::UnaryOp::exp},
                       []<typename T>(const T* v, T* y, int64_t n) { vmath::exp(v, y, n); });
  return record_unary("exp", x, y, y, kCheap, {cuda::UnaryGrad::exp_of_y},
                      []<typename T>(T e) -> T { return e; });
}

Tensor log(const Tensor& x) {
  Tensor y = map_block(x, "log", kVectorMath, {cuda::UnaryOp::log},
                       []<typename T>(const T* v, T* y, int64_t n) { vmath::log(v, y, n); });
  return record_unary("log", x, y, x, kCheap, {cuda::UnaryGrad::log},
                      []<typename T>(T v) -> T { return T(1) / v; });
}

Tensor sqrt(const Tensor& x) {
  Tensor y = map(x, "sqrt", kCheap, {cuda::UnaryOp::sqrt},
                 []<typename T>(T v) -> T { return std::sqrt(v); });
  // d sqrt(x)/dx = 1 / (2 sqrt(x)), from the output.
  return record_unary("sqrt", x, y, y, kCheap, {cuda::UnaryGrad::sqrt_of_y},
                      []<typename T>(T r) -> T { return T(0.5) / r; });
}

Tensor rsqrt(const Tensor& x) {
  Tensor y = map(x, "rsqrt", kCheap, {cuda::UnaryOp::rsqrt},
                 []<typename T>(T v) -> T { return T(1) / std::sqrt(v); });
  // d x^(-1/2)/dx = -x^(-3/2) / 2 = -y^3 / 2.
  return record_unary("rsqrt", x, y, y, kCheap, {cuda::UnaryGrad::rsqrt_of_y},
                      []<typename T>(T r) -> T { return T(-0.5) * r * r * r; });
}

Tensor pow(const Tensor& x, double exponent) {
  Tensor y = map(x, "pow", kPow, {cuda::UnaryOp::pow, exponent}, [exponent]<typename T>(T v) -> T {
    return std::pow(v, static_cast<T>(exponent));
  });
  // p * x^(p-1); exponent 0 is a constant, whose gradient is 0 even at x = 0.
  return record_unary("pow", x, y, x, kPow, {cuda::UnaryGrad::pow, exponent, exponent - 1},
                      [exponent]<typename T>(T v) -> T {
                        return exponent == 0 ? T(0)
                                             : static_cast<T>(exponent) *
                                                   std::pow(v, static_cast<T>(exponent - 1));
                      });
}

Tensor abs(const Tensor& x) {
  Tensor y =
      map(x, "abs", kCheap, {cuda::UnaryOp::abs}, []<typename T>(T v) -> T { return std::abs(v); });
  return record_unary("abs", x, y, x, kCheap, {cuda::UnaryGrad::abs}, []<typename T>(T v) -> T {
    return v > T(0) ? T(1) : (v < T(0) ? T(-1) : T(0));
  });
}

Tensor square(const Tensor& x) {
  Tensor y =
      map(x, "square", kCheap, {cuda::UnaryOp::square}, []<typename T>(T v) -> T { return v * v; });
  return record_unary("square", x, y, x, kCheap, {cuda::UnaryGrad::square},
                      []<typename T>(T v) -> T { return T(2) * v; });
}

Tensor clamp(const Tensor& x, double lo, double hi) {
  FORGE_CHECK(!(lo > hi), "clamp: lo ({}) must not exceed hi ({})", lo, hi);
  Tensor y =
      map(x, "clamp", kCheap, {cuda::UnaryOp::clamp, lo, hi}, [lo, hi]<typename T>(T v) -> T {
        return std::min(std::max(v, static_cast<T>(lo)), static_cast<T>(hi));
      });
  return record_unary("clamp", x, y, x, kCheap, {cuda::UnaryGrad::clamp, lo, hi},
                      [lo, hi]<typename T>(T v) -> T {
                        return v >= static_cast<T>(lo) && v <= static_cast<T>(hi) ? T(1) : T(0);
                      });
}

Tensor relu(const Tensor& x) {
  Tensor y = map(x, "relu", kCheap, {cuda::UnaryOp::relu},
                 []<typename T>(T v) -> T { return v > T(0) ? v : T(0); });
  return record_unary("relu", x, y, x, kCheap, {cuda::UnaryGrad::relu},
                      []<typename T>(T v) -> T { return v > T(0) ? T(1) : T(0); });
}

namespace {

using namespace gelu_constants;

// The CPU kernels of the smooth activations, over contiguous runs (map_block
// and chain_block), with their transcendental parts in core/vmath.h's vectors.
// Scratch lives on the stack in runs of kVectorChunk.

// y = Phi(x) = (1 + erf(x / sqrt 2)) / 2, as PyTorch computes it. erf is
// 2x faster than erfc here (glibc's vectors), and Phi's far negative tail,
// where 1 + erf cancels (below 1e-6 in f32), is far below the outputs' scale.
template <typename T>
void normal_cdf(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * T(kInvSqrt2);
  vmath::erf(y, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = T(0.5) * (T(1) + y[i]);
}

// y = sigmoid(x) from exp(-|x|): no overflow at either end.
template <typename T>
void sigmoid_of(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = -std::abs(x[i]);
  vmath::exp(y, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] >= T(0) ? T(1) : y[i]) / (T(1) + y[i]);
}

// y = tanh(sqrt(2/pi) (x + 0.044715 x^3)), the tanh approximation's inner tanh.
template <typename T>
void gelu_tanh_inner(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = T(kSqrt2OverPi) * (x[i] + T(kGeluCubic) * x[i] * x[i] * x[i]);
  vmath::tanh(y, y, n);
}

}  // namespace

Tensor gelu(const Tensor& x, GeluApprox approx) {
  if (approx == GeluApprox::tanh) {
    // 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3);
    // dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
    Tensor y = map_block(x, "gelu", kVectorMath, {cuda::UnaryOp::gelu_tanh},
                         []<typename T>(const T* v, T* y, int64_t n) {
                           gelu_tanh_inner(v, y, n);
                           for (int64_t i = 0; i < n; ++i) y[i] = T(0.5) * v[i] * (T(1) + y[i]);
                         });
    return record_unary_block(
        "gelu_tanh", x, y, x, kVectorMath, {cuda::UnaryGrad::gelu_tanh},
        []<typename T>(const T* g, const T* v, T* dx, int64_t n) {
          gelu_tanh_inner(v, dx, n);
          for (int64_t i = 0; i < n; ++i) {
            const T t = dx[i];
            dx[i] = g[i] * (T(0.5) * (T(1) + t) + T(0.5) * v[i] * (T(1) - t * t) * T(kSqrt2OverPi) *
                                                      (T(1) + T(3 * kGeluCubic) * v[i] * v[i]));
          }
        });
  }
  // x Phi(x); dy/dx = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
  Tensor y = map_block(x, "gelu", kVectorMath, {cuda::UnaryOp::gelu},
                       []<typename T>(const T* v, T* y, int64_t n) {
                         normal_cdf(v, y, n);
                         for (int64_t i = 0; i < n; ++i) y[i] *= v[i];
                       });
  return record_unary_block("gelu", x, y, x, 2 * kVectorMath, {cuda::UnaryGrad::gelu},
                            []<typename T>(const T* g, const T* v, T* dx, int64_t n) {
                              for_chunks(n, [&](int64_t o, int64_t m) {
                                T pdf[kVectorChunk] = {};
                                for (int64_t i = 0; i < m; ++i)
                                  pdf[i] = T(-0.5) * v[o + i] * v[o + i];
                                vmath::exp(pdf, pdf, m);
                                normal_cdf(v + o, dx + o, m);
                                for (int64_t i = 0; i < m; ++i)
                                  dx[o + i] =
                                      g[o + i] * (dx[o + i] + v[o + i] * T(kInvSqrt2Pi) * pdf[i]);
                              });
                            });
}

Tensor elu(const Tensor& x, double alpha) {
  // x > 0 ? x : alpha (e^x - 1); dy/dx = x > 0 ? 1 : alpha e^x.
  Tensor y = map_block(x, "elu", kVectorMath, {cuda::UnaryOp::elu, alpha},
                       [alpha]<typename T>(const T* v, T* y, int64_t n) {
                         vmath::expm1(v, y, n);
                         for (int64_t i = 0; i < n; ++i)
                           y[i] = v[i] > T(0) ? v[i] : static_cast<T>(alpha) * y[i];
                       });
  return record_unary_block("elu", x, y, x, kVectorMath, {cuda::UnaryGrad::elu, alpha},
                            [alpha]<typename T>(const T* g, const T* v, T* dx, int64_t n) {
                              vmath::exp(v, dx, n);
                              for (int64_t i = 0; i < n; ++i)
                                dx[i] = g[i] * (v[i] > T(0) ? T(1) : static_cast<T>(alpha) * dx[i]);
                            });
}

Tensor silu(const Tensor& x) {
  Tensor y = map_block(x, "silu", kVectorMath, {cuda::UnaryOp::silu},
                       []<typename T>(const T* v, T* y, int64_t n) {
                         sigmoid_of(v, y, n);
                         for (int64_t i = 0; i < n; ++i) y[i] *= v[i];
                       });
  // d(x s)/dx = s + x s (1 - s) with s = sigmoid(x).
  return record_unary_block("silu", x, y, x, kVectorMath, {cuda::UnaryGrad::silu},
                            []<typename T>(const T* g, const T* v, T* dx, int64_t n) {
                              sigmoid_of(v, dx, n);
                              for (int64_t i = 0; i < n; ++i)
                                dx[i] = g[i] * (dx[i] * (T(1) + v[i] * (T(1) - dx[i])));
                            });
}

Tensor sigmoid(const Tensor& x) {
  Tensor y = map_block(x, "sigmoid", kVectorMath, {cuda::UnaryOp::sigmoid},
                       []<typename T>(const T* v, T* y, int64_t n) { sigmoid_of(v, y, n); });
  return record_unary("sigmoid", x, y, y, kCheap, {cuda::UnaryGrad::sigmoid_of_y},
                      []<typename T>(T s) -> T { return s * (T(1) - s); });
}

Tensor tanh(const Tensor& x) {
  Tensor y = map_block(x, "tanh", kVectorMath, {cuda::UnaryOp::tanh},
                       []<typename T>(const T* v, T* y, int64_t n) { vmath::tanh(v, y, n); });
  return record_unary("tanh", x, y, y, kCheap, {cuda::UnaryGrad::tanh_of_y},
                      []<typename T>(T t) -> T { return T(1) - t * t; });
}

}  // namespace forge::ops
