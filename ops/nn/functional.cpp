// softmax, log_softmax, layer_norm, dropout, cross_entropy and mse_loss: each
// a fused forward kernel and, next to it, the fused backward that retraces it.
// On the CPU row statistics (max, sums, mean, variance) accumulate in double;
// CUDA tensors go to the kernels of functional_cuda.cu (statistics in f32 for
// f32 / bf16 / f16, f64 for f64).
#include "ops/nn/functional.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "core/vmath.h"
#include "ops/nn/functional_cuda.h"

namespace forge::ops {

namespace {

// Columns one task handles when the reduced dim is not the last one: each of
// its rows is contiguous, so the loop over the dim streams memory.
constexpr int64_t kTile = 256;

void check_defined(const Tensor& x, const char* op, const char* what) {
  FORGE_CHECK(x.defined(), "{}: expected a tensor for {}, got an undefined one", op, what);
}

// `t` (named `what`) must be on the device of `x` (named `x_what`).
void check_device(const Tensor& t, const char* what, const Tensor& x, const char* x_what,
                  const char* op) {
  FORGE_CHECK(t.device() == x.device(),
              "{}: {} is on {} but {} is on {}; all tensors must be on one device", op, what,
              t.device().str(), x_what, x.device().str());
}

// The dtype of saved row statistics (layer_norm's mean and rstd,
// cross_entropy's logsumexp): x's on the CPU, the kernels' accumulation type
// on a GPU (f32 for f32 / bf16 / f16, f64 for f64).
DType stats_dtype(const Tensor& x) {
  return x.device().is_cuda() && x.dtype() != DType::f64 ? DType::f32 : x.dtype();
}

// x seen as (outer, C, inner) around dim `dim`.
struct Around {
  int64_t outer = 1, C = 1, inner = 1;
};

Around around(const Tensor& x, int64_t dim, const char* op) {
  const int64_t d = wrap_dim(dim, x.dim(), op);
  Around a;
  for (int64_t k = 0; k < x.dim(); ++k)
    (k < d ? a.outer : k == d ? a.C : a.inner) *= x.shape()[static_cast<size_t>(k)];
  return a;
}

// Calls row(o) for each outer row when inner == 1, else tile(o, i0, i1) for
// each block of at most kTile columns; in parallel either way.
template <typename Row, typename Tile>
void for_each_group(const Around& a, int64_t cost, Row&& row, Tile&& tile) {
  if (a.inner == 1) {
    parallel_for(a.outer, cost * a.C, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) row(o);
    });
    return;
  }
  const int64_t tiles = (a.inner + kTile - 1) / kTile;
  parallel_for(a.outer * tiles, cost * a.C * std::min(a.inner, kTile), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / tiles, i0 = (t % tiles) * kTile;
      tile(o, i0, std::min(i0 + kTile, a.inner));
    }
  });
}

// ---- softmax and log_softmax along a dim, x as (outer, C, inner) ----
// y = exp(x - m) / s, or log y = x - m - log s, with m the max over C and
// s = sum exp(x - m); subtracting m keeps exp from overflowing.

