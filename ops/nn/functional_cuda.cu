// The neural-network ops on a GPU (see functional_cuda.h): each a fused kernel
// like its CPU counterpart in functional.cpp. A row along the last dim is
// reduced by one warp (rows of up to kWarpCols columns) or one block; a
// reduction along another dim runs one thread per (outer, inner) column.
// Statistics accumulate in acc_t and every store rounds once. Sums over rows
// (layer_norm's dweight / dbias, the losses' reductions) add per-block partial
// sums in a fixed order, never with atomics, so results repeat bit for bit.
#include <climits>
#include <type_traits>

#include "core/allocator.h"
#include "core/cuda_kernels.cuh"
#include "ops/nn/functional_cuda.h"

namespace forge::cuda {

namespace {

// ---- scratch memory and index dispatch ----

// Calls f(I{}) with I the C++ type of an index dtype (i32, i64).
template <typename F>
void dispatch_index(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    default:
      fail_dtype(op, dtype);
  }
}

// ---- rows: one warp or one block per row ----

constexpr int64_t kWarpCols = 1024;   // longer rows get a block each
constexpr int kWarpRowThreads = 128;  // four rows per block
constexpr int kBlockRowThreads = 512;

// The threads that share a row: lane in [0, lanes) walks the row's columns,
// `first` is the team's first row and `stride` the step to its next one.
template <bool kBlock>
struct RowTeam {
  int lane, lanes;
  int64_t first, stride;

  __device__ RowTeam() {
    if constexpr (kBlock) {
      lane = static_cast<int>(threadIdx.x);
      lanes = static_cast<int>(blockDim.x);
      first = blockIdx.x;
      stride = gridDim.x;
    } else {
      const int64_t per_block = blockDim.x / kWarp;
      lane = static_cast<int>(threadIdx.x % kWarp);
      lanes = kWarp;
      first = blockIdx.x * per_block + threadIdx.x / kWarp;
      stride = gridDim.x * per_block;
    }
  }

  // Sum and max over the team, returned to every lane; `shared` (kWarp values)
  // is used by block teams, and the whole block must call.
  template <typename A>
  __device__ A sum(A v, [[maybe_unused]] A* shared) const {
    if constexpr (kBlock) {
      return block_sum(v, shared);
    } else {
      return warp_sum(v);
    }
  }
  template <typename A>
  __device__ A max(A v, [[maybe_unused]] A* shared) const {
    if constexpr (kBlock) {
      return block_max(v, shared);
    } else {
      return warp_max(v);
    }
  }
};

// Runs launch(std::bool_constant<kBlock>, grid, threads), which launches a
// kernel of RowTeam<kBlock>, for `rows` rows of `cols` columns; the grid is
// capped (the kernels loop over rows) and checked.
template <typename Launch>
void launch_rows(int64_t rows, int64_t cols, int device, const char* name, Launch&& launch) {
  const bool block = cols > kWarpCols;
  const int threads = block ? kBlockRowThreads : kWarpRowThreads;
  const int64_t per_block = block ? 1 : threads / kWarp;
  const int64_t need = (rows + per_block - 1) / per_block;
  const int64_t cap = static_cast<int64_t>(multiprocessor_count(device)) * 16;
  const auto grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(need, cap)));
  if (block) {
    launch(std::true_type{}, grid, threads);
  } else {
    launch(std::false_type{}, grid, threads);
  }
  FORGE_CUDA_CHECK_LAUNCH(name);
}

// out[0] = (v[0] + ... + v[n - 1]) / divisor, summed by one block in a fixed
// order (n may be 0: then 0 / divisor).
constexpr int kSumThreads = 1024;

template <typename T>
__global__ void sum_to_scalar_kernel(const acc_t<T>* v, int64_t n, T* out, acc_t<T> divisor) {
  using A = acc_t<T>;
  __shared__ A shared[kWarp];
  A s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = from_acc<T>(s / divisor);
}

// ---- softmax and log_softmax ----

