// Layout ops on contiguous row-major tensors. reshape and its kin, and narrow of
// dim 0, are free views; every other op writes a new tensor through one
// strided-copy kernel whose innermost loop is a memcpy wherever the source and
// destination are both contiguous. Copies move elements as raw bytes of the
// dtype's size, so they serve every dtype; backwards compute on floating
// gradients only. The index ops (index_select, gather, embedding) are row or
// element gathers whose backward is a scatter-add into zeros. CUDA tensors take
// the same boxes and index maps to the kernels of layout_cuda.cu.
#include "ops/layout/layout.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/layout/layout_cuda.h"

namespace forge::ops {
namespace {

using Strides = std::vector<int64_t>;
using Grads = std::vector<Tensor>;

Strides contiguous_strides(const Shape& shape) {
  Strides s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

// Product of shape[begin, end).
int64_t numel_between(const Shape& shape, int64_t begin, int64_t end) {
  int64_t n = 1;
  for (int64_t d = begin; d < end; ++d) n *= shape[static_cast<size_t>(d)];
  return n;
}

char* bytes(const Tensor& t) {
  return static_cast<char*>(t.raw_data());
}

// Calls f(std::integral_constant<size_t, S>) with S = esize: copies move
// elements as S opaque bytes, so one instantiation per size serves all dtypes.
template <typename F>
void with_element_size(size_t esize, F&& f) {
  switch (esize) {
    case 1:
      return f(std::integral_constant<size_t, 1>{});
    case 2:
      return f(std::integral_constant<size_t, 2>{});
    case 4:
      return f(std::integral_constant<size_t, 4>{});
    case 8:
      return f(std::integral_constant<size_t, 8>{});
    default:
      FORGE_FAIL("layout: no copy kernel for elements of {} bytes", esize);
  }
}

// The dims of a strided copy with size-1 dims dropped and neighbouring dims
// that are contiguous in both src and dst merged (so a block copy becomes a
// few long runs); empty when a size is 0, one dim of 1 for a single element.
struct MergedDims {
  Shape n;
  Strides ss, ds;
};

MergedDims merge_dims(const Shape& sizes, const Strides& src_strides, const Strides& dst_strides) {
  MergedDims m;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] == 0) return {};
    if (sizes[k] == 1) continue;
    if (!m.n.empty() && m.ss.back() == src_strides[k] * sizes[k] &&
        m.ds.back() == dst_strides[k] * sizes[k]) {
      m.n.back() *= sizes[k];
      m.ss.back() = src_strides[k];
      m.ds.back() = dst_strides[k];
    } else {
      m.n.push_back(sizes[k]);
      m.ss.push_back(src_strides[k]);
      m.ds.push_back(dst_strides[k]);
    }
  }
  if (m.n.empty()) m = {{1}, {1}, {1}};
  return m;
}

// dst[i] = src[i] for every multi-index i of the merged dims, where element i
// lies sum_k i_k * strides[k] elements past each base: long memcpy runs where
// the last dim is contiguous in both; a permute that moves the last dim keeps
// an element loop (reads strided, writes sequential).
void strided_copy(const MergedDims& m, const char* src, char* dst, size_t esize) {
  const Shape& n = m.n;
  const Strides &ss = m.ss, &ds = m.ds;
  // The last merged dim is the inner loop; the rest form `rows` walked by an odometer.
  const int64_t outer_dims = static_cast<int64_t>(n.size()) - 1;
  const int64_t inner = n.back(), inner_src = ss.back(), inner_dst = ds.back();
  const bool run = inner_src == 1 && inner_dst == 1;
  const int64_t rows = numel_between(n, 0, outer_dims);
  with_element_size(esize, [&](auto size_tag) {
    constexpr size_t S = decltype(size_tag)::value;
    parallel_for(rows, inner * static_cast<int64_t>(S), [&](int64_t begin, int64_t end) {
      std::vector<int64_t> idx(static_cast<size_t>(outer_dims));
      int64_t so = 0, dof = 0, r = begin;
      for (int64_t k = outer_dims - 1; k >= 0; --k) {
        const auto uk = static_cast<size_t>(k);
        idx[uk] = r % n[uk];
        r /= n[uk];
        so += idx[uk] * ss[uk];
        dof += idx[uk] * ds[uk];
      }
      for (int64_t row = begin; row < end; ++row) {
        const char* s = src + so * static_cast<int64_t>(S);
        char* d = dst + dof * static_cast<int64_t>(S);
        if (run) {
          std::memcpy(d, s, static_cast<size_t>(inner) * S);
        } else {
          for (int64_t i = 0; i < inner; ++i) {
            std::memcpy(d + i * inner_dst * static_cast<int64_t>(S),
                        s + i * inner_src * static_cast<int64_t>(S), S);
          }
        }
        for (int64_t k = outer_dims - 1; k >= 0; --k) {
          const auto uk = static_cast<size_t>(k);
          so += ss[uk];
          dof += ds[uk];
          if (++idx[uk] < n[uk]) break;
          so -= n[uk] * ss[uk];
          dof -= n[uk] * ds[uk];
          idx[uk] = 0;
        }
      }
    });
  });
}