template <typename T>
void softmax_forward(const T* x, T* y, const Around& a, bool log) {
  const int64_t C = a.C, inner = a.inner;
  for_each_group(
      a, 8,
      [&](int64_t o) {
        const T* xr = x + o * C;
        T* yr = y + o * C;
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t c = 0; c < C; ++c) m = xr[c] > m ? xr[c] : m;
        // exp(x - m) over the row in glibc's vector math (core/vmath.h), into y.
        for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] - m;
        vmath::exp(yr, yr, C);
        double s = 0;
        for (int64_t c = 0; c < C; ++c) s += static_cast<double>(yr[c]);
        if (log) {
          const T shift = static_cast<T>(static_cast<double>(m) + std::log(s));
          for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] - shift;
        } else {
          const T inv = static_cast<T>(1.0 / s);
          for (int64_t c = 0; c < C; ++c) yr[c] *= inv;
        }
      },
      [&](int64_t o, int64_t i0, int64_t i1) {
        T m[kTile];
        double s[kTile] = {};
        const int64_t w = i1 - i0;
        const T* x0 = x + o * C * inner + i0;
        T* y0 = y + o * C * inner + i0;
        for (int64_t j = 0; j < w; ++j) m[j] = -std::numeric_limits<T>::infinity();
        for (int64_t c = 0; c < C; ++c) {
          for (int64_t j = 0; j < w; ++j)
            m[j] = x0[c * inner + j] > m[j] ? x0[c * inner + j] : m[j];
        }
        for (int64_t c = 0; c < C; ++c) {
          for (int64_t j = 0; j < w; ++j)
            s[j] += static_cast<double>(std::exp(x0[c * inner + j] - m[j]));
        }
        for (int64_t j = 0; j < w; ++j) {
          // Reused as the per-column shift (log) or scale (softmax).
          m[j] = log ? static_cast<T>(static_cast<double>(m[j]) + std::log(s[j])) : m[j];
          s[j] = 1.0 / s[j];
        }
        for (int64_t c = 0; c < C; ++c) {
          for (int64_t j = 0; j < w; ++j) {
            const T v = x0[c * inner + j] - m[j];
            y0[c * inner + j] = log ? v : static_cast<T>(std::exp(v) * s[j]);
          }
        }
      });
}

// softmax: dx = y * (g - sum_c g y). log_softmax: dx = g - exp(y) * sum_c g.
template <typename T>
void softmax_backward(const T* y, const T* g, T* gx, const Around& a, bool log) {
  const int64_t C = a.C, inner = a.inner;
  for_each_group(
      a, 6,
      [&](int64_t o) {
        const T* yr = y + o * C;
        const T* gr = g + o * C;
        T* dst = gx + o * C;
        double dot = 0;
        for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(log ? gr[c] : gr[c] * yr[c]);
        const T d = static_cast<T>(dot);
        if (log) {
          vmath::exp(yr, dst, C);
          for (int64_t c = 0; c < C; ++c) dst[c] = gr[c] - dst[c] * d;
        } else {
          for (int64_t c = 0; c < C; ++c) dst[c] = yr[c] * (gr[c] - d);
        }
      },
      [&](int64_t o, int64_t i0, int64_t i1) {
        double dot[kTile] = {};
        const int64_t w = i1 - i0, base = o * C * inner + i0;
        for (int64_t c = 0; c < C; ++c) {
          const T* yr = y + base + c * inner;
          const T* gr = g + base + c * inner;
          for (int64_t j = 0; j < w; ++j)
            dot[j] += static_cast<double>(log ? gr[j] : gr[j] * yr[j]);
        }
        for (int64_t c = 0; c < C; ++c) {
          const T* yr = y + base + c * inner;
          const T* gr = g + base + c * inner;
          T* dst = gx + base + c * inner;
          for (int64_t j = 0; j < w; ++j) {
            const T d = static_cast<T>(dot[j]);
            dst[j] = log ? gr[j] - std::exp(yr[j]) * d : yr[j] * (gr[j] - d);
          }
        }
      });
}

Tensor softmax_op(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_defined(x, op, "x");
  const Around a = around(x, dim, op);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  FORGE_IF_CUDA(x) {
    cuda::softmax_forward(x.dtype(), x.device().index, x.raw_device_data(), y.raw_device_data(),
                          a.outer, a.C, a.inner, log);
  }
  if (x.device().is_cpu()) {
    FORGE_DISPATCH_FLOAT(x.dtype(), op,
                         [&] { softmax_forward(x.data<scalar_t>(), y.data<scalar_t>(), a, log); });
  }
  if (!autograd::needs_grad({x})) return y;
  return autograd::record(op, {x}, y, [a, log, ys = y.detach()](const std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    Tensor gx = Tensor::empty(g.shape(), g.dtype(), g.device());
    FORGE_IF_CUDA(g) {
      cuda::softmax_backward(g.dtype(), g.device().index, ys.raw_device_data(), g.raw_device_data(),
                             gx.raw_device_data(), a.outer, a.C, a.inner, log);
    }
    if (g.device().is_cpu()) {
      FORGE_DISPATCH_FLOAT(g.dtype(), "softmax backward", [&] {
        softmax_backward(ys.data<scalar_t>(), g.data<scalar_t>(), gx.data<scalar_t>(), a, log);
      });
    }
    return std::vector<Tensor>{gx};
  });
}