// x, y (rows, C); a team per row.
template <typename T, bool kBlock>
__global__ void softmax_rows_kernel(const T* x, T* y, int64_t rows, int64_t C, bool is_log) {
  using A = acc_t<T>;
  __shared__ A shared[kWarp];
  const RowTeam<kBlock> team;
  for (int64_t r = team.first; r < rows; r += team.stride) {
    const T* xr = x + r * C;
    T* yr = y + r * C;
    A m = -INFINITY;
    for (int64_t c = team.lane; c < C; c += team.lanes) m = max(m, to_acc<A>(xr[c]));
    m = team.max(m, shared);
    A s = 0;
    for (int64_t c = team.lane; c < C; c += team.lanes) s += exp_of(to_acc<A>(xr[c]) - m);
    s = team.sum(s, shared);
    if (is_log) {
      const A shift = m + log_of(s);
      for (int64_t c = team.lane; c < C; c += team.lanes)
        yr[c] = from_acc<T>(to_acc<A>(xr[c]) - shift);
    } else {
      const A inv = A(1) / s;
      for (int64_t c = team.lane; c < C; c += team.lanes)
        yr[c] = from_acc<T>(exp_of(to_acc<A>(xr[c]) - m) * inv);
    }
  }
}

// x, y (outer, C, inner), inner > 1: a thread per (outer, inner) column.
template <typename T>
__global__ void softmax_columns_kernel(const T* x, T* y, int64_t outer, int64_t C, int64_t inner,
                                       bool is_log) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(k, outer * inner) {
    const int64_t base = (k / inner) * C * inner + k % inner;  // element c at base + c * inner
    A m = -INFINITY;
    for (int64_t c = 0; c < C; ++c) m = max(m, to_acc<A>(x[base + c * inner]));
    A s = 0;
    for (int64_t c = 0; c < C; ++c) s += exp_of(to_acc<A>(x[base + c * inner]) - m);
    const A shift = is_log ? m + log_of(s) : m, inv = A(1) / s;
    for (int64_t c = 0; c < C; ++c) {
      const A v = to_acc<A>(x[base + c * inner]) - shift;
      y[base + c * inner] = from_acc<T>(is_log ? v : exp_of(v) * inv);
    }
  }
}

// dot = sum_c (log ? g : g y); gx = log ? g - exp(y) dot : y (g - dot).
template <typename T, bool kBlock>
__global__ void softmax_backward_rows_kernel(const T* y, const T* g, T* gx, int64_t rows, int64_t C,
                                             bool is_log) {
  using A = acc_t<T>;
  __shared__ A shared[kWarp];
  const RowTeam<kBlock> team;
  for (int64_t r = team.first; r < rows; r += team.stride) {
    const T* yr = y + r * C;
    const T* gr = g + r * C;
    T* dst = gx + r * C;
    A dot = 0;
    for (int64_t c = team.lane; c < C; c += team.lanes)
      dot += is_log ? to_acc<A>(gr[c]) : to_acc<A>(gr[c]) * to_acc<A>(yr[c]);
    dot = team.sum(dot, shared);
    for (int64_t c = team.lane; c < C; c += team.lanes) {
      const A gv = to_acc<A>(gr[c]), yv = to_acc<A>(yr[c]);
      dst[c] = from_acc<T>(is_log ? gv - exp_of(yv) * dot : yv * (gv - dot));
    }
  }
}

template <typename T>
__global__ void softmax_backward_columns_kernel(const T* y, const T* g, T* gx, int64_t outer,
                                                int64_t C, int64_t inner, bool is_log) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(k, outer * inner) {
    const int64_t base = (k / inner) * C * inner + k % inner;
    A dot = 0;
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = base + c * inner;
      dot += is_log ? to_acc<A>(g[i]) : to_acc<A>(g[i]) * to_acc<A>(y[i]);
    }
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = base + c * inner;
      const A gv = to_acc<A>(g[i]), yv = to_acc<A>(y[i]);
      gx[i] = from_acc<T>(is_log ? gv - exp_of(yv) * dot : yv * (gv - dot));
    }
  }
}

// ---- layer_norm ----