// strided_copy between two tensors of one device, starting src_off / dst_off
// elements into them; on the GPU for CUDA tensors.
void copy_strided(const Shape& sizes, const Tensor& src, int64_t src_off, const Strides& ss,
                  const Tensor& dst, int64_t dst_off, const Strides& ds) {
  const auto esize = static_cast<int64_t>(dtype_size(src.dtype()));
  const MergedDims m = merge_dims(sizes, ss, ds);
  if (m.n.empty()) return;  // nothing to copy
  FORGE_IF_CUDA(dst) {
    return cuda::strided_copy(dst.device().index, static_cast<size_t>(esize), m.n,
                              static_cast<const char*>(src.raw_device_data()) + src_off * esize,
                              m.ss, static_cast<char*>(dst.raw_device_data()) + dst_off * esize,
                              m.ds);
  }
  strided_copy(m, bytes(src) + src_off * esize, bytes(dst) + dst_off * esize,
               static_cast<size_t>(esize));
}

// One side of a box copy: the box's first element and the step along each dim
// of a contiguous tensor.
struct Window {
  Shape start, step;
};

Window whole(size_t ndim) {
  return {Shape(ndim, 0), Shape(ndim, 1)};
}

Window along(size_t ndim, int64_t dim, int64_t start, int64_t step = 1) {
  Window w = whole(ndim);
  w.start[static_cast<size_t>(dim)] = start;
  w.step[static_cast<size_t>(dim)] = step;
  return w;
}

// Copies an `extent`-shaped box from src's window into dst's window (both
// contiguous, same dtype, same rank).
void copy_box(const Tensor& src, const Window& from, const Tensor& dst, const Window& to,
              const Shape& extent) {
  if (shape_numel(extent) == 0) return;
  const Strides sc = contiguous_strides(src.shape()), dc = contiguous_strides(dst.shape());
  Strides ss(extent.size()), ds(extent.size());
  int64_t so = 0, dof = 0;
  for (size_t k = 0; k < extent.size(); ++k) {
    so += from.start[k] * sc[k];
    dof += to.start[k] * dc[k];
    ss[k] = from.step[k] * sc[k];
    ds[k] = to.step[k] * dc[k];
  }
  copy_strided(extent, src, so, ss, dst, dof, ds);
}

// x[..., start : start + count * step : step, ...] along dim, as a new tensor.
Tensor take_window(const Tensor& x, int64_t dim, int64_t start, int64_t step, int64_t count) {
  Shape shape = x.shape();
  shape[static_cast<size_t>(dim)] = count;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  copy_box(x, along(shape.size(), dim, start, step), out, whole(shape.size()), shape);
  return out;
}

// The reverse of take_window for gradients: zeros of `shape` with g written
// into the window it was taken from.
Tensor put_window(const Tensor& g, const Shape& shape, int64_t dim, int64_t start, int64_t step) {
  Tensor out = Tensor::zeros(shape, g.dtype(), g.device());
  copy_box(g, whole(shape.size()), out, along(shape.size(), dim, start, step), g.shape());
  return out;
}

// x laid out as out[i] = x[perm[i]] dims, as a new contiguous tensor.
Tensor permute_copy(const Tensor& x, const std::vector<int64_t>& perm) {
  const Strides xs = contiguous_strides(x.shape());
  Shape shape(perm.size());
  Strides src_strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    shape[i] = x.shape()[static_cast<size_t>(perm[i])];
    src_strides[i] = xs[static_cast<size_t>(perm[i])];
  }
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  if (out.numel() > 0) copy_strided(shape, x, 0, src_strides, out, 0, contiguous_strides(shape));
  return out;
}

// "[1, 2]": the multi-index of flat position `flat` in `shape`, for errors.
std::string position_str(int64_t flat, const Shape& shape) {
  Shape pos(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    pos[k] = flat % shape[k];
    flat /= shape[k];
  }
  return shape_str(pos);
}

// The error for value v at flat position `at` of the index, outside [0, n).
[[noreturn]] void fail_index(const char* op, int64_t v, int64_t at, const Tensor& index,
                             int64_t dim, int64_t n) {
  FORGE_FAIL(
      "{}: index {} at position {} of the index (shape {}) is out of range for dim {} of size {} "
      "(valid range [0, {}))",
      op, v, position_str(at, index.shape()), shape_str(index.shape()), dim, n, n);
}

// The index tensor (i32 or i64) as int64, each value checked to lie in [0, n):
// the check runs here, before any parallel kernel, so a bad index is a clean error.
std::vector<int64_t> read_indices(const Tensor& index, int64_t n, const char* op, int64_t dim) {
  std::vector<int64_t> out(static_cast<size_t>(index.numel()));
  FORGE_DISPATCH_INDEX(index.dtype(), op, [&] {
    const index_t* p = index.data<index_t>();
    for (size_t i = 0; i < out.size(); ++i) {
      const auto v = static_cast<int64_t>(p[i]);
      if (v < 0 || v >= n) fail_index(op, v, static_cast<int64_t>(i), index, dim, n);
      out[i] = v;
    }
  });
  return out;
}

