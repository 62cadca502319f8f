// Reductions (sum, mean, max, logsumexp) and cumsum on the CPU, forward and
// backward side by side. Every reduction runs on x seen as (outer, R, inner):
// output element (o, i) reduces x[o, :, i]. When the reduced dims are adjacent
// (ignoring size-1 dims) that view is free; otherwise x is first copied with
// the kept dims in front and the reduced dims at the end, so inner == 1, and
// the backward copies its gradient back the same way. Sums accumulate in double.
// CUDA tensors take the same plan to the kernels of reduce_cuda.cu (f32, f64,
// bf16 and f16 there), with the permuting copy from layout_cuda.cu.
#include "ops/reduce/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/layout/layout.h"
#include "ops/reduce/reduce_cuda.h"

namespace forge::ops {

namespace {

// Columns of `inner` one task handles when inner > 1: the rows of a tile are
// contiguous, so the r-loop streams memory and the column loop vectorises.
constexpr int64_t kTile = 256;

void check_defined(const Tensor& x, const char* op) {
  FORGE_CHECK(x.defined(), "{}: expected a tensor, got an undefined one", op);
}

struct ReducePlan {
  Shape out_shape;            // the result's shape, keepdim applied
  Shape layout;               // x's shape, permuted as perm says
  std::vector<int64_t> perm;  // x's dims, kept then reduced; empty when the view is free
  int64_t outer = 1, R = 1, inner = 1;
};

// How reducing `dims` of x (with keepdim) maps onto the (outer, R, inner) loop.
ReducePlan make_plan(const Tensor& x, const Dims& dims, bool keepdim, const char* op) {
  const Shape& shape = x.shape();
  const int64_t nd = x.dim();
  std::vector<bool> reduced(static_cast<size_t>(nd), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, nd, op);
    if (nd == 0) continue;  // a scalar reduces to itself over dim 0 or -1
    FORGE_CHECK(!reduced[static_cast<size_t>(w)], "{}: dim {} appears more than once in dims {}",
                op, w, fmt::join(dims, ", "));
    reduced[static_cast<size_t>(w)] = true;
  }
  ReducePlan plan;
  plan.layout = shape;
  for (int64_t d = 0; d < nd; ++d) {
    if (!reduced[static_cast<size_t>(d)]) {
      plan.out_shape.push_back(shape[static_cast<size_t>(d)]);
    } else if (keepdim) {
      plan.out_shape.push_back(1);
    }
  }
  // Size-1 dims may sit on either side, so only the reduced dims of size > 1
  // decide whether the reduced block is contiguous.
  auto big = [&](int64_t d) { return shape[static_cast<size_t>(d)] != 1; };
  int64_t first = -1, last = -1;
  for (int64_t d = 0; d < nd; ++d) {
    if (reduced[static_cast<size_t>(d)] && big(d)) {
      if (first < 0) first = d;
      last = d;
    }
  }
  if (first < 0) {
    plan.outer = x.numel();
    return plan;
  }
  bool contiguous = true;
  for (int64_t d = first; d <= last; ++d) contiguous &= reduced[static_cast<size_t>(d)] || !big(d);
  if (contiguous) {
    for (int64_t d = 0; d < nd; ++d) {
      const int64_t s = shape[static_cast<size_t>(d)];
      (d < first ? plan.outer : d <= last ? plan.R : plan.inner) *= s;
    }
    return plan;
  }
  for (int64_t d = 0; d < nd; ++d) {
    if (!reduced[static_cast<size_t>(d)]) plan.perm.push_back(d);
  }
  for (int64_t d = 0; d < nd; ++d) {
    if (reduced[static_cast<size_t>(d)]) plan.perm.push_back(d);
  }
  for (size_t k = 0; k < plan.perm.size(); ++k) {
    const int64_t d = plan.perm[k];
    plan.layout[k] = shape[static_cast<size_t>(d)];
    (reduced[static_cast<size_t>(d)] ? plan.R : plan.outer) *= shape[static_cast<size_t>(d)];
  }
  return plan;
}

// A contiguous copy of src with its dims reordered: out dim k is src dim perm[k].
Tensor permute_copy(const Tensor& src, const std::vector<int64_t>& perm) {
  const Shape& in_shape = src.shape();
  const size_t nd = in_shape.size();
  Shape out_shape(nd);
  std::vector<int64_t> in_stride(nd, 1), stride(nd);  // stride[k]: src stride of out dim k
  for (size_t d = nd - 1; d > 0; --d) in_stride[d - 1] = in_stride[d] * in_shape[d];
  for (size_t k = 0; k < nd; ++k) {
    out_shape[k] = in_shape[static_cast<size_t>(perm[k])];
    stride[k] = in_stride[static_cast<size_t>(perm[k])];
  }
  // On the GPU: the layout op's copy (no autograd: src is detached).
  FORGE_IF_CUDA(src) return permute(src.detach(), perm);
  Tensor out = Tensor::empty(out_shape, src.dtype(), src.device());
  const int64_t last = out_shape[nd - 1], rows = last == 0 ? 0 : out.numel() / last,
                last_stride = stride[nd - 1];
  FORGE_DISPATCH_FLOAT(src.dtype(), "permute_copy", [&] {
    const scalar_t* s = src.data<scalar_t>();
    scalar_t* o = out.data<scalar_t>();
    parallel_for(rows, last, [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        int64_t base = 0, rem = row;
        for (size_t k = nd - 1; k-- > 0;) {
          base += (rem % out_shape[k]) * stride[k];
          rem /= out_shape[k];
        }
        scalar_t* dst = o + row * last;
        for (int64_t j = 0; j < last; ++j) dst[j] = s[base + j * last_stride];
      }
    });
  });
  return out;
}