// x, y (rows, N); w, b (N) or null; mean, rstd (rows).
template <typename T, bool kBlock>
__global__ void layer_norm_rows_kernel(const T* x, const T* w, const T* b, T* y, acc_t<T>* mean,
                                       acc_t<T>* rstd, int64_t rows, int64_t N, acc_t<T> eps) {
  using A = acc_t<T>;
  __shared__ A shared[kWarp];
  const RowTeam<kBlock> team;
  for (int64_t r = team.first; r < rows; r += team.stride) {
    const T* xr = x + r * N;
    T* yr = y + r * N;
    A s = 0;
    for (int64_t j = team.lane; j < N; j += team.lanes) s += to_acc<A>(xr[j]);
    const A mu = team.sum(s, shared) / static_cast<A>(N);
    // Two passes (mean, then squared deviations), as on the CPU.
    A v = 0;
    for (int64_t j = team.lane; j < N; j += team.lanes) {
      const A d = to_acc<A>(xr[j]) - mu;
      v += d * d;
    }
    const A rs = A(1) / sqrt_of(team.sum(v, shared) / static_cast<A>(N) + eps);
    for (int64_t j = team.lane; j < N; j += team.lanes) {
      A n = (to_acc<A>(xr[j]) - mu) * rs;
      if (w) n *= to_acc<A>(w[j]);
      if (b) n += to_acc<A>(b[j]);
      yr[j] = from_acc<T>(n);
    }
    if (team.lane == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
  }
}

// With xhat = (x - mean) rstd and dn = g w (g without weight):
// gx = rstd (dn - mean_j(dn) - xhat mean_j(dn xhat)).
template <typename T, bool kBlock>
__global__ void layer_norm_backward_rows_kernel(const T* x, const T* w, const acc_t<T>* mean,
                                                const acc_t<T>* rstd, const T* g, T* gx,
                                                int64_t rows, int64_t N) {
  using A = acc_t<T>;
  __shared__ A shared[kWarp];
  const RowTeam<kBlock> team;
  for (int64_t r = team.first; r < rows; r += team.stride) {
    const T* xr = x + r * N;
    const T* gr = g + r * N;
    T* dst = gx + r * N;
    const A m = mean[r], k = rstd[r];
    A s1 = 0, s2 = 0;
    for (int64_t j = team.lane; j < N; j += team.lanes) {
      const A dn = w ? to_acc<A>(gr[j]) * to_acc<A>(w[j]) : to_acc<A>(gr[j]);
      s1 += dn;
      s2 += dn * (to_acc<A>(xr[j]) - m) * k;
    }
    const A a = team.sum(s1, shared) / static_cast<A>(N);
    const A c = team.sum(s2, shared) / static_cast<A>(N);
    for (int64_t j = team.lane; j < N; j += team.lanes) {
      const A dn = w ? to_acc<A>(gr[j]) * to_acc<A>(w[j]) : to_acc<A>(gr[j]);
      dst[j] = from_acc<T>(k * (dn - a - (to_acc<A>(xr[j]) - m) * k * c));
    }
  }
}

// dw = sum_r g xhat and db = sum_r g, in two passes: block (tile, chunk) of
// kParamCols x kParamRows threads sums its chunk of rows for its tile of
// columns into pw / pb (chunks, N); then each column adds its chunks in order.
constexpr int kParamCols = 32, kParamRows = 8;
constexpr int64_t kMaxChunks = 1024;  // gridDim.y, at most 65535

template <typename T>
__global__ void layer_norm_param_partial_kernel(const T* x, const acc_t<T>* mean,
                                                const acc_t<T>* rstd, const T* g, acc_t<T>* pw,
                                                acc_t<T>* pb, int64_t rows, int64_t N,
                                                int64_t rows_per_chunk) {
  using A = acc_t<T>;
  __shared__ A sw[kParamRows][kParamCols], sb[kParamRows][kParamCols];
  const int64_t j = blockIdx.x * static_cast<int64_t>(kParamCols) + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  A aw = 0, ab = 0;
  if (j < N) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kParamRows) {
      const A gv = to_acc<A>(g[r * N + j]);
      aw += gv * (to_acc<A>(x[r * N + j]) - mean[r]) * rstd[r];
      ab += gv;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y != 0 || j >= N) return;
  for (int k = 1; k < kParamRows; ++k) {
    aw += sw[k][threadIdx.x];
    ab += sb[k][threadIdx.x];
  }
  const int64_t at = blockIdx.y * N + j;
  if (pw) pw[at] = aw;
  if (pb) pb[at] = ab;
}

