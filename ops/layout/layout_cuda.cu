// Layout copies, index gathers and their scatter-adds on the GPU (see
// ops/layout/layout_cuda.h).
//
// Every kernel runs one thread per destination element (per gradient element
// for the scatter-adds), in destination order, so writes are coalesced; a
// permute that moves the last dim reads with a stride. Copies move elements as
// unsigned words of their size, widened up to 16 bytes wherever the innermost
// run is contiguous on both sides and every offset stays aligned (cat, split,
// narrow, pad and row gathers of [.., N, D] tensors), and the strided copy does
// its index arithmetic in 32 bits when every offset fits. The scatter-adds use
// atomicAdd in the compute type, so repeated indices accumulate in an order
// that may vary from run to run (in f32, unlike the CPU's fixed order).
#include <string>
#include <type_traits>

#include "core/cuda_kernels.cuh"
#include "ops/layout/layout_cuda.h"

namespace forge::cuda {
namespace {

// Calls f(std::type_identity<W>{}) with W an unsigned word of `bytes` bytes.
template <typename F>
void with_word(size_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      return f(std::type_identity<uint8_t>{});
    case 2:
      return f(std::type_identity<uint16_t>{});
    case 4:
      return f(std::type_identity<uint32_t>{});
    case 8:
      return f(std::type_identity<uint64_t>{});
    case 16:
      return f(std::type_identity<uint4>{});
    default:
      fail(("layout (CUDA): no copy kernel for elements of " + std::to_string(bytes) + " bytes")
               .c_str());
  }
}

// Calls f(std::type_identity<I>{}) with I the C++ type of an index dtype.
template <typename F>
void with_index(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::i32:
      return f(std::type_identity<int32_t>{});
    case DType::i64:
      return f(std::type_identity<int64_t>{});
    default:
      fail_dtype(op, dtype);
  }
}

// The widest word (at most 16 bytes) that divides both addresses and
// esize * c for every element count c, or esize when none wider does.
size_t widest_word(size_t esize, const std::vector<int64_t>& counts, const void* a, const void* b) {
  for (size_t w = 16; w > esize; w /= 2) {
    bool ok = reinterpret_cast<uintptr_t>(a) % w == 0 && reinterpret_cast<uintptr_t>(b) % w == 0;
    for (int64_t c : counts) ok = ok && static_cast<size_t>(c) * esize % w == 0;
    if (ok) return w;
  }
  return esize;
}

// ---- strided copy ----

// The merged dims of a copy, innermost first; I is the offset type.
template <typename I>
struct CopyGeometry {
  int nd;
  I size[kMaxLayoutDims], src[kMaxLayoutDims], dst[kMaxLayoutDims];
};

template <typename W, typename I>
__global__ void strided_copy_kernel(const W* __restrict__ src, W* __restrict__ dst,
                                    CopyGeometry<I> g, I n) {
  for (I e = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<I>(gridDim.x) * blockDim.x) {
    I rem = e, s = 0, d = 0;
#pragma unroll
    for (int k = 0; k < kMaxLayoutDims; ++k) {
      if (k == g.nd) break;
      const I c = rem % g.size[k];
      rem /= g.size[k];
      s += c * g.src[k];
      d += c * g.dst[k];
    }
    dst[d] = src[s];
  }
}

template <typename W, typename I>
void launch_strided_copy(int device, const std::vector<int64_t>& n, const void* src,
                         const std::vector<int64_t>& ss, void* dst, const std::vector<int64_t>& ds,
                         int64_t total) {
  CopyGeometry<I> g{};
  g.nd = static_cast<int>(n.size());
  for (int k = 0; k < g.nd; ++k) {
    const auto from_outer = n.size() - 1 - static_cast<size_t>(k);
    g.size[k] = static_cast<I>(n[from_outer]);
    g.src[k] = static_cast<I>(ss[from_outer]);
    g.dst[k] = static_cast<I>(ds[from_outer]);
  }
  strided_copy_kernel<<<grid_for(total, device), kThreads, 0, stream(device)>>>(
      static_cast<const W*>(src), static_cast<W*>(dst), g, static_cast<I>(total));
  FORGE_CUDA_CHECK_LAUNCH("strided_copy");
}

// ---- index checks, gathers and scatter-adds ----

template <typename Ix>
__global__ void find_bad_index_kernel(const Ix* index, int64_t count, int64_t n,
                                      unsigned long long* bad) {
  FORGE_GRID_STRIDE(p, count) {
    const auto v = static_cast<int64_t>(index[p]);
    if (v < 0 || v >= n) atomicMin(bad, static_cast<unsigned long long>(p));
  }
}