std::vector<int64_t> inverse(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t k = 0; k < perm.size(); ++k)
    inv[static_cast<size_t>(perm[k])] = static_cast<int64_t>(k);
  return inv;
}

// x in the (outer, R, inner) layout the plan reduces.
Tensor plan_input(const Tensor& x, const ReducePlan& plan) {
  return plan.perm.empty() ? x : permute_copy(x, plan.perm);
}

// A gradient computed in the plan's layout, returned to x's shape.
Tensor plan_grad(const Tensor& g_layout, const ReducePlan& plan) {
  return plan.perm.empty() ? g_layout : permute_copy(g_layout, inverse(plan.perm));
}

// Calls row(o) for each outer row when inner == 1, else tile(o, i0, i1) for
// each block of at most kTile columns; in parallel either way.
template <typename Row, typename Tile>
void for_each_group(int64_t outer, int64_t R, int64_t inner, Row&& row, Tile&& tile) {
  if (inner == 1) {
    parallel_for(outer, R, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) row(o);
    });
    return;
  }
  const int64_t tiles = (inner + kTile - 1) / kTile;
  parallel_for(outer * tiles, R * std::min(inner, kTile), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / tiles, i0 = (t % tiles) * kTile;
      tile(o, i0, std::min(i0 + kTile, inner));
    }
  });
}

// ---- sum and mean: y[o, i] = scale * sum_r x[o, r, i] ----

template <typename T>
void sum_forward(const T* x, T* y, int64_t outer, int64_t R, int64_t inner, double scale) {
  for_each_group(
      outer, R, inner,
      [&](int64_t o) {
        const T* xr = x + o * R;
        double acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t r = 0; r < R; ++r) acc += static_cast<double>(xr[r]);
        y[o] = static_cast<T>(acc * scale);
      },
      [&](int64_t o, int64_t i0, int64_t i1) {
        double acc[kTile] = {};
        const int64_t w = i1 - i0;
        for (int64_t r = 0; r < R; ++r) {
          const T* xr = x + (o * R + r) * inner + i0;
          for (int64_t j = 0; j < w; ++j) acc[j] += static_cast<double>(xr[j]);
        }
        for (int64_t j = 0; j < w; ++j) y[o * inner + i0 + j] = static_cast<T>(acc[j] * scale);
      });
}