template <typename T>
__global__ void layer_norm_param_finish_kernel(const acc_t<T>* pw, const acc_t<T>* pb, T* gw, T* gb,
                                               int64_t chunks, int64_t N) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(j, N) {
    A sw = 0, sb = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      if (gw) sw += pw[k * N + j];
      if (gb) sb += pb[k * N + j];
    }
    if (gw) gw[j] = from_acc<T>(sw);
    if (gb) gb[j] = from_acc<T>(sb);
  }
}

// ---- dropout ----

// Element i uses draw first + i. A thread per Philox block that draws
// [first, first + n) touch: thread t computes block first / 4 + t, whose four
// draws in range are elements draw - first.
template <typename T>
__global__ void dropout_kernel(const T* x, T* y, uint8_t* mask, int64_t n, uint64_t seed,
                               uint64_t offset, uint64_t first, double p, acc_t<T> scale) {
  using A = acc_t<T>;
  const uint64_t b0 = first / 4;
  const int64_t blocks = static_cast<int64_t>((first + static_cast<uint64_t>(n) + 3) / 4 - b0);
  FORGE_GRID_STRIDE(t, blocks) {
    const uint64_t b = b0 + static_cast<uint64_t>(t);
    const PhiloxWords w = philox_block(seed, offset, b);
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t draw = 4 * b + static_cast<uint64_t>(lane);
      if (draw < first || draw - first >= static_cast<uint64_t>(n)) continue;
      const auto i = static_cast<int64_t>(draw - first);
      // u >= p compared in double, as the CPU compares its f32 draw with p.
      const bool keep = static_cast<double>(philox_unit_f32(w.w[lane])) >= p;
      mask[i] = keep ? 1 : 0;
      y[i] = keep ? from_acc<T>(to_acc<A>(x[i]) * scale) : from_acc<T>(A(0));
    }
  }
}

template <typename T>
__global__ void dropout_backward_kernel(const T* g, const uint8_t* mask, T* gx, int64_t n,
                                        acc_t<T> scale) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(i, n) gx[i] = from_acc<T>(to_acc<A>(g[i]) * static_cast<A>(mask[i]) * scale);
}

// ---- cross_entropy ----

// count += targets other than ignore; bad_row = min over rows with a target
// out of [0, C).
template <typename I>
__global__ void check_targets_kernel(const I* target, int64_t rows, int64_t C, int64_t ignore,
                                     unsigned long long* count, unsigned long long* bad_row) {
  __shared__ long long shared[kWarp];
  long long n = 0;
  FORGE_GRID_STRIDE(r, rows) {
    const int64_t t = static_cast<int64_t>(target[r]);
    if (t == ignore) continue;
    if (t < 0 || t >= C) {
      atomicMin(bad_row, static_cast<unsigned long long>(r));
    } else {
      ++n;
    }
  }
  n = block_sum(n, shared);
  if (threadIdx.x == 0) atomicAdd(count, static_cast<unsigned long long>(n));
}

// x (rows, C); per row lse[r] and the loss, into y_rows (T) when given, else
// into losses (acc).
template <typename T, typename I, bool kBlock>
__global__ void cross_entropy_rows_kernel(const T* x, const I* target, acc_t<T>* lse, T* y_rows,
                                          acc_t<T>* losses, int64_t rows, int64_t C, acc_t<T> eps,
                                          int64_t ignore) {
  using A = acc_t<T>;
  __shared__ A shared[kWarp];
  const RowTeam<kBlock> team;
  for (int64_t r = team.first; r < rows; r += team.stride) {
    const T* xr = x + r * C;
    A m = -INFINITY;
    for (int64_t c = team.lane; c < C; c += team.lanes) m = max(m, to_acc<A>(xr[c]));
    m = team.max(m, shared);
    A s = 0, sx = 0;
    for (int64_t c = team.lane; c < C; c += team.lanes) {
      const A v = to_acc<A>(xr[c]);
      s += exp_of(v - m);
      sx += v;
    }
    s = team.sum(s, shared);
    sx = team.sum(sx, shared);
    if (team.lane == 0) {
      const A l = m + log_of(s);
      lse[r] = l;
      const int64_t t = static_cast<int64_t>(target[r]);
      const A loss =
          t == ignore ? A(0)
                      : (A(1) - eps) * (l - to_acc<A>(xr[t])) + eps * (l - sx / static_cast<A>(C));
      if (y_rows) {
        y_rows[r] = from_acc<T>(loss);
      } else {
        losses[r] = loss;
      }
    }
  }
}