// read_indices' check for an index on a GPU, with the same error: a kernel
// finds the first bad position, and reading its verdict back waits for the GPU.
void check_indices_gpu(const Tensor& index, int64_t n, const char* op, int64_t dim) {
  FORGE_IF_CUDA(index) {
    FORGE_CHECK(index.dtype() == DType::i32 || index.dtype() == DType::i64,
                "{}: expected an i32 or i64 index tensor, got {}", op, dtype_name(index.dtype()));
    if (index.numel() == 0) return;
    const Tensor bad = Tensor::full({1}, -1, DType::i64, index.device());
    cuda::find_bad_index(index.dtype(), index.device().index, index.raw_device_data(),
                         index.numel(), n, static_cast<int64_t*>(bad.raw_device_data()));
    const int64_t at = bad.to_vector<int64_t>()[0];
    if (at < 0) return;
    fail_index(op, index.view({-1}).slice0(at, at + 1).to_vector<int64_t>()[0], at, index, dim, n);
  }
}

// An op's two tensors must share a device.
void check_same_device(const char* op, const Tensor& a, const char* a_name, const Tensor& b,
                       const char* b_name) {
  FORGE_CHECK(a.device() == b.device(),
              "{}: {} is on {} but {} is on {}; both must be on one device", op, b_name,
              b.device().str(), a_name, a.device().str());
}

// The dtype scatter-adds accumulate in on the GPU: f64 for f64, else f32.
DType compute_dtype(DType dtype) {
  return dtype == DType::f64 ? DType::f64 : DType::f32;
}

// x viewed as (outer, n, inner) -> out (outer, J, inner) with out[o][j] = x[o][idx[j]]:
// each (o, j) row is one memcpy of inner elements.
void gather_rows(const Tensor& x, const std::vector<int64_t>& idx, int64_t outer, int64_t n,
                 int64_t inner, const Tensor& out) {
  const auto J = static_cast<int64_t>(idx.size());
  const auto row = inner * static_cast<int64_t>(dtype_size(x.dtype()));
  if (outer * J * row == 0) return;
  const char* src = bytes(x);
  char* dst = bytes(out);
  parallel_for(outer * J, row, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t o = r / J, j = r % J;
      std::memcpy(dst + r * row, src + (o * n + idx[static_cast<size_t>(j)]) * row,
                  static_cast<size_t>(row));
    }
  });
}

// The backward of gather_rows: zeros (outer, n, inner) += g (outer, J, inner)
// scattered along the middle dim, skipping j where idx[j] == skip. Threads
// split the (o, k) columns and each column belongs to one thread, so repeated
// indices accumulate without races and in a fixed order.
Tensor scatter_add_rows(const Tensor& g, const std::vector<int64_t>& idx, const Shape& shape,
                        int64_t outer, int64_t n, int64_t inner, int64_t skip) {
  Tensor out = Tensor::zeros(shape, g.dtype());
  const auto J = static_cast<int64_t>(idx.size());
  FORGE_DISPATCH_FLOAT(g.dtype(), "scatter_add_rows", [&] {
    const scalar_t* gp = g.data<scalar_t>();
    scalar_t* op = out.data<scalar_t>();
    parallel_for(outer * inner, J, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin / inner; o * inner < end; ++o) {
        const int64_t kb = std::max(begin, o * inner) - o * inner;
        const int64_t ke = std::min(end, (o + 1) * inner) - o * inner;
        for (int64_t j = 0; j < J; ++j) {
          const int64_t i = idx[static_cast<size_t>(j)];
          if (i == skip) continue;
          scalar_t* d = op + (o * n + i) * inner;
          const scalar_t* s = gp + (o * J + j) * inner;
          for (int64_t k = kb; k < ke; ++k) d[k] += s[k];
        }
      }
    });
  });
  return out;
}

// gather_rows with the index checked, on x's device.
void select_rows(const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                 const Tensor& out, const char* op, int64_t dim) {
  FORGE_IF_CUDA(x) {
    check_indices_gpu(index, n, op, dim);
    return cuda::index_rows(index.dtype(), x.device().index, dtype_size(x.dtype()),
                            x.raw_device_data(), index.raw_device_data(), out.raw_device_data(),
                            outer, n, index.numel(), inner);
  }
  gather_rows(x, read_indices(index, n, op, dim), outer, n, inner, out);
}

// scatter_add_rows with the index checked, on g's device (atomics in the compute dtype there).
Tensor scatter_rows(const Tensor& g, const Tensor& index, const Shape& shape, int64_t outer,
                    int64_t n, int64_t inner, int64_t skip, const char* op, int64_t dim) {
  FORGE_IF_CUDA(g) {
    check_indices_gpu(index, n, op, dim);
    const Tensor acc = Tensor::zeros(shape, compute_dtype(g.dtype()), g.device());
    cuda::index_rows_backward(g.dtype(), index.dtype(), g.device().index, g.raw_device_data(),
                              index.raw_device_data(), acc.raw_device_data(), outer, n,
                              index.numel(), inner, skip);
    return acc.to(g.dtype());
  }
  return scatter_add_rows(g, read_indices(index, n, op, dim), shape, outer, n, inner, skip);
}