// Element e = (o, j, k) of out (outer, J, inner).
template <typename W, typename Ix>
__global__ void index_rows_kernel(const W* x, const Ix* index, W* out, int64_t outer, int64_t n,
                                  int64_t J, int64_t inner) {
  FORGE_GRID_STRIDE(e, outer * J * inner) {
    const int64_t row = e / inner, o = row / J, j = row % J;
    const auto v = static_cast<int64_t>(index[j]);
    if (v < 0 || v >= n) continue;
    out[e] = x[(o * n + v) * inner + e % inner];
  }
}

// Element e = (o, j, k) of g (outer, J, inner).
template <typename T, typename Ix>
__global__ void index_rows_backward_kernel(const T* g, const Ix* index, acc_t<T>* gx, int64_t outer,
                                           int64_t n, int64_t J, int64_t inner, int64_t skip) {
  FORGE_GRID_STRIDE(e, outer * J * inner) {
    const int64_t row = e / inner, o = row / J, j = row % J;
    const auto v = static_cast<int64_t>(index[j]);
    if (v < 0 || v >= n || v == skip) continue;
    atomicAdd(gx + (o * n + v) * inner + e % inner, to_acc<acc_t<T>>(g[e]));
  }
}

// The index's shape and x's strides, for gather.
struct GatherGeometry {
  int nd, dim;
  int64_t size[kMaxLayoutDims], x_stride[kMaxLayoutDims];
};

// x's offset for element e of the index, whose value there is v.
__device__ __forceinline__ int64_t gather_offset(const GatherGeometry& g, int64_t e, int64_t v) {
  int64_t rem = e, off = 0;
  for (int k = g.nd - 1; k >= 0; --k) {
    const int64_t c = rem % g.size[k];
    rem /= g.size[k];
    off += (k == g.dim ? v : c) * g.x_stride[k];
  }
  return off;
}

template <typename W, typename Ix>
__global__ void gather_kernel(const W* x, const Ix* index, W* out, GatherGeometry g, int64_t total,
                              int64_t n) {
  FORGE_GRID_STRIDE(e, total) {
    const auto v = static_cast<int64_t>(index[e]);
    if (v < 0 || v >= n) continue;
    out[e] = x[gather_offset(g, e, v)];
  }
}

template <typename T, typename Ix>
__global__ void gather_backward_kernel(const T* g, const Ix* index, acc_t<T>* gx,
                                       GatherGeometry geo, int64_t total, int64_t n) {
  FORGE_GRID_STRIDE(e, total) {
    const auto v = static_cast<int64_t>(index[e]);
    if (v < 0 || v >= n) continue;
    atomicAdd(gx + gather_offset(geo, e, v), to_acc<acc_t<T>>(g[e]));
  }
}

GatherGeometry gather_geometry(const std::vector<int64_t>& index_shape,
                               const std::vector<int64_t>& x_strides, int64_t dim) {
  GatherGeometry g{};
  g.nd = static_cast<int>(index_shape.size());
  g.dim = static_cast<int>(dim);
  if (g.nd > kMaxLayoutDims) {
    fail(("gather (CUDA): the index has " + std::to_string(g.nd) + " dims; at most " +
          std::to_string(kMaxLayoutDims) + " are supported")
             .c_str());
  }
  for (int k = 0; k < g.nd; ++k) {
    g.size[k] = index_shape[static_cast<size_t>(k)];
    g.x_stride[k] = x_strides[static_cast<size_t>(k)];
  }
  return g;
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

}  // namespace

void strided_copy(int device, size_t esize, const std::vector<int64_t>& sizes, const void* src,
                  const std::vector<int64_t>& src_strides, void* dst,
                  const std::vector<int64_t>& dst_strides) {
  // The dims come merged by the caller (layout.cpp's merge_dims); the word
  // widening below rescales copies of them.
  std::vector<int64_t> n = sizes, ss = src_strides, ds = dst_strides;
  if (n.size() > static_cast<size_t>(kMaxLayoutDims)) {
    fail(("layout (CUDA): a copy over " + std::to_string(n.size()) +
          " dims that do not merge; at most " + std::to_string(kMaxLayoutDims) + " are supported")
             .c_str());
  }
  // A contiguous innermost run moves in words of up to 16 bytes when every
  // other offset stays a whole number of them.
  if (ss.back() == 1 && ds.back() == 1) {
    std::vector<int64_t> counts{n.back()};
    counts.insert(counts.end(), ss.begin(), ss.end() - 1);
    counts.insert(counts.end(), ds.begin(), ds.end() - 1);
    const size_t w = widest_word(esize, counts, src, dst);
    const auto f = static_cast<int64_t>(w / esize);
    n.back() /= f;
    for (size_t k = 0; k + 1 < n.size(); ++k) {
      ss[k] /= f;
      ds[k] /= f;
    }
    esize = w;
  }
  const int64_t total = product(n);
  int64_t last_src = 0, last_dst = 0;  // the largest offsets
  for (size_t k = 0; k < n.size(); ++k) {
    last_src += (n[k] - 1) * ss[k];
    last_dst += (n[k] - 1) * ds[k];
  }
  constexpr int64_t k32 = int64_t{1} << 31;
  const bool narrow = total < k32 && last_src < k32 && last_dst < k32;
  DeviceGuard guard(device);
  with_word(esize, [&](auto word) {
    using W = typename decltype(word)::type;
    if (narrow) {
      launch_strided_copy<W, uint32_t>(device, n, src, ss, dst, ds, total);
    } else {
      launch_strided_copy<W, int64_t>(device, n, src, ss, dst, ds, total);
    }
  });
}