// gx row r = w_r (exp(x - lse) - eps / C - (1 - eps) [c == t]), 0 when ignored.
template <typename T, typename I, bool kBlock>
__global__ void cross_entropy_backward_rows_kernel(const T* x, const I* target, const acc_t<T>* lse,
                                                   const T* g, T* gx, int64_t rows, int64_t C,
                                                   acc_t<T> eps, int64_t ignore, bool per_row,
                                                   acc_t<T> divisor) {
  using A = acc_t<T>;
  const RowTeam<kBlock> team;
  const A smooth = eps / static_cast<A>(C);
  for (int64_t r = team.first; r < rows; r += team.stride) {
    const T* xr = x + r * C;
    T* dst = gx + r * C;
    const int64_t t = static_cast<int64_t>(target[r]);
    const bool ignored = t == ignore;
    const A wr = per_row ? to_acc<A>(g[r]) : to_acc<A>(g[0]) / divisor, l = lse[r];
    for (int64_t c = team.lane; c < C; c += team.lanes) {
      A v = wr * (exp_of(to_acc<A>(xr[c]) - l) - smooth);
      if (c == t) v -= wr * (A(1) - eps);
      dst[c] = from_acc<T>(ignored ? A(0) : v);
    }
  }
}

// ---- mse_loss ----

template <typename T>
__global__ void squared_error_kernel(const T* x, const T* t, T* y, int64_t n) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(i, n) {
    const A d = to_acc<A>(x[i]) - to_acc<A>(t[i]);
    y[i] = from_acc<T>(d * d);
  }
}