// In the forward each x[o, r, i] added scale times itself into y[o, i], so
// now each receives scale * g[o, i].
template <typename T>
void sum_backward(const T* g, T* gx, int64_t outer, int64_t R, int64_t inner, double scale) {
  for_each_group(
      outer, R, inner,
      [&](int64_t o) {
        const T v = static_cast<T>(g[o] * scale);
        for (int64_t r = 0; r < R; ++r) gx[o * R + r] = v;
      },
      [&](int64_t o, int64_t i0, int64_t i1) {
        const T s = static_cast<T>(scale);
        for (int64_t r = 0; r < R; ++r) {
          T* dst = gx + (o * R + r) * inner;
          for (int64_t i = i0; i < i1; ++i) dst[i] = g[o * inner + i] * s;
        }
      });
}

// y = scale * each group's sum of xs (in the plan's layout), on xs's device.
void run_sum(const Tensor& xs, const Tensor& y, const ReducePlan& plan, double scale,
             const char* op) {
  FORGE_IF_CUDA(xs) {
    return cuda::reduce_sum(xs.dtype(), xs.device().index, xs.raw_device_data(),
                            y.raw_device_data(), plan.outer, plan.R, plan.inner, scale);
  }
  FORGE_DISPATCH_FLOAT(xs.dtype(), op, [&] {
    sum_forward(xs.data<scalar_t>(), y.data<scalar_t>(), plan.outer, plan.R, plan.inner, scale);
  });
}

void run_sum_backward(const Tensor& g, const Tensor& gl, const ReducePlan& plan, double scale) {
  FORGE_IF_CUDA(g) {
    return cuda::reduce_sum_backward(g.dtype(), g.device().index, g.raw_device_data(),
                                     gl.raw_device_data(), plan.outer, plan.R, plan.inner, scale);
  }
  FORGE_DISPATCH_FLOAT(g.dtype(), "sum backward", [&] {
    sum_backward(g.data<scalar_t>(), gl.data<scalar_t>(), plan.outer, plan.R, plan.inner, scale);
  });
}

Tensor sum_like(const Tensor& x, const Dims& dims, bool keepdim, bool is_mean) {
  const char* op = is_mean ? "mean" : "sum";
  check_defined(x, op);
  const ReducePlan plan = make_plan(x, dims, keepdim, op);
  const double scale = is_mean ? 1.0 / static_cast<double>(plan.R) : 1.0;
  const Tensor xs = plan_input(x, plan);
  Tensor y = Tensor::empty(plan.out_shape, x.dtype(), x.device());
  run_sum(xs, y, plan, scale, op);
  if (!autograd::needs_grad({x})) return y;
  return autograd::record(op, {x}, y, [plan, scale](const std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    Tensor gl = Tensor::empty(plan.layout, g.dtype(), g.device());
    run_sum_backward(g, gl, plan, scale);
    return std::vector<Tensor>{plan_grad(gl, plan)};
  });
}

// ---- max: y[o, i] = max_r x[o, r, i], at the first r that attains it ----

// True when v should replace the running maximum m: strictly greater, or the
// first NaN (NaN propagates, as in PyTorch).
template <typename T>
inline bool beats(T v, T m) {
  return v > m || (v != v && m == m);
}