// For each multi-index of `sizes` in row-major order, sum_k i_k * strides[k].
std::vector<int64_t> offset_table(const Shape& sizes, const Strides& strides) {
  std::vector<int64_t> offs{0};
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<int64_t> next;
    next.reserve(offs.size() * static_cast<size_t>(sizes[k]));
    for (int64_t base : offs) {
      for (int64_t i = 0; i < sizes[k]; ++i) next.push_back(base + i * strides[k]);
    }
    offs = std::move(next);
  }
  return offs;
}

// Where gather's index positions (outer, J, inner) -- the index shape split
// around dim -- land in x: the index may be smaller than x off dim, so the
// outer rows and inner columns carry their own x offsets.
struct GatherMap {
  int64_t J = 0, dim_stride = 0;
  std::vector<int64_t> outer_off, inner_off;
};

GatherMap gather_map(const Shape& x_shape, const Shape& index_shape, int64_t dim) {
  const Strides xs = contiguous_strides(x_shape);
  const auto d = static_cast<size_t>(dim);
  GatherMap m;
  m.J = index_shape[d];
  m.dim_stride = xs[d];
  m.outer_off = offset_table(Shape(index_shape.begin(), index_shape.begin() + dim),
                             Strides(xs.begin(), xs.begin() + dim));
  m.inner_off = offset_table(Shape(index_shape.begin() + dim + 1, index_shape.end()),
                             Strides(xs.begin() + dim + 1, xs.end()));
  return m;
}

}  // namespace

// ---- views: the output shares x's storage; backward views the gradient back ----

namespace {

Tensor view_op(const char* name, const Tensor& x, const Shape& shape) {
  Tensor out = x.view(shape);
  if (!autograd::needs_grad({x})) return out;
  return autograd::record(name, {x}, out,
                          [in = x.shape()](const Grads& g) { return Grads{g[0].view(in)}; });
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  return view_op("reshape", x, shape);
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return view_op("flatten", x, {1});
  const int64_t s = wrap_dim(start_dim, x.dim(), "flatten"),
                e = wrap_dim(end_dim, x.dim(), "flatten");
  FORGE_CHECK(s <= e, "flatten: start_dim {} comes after end_dim {} for shape {}", start_dim,
              end_dim, shape_str(x.shape()));
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  shape.push_back(numel_between(x.shape(), s, e + 1));
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return view_op("flatten", x, shape);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim() + 1, "unsqueeze");
  Shape shape = x.shape();
  shape.insert(shape.begin() + d, 1);
  return view_op("unsqueeze", x, shape);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim(), "squeeze");
  FORGE_CHECK(x.dim() > 0 && x.shape()[static_cast<size_t>(d)] == 1,
              "squeeze: dim {} of shape {} must have size 1", dim, shape_str(x.shape()));
  Shape shape = x.shape();
  shape.erase(shape.begin() + d);
  return view_op("squeeze", x, shape);
}

// ---- permutations: backward applies the inverse permutation ----

Tensor permute(const Tensor& x, const std::vector<int64_t>& perm) {
  const int64_t nd = x.dim();
  FORGE_CHECK(static_cast<int64_t>(perm.size()) == nd,
              "permute: expected a permutation of the {} dims of shape {}, got {}", nd,
              shape_str(x.shape()), shape_str(perm));
  std::vector<int64_t> p(perm.size()), inverse(perm.size(), -1);
  for (size_t i = 0; i < perm.size(); ++i) {
    p[i] = wrap_dim(perm[i], nd, "permute");
    FORGE_CHECK(inverse[static_cast<size_t>(p[i])] < 0,
                "permute: dim {} appears twice in {}; expected each of 0..{} once", p[i],
                shape_str(perm), nd - 1);
    inverse[static_cast<size_t>(p[i])] = static_cast<int64_t>(i);
  }
  Tensor out = permute_copy(x, p);
  if (!autograd::needs_grad({x})) return out;
  return autograd::record("permute", {x}, out,
                          [inverse](const Grads& g) { return Grads{permute_copy(g[0], inverse)}; });
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  const int64_t a = wrap_dim(dim0, x.dim(), "transpose"), b = wrap_dim(dim1, x.dim(), "transpose");
  std::vector<int64_t> perm(static_cast<size_t>(x.dim()));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  if (x.dim() > 0) std::swap(perm[static_cast<size_t>(a)], perm[static_cast<size_t>(b)]);
  return permute(x, perm);
}