// partial[block] = the block's share of sum (x - t)^2.
template <typename T>
__global__ void squared_error_partial_kernel(const T* x, const T* t, acc_t<T>* partial, int64_t n) {
  using A = acc_t<T>;
  __shared__ A shared[kWarp];
  A s = 0;
  FORGE_GRID_STRIDE(i, n) {
    const A d = to_acc<A>(x[i]) - to_acc<A>(t[i]);
    s += d * d;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

template <typename T>
__global__ void mse_backward_kernel(const T* x, const T* t, const T* g, T* gx, T* gt, int64_t n,
                                    bool per_element, acc_t<T> divisor) {
  using A = acc_t<T>;
  const A scale = per_element ? A(0) : A(2) * (to_acc<A>(g[0]) / divisor);
  FORGE_GRID_STRIDE(i, n) {
    const A w = per_element ? A(2) * to_acc<A>(g[i]) : scale;
    const A d = w * (to_acc<A>(x[i]) - to_acc<A>(t[i]));
    if (gx) gx[i] = from_acc<T>(d);
    if (gt) gt[i] = from_acc<T>(-d);
  }
}

}  // namespace

void softmax_forward(DType dtype, int device, const void* x, void* y, int64_t outer, int64_t C,
                     int64_t inner, bool log) {
  if (outer * C * inner == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, log ? "log_softmax" : "softmax", [&] {
    const auto* xp = static_cast<const scalar_t*>(x);
    auto* yp = static_cast<scalar_t*>(y);
    if (inner == 1) {
      launch_rows(outer, C, device, "softmax (rows)", [&](auto block, unsigned grid, int threads) {
        softmax_rows_kernel<scalar_t, decltype(block)::value>
            <<<grid, threads, 0, stream(device)>>>(xp, yp, outer, C, log);
      });
      return;
    }
    softmax_columns_kernel<scalar_t>
        <<<grid_for(outer * inner, device), kThreads, 0, stream(device)>>>(xp, yp, outer, C, inner,
                                                                           log);
    FORGE_CUDA_CHECK_LAUNCH("softmax (columns)");
  });
}

void softmax_backward(DType dtype, int device, const void* y, const void* g, void* gx,
                      int64_t outer, int64_t C, int64_t inner, bool log) {
  if (outer * C * inner == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, log ? "log_softmax backward" : "softmax backward", [&] {
    const auto* yp = static_cast<const scalar_t*>(y);
    const auto* gp = static_cast<const scalar_t*>(g);
    auto* dst = static_cast<scalar_t*>(gx);
    if (inner == 1) {
      launch_rows(outer, C, device, "softmax backward (rows)",
                  [&](auto block, unsigned grid, int threads) {
                    softmax_backward_rows_kernel<scalar_t, decltype(block)::value>
                        <<<grid, threads, 0, stream(device)>>>(yp, gp, dst, outer, C, log);
                  });
      return;
    }
    softmax_backward_columns_kernel<scalar_t>
        <<<grid_for(outer * inner, device), kThreads, 0, stream(device)>>>(yp, gp, dst, outer, C,
                                                                           inner, log);
    FORGE_CUDA_CHECK_LAUNCH("softmax backward (columns)");
  });
}

void layer_norm_forward(DType dtype, int device, const void* x, const void* w, const void* b,
                        void* y, void* mean, void* rstd, int64_t rows, int64_t N, double eps) {
  if (rows == 0 || N == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "layer_norm", [&] {
    using A = acc_type;
    launch_rows(rows, N, device, "layer_norm", [&](auto block, unsigned grid, int threads) {
      layer_norm_rows_kernel<scalar_t, decltype(block)::value>
          <<<grid, threads, 0, stream(device)>>>(
              static_cast<const scalar_t*>(x), static_cast<const scalar_t*>(w),
              static_cast<const scalar_t*>(b), static_cast<scalar_t*>(y), static_cast<A*>(mean),
              static_cast<A*>(rstd), rows, N, static_cast<A>(eps));
    });
  });
}

void layer_norm_backward(DType dtype, int device, const void* x, const void* w, const void* mean,
                         const void* rstd, const void* g, void* gx, void* gw, void* gb,
                         int64_t rows, int64_t N) {
  if (N == 0) return;
  DeviceGuard guard(device);
  cudaStream_t s = stream(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "layer_norm backward", [&] {
    using A = acc_type;
    const auto* xp = static_cast<const scalar_t*>(x);
    const auto* gp = static_cast<const scalar_t*>(g);
    const auto* mp = static_cast<const A*>(mean);
    const auto* rp = static_cast<const A*>(rstd);
    auto* gwp = static_cast<scalar_t*>(gw);
    auto* gbp = static_cast<scalar_t*>(gb);
    if (gx && rows > 0) {
      launch_rows(rows, N, device, "layer_norm backward",
                  [&](auto block, unsigned grid, int threads) {
                    layer_norm_backward_rows_kernel<scalar_t, decltype(block)::value>
                        <<<grid, threads, 0, s>>>(xp, static_cast<const scalar_t*>(w), mp, rp, gp,
                                                  static_cast<scalar_t*>(gx), rows, N);
                  });
    }
    if (!gw && !gb) return;
    if (rows == 0) {  // empty sums: all-zero bits are 0 in every float type
      if (gw) FORGE_CUDA_CHECK(cudaMemsetAsync(gw, 0, N * sizeof(scalar_t), s));
      if (gb) FORGE_CUDA_CHECK(cudaMemsetAsync(gb, 0, N * sizeof(scalar_t), s));
      return;
    }
    // Enough (tile, chunk) blocks to fill the device, each chunk at least a row.
    const int64_t tiles = (N + kParamCols - 1) / kParamCols;
    const int64_t want =
        (static_cast<int64_t>(multiprocessor_count(device)) * 8 + tiles - 1) / tiles;
    const int64_t chunks = std::max<int64_t>(1, std::min({want, rows, kMaxChunks}));
    const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
    Scratch partial(device, 2 * static_cast<size_t>(chunks * N) * sizeof(A));
    A* pw = gw ? partial.as<A>() : nullptr;
    A* pb = gb ? partial.as<A>() + chunks * N : nullptr;
    layer_norm_param_partial_kernel<scalar_t>
        <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)),
           dim3(kParamCols, kParamRows), 0, s>>>(xp, mp, rp, gp, pw, pb, rows, N, rows_per_chunk);
    FORGE_CUDA_CHECK_LAUNCH("layer_norm backward (weight, bias partial sums)");
    layer_norm_param_finish_kernel<scalar_t>
        <<<grid_for(N, device), kThreads, 0, s>>>(pw, pb, gwp, gbp, chunks, N);
    FORGE_CUDA_CHECK_LAUNCH("layer_norm backward (weight, bias)");
  });
}