// ---- layer_norm: x as (rows, N), N the product of the normalised dims ----

template <typename T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows,
                        int64_t N, double eps) {
  parallel_for(rows, 6 * N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * N;
      T* yr = y + r * N;
      // The row's sums in vector lanes (omp simd), each lane in double.
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < N; ++j) s += static_cast<double>(xr[j]);
      const double mu = s / static_cast<double>(N);
      // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
      double v = 0;
#pragma omp simd reduction(+ : v)
      for (int64_t j = 0; j < N; ++j) {
        const double d = static_cast<double>(xr[j]) - mu;
        v += d * d;
      }
      const double rs = 1.0 / std::sqrt(v / static_cast<double>(N) + eps);
      const T m = static_cast<T>(mu), k = static_cast<T>(rs);
      for (int64_t j = 0; j < N; ++j) {
        const T n = (xr[j] - m) * k;
        yr[j] = (w ? n * w[j] : n) + (b ? b[j] : T(0));
      }
      mean[r] = m;
      rstd[r] = k;
    }
  });
}

// In the forward y = xhat * w + b with xhat = (x - mean) * rstd, so
// dxhat = g * w, and through the normalisation
// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat));
// dw = sum over rows of g * xhat, db = sum over rows of g.
template <typename T>
void layer_norm_backward(const T* x, const T* w, const T* mean, const T* rstd, const T* g, T* gx,
                         T* gw, T* gb, int64_t rows, int64_t N) {
  if (gx) {
    parallel_for(rows, 8 * N, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = x + r * N;
        const T* gr = g + r * N;
        T* dst = gx + r * N;
        const T m = mean[r], k = rstd[r];
        // dxhat into dst first, so that the sums below are plain vector
        // reductions (a conditional w[j] inside them became masked gathers).
        for (int64_t j = 0; j < N; ++j) dst[j] = w ? gr[j] * w[j] : gr[j];
        double s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
        for (int64_t j = 0; j < N; ++j) {
          s1 += static_cast<double>(dst[j]);
          s2 += static_cast<double>(dst[j] * (xr[j] - m) * k);
        }
        const T a = static_cast<T>(s1 / static_cast<double>(N)),
                c = static_cast<T>(s2 / static_cast<double>(N));
        for (int64_t j = 0; j < N; ++j) dst[j] = k * (dst[j] - a - (xr[j] - m) * k * c);
      }
    });
  }
  if (!gw && !gb) return;
  // dw and db reduce over rows. A task owns a block of columns of a block of
  // kRowBlock rows and writes its partial sums; the partials are added in
  // row-block order after. The blocks are fixed, so the sums do not depend on
  // the number of threads, and a narrow norm (N = 64) still uses every thread.
  constexpr int64_t kRowBlock = 512;
  const int64_t tiles = (N + kTile - 1) / kTile, blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<double> part(static_cast<size_t>(2 * blocks * N), 0.0);  // [blocks, N] dw, then db
  parallel_for(
      tiles * blocks, 4 * std::min(rows, kRowBlock) * std::min(N, kTile),
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t blk = t / tiles, j0 = (t % tiles) * kTile, w_ = std::min(kTile, N - j0);
          double sw[kTile] = {}, sb[kTile] = {};  // local, so the loop below vectorises
          for (int64_t r = blk * kRowBlock; r < std::min(rows, (blk + 1) * kRowBlock); ++r) {
            const T* xr = x + r * N + j0;
            const T* gr = g + r * N + j0;
            const T m = mean[r], k = rstd[r];
            for (int64_t j = 0; j < w_; ++j) {
              sw[j] += static_cast<double>(gr[j] * (xr[j] - m) * k);
              sb[j] += static_cast<double>(gr[j]);
            }
          }
          std::copy(sw, sw + w_, part.data() + blk * N + j0);
          std::copy(sb, sb + w_, part.data() + (blocks + blk) * N + j0);
        }
      });
  for (int64_t j = 0; j < N; ++j) {
    double sw = 0, sb = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      sw += part[static_cast<size_t>(blk * N + j)];
      sb += part[static_cast<size_t>((blocks + blk) * N + j)];
    }
    if (gw) gw[j] = static_cast<T>(sw);
    if (gb) gb[j] = static_cast<T>(sb);
  }
}