// ---- windows: backward writes the gradient into zeros of the input's shape ----

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  FORGE_CHECK(x.dim() > 0, "narrow: expected a tensor with at least one dim, got a scalar");
  const int64_t d = wrap_dim(dim, x.dim(), "narrow");
  const int64_t n = x.shape()[static_cast<size_t>(d)];
  const int64_t s = start < 0 ? start + n : start;
  FORGE_CHECK(s >= 0 && length >= 0 && s + length <= n,
              "narrow: elements [{}, {}) of dim {} are out of range for shape {} (size {})", start,
              start + length, dim, shape_str(x.shape()), n);
  Tensor out = d == 0 ? x.slice0(s, s + length) : take_window(x, d, s, 1, length);
  if (!autograd::needs_grad({x})) return out;
  return autograd::record("narrow", {x}, out, [in = x.shape(), d, s](const Grads& g) {
    return Grads{put_window(g[0], in, d, s, 1)};
  });
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  FORGE_CHECK(x.dim() > 0, "slice: expected a tensor with at least one dim, got a scalar");
  FORGE_CHECK(step > 0, "slice: step must be positive, got {}", step);
  const int64_t d = wrap_dim(dim, x.dim(), "slice");
  const int64_t n = x.shape()[static_cast<size_t>(d)];
  // Python semantics: negative bounds count from the end, then both clamp to [0, n].
  const auto clamp_bound = [n](int64_t b) { return std::clamp<int64_t>(b < 0 ? b + n : b, 0, n); };
  const int64_t s = clamp_bound(start), e = clamp_bound(end);
  const int64_t count = e > s ? (e - s + step - 1) / step : 0;
  if (step == 1) return narrow(x, d, s, count);
  Tensor out = take_window(x, d, s, step, count);
  if (!autograd::needs_grad({x})) return out;
  return autograd::record("slice", {x}, out, [in = x.shape(), d, s, step](const Grads& g) {
    return Grads{put_window(g[0], in, d, s, step)};
  });
}

// ---- cat / split / stack: each one's backward is the other's forward ----

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  FORGE_CHECK(!xs.empty(), "cat: expected at least one tensor, got an empty list");
  for (size_t i = 0; i < xs.size(); ++i) {
    FORGE_CHECK(xs[i].defined(), "cat: tensor {} is undefined", i);
  }
  const Tensor& ref = xs[0];
  FORGE_CHECK(ref.dim() > 0,
              "cat: tensor 0 is a scalar; cat joins along an existing dim (use stack)");
  const int64_t d = wrap_dim(dim, ref.dim(), "cat");
  const auto ud = static_cast<size_t>(d);
  std::vector<int64_t> sizes(xs.size());
  Shape shape = ref.shape();
  shape[ud] = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Shape& si = xs[i].shape();
    bool match = si.size() == shape.size();
    for (size_t k = 0; match && k < si.size(); ++k) match = k == ud || si[k] == shape[k];
    FORGE_CHECK(
        match,
        "cat: tensor {} has shape {} but tensor 0 has shape {}; all must match except along dim {}",
        i, shape_str(si), shape_str(ref.shape()), dim);
    FORGE_CHECK(xs[i].dtype() == ref.dtype(), "cat: tensor {} is {} but tensor 0 is {}", i,
                dtype_name(xs[i].dtype()), dtype_name(ref.dtype()));
    FORGE_CHECK(xs[i].device() == ref.device(),
                "cat: tensor {} is on {} but tensor 0 is on {}; all must be on one device", i,
                xs[i].device().str(), ref.device().str());
    sizes[i] = si[ud];
    shape[ud] += sizes[i];
  }
  Tensor out = Tensor::empty(shape, ref.dtype(), ref.device());
  int64_t off = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    copy_box(xs[i], whole(shape.size()), out, along(shape.size(), d, off), xs[i].shape());
    off += sizes[i];
  }
  if (!autograd::needs_grad(xs)) return out;
  std::vector<bool> wanted(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) wanted[i] = xs[i].requires_grad();
  return autograd::record("cat", xs, out, [d, sizes, wanted](const Grads& g) {
    Grads gx(sizes.size());
    int64_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (wanted[i]) gx[i] = take_window(g[0], d, at, 1, sizes[i]);
      at += sizes[i];
    }
    return gx;
  });
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  FORGE_CHECK(x.dim() > 0, "split: expected a tensor with at least one dim, got a scalar");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.shape()[static_cast<size_t>(d)];
  int64_t total = 0;
  for (int64_t s : sizes) {
    FORGE_CHECK(s >= 0, "split: sizes must be non-negative, got {}", shape_str(sizes));
    total += s;
  }
  FORGE_CHECK(total == n, "split: sizes {} sum to {} but dim {} of shape {} has size {}",
              shape_str(sizes), total, dim, shape_str(x.shape()), n);
  std::vector<Tensor> outs;
  outs.reserve(sizes.size());
  int64_t off = 0;
  for (int64_t s : sizes) {
    outs.push_back(take_window(x, d, off, 1, s));
    off += s;
  }
  if (!autograd::needs_grad({x})) return outs;
  // An output nobody used contributes zeros (the engine passes zeros; an
  // undefined gradient is treated the same).
  autograd::record(
      "split", {x}, outs,
      [in = x.shape(), dtype = x.dtype(), device = x.device(), d, sizes](const Grads& g) {
        const bool all =
            std::all_of(g.begin(), g.end(), [](const Tensor& t) { return t.defined(); });
        Tensor gx = all ? Tensor::empty(in, dtype, device) : Tensor::zeros(in, dtype, device);
        int64_t at = 0;
        for (size_t i = 0; i < sizes.size(); ++i) {
          if (g[i].defined())
            copy_box(g[i], whole(in.size()), gx, along(in.size(), d, at), g[i].shape());
          at += sizes[i];
        }
        return Grads{gx};
      });
  return outs;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  FORGE_CHECK(split_size > 0, "split: split_size must be positive, got {}", split_size);
  FORGE_CHECK(x.dim() > 0, "split: expected a tensor with at least one dim, got a scalar");
  const int64_t n = x.shape()[static_cast<size_t>(wrap_dim(dim, x.dim(), "split"))];
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < n; at += split_size) sizes.push_back(std::min(split_size, n - at));
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, dim);
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  FORGE_CHECK(!xs.empty(), "stack: expected at least one tensor, got an empty list");
  for (size_t i = 0; i < xs.size(); ++i) {
    FORGE_CHECK(xs[i].defined(), "stack: tensor {} is undefined", i);
  }
  const Tensor& ref = xs[0];
  for (size_t i = 0; i < xs.size(); ++i) {
    FORGE_CHECK(xs[i].shape() == ref.shape(),
                "stack: tensor {} has shape {} but tensor 0 has shape {}; all must match", i,
                shape_str(xs[i].shape()), shape_str(ref.shape()));
    FORGE_CHECK(xs[i].dtype() == ref.dtype(), "stack: tensor {} is {} but tensor 0 is {}", i,
                dtype_name(xs[i].dtype()), dtype_name(ref.dtype()));
    FORGE_CHECK(xs[i].device() == ref.device(),
                "stack: tensor {} is on {} but tensor 0 is on {}; all must be on one device", i,
                xs[i].device().str(), ref.device().str());
  }
  const int64_t d = wrap_dim(dim, ref.dim() + 1, "stack");
  // Each input, viewed as (..., 1, ...), is slot i of the new dim.
  Shape one = ref.shape();
  one.insert(one.begin() + d, 1);
  Shape shape = one;
  shape[static_cast<size_t>(d)] = static_cast<int64_t>(xs.size());
  Tensor out = Tensor::empty(shape, ref.dtype(), ref.device());
  for (size_t i = 0; i < xs.size(); ++i) {
    copy_box(xs[i].view(one), whole(shape.size()), out,
             along(shape.size(), d, static_cast<int64_t>(i)), one);
  }
  if (!autograd::needs_grad(xs)) return out;
  std::vector<bool> wanted(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) wanted[i] = xs[i].requires_grad();
  return autograd::record("stack", xs, out, [in = ref.shape(), d, wanted](const Grads& g) {
    Grads gx(wanted.size());
    for (size_t i = 0; i < wanted.size(); ++i) {
      if (wanted[i]) gx[i] = take_window(g[0], d, static_cast<int64_t>(i), 1, 1).view(in);
    }
    return gx;
  });
}