void find_bad_index(DType index_dtype, int device, const void* index, int64_t count, int64_t n,
                    int64_t* bad) {
  if (count == 0) return;
  DeviceGuard guard(device);
  with_index(index_dtype, "index check", [&](auto ix) {
    using Ix = typename decltype(ix)::type;
    find_bad_index_kernel<<<grid_for(count, device), kThreads, 0, stream(device)>>>(
        static_cast<const Ix*>(index), count, n, reinterpret_cast<unsigned long long*>(bad));
    FORGE_CUDA_CHECK_LAUNCH("find_bad_index");
  });
}

void index_rows(DType index_dtype, int device, size_t esize, const void* x, const void* index,
                void* out, int64_t outer, int64_t n, int64_t J, int64_t inner) {
  if (outer * J * inner == 0) return;
  // Rows of inner elements move as rows of wider words when they divide evenly.
  const size_t w = widest_word(esize, {inner}, x, out);
  inner = inner * static_cast<int64_t>(esize) / static_cast<int64_t>(w);
  const int64_t total = outer * J * inner;
  DeviceGuard guard(device);
  with_index(index_dtype, "index_select", [&](auto ix) {
    using Ix = typename decltype(ix)::type;
    with_word(w, [&](auto word) {
      using W = typename decltype(word)::type;
      index_rows_kernel<<<grid_for(total, device), kThreads, 0, stream(device)>>>(
          static_cast<const W*>(x), static_cast<const Ix*>(index), static_cast<W*>(out), outer, n,
          J, inner);
      FORGE_CUDA_CHECK_LAUNCH("index_rows");
    });
  });
}

void index_rows_backward(DType dtype, DType index_dtype, int device, const void* g,
                         const void* index, void* gx, int64_t outer, int64_t n, int64_t J,
                         int64_t inner, int64_t skip) {
  const int64_t total = outer * J * inner;
  if (total == 0) return;
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "index_select backward", [&] {
    with_index(index_dtype, "index_select backward", [&](auto ix) {
      using Ix = typename decltype(ix)::type;
      index_rows_backward_kernel<<<grid_for(total, device), kThreads, 0, stream(device)>>>(
          static_cast<const scalar_t*>(g), static_cast<const Ix*>(index),
          static_cast<acc_type*>(gx), outer, n, J, inner, skip);
      FORGE_CUDA_CHECK_LAUNCH("index_rows_backward");
    });
  });
}

void gather(DType index_dtype, int device, size_t esize, const void* x, const void* index,
            void* out, const std::vector<int64_t>& index_shape,
            const std::vector<int64_t>& x_strides, int64_t dim, int64_t n) {
  const int64_t total = product(index_shape);
  if (total == 0) return;
  const GatherGeometry geo = gather_geometry(index_shape, x_strides, dim);
  DeviceGuard guard(device);
  with_index(index_dtype, "gather", [&](auto ix) {
    using Ix = typename decltype(ix)::type;
    with_word(esize, [&](auto word) {
      using W = typename decltype(word)::type;
      gather_kernel<<<grid_for(total, device), kThreads, 0, stream(device)>>>(
          static_cast<const W*>(x), static_cast<const Ix*>(index), static_cast<W*>(out), geo, total,
          n);
      FORGE_CUDA_CHECK_LAUNCH("gather");
    });
  });
}

void gather_backward(DType dtype, DType index_dtype, int device, const void* g, const void* index,
                     void* gx, const std::vector<int64_t>& index_shape,
                     const std::vector<int64_t>& x_strides, int64_t dim, int64_t n) {
  const int64_t total = product(index_shape);
  if (total == 0) return;
  const GatherGeometry geo = gather_geometry(index_shape, x_strides, dim);
  DeviceGuard guard(device);
  FORGE_CUDA_DISPATCH_FLOAT(dtype, "gather backward", [&] {
    with_index(index_dtype, "gather backward", [&](auto ix) {
      using Ix = typename decltype(ix)::type;
      gather_backward_kernel<<<grid_for(total, device), kThreads, 0, stream(device)>>>(
          static_cast<const scalar_t*>(g), static_cast<const Ix*>(index),
          static_cast<acc_type*>(gx), geo, total, n);
      FORGE_CUDA_CHECK_LAUNCH("gather_backward");
    });
  });
}

}  // namespace forge::cuda