template <typename T>
void max_forward(const T* x, T* y, int64_t* arg, int64_t outer, int64_t R, int64_t inner) {
  for_each_group(
      outer, R, inner,
      [&](int64_t o) {
        const T* xr = x + o * R;
        T m = xr[0];
        int64_t a = 0;
        for (int64_t r = 1; r < R; ++r) {
          if (beats(xr[r], m)) {
            m = xr[r];
            a = r;
          }
        }
        y[o] = m;
        if (arg) arg[o] = a;
      },
      [&](int64_t o, int64_t i0, int64_t i1) {
        T m[kTile];
        int64_t a[kTile] = {};
        const int64_t w = i1 - i0;
        const T* x0 = x + o * R * inner + i0;
        for (int64_t j = 0; j < w; ++j) m[j] = x0[j];
        for (int64_t r = 1; r < R; ++r) {
          const T* xr = x0 + r * inner;
          for (int64_t j = 0; j < w; ++j) {
            if (beats(xr[j], m[j])) {
              m[j] = xr[j];
              a[j] = r;
            }
          }
        }
        for (int64_t j = 0; j < w; ++j) {
          y[o * inner + i0 + j] = m[j];
          if (arg) arg[o * inner + i0 + j] = a[j];
        }
      });
}

// In the forward y[o, i] was x[o, arg[o, i], i], so the gradient goes there
// and nowhere else in the group.
template <typename T>
void max_backward(const T* g, const int64_t* arg, T* gx, int64_t outer, int64_t R, int64_t inner) {
  std::fill(gx, gx + outer * R * inner, T(0));
  parallel_for(outer * inner, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t o = k / inner, i = k % inner;
      gx[(o * R + arg[k]) * inner + i] = g[k];
    }
  });
}

// y = each group's maximum of xs, arg (when defined) its first position.
void run_max(const Tensor& xs, const Tensor& y, const Tensor& arg, const ReducePlan& plan) {
  int64_t* a = nullptr;
  FORGE_IF_CUDA(xs) {
    if (arg.defined()) a = static_cast<int64_t*>(arg.raw_device_data());
    return cuda::reduce_max(xs.dtype(), xs.device().index, xs.raw_device_data(),
                            y.raw_device_data(), a, plan.outer, plan.R, plan.inner);
  }
  if (arg.defined()) a = arg.data<int64_t>();
  FORGE_DISPATCH_FLOAT(xs.dtype(), "max", [&] {
    max_forward(xs.data<scalar_t>(), y.data<scalar_t>(), a, plan.outer, plan.R, plan.inner);
  });
}

void run_max_backward(const Tensor& g, const Tensor& arg, const Tensor& gl,
                      const ReducePlan& plan) {
  FORGE_IF_CUDA(g) {
    return cuda::reduce_max_backward(g.dtype(), g.device().index, g.raw_device_data(),
                                     static_cast<const int64_t*>(arg.raw_device_data()),
                                     gl.raw_device_data(), plan.outer, plan.R, plan.inner);
  }
  FORGE_DISPATCH_FLOAT(g.dtype(), "max backward", [&] {
    max_backward(g.data<scalar_t>(), arg.data<int64_t>(), gl.data<scalar_t>(), plan.outer, plan.R,
                 plan.inner);
  });
}

// ---- logsumexp: y[o, i] = m + log(sum_r exp(x[o, r, i] - m)), m the group max ----

// The shift that keeps exp from overflowing: the max when finite. An infinite
// max gives the right answer unshifted (+inf, or -inf when every element is).
template <typename T>
inline double lse_shift(T m) {
  return std::isfinite(m) ? static_cast<double>(m) : 0.0;
}

template <typename T>
void logsumexp_forward(const T* x, T* y, int64_t outer, int64_t R, int64_t inner) {
  for_each_group(
      outer, R, inner,
      [&](int64_t o) {
        const T* xr = x + o * R;
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t r = 0; r < R; ++r) m = xr[r] > m ? xr[r] : m;
        const T shift = static_cast<T>(lse_shift(m));
        double acc = 0;
        for (int64_t r = 0; r < R; ++r) acc += static_cast<double>(std::exp(xr[r] - shift));
        y[o] = static_cast<T>(static_cast<double>(shift) + std::log(acc));
      },
      [&](int64_t o, int64_t i0, int64_t i1) {
        T m[kTile];
        double acc[kTile] = {};
        const int64_t w = i1 - i0;
        const T* x0 = x + o * R * inner + i0;
        for (int64_t j = 0; j < w; ++j) m[j] = -std::numeric_limits<T>::infinity();
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t j = 0; j < w; ++j)
            m[j] = x0[r * inner + j] > m[j] ? x0[r * inner + j] : m[j];
        }
        for (int64_t j = 0; j < w; ++j) m[j] = static_cast<T>(lse_shift(m[j]));
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t j = 0; j < w; ++j)
            acc[j] += static_cast<double>(std::exp(x0[r * inner + j] - m[j]));
        }
        for (int64_t j = 0; j < w; ++j) {
          y[o * inner + i0 + j] = static_cast<T>(static_cast<double>(m[j]) + std::log(acc[j]));
        }
      });
}