// ---- pad: the kept part of x is one box; backward crops it out of the gradient ----

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value) {
  const int64_t nd = x.dim();
  FORGE_CHECK(pads.size() % 2 == 0 && static_cast<int64_t>(pads.size()) <= 2 * nd,
              "pad: expected (before, after) pairs for at most {} dims of shape {}, got {} values",
              nd, shape_str(x.shape()), pads.size());
  // In x: the kept box starts at `from`; in the output at `to`; it spans `extent`.
  Shape shape = x.shape(), extent = x.shape();
  Window from = whole(shape.size()), to = whole(shape.size());
  bool grows = false;
  for (size_t p = 0; p < pads.size() / 2; ++p) {
    const size_t k = shape.size() - 1 - p;
    const int64_t before = pads[2 * p], after = pads[2 * p + 1], n = shape[k];
    shape[k] = n + before + after;
    FORGE_CHECK(shape[k] >= 0, "pad: pads ({}, {}) on dim {} of size {} leave a negative size {}",
                before, after, k, n, shape[k]);
    from.start[k] = std::max<int64_t>(0, -before);
    to.start[k] = std::max<int64_t>(0, before);
    extent[k] = std::max<int64_t>(0, n - from.start[k] - std::max<int64_t>(0, -after));
    grows = grows || before > 0 || after > 0;
  }
  Tensor out = grows ? Tensor::full(shape, value, x.dtype(), x.device())
                     : Tensor::empty(shape, x.dtype(), x.device());
  copy_box(x, from, out, to, extent);
  if (!autograd::needs_grad({x})) return out;
  return autograd::record("pad", {x}, out, [in = x.shape(), from, to, extent](const Grads& g) {
    const Tensor& go = g[0];
    Tensor gx = extent == in ? Tensor::empty(in, go.dtype(), go.device())
                             : Tensor::zeros(in, go.dtype(), go.device());
    copy_box(go, to, gx, from, extent);
    return Grads{gx};
  });
}

// ---- token shift: one box per segment; the backward moves the gradient back ----

