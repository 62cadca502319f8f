// Reductions and cumsum on the GPU (see ops/reduce/reduce_cuda.h).
//
// One kernel serves sum, max and logsumexp. An op supplies the State a partial
// reduction carries, its identity, how an element becomes a State, how two
// States combine, and how the final State is stored. A block of (bx, by)
// threads owns bx adjacent columns i of one outer row o: bx is inner rounded up
// to a power of two, at most 32, so each warp reads whole contiguous stretches
// of x (inner == 1 gives a 1 x 256 block walking along r); its by rows of
// threads stride over r, and a tree in shared memory combines them in a fixed
// order. When there are too few (o, column tile) groups to fill the GPU (a
// full reduction, say), r is split into chunks that separate blocks reduce into
// a scratch buffer of States, and a second launch of the same kernel combines
// the chunks.
#include <type_traits>

#include "core/allocator.h"
#include "core/cuda_kernels.cuh"
#include "ops/reduce/reduce_cuda.h"

namespace forge::cuda {
namespace {

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// ---- the ops ----

template <typename T>
struct SumOp {
  using Elem = T;
  using A = acc_t<T>;
  using State = A;
  T* y;
  A scale;
  __device__ static State identity() { return A(0); }
  __device__ static State element(A v, int64_t) { return v; }
  __device__ static State combine(State a, State b) { return a + b; }
  __device__ void store(int64_t k, State s) const { y[k] = from_acc<T>(s * scale); }
};

template <typename A>
struct MaxState {
  A v;
  int64_t r;  // where v was found
};

// The larger value wins, NaN above everything, and of two equals the smaller
// r: the CPU's "first maximum, or first NaN", whatever the combination order.
template <typename T>
struct MaxOp {
  using Elem = T;
  using A = acc_t<T>;
  using State = MaxState<A>;
  T* y;
  int64_t* arg;  // may be null
  __device__ static State identity() { return {-INFINITY, INT64_MAX}; }
  __device__ static State element(A v, int64_t r) { return {v, r}; }
  __device__ static State combine(State a, State b) {
    const bool a_nan = isnan(a.v), b_nan = isnan(b.v);
    const bool b_wins =
        a_nan || b_nan ? b_nan && (!a_nan || b.r < a.r) : b.v > a.v || (b.v == a.v && b.r < a.r);
    return b_wins ? b : a;
  }
  __device__ void store(int64_t k, State s) const {
    y[k] = from_acc<T>(s.v);
    if (arg) arg[k] = s.r;
  }
};

template <typename A>
struct LseState {
  A m;    // the largest element so far (NaN ignored)
  A sum;  // sum of exp(x - m) over the elements so far
};

// Online logsumexp: combining rescales each side's sum to the larger maximum.
// A side already at that maximum keeps its sum unscaled, so infinite maxima
// never meet inf - inf (all -inf gives -inf, any +inf gives +inf, as on the
// CPU); a NaN element makes its sum NaN, and so the result.
template <typename T>
struct LseOp {
  using Elem = T;
  using A = acc_t<T>;
  using State = LseState<A>;
  T* y;
  __device__ static State identity() { return {-INFINITY, A(0)}; }
  __device__ static State element(A v, int64_t) { return {v, A(1)}; }
  __device__ static State combine(State a, State b) {
    const A m = fmax(a.m, b.m);
    const A sa = a.m == m ? a.sum : a.sum * exp(a.m - m);
    const A sb = b.m == m ? b.sum : b.sum * exp(b.m - m);
    return {m, sa + sb};
  }
  __device__ void store(int64_t k, State s) const { y[k] = from_acc<T>(s.m + log(s.sum)); }
};

// ---- the reduction kernel ----

// What a launch reads and writes: elements to outputs (whole), elements to one
// State per chunk (chunks), or those States to outputs (merge).
enum class Pass { whole, chunks, merge };

// `in` is (outer, R, inner) of Op::Elem, or of Op::State in the merge pass.
// Work item w is (o, column tile, chunk s); chunk s covers r in
// [s * chunk, min(R, (s + 1) * chunk)), and chunk States go to partial
// (outer, splits, inner).
template <typename Op, Pass P>
__global__ void reduce_kernel(Op op, const void* in, typename Op::State* partial, int64_t outer,
                              int64_t R, int64_t inner, int64_t splits, int64_t chunk) {
  using State = typename Op::State;
  using In = std::conditional_t<P == Pass::merge, State, typename Op::Elem>;
  __shared__ State buf[kThreads];
  const In* x = static_cast<const In*>(in);
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x;
  const int64_t tiles = ceil_div(inner, bx), work = outer * tiles * splits;
  for (int64_t w = blockIdx.x; w < work; w += gridDim.x) {
    const int64_t s = w % splits, t = w / splits;
    const int64_t o = t / tiles, i = (t % tiles) * bx + tx;
    const int64_t r_end = (s + 1) * chunk < R ? (s + 1) * chunk : R;
    State st = Op::identity();
    if (i < inner) {
      for (int64_t r = s * chunk + ty; r < r_end; r += blockDim.y) {
        const int64_t at = (o * R + r) * inner + i;
        if constexpr (P == Pass::merge) {
          st = Op::combine(st, x[at]);
        } else {
          st = Op::combine(st, Op::element(to_acc<typename Op::A>(x[at]), r));
        }
      }
    }
    buf[ty * bx + tx] = st;
    __syncthreads();
    for (int h = blockDim.y / 2; h > 0; h /= 2) {
      if (ty < h) buf[ty * bx + tx] = Op::combine(buf[ty * bx + tx], buf[(ty + h) * bx + tx]);
      __syncthreads();
    }
    if (ty == 0 && i < inner) {
      if constexpr (P == Pass::chunks) {
        partial[(o * splits + s) * inner + i] = buf[tx];
      } else {
        op.store(o * inner + i, buf[tx]);
      }
    }
    __syncthreads();  // buf is rewritten by the next work item
  }
}

// A split must leave each thread at least this many rows of r.
constexpr int64_t kMinRowsPerThread = 16;

template <typename Op>
void run_reduce(const Op& op, const void* x, int64_t outer, int64_t R, int64_t inner, int device,
                const char* name) {
  using State = typename Op::State;
  if (outer * inner == 0) return;
  DeviceGuard guard(device);
  int bx = 1;
  while (bx < inner && bx < kWarp) bx *= 2;
  const dim3 block(bx, kThreads / bx);
  const int64_t groups = outer * ceil_div(inner, bx);
  const int64_t fill = 4 * static_cast<int64_t>(multiprocessor_count(device));
  const auto grid = [&](int64_t work) { return static_cast<unsigned>(std::min(work, 2 * fill)); };
  const int64_t splits =
      groups >= fill ? 1
                     : std::min(ceil_div(fill, groups), ceil_div(R, kMinRowsPerThread * block.y));
  cudaStream_t s = stream(device);
  if (splits <= 1) {
    reduce_kernel<Op, Pass::whole>
        <<<grid(groups), block, 0, s>>>(op, x, nullptr, outer, R, inner, 1, R);
    FORGE_CUDA_CHECK_LAUNCH(name);
    return;
  }
  const int64_t chunk = ceil_div(R, splits), chunks = ceil_div(R, chunk);  // none empty
  Scratch partial(device, sizeof(State) * static_cast<size_t>(outer * chunks * inner));
  auto* p = static_cast<State*>(partial.get());
  reduce_kernel<Op, Pass::chunks>
      <<<grid(groups * chunks), block, 0, s>>>(op, x, p, outer, R, inner, chunks, chunk);
  FORGE_CUDA_CHECK_LAUNCH(name);
  reduce_kernel<Op, Pass::merge>
      <<<grid(groups), block, 0, s>>>(op, p, nullptr, outer, chunks, inner, 1, chunks);
  FORGE_CUDA_CHECK_LAUNCH(name);
}

// ---- backward kernels: one thread per element e = (o, r, i) of gx ----

template <typename T>
__global__ void sum_backward_kernel(const T* g, T* gx, int64_t n, int64_t R, int64_t inner,
                                    acc_t<T> scale) {
  FORGE_GRID_STRIDE(e, n) {
    const int64_t k = e / (R * inner) * inner + e % inner;  // (o, i)
    gx[e] = from_acc<T>(to_acc<acc_t<T>>(g[k]) * scale);
  }
}

template <typename T>
__global__ void max_backward_kernel(const T* g, const int64_t* arg, T* gx, int64_t n, int64_t R,
                                    int64_t inner) {
  FORGE_GRID_STRIDE(e, n) {
    const int64_t k = e / (R * inner) * inner + e % inner, r = e / inner % R;
    gx[e] = r == arg[k] ? g[k] : from_acc<T>(acc_t<T>(0));
  }
}

template <typename T>
__global__ void logsumexp_backward_kernel(const T* x, const T* y, const T* g, T* gx, int64_t n,
                                          int64_t R, int64_t inner) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(e, n) {
    const int64_t k = e / (R * inner) * inner + e % inner;
    gx[e] = from_acc<T>(to_acc<A>(g[k]) * exp(to_acc<A>(x[e]) - to_acc<A>(y[k])));
  }
}

// A sequential scan per (o, i) line, one thread each: simple, and coalesced
// when inner > 1; along the last dim (inner == 1) the reads stride by R.
template <typename T>
__global__ void cumsum_kernel(const T* x, T* y, int64_t lines, int64_t R, int64_t inner,
                              bool reverse) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(l, lines) {
    const int64_t base = l / inner * R * inner + l % inner;
    A acc = 0;
    for (int64_t k = 0; k < R; ++k) {
      const int64_t at = base + (reverse ? R - 1 - k : k) * inner;
      acc += to_acc<A>(x[at]);
      y[at] = from_acc<T>(acc);
    }
  }
}

}  // namespace

