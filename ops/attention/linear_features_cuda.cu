// The feature maps of linear, efficient and taylor_linear on the GPU and their
// backward (see linear_features_cuda.h). Elementwise maps are grid-stride
// loops; maps over a row (softmax over d, the unit norm) give each row a warp;
// reductions over the rows of a column (the key softmax over the sequence and
// its backward) give 32 columns a block of 32 x 32 threads: 32 row groups,
// each thread reducing its rows in one pass (for the softmax a running max
// and sum), then the groups combine in a fixed order (deterministic).
#include <cmath>

#include "core/cuda_kernels.cuh"
#include "ops/attention/linear_features_cuda.h"

namespace forge::cuda {

namespace {

constexpr int kRowGroups = 32;  // row groups of the column kernels (block: 32 x 32 threads)

// Whether row `row` of [BH * L] rows is a real token.
__device__ __forceinline__ bool kept(const FeatureRows& r, int64_t row) {
  if (r.keep == nullptr) return true;
  const int64_t bh = row / r.L, j = row % r.L;
  return r.keep[bh / r.H * r.L + j] != 0;
}

// ---- elementwise maps ----

template <typename T, typename A>
__global__ void elu_kernel(const T* x, FeatureRows r, A* f) {
  FORGE_GRID_STRIDE(i, r.BH * r.L * r.d) {
    const A on = kept(r, i / r.d) ? A(1) : A(0);
    const A v = to_acc<A>(x[i]);
    f[i] = on * (v > 0 ? v + A(1) : exp_of(v));
  }
}

template <typename T, typename A>
__global__ void elu_backward_kernel(const T* x, const A* df, FeatureRows r, T* dx) {
  FORGE_GRID_STRIDE(i, r.BH * r.L * r.d) {
    const A on = kept(r, i / r.d) ? A(1) : A(0);
    const A v = to_acc<A>(x[i]);
    dx[i] = from_acc<T>(df[i] * (on * (v > 0 ? A(1) : exp_of(v))));
  }
}

template <typename T, typename A>
__global__ void exp_kernel(const T* x, FeatureRows r, A* f) {
  FORGE_GRID_STRIDE(i, r.BH * r.L * r.d) {
    f[i] = kept(r, i / r.d) ? exp_of(to_acc<A>(x[i])) : A(0);
  }
}

template <typename T, typename A>
__global__ void exp_backward_kernel(const T* x, const A* df, FeatureRows r, T* dx) {
  FORGE_GRID_STRIDE(i, r.BH * r.L * r.d) {
    const A f = kept(r, i / r.d) ? exp_of(to_acc<A>(x[i])) : A(0);
    dx[i] = from_acc<T>(f * df[i]);
  }
}

// ---- maps over a row: one warp per row ----

#define FORGE_WARP_PER_ROW(row, rows)                                                       \
  for (int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp; \
       row < (rows); row += static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp)

// The max of row xr [d] and the sum of exp(x - max), on every lane.
template <typename T, typename A>
__device__ void row_softmax_stats(const T* xr, int64_t d, A& mx, A& sum) {
  const int lane = threadIdx.x % kWarp;
  mx = -INFINITY;
  for (int64_t c = lane; c < d; c += kWarp) mx = max(mx, to_acc<A>(xr[c]));
  mx = warp_max(mx);
  sum = 0;
  for (int64_t c = lane; c < d; c += kWarp) sum += exp_of(to_acc<A>(xr[c]) - mx);
  sum = warp_sum(sum);
}

// f = scale * softmax_d(x) per row.
template <typename T, typename A>
__global__ void row_softmax_kernel(const T* x, int64_t rows, int64_t d, A scale, A* f) {
  const int lane = threadIdx.x % kWarp;
  FORGE_WARP_PER_ROW(row, rows) {
    const T* xr = x + row * d;
    A mx, sum;
    row_softmax_stats(xr, d, mx, sum);
    const A inv = A(1) / sum;
    for (int64_t c = lane; c < d; c += kWarp)
      f[row * d + c] = scale * (exp_of(to_acc<A>(xr[c]) - mx) * inv);
  }
}

// f = scale p with p = softmax_d(x): dx = scale p (df - p . df).
template <typename T, typename A>
__global__ void row_softmax_backward_kernel(const T* x, const A* df, int64_t rows, int64_t d,
                                            A scale, T* dx) {
  const int lane = threadIdx.x % kWarp;
  FORGE_WARP_PER_ROW(row, rows) {
    const T* xr = x + row * d;
    const A* gr = df + row * d;
    A mx, sum;
    row_softmax_stats(xr, d, mx, sum);
    const A inv = A(1) / sum;
    A dot = 0;
    for (int64_t c = lane; c < d; c += kWarp) dot += exp_of(to_acc<A>(xr[c]) - mx) * inv * gr[c];
    dot = warp_sum(dot);
    for (int64_t c = lane; c < d; c += kWarp) {
      const A p = exp_of(to_acc<A>(xr[c]) - mx) * inv;
      dx[row * d + c] = from_acc<T>(scale * p * (gr[c] - dot));
    }
  }
}

// f = [1, x / ||x||] [d + 1] on real rows, 0 on padding.
template <typename T, typename A>
__global__ void unit_kernel(const T* x, FeatureRows r, A* f) {
  const int lane = threadIdx.x % kWarp;
  const int64_t d = r.d;
  FORGE_WARP_PER_ROW(row, r.BH * r.L) {
    const T* xr = x + row * d;
    A* fr = f + row * (d + 1);
    if (!kept(r, row)) {
      for (int64_t c = lane; c < d + 1; c += kWarp) fr[c] = 0;
      continue;
    }
    A ss = 0;
    for (int64_t c = lane; c < d; c += kWarp) {
      const A v = to_acc<A>(xr[c]);
      ss += v * v;
    }
    const A a = A(1) / sqrt_of(warp_sum(ss));
    if (lane == 0) fr[0] = 1;
    for (int64_t c = lane; c < d; c += kWarp) fr[1 + c] = to_acc<A>(xr[c]) * a;
  }
}

// x' = x a, a = 1 / ||x||: dx = (g - x' (x' . g)) a with g = df[1:]; 0 on padding.
template <typename T, typename A>
__global__ void unit_backward_kernel(const T* x, const A* df, FeatureRows r, T* dx) {
  const int lane = threadIdx.x % kWarp;
  const int64_t d = r.d;
  FORGE_WARP_PER_ROW(row, r.BH * r.L) {
    const T* xr = x + row * d;
    const A* gr = df + row * (d + 1) + 1;
    T* dr = dx + row * d;
    if (!kept(r, row)) {
      for (int64_t c = lane; c < d; c += kWarp) dr[c] = from_acc<T>(A(0));
      continue;
    }
    A ss = 0;
    for (int64_t c = lane; c < d; c += kWarp) {
      const A v = to_acc<A>(xr[c]);
      ss += v * v;
    }
    const A a = A(1) / sqrt_of(warp_sum(ss));
    A proj = 0;
    for (int64_t c = lane; c < d; c += kWarp) proj += to_acc<A>(xr[c]) * a * gr[c];
    proj = warp_sum(proj);
    for (int64_t c = lane; c < d; c += kWarp)
      dr[c] = from_acc<T>((gr[c] - to_acc<A>(xr[c]) * a * proj) * a);
  }
}

// ---- maps over the rows of a column ----
// Block b: batch-head b / col_tiles, columns (b % col_tiles) * 32 + lane; row
// group g = threadIdx.x / 32 takes rows g, g + 32, ...

// colmax [BH, d] = the max of each column over the real rows (-inf: none),
// colinv [BH, d] = 1 / sum_j exp(x[j, c] - colmax) over them (0: none).
template <typename T, typename A>
__global__ void __launch_bounds__(kWarp* kRowGroups)
    column_stats_kernel(const T* x, FeatureRows r, int64_t col_tiles, A* colmax, A* colinv) {
  __shared__ A s_max[kRowGroups][kWarp], s_sum[kRowGroups][kWarp];
  const int lane = threadIdx.x % kWarp, g = threadIdx.x / kWarp;
  const int64_t bh = blockIdx.x / col_tiles, c = blockIdx.x % col_tiles * kWarp + lane;
  A m = -INFINITY, s = 0;
  if (c < r.d)
    for (int64_t j = g; j < r.L; j += kRowGroups) {
      const int64_t row = bh * r.L + j;
      if (!kept(r, row)) continue;
      const A v = to_acc<A>(x[row * r.d + c]);
      if (v > m) {
        s = s * exp_of(m - v) + A(1);
        m = v;
      } else {
        s += exp_of(v - m);
      }
    }
  s_max[g][lane] = m;
  s_sum[g][lane] = s;
  __syncthreads();
  if (g == 0 && c < r.d) {
    A mx = -INFINITY;
    for (int k = 0; k < kRowGroups; ++k) mx = max(mx, s_max[k][lane]);
    A sum = 0;
    for (int k = 0; k < kRowGroups; ++k)
      if (s_sum[k][lane] > 0) sum += s_sum[k][lane] * exp_of(s_max[k][lane] - mx);
    colmax[bh * r.d + c] = mx;
    colinv[bh * r.d + c] = sum > 0 ? A(1) / sum : A(0);
  }
}

template <typename T, typename A>
__global__ void column_softmax_kernel(const T* x, FeatureRows r, const A* colmax, const A* colinv,
                                      A* f) {
  FORGE_GRID_STRIDE(i, r.BH * r.L * r.d) {
    const int64_t row = i / r.d, c = i % r.d, at = row / r.L * r.d + c;
    f[i] = kept(r, row) ? exp_of(to_acc<A>(x[i]) - colmax[at]) * colinv[at] : A(0);
  }
}

// t [BH, d] = sum_j f[j, c] df[j, c] per column.
template <typename A>
__global__ void __launch_bounds__(kWarp* kRowGroups)
    column_dot_kernel(const A* f, const A* df, FeatureRows r, int64_t col_tiles, A* t) {
  __shared__ A s_part[kRowGroups][kWarp];
  const int lane = threadIdx.x % kWarp, g = threadIdx.x / kWarp;
  const int64_t bh = blockIdx.x / col_tiles, c = blockIdx.x % col_tiles * kWarp + lane;
  A s = 0;
  if (c < r.d)
    for (int64_t j = g; j < r.L; j += kRowGroups) {
      const int64_t at = (bh * r.L + j) * r.d + c;
      s += f[at] * df[at];
    }
  s_part[g][lane] = s;
  __syncthreads();
  if (g == 0 && c < r.d) {
    A sum = 0;
    for (int k = 0; k < kRowGroups; ++k) sum += s_part[k][lane];
    t[bh * r.d + c] = sum;
  }
}

// dx = f (df - t[column]).
template <typename T, typename A>
__global__ void column_softmax_backward_kernel(const A* f, const A* df, const A* t, FeatureRows r,
                                               T* dx) {
  FORGE_GRID_STRIDE(i, r.BH * r.L * r.d) {
    const int64_t at = i / (r.L * r.d) * r.d + i % r.d;
    dx[i] = from_acc<T>(f[i] * (df[i] - t[at]));
  }
}

// ---- launch shapes ----

int64_t elements(const FeatureRows& r) {
  return r.BH * r.L * r.d;
}

unsigned grid_rows(const FeatureRows& r, int device) {
  return grid_for(r.BH * r.L * kWarp, device);
}

int64_t col_tiles(const FeatureRows& r) {
  return (r.d + kWarp - 1) / kWarp;
}

unsigned grid_columns(const FeatureRows& r) {
  const int64_t blocks = r.BH * col_tiles(r);
  if (blocks > 0x7fffffff) fail("efficient attention: too many batch-heads for one launch");
  return static_cast<unsigned>(blocks);
}

}  // namespace

void elu_features(DType dtype, const FeatureRows& r, const void* x, void* f, int device) {
  if (elements(r) == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "attention::linear features", [&] {
    elu_kernel<scalar_t, acc_type><<<grid_for(elements(r), device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(x), r, static_cast<acc_type*>(f));
    FORGE_CUDA_CHECK_LAUNCH("elu_kernel");
  });
}

void elu_features_backward(DType dtype, const FeatureRows& r, const void* x, const void* df,
                           void* dx, int device) {
  if (elements(r) == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "attention::linear features backward", [&] {
    elu_backward_kernel<scalar_t, acc_type>
        <<<grid_for(elements(r), device), kThreads, 0, stream(device)>>>(
            static_cast<const scalar_t*>(x), static_cast<const acc_type*>(df), r,
            static_cast<scalar_t*>(dx));
    FORGE_CUDA_CHECK_LAUNCH("elu_backward_kernel");
  });
}

void row_softmax_features(DType dtype, const FeatureRows& r, const void* x, void* f, int device) {
  if (elements(r) == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "attention::efficient query features", [&] {
    const auto scale = static_cast<acc_type>(1) / std::sqrt(static_cast<acc_type>(r.d));
    row_softmax_kernel<scalar_t, acc_type><<<grid_rows(r, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(x), r.BH * r.L, r.d, scale, static_cast<acc_type*>(f));
    FORGE_CUDA_CHECK_LAUNCH("row_softmax_kernel");
  });
}

void row_softmax_features_backward(DType dtype, const FeatureRows& r, const void* x, const void* df,
                                   void* dx, int device) {
  if (elements(r) == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "attention::efficient query features backward", [&] {
    const auto scale = static_cast<acc_type>(1) / std::sqrt(static_cast<acc_type>(r.d));
    row_softmax_backward_kernel<scalar_t, acc_type>
        <<<grid_rows(r, device), kThreads, 0, stream(device)>>>(
            static_cast<const scalar_t*>(x), static_cast<const acc_type*>(df), r.BH * r.L, r.d,
            scale, static_cast<scalar_t*>(dx));
    FORGE_CUDA_CHECK_LAUNCH("row_softmax_backward_kernel");
  });
}

void exp_features(DType dtype, const FeatureRows& r, const void* x, void* f, int device) {
  if (elements(r) == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "attention::efficient key features", [&] {
    exp_kernel<scalar_t, acc_type><<<grid_for(elements(r), device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(x), r, static_cast<acc_type*>(f));
    FORGE_CUDA_CHECK_LAUNCH("exp_kernel");
  });
}

void exp_features_backward(DType dtype, const FeatureRows& r, const void* x, const void* df,
                           void* dx, int device) {
  if (elements(r) == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "attention::efficient key features backward", [&] {
    exp_backward_kernel<scalar_t, acc_type>
        <<<grid_for(elements(r), device), kThreads, 0, stream(device)>>>(
            static_cast<const scalar_t*>(x), static_cast<const acc_type*>(df), r,
            static_cast<scalar_t*>(dx));
    FORGE_CUDA_CHECK_LAUNCH("exp_backward_kernel");
  });
}

void column_softmax_features(DType dtype, const FeatureRows& r, const void* x, void* f,
                             void* scratch, int device) {
  if (elements(r) == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "attention::efficient key features", [&] {
    auto* colmax = static_cast<acc_type*>(scratch);
    acc_type* colinv = colmax + r.BH * r.d;
    column_stats_kernel<scalar_t, acc_type>
        <<<grid_columns(r), kWarp * kRowGroups, 0, stream(device)>>>(
            static_cast<const scalar_t*>(x), r, col_tiles(r), colmax, colinv);
    FORGE_CUDA_CHECK_LAUNCH("column_stats_kernel");
    column_softmax_kernel<scalar_t, acc_type>
        <<<grid_for(elements(r), device), kThreads, 0, stream(device)>>>(
            static_cast<const scalar_t*>(x), r, colmax, colinv, static_cast<acc_type*>(f));
    FORGE_CUDA_CHECK_LAUNCH("column_softmax_kernel");
  });
}

void column_softmax_features_backward(DType dtype, const FeatureRows& r, const void* f,
                                      const void* df, void* dx, void* scratch, int device) {
  if (elements(r) == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "attention::efficient key features backward", [&] {
    const auto* fa = static_cast<const acc_type*>(f);
    const auto* dfa = static_cast<const acc_type*>(df);
    auto* t = static_cast<acc_type*>(scratch);
    column_dot_kernel<acc_type>
        <<<grid_columns(r), kWarp * kRowGroups, 0, stream(device)>>>(fa, dfa, r, col_tiles(r), t);
    FORGE_CUDA_CHECK_LAUNCH("column_dot_kernel");
    column_softmax_backward_kernel<scalar_t, acc_type>
        <<<grid_for(elements(r), device), kThreads, 0, stream(device)>>>(
            fa, dfa, t, r, static_cast<scalar_t*>(dx));
    FORGE_CUDA_CHECK_LAUNCH("column_softmax_backward_kernel");
  });
}

void unit_features(DType dtype, const FeatureRows& r, const void* x, void* f, int device) {
  if (r.BH * r.L == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "attention::taylor_linear features", [&] {
    unit_kernel<scalar_t, acc_type><<<grid_rows(r, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(x), r, static_cast<acc_type*>(f));
    FORGE_CUDA_CHECK_LAUNCH("unit_kernel");
  });
}

void unit_features_backward(DType dtype, const FeatureRows& r, const void* x, const void* df,
                            void* dx, int device) {
  if (elements(r) == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "attention::taylor_linear features backward", [&] {
    unit_backward_kernel<scalar_t, acc_type><<<grid_rows(r, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(x), static_cast<const acc_type*>(df), r,
        static_cast<scalar_t*>(dx));
    FORGE_CUDA_CHECK_LAUNCH("unit_backward_kernel");
  });
}

}  // namespace forge::cuda