// d y[o, i] / d x[o, r, i] = exp(x[o, r, i] - y[o, i]): the softmax of the group.
template <typename T>
void logsumexp_backward(const T* x, const T* y, const T* g, T* gx, int64_t outer, int64_t R,
                        int64_t inner) {
  for_each_group(
      outer, R, inner,
      [&](int64_t o) {
        const T* xr = x + o * R;
        T* dst = gx + o * R;
        for (int64_t r = 0; r < R; ++r) dst[r] = g[o] * std::exp(xr[r] - y[o]);
      },
      [&](int64_t o, int64_t i0, int64_t i1) {
        const T* yo = y + o * inner;
        const T* go = g + o * inner;
        for (int64_t r = 0; r < R; ++r) {
          const T* xr = x + (o * R + r) * inner;
          T* dst = gx + (o * R + r) * inner;
          for (int64_t i = i0; i < i1; ++i) dst[i] = go[i] * std::exp(xr[i] - yo[i]);
        }
      });
}

void run_logsumexp(const Tensor& xs, const Tensor& y, const ReducePlan& plan) {
  FORGE_IF_CUDA(xs) {
    return cuda::logsumexp(xs.dtype(), xs.device().index, xs.raw_device_data(), y.raw_device_data(),
                           plan.outer, plan.R, plan.inner);
  }
  FORGE_DISPATCH_FLOAT(xs.dtype(), "logsumexp", [&] {
    logsumexp_forward(xs.data<scalar_t>(), y.data<scalar_t>(), plan.outer, plan.R, plan.inner);
  });
}

void run_logsumexp_backward(const Tensor& xs, const Tensor& y, const Tensor& g, const Tensor& gl,
                            const ReducePlan& plan) {
  FORGE_IF_CUDA(g) {
    return cuda::logsumexp_backward(g.dtype(), g.device().index, xs.raw_device_data(),
                                    y.raw_device_data(), g.raw_device_data(), gl.raw_device_data(),
                                    plan.outer, plan.R, plan.inner);
  }
  FORGE_DISPATCH_FLOAT(g.dtype(), "logsumexp backward", [&] {
    logsumexp_backward(xs.data<scalar_t>(), y.data<scalar_t>(), g.data<scalar_t>(),
                       gl.data<scalar_t>(), plan.outer, plan.R, plan.inner);
  });
}

// ---- cumsum along one dim, x as (outer, R, inner); reverse = suffix sums ----

template <typename T>
void cumsum_kernel(const T* x, T* y, int64_t outer, int64_t R, int64_t inner, bool reverse) {
  auto at = [&](int64_t k) { return reverse ? R - 1 - k : k; };
  for_each_group(
      outer, R, inner,
      [&](int64_t o) {
        double acc = 0;
        for (int64_t k = 0; k < R; ++k) {
          const int64_t r = o * R + at(k);
          acc += static_cast<double>(x[r]);
          y[r] = static_cast<T>(acc);
        }
      },
      [&](int64_t o, int64_t i0, int64_t i1) {
        double acc[kTile] = {};
        const int64_t w = i1 - i0;
        for (int64_t k = 0; k < R; ++k) {
          const int64_t base = (o * R + at(k)) * inner + i0;
          for (int64_t j = 0; j < w; ++j) {
            acc[j] += static_cast<double>(x[base + j]);
            y[base + j] = static_cast<T>(acc[j]);
          }
        }
      });
}