void reduce_sum(DType dtype, int device, const void* x, void* y, int64_t outer, int64_t R,
                int64_t inner, double scale) {
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "sum", [&] {
    const SumOp<scalar_t> op{static_cast<scalar_t*>(y), static_cast<acc_type>(scale)};
    run_reduce(op, x, outer, R, inner, device, "sum");
  });
}

void reduce_sum_backward(DType dtype, int device, const void* g, void* gx, int64_t outer, int64_t R,
                         int64_t inner, double scale) {
  const int64_t n = outer * R * inner;
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "sum backward", [&] {
    sum_backward_kernel<<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(g), static_cast<scalar_t*>(gx), n, R, inner,
        static_cast<acc_type>(scale));
    FORGE_CUDA_CHECK_LAUNCH("sum backward");
  });
}

void reduce_max(DType dtype, int device, const void* x, void* y, int64_t* arg, int64_t outer,
                int64_t R, int64_t inner) {
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "max", [&] {
    const MaxOp<scalar_t> op{static_cast<scalar_t*>(y), arg};
    run_reduce(op, x, outer, R, inner, device, "max");
  });
}

void reduce_max_backward(DType dtype, int device, const void* g, const int64_t* arg, void* gx,
                         int64_t outer, int64_t R, int64_t inner) {
  const int64_t n = outer * R * inner;
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "max backward", [&] {
    max_backward_kernel<<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(g), arg, static_cast<scalar_t*>(gx), n, R, inner);
    FORGE_CUDA_CHECK_LAUNCH("max backward");
  });
}