void dropout_forward(DType dtype, int device, const void* x, void* y, uint8_t* mask, int64_t n,
                     uint64_t seed, uint64_t offset, uint64_t first, double p, double scale) {
  if (n == 0) return;
  DeviceGuard guard(device);
  // The Philox blocks that draws [first, first + n) touch: ceil(n / 4), or one
  // more when first is not a multiple of 4.
  const auto blocks = static_cast<int64_t>((first + static_cast<uint64_t>(n) + 3) / 4 - first / 4);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "dropout", [&] {
    dropout_kernel<scalar_t><<<grid_for(blocks, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(x), static_cast<scalar_t*>(y), mask, n, seed, offset, first, p,
        static_cast<acc_type>(scale));
    FORGE_CUDA_CHECK_LAUNCH("dropout");
  });
}

void dropout_backward(DType dtype, int device, const void* g, const uint8_t* mask, void* gx,
                      int64_t n, double scale) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "dropout backward", [&] {
    dropout_backward_kernel<scalar_t><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(g), mask, static_cast<scalar_t*>(gx), n,
        static_cast<acc_type>(scale));
    FORGE_CUDA_CHECK_LAUNCH("dropout backward");
  });
}

TargetCheck cross_entropy_check_targets(DType target_dtype, int device, const void* target,
                                        int64_t rows, int64_t C, int64_t ignore_index) {
  TargetCheck result;
  if (rows == 0) return result;
  DeviceGuard guard(device);
  cudaStream_t s = stream(device);
  // found[0]: the count, from 0; found[1]: the first bad row, from "none" (all ones).
  Scratch scratch(device, 2 * sizeof(unsigned long long));
  unsigned long long* found = scratch.as<unsigned long long>();
  FORGE_CUDA_CHECK(cudaMemsetAsync(found, 0, sizeof(unsigned long long), s));
  FORGE_CUDA_CHECK(cudaMemsetAsync(found + 1, 0xff, sizeof(unsigned long long), s));
  dispatch_index(target_dtype, "cross_entropy (target)", [&](auto tag) {
    using I = decltype(tag);
    check_targets_kernel<I><<<grid_for(rows, device), kThreads, 0, s>>>(
        static_cast<const I*>(target), rows, C, ignore_index, found, found + 1);
    FORGE_CUDA_CHECK_LAUNCH("cross_entropy (target check)");
  });
  unsigned long long host[2];
  FORGE_CUDA_CHECK(cudaMemcpyAsync(host, found, sizeof host, cudaMemcpyDeviceToHost, s));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(s));
  result.count = static_cast<int64_t>(host[0]);
  if (host[1] == ULLONG_MAX) return result;
  result.bad_row = static_cast<int64_t>(host[1]);
  dispatch_index(target_dtype, "cross_entropy (target)", [&](auto tag) {
    using I = decltype(tag);
    I value{};
    FORGE_CUDA_CHECK(cudaMemcpyAsync(&value, static_cast<const I*>(target) + result.bad_row,
                                     sizeof value, cudaMemcpyDeviceToHost, s));
    FORGE_CUDA_CHECK(cudaStreamSynchronize(s));
    result.bad_value = static_cast<int64_t>(value);
  });
  return result;
}