namespace {

// Writes segment s of src (B, N, D), moved by `shift` along N, into dst (zeros
// where nothing lands); per features from `first`.
void move_segment(const Tensor& src, const Tensor& dst, int64_t first, int64_t per,
                  int64_t shift) {
  const int64_t B = src.size(0), N = src.size(1);
  const int64_t rows = std::max<int64_t>(0, N - std::abs(shift));
  Window from = whole(3), to = whole(3);
  from.start = {0, std::max<int64_t>(0, -shift), first};
  to.start = {0, std::max<int64_t>(0, shift), first};
  copy_box(src, from, dst, to, {B, rows, per});
}

}  // namespace

Tensor token_shift(const Tensor& x, const std::vector<int64_t>& shifts, const Tensor& moving) {
  const auto segments = static_cast<int64_t>(shifts.size());
  FORGE_CHECK(segments > 0, "token_shift: expected at least one shift, got none");
  FORGE_CHECK(x.dim() == 3 && x.size(2) >= segments,
              "token_shift: expected x (B, N, D) with D >= {} (one feature per shift), got {}",
              segments, shape_str(x.shape()));
  if (moving.defined()) {
    FORGE_CHECK(moving.shape() == x.shape() && moving.dtype() == x.dtype() &&
                    moving.device() == x.device(),
                "token_shift: moving must match x ({} {} on {}), got {} {} on {}",
                dtype_name(x.dtype()), shape_str(x.shape()), x.device().str(),
                dtype_name(moving.dtype()), shape_str(moving.shape()), moving.device().str());
  }
  const Tensor& mc = moving.defined() ? moving : x;
  const int64_t D = x.size(2), per = D / segments;
  Tensor out = Tensor::zeros(x.shape(), x.dtype(), x.device());
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t shift = shifts[static_cast<size_t>(s)];
    move_segment(shift == 0 ? x : mc, out, s * per, per, shift);
  }
  if (D > segments * per) move_segment(x, out, segments * per, D - segments * per, 0);
  const std::vector<Tensor> inputs = moving.defined() ? std::vector<Tensor>{x, moving}
                                                      : std::vector<Tensor>{x};
  if (!autograd::needs_grad(inputs)) return out;
  return autograd::record("token_shift", inputs, out,
                          [shifts, per, two = moving.defined()](const Grads& g) {
    // Each segment's gradient moves back by -shift into the input it came from.
    const Tensor& go = g[0];
    Tensor gx = Tensor::zeros(go.shape(), go.dtype(), go.device());
    Tensor gm = two ? Tensor::zeros(go.shape(), go.dtype(), go.device()) : gx;
    const auto segments = static_cast<int64_t>(shifts.size());
    const int64_t D = go.size(2);
    for (int64_t s = 0; s < segments; ++s) {
      const int64_t shift = shifts[static_cast<size_t>(s)];
      move_segment(go, shift == 0 ? gx : gm, s * per, per, -shift);
    }
    if (D > segments * per) move_segment(go, gx, segments * per, D - segments * per, 0);
    return two ? Grads{gx, gm} : Grads{gx};
  });
}

// ---- index ops: gathers forward, scatter-adds backward ----

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  FORGE_CHECK(x.dim() > 0, "index_select: expected a tensor with at least one dim, got a scalar");
  FORGE_CHECK(index.dim() == 1, "index_select: expected a 1-d index, got shape {}",
              shape_str(index.shape()));
  check_same_device("index_select", x, "x", index, "index");
  const int64_t d = wrap_dim(dim, x.dim(), "index_select");
  const int64_t n = x.shape()[static_cast<size_t>(d)];
  // x is (outer, n, inner) around dim; out is (outer, J, inner).
  const int64_t outer = numel_between(x.shape(), 0, d),
                inner = numel_between(x.shape(), d + 1, x.dim());
  Shape shape = x.shape();
  shape[static_cast<size_t>(d)] = index.numel();
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  select_rows(x, index, outer, n, inner, out, "index_select", d);
  if (!autograd::needs_grad({x})) return out;
  return autograd::record(
      "index_select", {x, index}, out,
      [in = x.shape(), index = index.detach(), d, n, outer, inner](const Grads& g) {
        return Grads{scatter_rows(g[0], index, in, outer, n, inner, -1, "index_select backward", d),
                     Tensor()};
      });
}

namespace {

// out (index's shape) = x at the index along dim d, on x's device.
void gather_into(const Tensor& x, int64_t d, const Tensor& index, const Tensor& out) {
  const int64_t n = x.size(d);
  FORGE_IF_CUDA(x) {
    check_indices_gpu(index, n, "gather", d);
    return cuda::gather(index.dtype(), x.device().index, dtype_size(x.dtype()), x.raw_device_data(),
                        index.raw_device_data(), out.raw_device_data(), index.shape(),
                        contiguous_strides(x.shape()), d, n);
  }
  const std::vector<int64_t> idx = read_indices(index, n, "gather", d);
  const GatherMap m = gather_map(x.shape(), index.shape(), d);
  const auto outer = static_cast<int64_t>(m.outer_off.size()),
             inner = static_cast<int64_t>(m.inner_off.size());
  // out (outer, J, inner): out[o][j][k] = x at outer_off[o] + idx[o][j][k] * dim_stride +
  // inner_off[k].
  if (out.numel() == 0) return;
  const char* src = bytes(x);
  char* dst = bytes(out);
  with_element_size(dtype_size(x.dtype()), [&](auto size_tag) {
    constexpr auto S = static_cast<int64_t>(decltype(size_tag)::value);
    parallel_for(outer * m.J, inner * S, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t base = m.outer_off[static_cast<size_t>(r / m.J)];
        for (int64_t k = 0; k < inner; ++k) {
          const int64_t at = base + idx[static_cast<size_t>(r * inner + k)] * m.dim_stride +
                             m.inner_off[static_cast<size_t>(k)];
          std::memcpy(dst + (r * inner + k) * S, src + at * S, S);
        }
      }
    });
  });
}