// ---- cross_entropy: logits as (rows, C), one target per row ----

// Per-row loss with label smoothing eps, from lse = logsumexp of the row:
// -log p[c] = lse - x[c], so loss = (1 - eps)(lse - x[t]) + eps (lse - mean_c x[c]).
template <typename T, typename I>
void cross_entropy_forward(const T* x, const I* target, T* lse, double* loss, int64_t rows,
                           int64_t C, double eps, int64_t ignore_index) {
  parallel_for(rows, 4 * C, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * C;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t c = 0; c < C; ++c) m = xr[c] > m ? xr[c] : m;
      double s = 0, sx = 0;
      for (int64_t c = 0; c < C; ++c) sx += static_cast<double>(xr[c]);
      // sum exp(x - m) in runs of a stack buffer, in glibc's vector math (core/vmath.h).
      constexpr int64_t kRun = 256;
      T e[kRun];
      for (int64_t c0 = 0; c0 < C; c0 += kRun) {
        const int64_t n = std::min(kRun, C - c0);
        for (int64_t c = 0; c < n; ++c) e[c] = xr[c0 + c] - m;
        vmath::exp(e, e, n);
        for (int64_t c = 0; c < n; ++c) s += static_cast<double>(e[c]);
      }
      const double l = static_cast<double>(m) + std::log(s);
      lse[r] = static_cast<T>(l);
      const int64_t t = static_cast<int64_t>(target[r]);
      loss[r] = t == ignore_index ? 0.0
                                  : (1.0 - eps) * (l - static_cast<double>(xr[t])) +
                                        eps * (l - sx / static_cast<double>(C));
    }
  });
}

// d loss_r / d x[c] = p[c] - (1 - eps) [c == t] - eps / C, scaled by the
// row's weight in the reduction (0 for ignored rows).
template <typename T, typename I>
void cross_entropy_backward(const T* x, const I* target, const T* lse, const T* g, T* gx,
                            int64_t rows, int64_t C, double eps, int64_t ignore_index,
                            Reduction reduction, double count) {
  parallel_for(rows, 4 * C, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * C;
      T* dst = gx + r * C;
      const int64_t t = static_cast<int64_t>(target[r]);
      if (t == ignore_index) {
        std::fill(dst, dst + C, T(0));
        continue;
      }
      const double wr = reduction == Reduction::none  ? static_cast<double>(g[r])
                        : reduction == Reduction::sum ? static_cast<double>(g[0])
                                                      : static_cast<double>(g[0]) / count;
      const T wt = static_cast<T>(wr), smooth = static_cast<T>(eps / static_cast<double>(C)),
              l = lse[r];
      for (int64_t c = 0; c < C; ++c) dst[c] = xr[c] - l;
      vmath::exp(dst, dst, C);
      for (int64_t c = 0; c < C; ++c) dst[c] = wt * (dst[c] - smooth);
      dst[t] -= static_cast<T>(wr * (1.0 - eps));
    }
  });
}

// ---- mse_loss ----

template <typename T>
double squared_error_sum(const T* x, const T* t, int64_t n) {
  double total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - static_cast<double>(t[i]);
    total += d * d;
  }
  return total;
}

// "[i, j]": the multi-index of flat position `flat` in `shape`.
std::string position_str(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = flat % shape[k];
    flat /= shape[k];
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}

// The error for class id t, out of range, at flat row `row` of the targets.
[[noreturn]] void fail_target(int64_t t, int64_t row, const Shape& lead, int64_t C,
                              int64_t ignore) {
  FORGE_FAIL(
      "cross_entropy: target {} at position {} is out of range for {} classes (expected 0..{}, or "
      "ignore_index {})",
      t, position_str(row, lead), C, C - 1, ignore);
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_op(x, dim, false);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_op(x, dim, true);
}