// y = the prefix sums of x along the middle of (outer, R, inner), suffix sums when reverse.
void run_cumsum(const Tensor& x, const Tensor& y, int64_t outer, int64_t R, int64_t inner,
                bool reverse, const char* op) {
  FORGE_IF_CUDA(x) {
    return cuda::cumsum(x.dtype(), x.device().index, x.raw_device_data(), y.raw_device_data(),
                        outer, R, inner, reverse);
  }
  FORGE_DISPATCH_FLOAT(x.dtype(), op, [&] {
    cumsum_kernel(x.data<scalar_t>(), y.data<scalar_t>(), outer, R, inner, reverse);
  });
}

}  // namespace

Tensor sum(const Tensor& x, const Dims& dims, bool keepdim) {
  return sum_like(x, dims, keepdim, false);
}

Tensor mean(const Tensor& x, const Dims& dims, bool keepdim) {
  return sum_like(x, dims, keepdim, true);
}

Tensor max(const Tensor& x, const Dims& dims, bool keepdim) {
  check_defined(x, "max");
  const ReducePlan plan = make_plan(x, dims, keepdim, "max");
  FORGE_CHECK(plan.R > 0 || plan.outer * plan.inner == 0,
              "max: cannot reduce over an empty group (x has shape {}, dims {}); the maximum of "
              "nothing is undefined",
              shape_str(x.shape()), fmt::join(dims, ", "));
  const Tensor xs = plan_input(x, plan);
  Tensor y = Tensor::empty(plan.out_shape, x.dtype(), x.device());
  const bool grad = autograd::needs_grad({x});
  Tensor arg = grad ? Tensor::empty(plan.out_shape, DType::i64, x.device()) : Tensor();
  run_max(xs, y, arg, plan);
  if (!grad) return y;
  return autograd::record("max", {x}, y, [plan, arg](const std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    Tensor gl = Tensor::empty(plan.layout, g.dtype(), g.device());
    run_max_backward(g, arg, gl, plan);
    return std::vector<Tensor>{plan_grad(gl, plan)};
  });
}

Tensor logsumexp(const Tensor& x, const Dims& dims, bool keepdim) {
  check_defined(x, "logsumexp");
  const ReducePlan plan = make_plan(x, dims, keepdim, "logsumexp");
  const Tensor xs = plan_input(x, plan);
  Tensor y = Tensor::empty(plan.out_shape, x.dtype(), x.device());
  run_logsumexp(xs, y, plan);
  if (!autograd::needs_grad({x})) return y;
  return autograd::record(
      "logsumexp", {x}, y,
      [plan, xs = xs.detach(), ys = y.detach()](const std::vector<Tensor>& grads) {
        const Tensor& g = grads[0];
        Tensor gl = Tensor::empty(xs.shape(), g.dtype(), g.device());
        run_logsumexp_backward(xs, ys, g, gl, plan);
        return std::vector<Tensor>{plan_grad(gl, plan)};
      });
}

Tensor cumsum(const Tensor& x, int64_t dim) {
  check_defined(x, "cumsum");
  const int64_t d = wrap_dim(dim, x.dim(), "cumsum");
  int64_t outer = 1, R = 1, inner = 1;
  for (int64_t k = 0; k < x.dim(); ++k)
    (k < d ? outer : k == d ? R : inner) *= x.shape()[static_cast<size_t>(k)];
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  run_cumsum(x, y, outer, R, inner, false, "cumsum");
  if (!autograd::needs_grad({x})) return y;
  // y[r] summed x[0..r], so x[r] feeds every y[r'] with r' >= r: its gradient
  // is the suffix sum of g.
  return autograd::record("cumsum", {x}, y, [outer, R, inner](const std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    Tensor gx = Tensor::empty(g.shape(), g.dtype(), g.device());
    run_cumsum(g, gx, outer, R, inner, true, "cumsum backward");
    return std::vector<Tensor>{gx};
  });
}

}  // namespace forge::ops