// gather's backward: zeros of x's shape `in` with g added where the index read, on g's device.
Tensor gather_grad(const Tensor& g, const Tensor& index, const Shape& in, int64_t d, int64_t n) {
  FORGE_IF_CUDA(g) {
    check_indices_gpu(index, n, "gather backward", d);
    const Tensor acc = Tensor::zeros(in, compute_dtype(g.dtype()), g.device());
    cuda::gather_backward(g.dtype(), index.dtype(), g.device().index, g.raw_device_data(),
                          index.raw_device_data(), acc.raw_device_data(), index.shape(),
                          contiguous_strides(in), d, n);
    return acc.to(g.dtype());
  }
  const std::vector<int64_t> ix = read_indices(index, n, "gather backward", d);
  const GatherMap gm = gather_map(in, index.shape(), d);
  const auto go = static_cast<int64_t>(gm.outer_off.size()),
             gi = static_cast<int64_t>(gm.inner_off.size());
  Tensor gx = Tensor::zeros(in, g.dtype());
  // Threads split the (o, k) columns of the index; distinct columns address
  // distinct x positions off dim, so no two threads add into one element.
  FORGE_DISPATCH_FLOAT(g.dtype(), "gather backward", [&] {
    const scalar_t* gp = g.data<scalar_t>();
    scalar_t* xp = gx.data<scalar_t>();
    parallel_for(go * gi, gm.J, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t o = c / gi, k = c % gi;
        const int64_t base =
            gm.outer_off[static_cast<size_t>(o)] + gm.inner_off[static_cast<size_t>(k)];
        for (int64_t j = 0; j < gm.J; ++j) {
          const int64_t e = (o * gm.J + j) * gi + k;
          xp[base + ix[static_cast<size_t>(e)] * gm.dim_stride] += gp[e];
        }
      }
    });
  });
  return gx;
}

}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  FORGE_CHECK(x.dim() > 0, "gather: expected a tensor with at least one dim, got a scalar");
  FORGE_CHECK(index.dim() == x.dim(),
              "gather: index must have the input's rank {} (input shape {}), got shape {}", x.dim(),
              shape_str(x.shape()), shape_str(index.shape()));
  check_same_device("gather", x, "x", index, "index");
  const int64_t d = wrap_dim(dim, x.dim(), "gather");
  for (int64_t k = 0; k < x.dim(); ++k) {
    FORGE_CHECK(k == d || index.size(k) <= x.size(k),
                "gather: index shape {} is larger than input shape {} at dim {} (only dim {} may "
                "differ freely)",
                shape_str(index.shape()), shape_str(x.shape()), k, d);
  }
  Tensor out = Tensor::empty(index.shape(), x.dtype(), x.device());
  gather_into(x, d, index, out);
  if (!autograd::needs_grad({x})) return out;
  return autograd::record(
      "gather", {x, index}, out,
      [in = x.shape(), index = index.detach(), d, n = x.size(d)](const Grads& g) {
        return Grads{gather_grad(g[0], index, in, d, n), Tensor()};
      });
}

Tensor embedding(const Tensor& weight, const Tensor& ids, int64_t padding_idx) {
  FORGE_CHECK(weight.dim() == 2, "embedding: expected a (V, D) weight, got shape {}",
              shape_str(weight.shape()));
  const int64_t V = weight.size(0), D = weight.size(1);
  FORGE_CHECK(
      padding_idx == -1 || (padding_idx >= 0 && padding_idx < V),
      "embedding: padding_idx must be -1 (none) or in [0, {}) for a weight of shape {}, got {}", V,
      shape_str(weight.shape()), padding_idx);
  check_same_device("embedding", weight, "weight", ids, "ids");
  // weight (V, D), ids (...) flattened to N rows -> out (..., D).
  Shape shape = ids.shape();
  shape.push_back(D);
  Tensor out = Tensor::empty(shape, weight.dtype(), weight.device());
  select_rows(weight, ids, 1, V, D, out, "embedding", 0);
  if (!autograd::needs_grad({weight})) return out;
  return autograd::record(
      "embedding", {weight, ids}, out, [ids = ids.detach(), V, D, padding_idx](const Grads& g) {
        return Grads{scatter_rows(g[0], ids, {V, D}, 1, V, D, padding_idx, "embedding backward", 0),
                     Tensor()};
      });
}

}  // namespace forge::ops