Tensor layer_norm(const Tensor& x, int64_t normalized_ndim, const Tensor& weight,
                  const Tensor& bias, double eps) {
  check_defined(x, "layer_norm", "x");
  FORGE_CHECK(normalized_ndim >= 1 && normalized_ndim <= x.dim(),
              "layer_norm: normalized_ndim must be in 1..{} for x of shape {}, got {}", x.dim(),
              shape_str(x.shape()), normalized_ndim);
  const Shape norm_shape(x.shape().end() - normalized_ndim, x.shape().end());
  for (const auto& [t, what] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!t->defined()) continue;
    check_device(*t, what, x, "x", "layer_norm");
    FORGE_CHECK(
        t->shape() == norm_shape,
        "layer_norm: {} must have the normalised shape {} (the last {} dims of x {}), got {}", what,
        shape_str(norm_shape), normalized_ndim, shape_str(x.shape()), shape_str(t->shape()));
    FORGE_CHECK(t->dtype() == x.dtype(), "layer_norm: {} must have x's dtype {}, got {}", what,
                dtype_name(x.dtype()), dtype_name(t->dtype()));
  }
  FORGE_CHECK(eps >= 0, "layer_norm: eps must be non-negative, got {}", eps);
  const int64_t N = shape_numel(norm_shape), rows = N == 0 ? 0 : x.numel() / N;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty({rows}, stats_dtype(x), x.device());
  Tensor rstd = Tensor::empty({rows}, stats_dtype(x), x.device());
  FORGE_IF_CUDA(x) {
    const auto ptr = [](const Tensor& t) { return t.defined() ? t.raw_device_data() : nullptr; };
    cuda::layer_norm_forward(x.dtype(), x.device().index, x.raw_device_data(), ptr(weight),
                             ptr(bias), y.raw_device_data(), mean.raw_device_data(),
                             rstd.raw_device_data(), rows, N, eps);
  }
  if (x.device().is_cpu()) {
    FORGE_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
      layer_norm_forward(x.data<scalar_t>(), weight.defined() ? weight.data<scalar_t>() : nullptr,
                         bias.defined() ? bias.data<scalar_t>() : nullptr, y.data<scalar_t>(),
                         mean.data<scalar_t>(), rstd.data<scalar_t>(), rows, N, eps);
    });
  }
  if (!autograd::needs_grad({x, weight, bias})) return y;
  const bool need_x = x.requires_grad(), need_w = weight.defined() && weight.requires_grad(),
             need_b = bias.defined() && bias.requires_grad();
  Tensor ws = weight.defined() ? weight.detach() : Tensor();
  return autograd::record(
      "layer_norm", {x, weight, bias}, y,
      [xs = x.detach(), ws, mean, rstd, norm_shape, rows, N, need_x, need_w,
       need_b](const std::vector<Tensor>& grads) {
        const Tensor& g = grads[0];
        Tensor gx = need_x ? Tensor::empty(xs.shape(), g.dtype(), g.device()) : Tensor();
        Tensor gw = need_w ? Tensor::empty(norm_shape, g.dtype(), g.device()) : Tensor();
        Tensor gb = need_b ? Tensor::empty(norm_shape, g.dtype(), g.device()) : Tensor();
        FORGE_IF_CUDA(g) {
          const auto ptr = [](const Tensor& t) {
            return t.defined() ? t.raw_device_data() : nullptr;
          };
          cuda::layer_norm_backward(g.dtype(), g.device().index, xs.raw_device_data(), ptr(ws),
                                    mean.raw_device_data(), rstd.raw_device_data(),
                                    g.raw_device_data(), ptr(gx), ptr(gw), ptr(gb), rows, N);
        }
        if (g.device().is_cpu()) {
          FORGE_DISPATCH_FLOAT(g.dtype(), "layer_norm backward", [&] {
            auto ptr = [](const Tensor& t) { return t.defined() ? t.data<scalar_t>() : nullptr; };
            layer_norm_backward<scalar_t>(xs.data<scalar_t>(), ptr(ws), mean.data<scalar_t>(),
                                          rstd.data<scalar_t>(), g.data<scalar_t>(), ptr(gx),
                                          ptr(gw), ptr(gb), rows, N);
          });
        }
        return std::vector<Tensor>{gx, gw, gb};
      });
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  check_defined(x, "dropout", "x");
  FORGE_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got {} (p = 1 would drop everything)",
              p);
  if (!training || p == 0) return x;
  Generator& g = gen ? *gen : default_generator();
  const int64_t n = x.numel();
  // x's leading dimension is the batch: under data parallelism this shard's
  // elements are draws [first, first + n) of the global batch's request.
  const RowDraws r = g.reserve_rows(static_cast<uint64_t>(n));
  Tensor mask = Tensor::empty(x.shape(), DType::u8, x.device());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const double scale = 1.0 / (1.0 - p);
  // The generator was advanced above on the host for either device, so the
  // state after the call and the mask are the same on both.
  FORGE_IF_CUDA(x) {
    cuda::dropout_forward(x.dtype(), x.device().index, x.raw_device_data(), y.raw_device_data(),
                          static_cast<uint8_t*>(mask.raw_device_data()), n, r.seed, r.offset,
                          r.first, p, scale);
  }
  if (x.device().is_cpu()) {
    FORGE_DISPATCH_FLOAT(x.dtype(), "dropout", [&] {
      const scalar_t* xp = x.data<scalar_t>();
      scalar_t* yp = y.data<scalar_t>();
      uint8_t* mp = mask.data<uint8_t>();
      const auto s = static_cast<scalar_t>(scale);
      // Element i keeps iff draw first + i of the reserved stream is >= p: the
      // same mask on any device and for either dtype.
      parallel_for(n, 20, [&](int64_t b, int64_t e) {
        Generator::for_each_uniform_f32(r.seed, r.offset, r.first + static_cast<uint64_t>(b),
                                        static_cast<uint64_t>(e - b), [&](uint64_t c, float u) {
                                          const int64_t i = b + static_cast<int64_t>(c);
                                          mp[i] = u >= p ? 1 : 0;
                                          yp[i] = mp[i] ? xp[i] * s : scalar_t(0);
                                        });
      });
    });
  }
  if (!autograd::needs_grad({x})) return y;
  // y = x * mask * scale, so dx = g * mask * scale.
  return autograd::record("dropout", {x}, y, [mask, scale](const std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    Tensor gx = Tensor::empty(g.shape(), g.dtype(), g.device());
    FORGE_IF_CUDA(g) {
      cuda::dropout_backward(g.dtype(), g.device().index, g.raw_device_data(),
                             static_cast<const uint8_t*>(mask.raw_device_data()),
                             gx.raw_device_data(), g.numel(), scale);
    }
    if (g.device().is_cpu()) {
      FORGE_DISPATCH_FLOAT(g.dtype(), "dropout backward", [&] {
        const scalar_t* gp = g.data<scalar_t>();
        const uint8_t* mp = mask.data<uint8_t>();
        scalar_t* dst = gx.data<scalar_t>();
        const auto s = static_cast<scalar_t>(scale);
        parallel_for(g.numel(), 2, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) dst[i] = gp[i] * static_cast<scalar_t>(mp[i]) * s;
        });
      });
    }
    return std::vector<Tensor>{gx};
  });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     const CrossEntropyOptions& options) {
  check_defined(logits, "cross_entropy", "logits");
  check_defined(target, "cross_entropy", "target");
  check_device(target, "target", logits, "logits", "cross_entropy");
  FORGE_CHECK(logits.dim() >= 1,
              "cross_entropy: logits must be (..., C) with at least one dim, got a scalar");
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  FORGE_CHECK(target.shape() == lead,
              "cross_entropy: target must have the leading shape {} of logits {} (one class id per "
              "row), got {}",
              shape_str(lead), shape_str(logits.shape()), shape_str(target.shape()));
  const double eps = options.label_smoothing;
  FORGE_CHECK(eps >= 0 && eps <= 1, "cross_entropy: label_smoothing must be in [0, 1], got {}",
              eps);
  const int64_t C = logits.shape().back(), rows = shape_numel(lead), ignore = options.ignore_index;
  const Reduction reduction = options.reduction;
  FORGE_CHECK(C > 0 || rows == 0, "cross_entropy: logits {} have no classes (C = 0)",
              shape_str(logits.shape()));

  // Targets are checked here, before any parallel region or kernel, so a bad
  // one is reported with its position (on a GPU by a kernel whose findings are
  // copied back).
  int64_t count = 0;
  FORGE_IF_CUDA(logits) {
    FORGE_CHECK(target.dtype() == DType::i32 || target.dtype() == DType::i64,
                "cross_entropy (target): expected an i32 or i64 index tensor, got {}",
                dtype_name(target.dtype()));
    const cuda::TargetCheck checked = cuda::cross_entropy_check_targets(
        target.dtype(), logits.device().index, target.raw_device_data(), rows, C, ignore);
    if (checked.bad_row >= 0) fail_target(checked.bad_value, checked.bad_row, lead, C, ignore);
    count = checked.count;
  }
  if (logits.device().is_cpu()) {
    FORGE_DISPATCH_INDEX(target.dtype(), "cross_entropy (target)", [&] {
      const index_t* tp = target.data<index_t>();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = static_cast<int64_t>(tp[r]);
        if (t == ignore) continue;
        if (t < 0 || t >= C) fail_target(t, r, lead, C, ignore);
        ++count;
      }
    });
  }

  Tensor lse = Tensor::empty({rows}, stats_dtype(logits), logits.device());
  Tensor y =
      Tensor::empty(reduction == Reduction::none ? lead : Shape{}, logits.dtype(), logits.device());
  // The mean is over the targets not ignored; all rows ignored: 0 / 0 = NaN,
  // as in PyTorch.
  const double divisor = reduction == Reduction::mean ? static_cast<double>(count) : 1.0;
  FORGE_IF_CUDA(logits) {
    cuda::cross_entropy_forward(logits.dtype(), target.dtype(), logits.device().index,
                                logits.raw_device_data(), target.raw_device_data(),
                                lse.raw_device_data(), y.raw_device_data(), rows, C, eps, ignore,
                                reduction == Reduction::none, divisor);
  }
  if (logits.device().is_cpu()) {
    std::vector<double> loss(static_cast<size_t>(rows));
    FORGE_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
      FORGE_DISPATCH_INDEX(target.dtype(), "cross_entropy (target)", [&] {
        cross_entropy_forward(logits.data<scalar_t>(), target.data<index_t>(), lse.data<scalar_t>(),
                              loss.data(), rows, C, eps, ignore);
      });
      scalar_t* yp = y.data<scalar_t>();
      if (reduction == Reduction::none) {
        for (int64_t r = 0; r < rows; ++r)
          yp[r] = static_cast<scalar_t>(loss[static_cast<size_t>(r)]);
      } else {
        double total = 0;
        for (double l : loss) total += l;
        yp[0] = static_cast<scalar_t>(total / divisor);
      }
    });
  }
  if (!autograd::needs_grad({logits})) return y;
  return autograd::record(
      "cross_entropy", {logits, target}, y,
      [xs = logits.detach(), ts = target.detach(), lse, rows, C, eps, ignore, reduction, count,
       divisor](const std::vector<Tensor>& grads) {
        const Tensor& g = grads[0];
        Tensor gx = Tensor::empty(xs.shape(), g.dtype(), g.device());
        FORGE_IF_CUDA(g) {
          cuda::cross_entropy_backward(
              g.dtype(), ts.dtype(), g.device().index, xs.raw_device_data(), ts.raw_device_data(),
              lse.raw_device_data(), g.raw_device_data(), gx.raw_device_data(), rows, C, eps,
              ignore, reduction == Reduction::none, divisor);
        }
        if (g.device().is_cpu()) {
          FORGE_DISPATCH_FLOAT(g.dtype(), "cross_entropy backward", [&] {
            FORGE_DISPATCH_INDEX(ts.dtype(), "cross_entropy backward (target)", [&] {
              cross_entropy_backward(xs.data<scalar_t>(), ts.data<index_t>(), lse.data<scalar_t>(),
                                     g.data<scalar_t>(), gx.data<scalar_t>(), rows, C, eps, ignore,
                                     reduction, static_cast<double>(count));
            });
          });
        }
        return std::vector<Tensor>{gx, Tensor()};
      });
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_defined(input, "mse_loss", "input");
  check_defined(target, "mse_loss", "target");
  check_device(target, "target", input, "input", "mse_loss");
  FORGE_CHECK(input.shape() == target.shape(),
              "mse_loss: input {} and target {} must have the same shape", shape_str(input.shape()),
              shape_str(target.shape()));
  FORGE_CHECK(input.dtype() == target.dtype(),
              "mse_loss: input ({}) and target ({}) must have the same dtype",
              dtype_name(input.dtype()), dtype_name(target.dtype()));
  const int64_t n = input.numel();
  Tensor y = Tensor::empty(reduction == Reduction::none ? input.shape() : Shape{}, input.dtype(),
                           input.device());
  // The reduced loss is the sum over this: n (mean) or 1 (sum).
  const double divisor = reduction == Reduction::mean ? static_cast<double>(n) : 1.0;
  FORGE_IF_CUDA(input) {
    cuda::mse_loss_forward(input.dtype(), input.device().index, input.raw_device_data(),
                           target.raw_device_data(), y.raw_device_data(), n,
                           reduction == Reduction::none, divisor);
  }
  if (input.device().is_cpu()) {
    FORGE_DISPATCH_FLOAT(input.dtype(), "mse_loss", [&] {
      const scalar_t* xp = input.data<scalar_t>();
      const scalar_t* tp = target.data<scalar_t>();
      scalar_t* yp = y.data<scalar_t>();
      if (reduction == Reduction::none) {
        parallel_for(n, 2, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) yp[i] = (xp[i] - tp[i]) * (xp[i] - tp[i]);
        });
        return;
      }
      yp[0] = static_cast<scalar_t>(squared_error_sum(xp, tp, n) / divisor);
    });
  }
  if (!autograd::needs_grad({input, target})) return y;
  const bool need_x = input.requires_grad(), need_t = target.requires_grad();
  // loss = sum_i w_i (x_i - t_i)^2 with w_i = 1 (sum), 1/n (mean) or g_i
  // (none), so dx = 2 w (x - t) and dt = -dx.
  return autograd::record(
      "mse_loss", {input, target}, y,
      [xs = input.detach(), ts = target.detach(), reduction, n, divisor, need_x,
       need_t](const std::vector<Tensor>& grads) {
        const Tensor& g = grads[0];
        Tensor gx = need_x ? Tensor::empty(xs.shape(), g.dtype(), g.device()) : Tensor();
        Tensor gt = need_t ? Tensor::empty(xs.shape(), g.dtype(), g.device()) : Tensor();
        const bool each = reduction == Reduction::none;
        FORGE_IF_CUDA(g) {
          cuda::mse_loss_backward(g.dtype(), g.device().index, xs.raw_device_data(),
                                  ts.raw_device_data(), g.raw_device_data(),
                                  need_x ? gx.raw_device_data() : nullptr,
                                  need_t ? gt.raw_device_data() : nullptr, n, each, divisor);
        }
        if (g.device().is_cpu()) {
          FORGE_DISPATCH_FLOAT(g.dtype(), "mse_loss backward", [&] {
            const scalar_t* xp = xs.data<scalar_t>();
            const scalar_t* tp = ts.data<scalar_t>();
            const scalar_t* gp = g.data<scalar_t>();
            scalar_t* dx = need_x ? gx.data<scalar_t>() : nullptr;
            scalar_t* dt = need_t ? gt.data<scalar_t>() : nullptr;
            const double w = each ? 0.0 : static_cast<double>(gp[0]) / divisor;
            const auto scale = static_cast<scalar_t>(2.0 * w);
            parallel_for(n, 4, [&](int64_t b, int64_t e) {
              for (int64_t i = b; i < e; ++i) {
                const scalar_t d = (each ? 2 * gp[i] : scale) * (xp[i] - tp[i]);
                if (dx) dx[i] = d;
                if (dt) dt[i] = -d;
              }
            });
          });
        }
        return std::vector<Tensor>{gx, gt};
      });
}

}  // namespace forge::ops