void cross_entropy_forward(DType dtype, DType target_dtype, int device, const void* x,
                           const void* target, void* lse, void* y, int64_t rows, int64_t C,
                           double eps, int64_t ignore_index, bool per_row, double divisor) {
  if (per_row && rows == 0) return;
  DeviceGuard guard(device);
  cudaStream_t s = stream(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "cross_entropy", [&] {
    using A = acc_type;
    dispatch_index(target_dtype, "cross_entropy (target)", [&](auto tag) {
      using I = decltype(tag);
      // Reduced: the per-row losses go to scratch, then one block sums them.
      Scratch losses(device, per_row ? 0 : static_cast<size_t>(rows) * sizeof(A));
      if (rows > 0) {
        launch_rows(rows, C, device, "cross_entropy", [&](auto block, unsigned grid, int threads) {
          cross_entropy_rows_kernel<scalar_t, I, decltype(block)::value><<<grid, threads, 0, s>>>(
              static_cast<const scalar_t*>(x), static_cast<const I*>(target), static_cast<A*>(lse),
              per_row ? static_cast<scalar_t*>(y) : nullptr, losses.as<A>(), rows, C,
              static_cast<A>(eps), ignore_index);
        });
      }
      if (per_row) return;
      sum_to_scalar_kernel<scalar_t><<<1, kSumThreads, 0, s>>>(
          losses.as<A>(), rows, static_cast<scalar_t*>(y), static_cast<A>(divisor));
      FORGE_CUDA_CHECK_LAUNCH("cross_entropy (reduction)");
    });
  });
}

void cross_entropy_backward(DType dtype, DType target_dtype, int device, const void* x,
                            const void* target, const void* lse, const void* g, void* gx,
                            int64_t rows, int64_t C, double eps, int64_t ignore_index, bool per_row,
                            double divisor) {
  if (rows * C == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "cross_entropy backward", [&] {
    using A = acc_type;
    dispatch_index(target_dtype, "cross_entropy backward (target)", [&](auto tag) {
      using I = decltype(tag);
      launch_rows(rows, C, device, "cross_entropy backward",
                  [&](auto block, unsigned grid, int threads) {
                    cross_entropy_backward_rows_kernel<scalar_t, I, decltype(block)::value>
                        <<<grid, threads, 0, stream(device)>>>(
                            static_cast<const scalar_t*>(x), static_cast<const I*>(target),
                            static_cast<const A*>(lse), static_cast<const scalar_t*>(g),
                            static_cast<scalar_t*>(gx), rows, C, static_cast<A>(eps), ignore_index,
                            per_row, static_cast<A>(divisor));
                  });
    });
  });
}

void mse_loss_forward(DType dtype, int device, const void* x, const void* t, void* y, int64_t n,
                      bool per_element, double divisor) {
  if (per_element && n == 0) return;
  DeviceGuard guard(device);
  cudaStream_t s = stream(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "mse_loss", [&] {
    using A = acc_type;
    const auto* xp = static_cast<const scalar_t*>(x);
    const auto* tp = static_cast<const scalar_t*>(t);
    auto* yp = static_cast<scalar_t*>(y);
    if (per_element) {
      squared_error_kernel<scalar_t><<<grid_for(n, device), kThreads, 0, s>>>(xp, tp, yp, n);
      FORGE_CUDA_CHECK_LAUNCH("mse_loss");
      return;
    }
    const unsigned blocks = grid_for(n, device);
    Scratch partial(device, blocks * sizeof(A));
    squared_error_partial_kernel<scalar_t><<<blocks, kThreads, 0, s>>>(xp, tp, partial.as<A>(), n);
    FORGE_CUDA_CHECK_LAUNCH("mse_loss (partial sums)");
    sum_to_scalar_kernel<scalar_t>
        <<<1, kSumThreads, 0, s>>>(partial.as<A>(), blocks, yp, static_cast<A>(divisor));
    FORGE_CUDA_CHECK_LAUNCH("mse_loss (reduction)");
  });
}

void mse_loss_backward(DType dtype, int device, const void* x, const void* t, const void* g,
                       void* gx, void* gt, int64_t n, bool per_element, double divisor) {
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "mse_loss backward", [&] {
    mse_backward_kernel<scalar_t><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(x), static_cast<const scalar_t*>(t),
        static_cast<const scalar_t*>(g), static_cast<scalar_t*>(gx), static_cast<scalar_t*>(gt), n,
        per_element, static_cast<acc_type>(divisor));
    FORGE_CUDA_CHECK_LAUNCH("mse_loss backward");
  });
}

}  // namespace forge::cuda