void logsumexp(DType dtype, int device, const void* x, void* y, int64_t outer, int64_t R,
               int64_t inner) {
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "logsumexp", [&] {
    const LseOp<scalar_t> op{static_cast<scalar_t*>(y)};
    run_reduce(op, x, outer, R, inner, device, "logsumexp");
  });
}

void logsumexp_backward(DType dtype, int device, const void* x, const void* y, const void* g,
                        void* gx, int64_t outer, int64_t R, int64_t inner) {
  const int64_t n = outer * R * inner;
  if (n == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "logsumexp backward", [&] {
    logsumexp_backward_kernel<<<grid_for(n, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(x), static_cast<const scalar_t*>(y),
        static_cast<const scalar_t*>(g), static_cast<scalar_t*>(gx), n, R, inner);
    FORGE_CUDA_CHECK_LAUNCH("logsumexp backward");
  });
}

void cumsum(DType dtype, int device, const void* x, void* y, int64_t outer, int64_t R,
            int64_t inner, bool reverse) {
  const int64_t lines = outer * inner;
  if (lines * R == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "cumsum", [&] {
    cumsum_kernel<<<grid_for(lines, device), kThreads, 0, stream(device)>>>(
        static_cast<const scalar_t*>(x), static_cast<scalar_t*>(y), lines, R, inner, reverse);
    FORGE_CUDA_CHECK_LAUNCH("cumsum");
  });
}

}  // namespace forge::cuda
