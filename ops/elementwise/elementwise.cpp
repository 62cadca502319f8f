// The broadcasting elementwise ops of elementwise.h (add, sub, mul and div of
// two tensors, where, masked_fill, expand and sum_to) and the Tensor
// operators. On the CPU: one flat loop per op when the operands need no index
// arithmetic (same shape, or one element), otherwise a broadcast walk over the
// output in innermost runs where each operand either advances by one element
// or stays put; the binary ops' backward goes through sum_to. On a GPU each op
// runs the kernel of elementwise_cuda.h its enum names, over the same merged
// broadcast plan. The one-tensor ops (the unary ops, the activations and the
// tensor-scalar add and mul) are unary.cpp's.
#include "ops/elementwise/elementwise.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "ops/elementwise/elementwise_internal.h"
#include "ops/reduce/reduce_cuda.h"

namespace forge::ops {

using namespace elementwise_detail;

namespace {

// ---- argument checks ----

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  FORGE_CHECK(a.dtype() == b.dtype(),
              "{}: operands must have one dtype, got {} and {}; convert one with .to()", op,
              dtype_name(a.dtype()), dtype_name(b.dtype()));
}

void check_same_device(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name,
                       const char* op) {
  FORGE_CHECK(a.device() == b.device(),
              "{}: {} is on {} but {} is on {}; move them to one device with .to()", op, a_name,
              a.device().str(), b_name, b.device().str());
}

void check_mask(const Tensor& t, const char* op, const char* arg) {
  FORGE_CHECK(t.defined(), "{}: {} is an undefined tensor", op, arg);
  FORGE_CHECK(t.dtype() == DType::boolean || t.dtype() == DType::u8,
              "{}: {} must be a bool or u8 tensor, got {}", op, arg, dtype_name(t.dtype()));
}

// Masks are bool or u8; both are one byte per element, true when non-zero.
const uint8_t* mask_data(const Tensor& m) {
  return static_cast<const uint8_t*>(m.raw_data());
}

Shape broadcast_pair(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    // Right-aligned: missing leading dims count as 1.
    const int64_t da = i + a.size() < n ? 1 : a[i + a.size() - n];
    const int64_t db = i + b.size() < n ? 1 : b[i + b.size() - n];
    FORGE_CHECK(da == db || da == 1 || db == 1,
                "{}: shapes {} and {} do not broadcast: dim {} is {} in one and {} in the other "
                "(sizes must match or "
                "one must be 1)",
                op, shape_str(a), shape_str(b), static_cast<int64_t>(i) - static_cast<int64_t>(n),
                da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Whether `from` broadcasts to exactly `to` (from's dims are each 1 or equal).
bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i] != 1 && from[i] != to[lead + i]) return false;
  }
  return true;
}

// ---- the broadcast walk ----

// How K operands are read while walking an output: the output's dims with
// size-1 dims dropped and neighbours merged wherever every operand is
// contiguous across them (e.g. [B, N, D] + [D] becomes [B*N, D] with strides
// [D, 1] and [0, 1]). The innermost stride of every operand is then 0 or 1.
template <size_t K>
struct BroadcastPlan {
  Shape sizes;                   // at least one dim
  std::array<Shape, K> strides;  // element strides over `sizes`, 0 where broadcast
};

template <size_t K>
BroadcastPlan<K> plan_broadcast(const Shape& out, const std::array<Shape, K>& ins) {
  const int64_t n = shape_numel(out);
  BroadcastPlan<K> p;
  bool flat = true;
  for (const Shape& s : ins) flat = flat && (shape_numel(s) == n || shape_numel(s) == 1);
  if (flat) {
    // Fast path: an operand with all n elements is laid out like the output
    // (broadcasting only added size-1 dims); a one-element one is a constant.
    p.sizes = {n};
    for (size_t k = 0; k < K; ++k) p.strides[k] = {shape_numel(ins[k]) == n ? 1 : 0};
    return p;
  }
  std::array<Shape, K> full;
  for (size_t k = 0; k < K; ++k) {
    const Shape& s = ins[k];
    full[k].assign(out.size(), 0);
    int64_t stride = 1;
    for (size_t i = s.size(); i-- > 0;) {
      full[k][i + out.size() - s.size()] = s[i] == 1 ? 0 : stride;
      stride *= s[i];
    }
  }
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    bool merge = !p.sizes.empty();
    for (size_t k = 0; k < K && merge; ++k) merge = p.strides[k].back() == full[k][d] * out[d];
    if (merge) {
      p.sizes.back() *= out[d];
      for (size_t k = 0; k < K; ++k) p.strides[k].back() = full[k][d];
    } else {
      p.sizes.push_back(out[d]);
      for (size_t k = 0; k < K; ++k) p.strides[k].push_back(full[k][d]);
    }
  }
  return p;
}

// The plan as the CUDA kernels take it.
template <size_t K>
cuda::Broadcast<K> cuda_plan(const BroadcastPlan<K>& p, const char* op) {
  FORGE_CHECK(p.sizes.size() <= static_cast<size_t>(cuda::kMaxElementwiseDims),
              "{}: this broadcast walks {} dims after merging neighbours; the CUDA kernels take "
              "at most {}",
              op, p.sizes.size(), cuda::kMaxElementwiseDims);
  cuda::Broadcast<K> b;
  b.ndim = static_cast<int>(p.sizes.size());
  for (size_t d = 0; d < p.sizes.size(); ++d) {
    b.sizes[d] = p.sizes[d];
    for (size_t k = 0; k < K; ++k) b.strides[k][d] = p.strides[k][d];
  }
  return b;
}

// Calls run(out_offset, in_offsets, len) on consecutive runs of output elements
// that lie in one innermost row; the output's elements are split evenly across
// threads, so a thread may start or end mid-row.
template <size_t K, typename Run>
void for_each_run(const BroadcastPlan<K>& p, int64_t cost_per_item, Run&& run) {
  const int64_t n = shape_numel(p.sizes);
  if (n == 0) return;
  const size_t nd = p.sizes.size(), last = nd - 1;
  const int64_t inner = p.sizes[last];
  parallel_for(n, cost_per_item, [&](int64_t begin, int64_t end) {
    // Odometer over the outer dims, started at begin's row.
    std::vector<int64_t> idx(last);
    std::array<int64_t, K> row{};
    int64_t rem = begin / inner;
    for (size_t d = last; d-- > 0;) {
      idx[d] = rem % p.sizes[d];
      rem /= p.sizes[d];
      for (size_t k = 0; k < K; ++k) row[k] += idx[d] * p.strides[k][d];
    }
    int64_t col = begin % inner;
    for (int64_t o = begin; o < end;) {
      const int64_t len = std::min(inner - col, end - o);
      std::array<int64_t, K> at;
      for (size_t k = 0; k < K; ++k) at[k] = row[k] + col * p.strides[k][last];
      run(o, at, len);
      o += len;
      col = 0;
      for (size_t d = last; d-- > 0;) {
        for (size_t k = 0; k < K; ++k) row[k] += p.strides[k][d];
        if (++idx[d] < p.sizes[d]) break;
        for (size_t k = 0; k < K; ++k) row[k] -= p.strides[k][d] * p.sizes[d];
        idx[d] = 0;
      }
    }
  });
}

// out[i] = f(a[i], b[i]) over one run; an operand that does not walk is one
// value. One loop per pattern so that each is a plain vectorisable loop.
template <typename T, typename F>
void binary_run(const T* a, bool a_walks, const T* b, bool b_walks, T* out, int64_t len, F f) {
  if (a_walks && b_walks) {
    for (int64_t i = 0; i < len; ++i) out[i] = f(a[i], b[i]);
  } else if (a_walks) {
    const T bv = *b;
    for (int64_t i = 0; i < len; ++i) out[i] = f(a[i], bv);
  } else if (b_walks) {
    const T av = *a;
    for (int64_t i = 0; i < len; ++i) out[i] = f(av, b[i]);
  } else {
    const T v = f(*a, *b);
    for (int64_t i = 0; i < len; ++i) out[i] = v;
  }
}

// out = f(a, b) broadcast; f is a generic lambda over the element type, and
// gpu_op the same op on a GPU.
template <typename F>
Tensor binary(const Tensor& a, const Tensor& b, const char* op, int64_t cost, cuda::BinaryOp gpu_op,
              F f) {
  check_float(a, op, "a");
  check_float(b, op, "b");
  check_same_device(a, "a", b, "b", op);
  check_same_dtype(a, b, op);
  const Shape shape = broadcast_pair(a.shape(), b.shape(), op);
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  const auto plan = plan_broadcast<2>(shape, {a.shape(), b.shape()});
  FORGE_IF_CUDA(a) {
    cuda::binary(gpu_op, a.dtype(), a.raw_device_data(), b.raw_device_data(), out.raw_device_data(),
                 out.numel(), cuda_plan(plan, op), a.device().index);
    return out;
  }
  const bool a_walks = plan.strides[0].back() != 0, b_walks = plan.strides[1].back() != 0;
  FORGE_DISPATCH_FLOAT(a.dtype(), op, [&] {
    const scalar_t* pa = a.data<scalar_t>();
    const scalar_t* pb = b.data<scalar_t>();
    scalar_t* po = out.data<scalar_t>();
    for_each_run(plan, cost, [&](int64_t o, const std::array<int64_t, 2>& at, int64_t len) {
      binary_run(pa + at[0], a_walks, pb + at[1], b_walks, po + o, len, f);
    });
  });
  return out;
}

// ---- sum_to's reduction ----

// Sum of n contiguous values in eight independent lanes, which the compiler
// can keep in one vector register without reassociating a single chain.
template <typename T>
T sum_contiguous(const T* p, int64_t n) {
  T lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) lanes[k] += p[i + k];
  }
  T s = 0;
  for (; i < n; ++i) s += p[i];
  for (int k = 0; k < 8; ++k) s += lanes[k];
  return s;
}

// g is [outer, R, inner] contiguous; out[o, i] = sum_r g[o, r, i].
template <typename T>
void sum_middle(const T* g, T* out, int64_t outer, int64_t R, int64_t inner) {
  if (inner == 1 && outer == 1) {
    // A full reduction (a scalar operand's gradient): partial sums per thread.
    const int64_t chunks = std::clamp<int64_t>(R / kParallelGrain, 1, num_threads());
    std::vector<T> partial(static_cast<size_t>(chunks));
    parallel_for(chunks, R / chunks, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t lo = R * c / chunks, hi = R * (c + 1) / chunks;
        partial[static_cast<size_t>(c)] = sum_contiguous(g + lo, hi - lo);
      }
    });
    T s = 0;
    for (T v : partial) s += v;
    out[0] = s;
  } else if (inner == 1) {
    parallel_for(outer, R, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) out[o] = sum_contiguous(g + o * R, R);
    });
  } else {
    // Rows of `inner` are added into the output row: the inner loop walks both
    // contiguously. Threads split the outer*inner outputs, cutting rows if needed.
    parallel_for(outer * inner, R, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin / inner; o * inner < end; ++o) {
        const int64_t i0 = std::max<int64_t>(begin - o * inner, 0),
                      i1 = std::min(end - o * inner, inner);
        T* dst = out + o * inner;
        const T* src = g + o * R * inner;
        for (int64_t i = i0; i < i1; ++i) dst[i] = 0;
        for (int64_t r = 0; r < R; ++r) {
          const T* row = src + r * inner;
          for (int64_t i = i0; i < i1; ++i) dst[i] += row[i];
        }
      }
    });
  }
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  return broadcast_pair(a, b, "broadcast_shapes");
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  check_float(g, "sum_to", "g");
  FORGE_CHECK(broadcasts_to(shape, g.shape()),
              "sum_to: cannot sum a tensor of shape {} to shape {}; the target must broadcast to "
              "the source",
              shape_str(g.shape()), shape_str(shape));
  // Already the right shape (the common case in binary backward): no copy.
  if (g.shape() == shape) return g;

  // g's dims as groups of reduced (target has 1) and kept dims, neighbours of
  // one kind merged and size-1 dims dropped: [B, N, D] -> [D] is {B*N: reduced, D: kept}.
  struct Group {
    int64_t size;
    bool reduced;
  };
  std::vector<Group> groups;
  const size_t lead = g.shape().size() - shape.size();
  for (size_t i = 0; i < g.shape().size(); ++i) {
    const int64_t gs = g.shape()[i];
    if (gs == 1) continue;
    const bool reduced = i < lead || shape[i - lead] == 1;
    if (!groups.empty() && groups.back().reduced == reduced) {
      groups.back().size *= gs;
    } else {
      groups.push_back({gs, reduced});
    }
  }

  // One pass per reduced group, outermost first, each viewing the current
  // tensor as [outer, R, inner]; the last pass writes the result. On a GPU
  // each pass is the reduction op's kernel (ops/reduce/reduce_cuda.h).
  Tensor cur = g;
  for (size_t p = 0; p < groups.size();) {
    if (!groups[p].reduced) {
      ++p;
      continue;
    }
    int64_t outer = 1, inner = 1;
    for (size_t q = 0; q < p; ++q) outer *= groups[q].size;
    for (size_t q = p + 1; q < groups.size(); ++q) inner *= groups[q].size;
    const int64_t R = groups[p].size;
    Tensor next = Tensor::empty({outer * inner}, g.dtype(), g.device());
    FORGE_IF_CUDA(g) {
      cuda::reduce_sum(g.dtype(), g.device().index, cur.raw_device_data(), next.raw_device_data(),
                       outer, R, inner, 1.0);
    }
    if (g.device().is_cpu()) {
      FORGE_DISPATCH_FLOAT(g.dtype(), "sum_to", [&] {
        sum_middle(cur.data<scalar_t>(), next.data<scalar_t>(), outer, R, inner);
      });
    }
    cur = next;
    groups.erase(groups.begin() + static_cast<std::ptrdiff_t>(p));
  }
  const Tensor out = cur.view(shape);
  if (!autograd::needs_grad({g})) return out;
  // Forward summed g over its broadcast dims, so each g element gets the gradient of its sum.
  return autograd::record("sum_to", {g}, out, [from = g.shape()](const std::vector<Tensor>& grad) {
    return std::vector<Tensor>{expand(grad[0], from)};
  });
}

Tensor expand(const Tensor& x, const Shape& shape) {
  check_float(x, "expand", "x");
  FORGE_CHECK(broadcasts_to(x.shape(), shape),
              "expand: cannot broadcast shape {} to {}; each dim must match or be 1",
              shape_str(x.shape()), shape_str(shape));
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const auto plan = plan_broadcast<1>(shape, {x.shape()});
  FORGE_IF_CUDA(x) {
    cuda::expand(x.dtype(), x.raw_device_data(), out.raw_device_data(), out.numel(),
                 cuda_plan(plan, "expand"), x.device().index);
  }
  if (x.device().is_cpu()) {
    const bool walks = plan.strides[0].back() != 0;
    FORGE_DISPATCH_FLOAT(x.dtype(), "expand", [&] {
      const scalar_t* px = x.data<scalar_t>();
      scalar_t* po = out.data<scalar_t>();
      for_each_run(plan, kCheap, [&](int64_t o, const std::array<int64_t, 1>& at, int64_t len) {
        if (walks) {
          std::copy(px + at[0], px + at[0] + len, po + o);
        } else {
          std::fill(po + o, po + o + len, px[at[0]]);
        }
      });
    });
  }
  if (!autograd::needs_grad({x})) return out;
  return autograd::record("expand", {x}, out, [from = x.shape()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to(g[0], from)};
  });
}

// ---- binary ops ----

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary(a, b, "add", kCheap, cuda::BinaryOp::add,
                      []<typename T>(T x, T y) -> T { return x + y; });
  if (!autograd::needs_grad({a, b})) return out;
  return autograd::record("add", {a, b}, out,
                          [sa = a.shape(), sb = b.shape(), ra = a.requires_grad(),
                           rb = b.requires_grad()](const std::vector<Tensor>& g) {
                            return std::vector<Tensor>{ra ? sum_to(g[0], sa) : Tensor(),
                                                       rb ? sum_to(g[0], sb) : Tensor()};
                          });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary(a, b, "sub", kCheap, cuda::BinaryOp::sub,
                      []<typename T>(T x, T y) -> T { return x - y; });
  if (!autograd::needs_grad({a, b})) return out;
  return autograd::record("sub", {a, b}, out,
                          [sa = a.shape(), sb = b.shape(), ra = a.requires_grad(),
                           rb = b.requires_grad()](const std::vector<Tensor>& g) {
                            // Negate after summing: the reduced tensor is the smaller one.
                            return std::vector<Tensor>{ra ? sum_to(g[0], sa) : Tensor(),
                                                       rb ? neg(sum_to(g[0], sb)) : Tensor()};
                          });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary(a, b, "mul", kCheap, cuda::BinaryOp::mul,
                      []<typename T>(T x, T y) -> T { return x * y; });
  if (!autograd::needs_grad({a, b})) return out;
  const bool ra = a.requires_grad(), rb = b.requires_grad();
  // d(a*b)/da = b and /db = a; only the factor another input's gradient needs is kept.
  return autograd::record(
      "mul", {a, b}, out,
      [sa = a.shape(), sb = b.shape(), ra, rb, a_saved = rb ? a.detach() : Tensor(),
       b_saved = ra ? b.detach() : Tensor()](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{ra ? sum_to(mul(g[0], b_saved), sa) : Tensor(),
                                   rb ? sum_to(mul(g[0], a_saved), sb) : Tensor()};
      });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary(a, b, "div", kCheap, cuda::BinaryOp::div,
                      []<typename T>(T x, T y) -> T { return x / y; });
  if (!autograd::needs_grad({a, b})) return out;
  // y = a / b: dy/da = 1 / b, dy/db = -a / b^2 = -y / b. Both start from g / b
  // (output shape), so it is computed once.
  return autograd::record(
      "div", {a, b}, out,
      [sa = a.shape(), sb = b.shape(), ra = a.requires_grad(), rb = b.requires_grad(),
       b_saved = b.detach(),
       y_saved = b.requires_grad() ? out.detach() : Tensor()](const std::vector<Tensor>& g) {
        const Tensor g_over_b = div(g[0], b_saved);
        return std::vector<Tensor>{ra ? sum_to(g_over_b, sa) : Tensor(),
                                   rb ? neg(sum_to(mul(g_over_b, y_saved), sb)) : Tensor()};
      });
}

// ---- selection ----

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_mask(cond, "where", "cond");
  check_float(a, "where", "a");
  check_float(b, "where", "b");
  check_same_device(cond, "cond", a, "a", "where");
  check_same_device(a, "a", b, "b", "where");
  check_same_dtype(a, b, "where");
  const Shape shape =
      broadcast_pair(broadcast_pair(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  const auto plan = plan_broadcast<3>(shape, {cond.shape(), a.shape(), b.shape()});
  FORGE_IF_CUDA(a) {
    cuda::where(a.dtype(), static_cast<const uint8_t*>(cond.raw_device_data()), a.raw_device_data(),
                b.raw_device_data(), out.raw_device_data(), out.numel(), cuda_plan(plan, "where"),
                a.device().index);
  }
  if (a.device().is_cpu()) {
    // Innermost strides are 0 or 1, so multiplying by them keeps each read in place or walking.
    const int64_t sc = plan.strides[0].back(), sa = plan.strides[1].back(),
                  sb = plan.strides[2].back();
    FORGE_DISPATCH_FLOAT(a.dtype(), "where", [&] {
      const uint8_t* pc = mask_data(cond);
      const scalar_t* pa = a.data<scalar_t>();
      const scalar_t* pb = b.data<scalar_t>();
      scalar_t* po = out.data<scalar_t>();
      for_each_run(plan, kCheap, [&](int64_t o, const std::array<int64_t, 3>& at, int64_t len) {
        const uint8_t* c = pc + at[0];
        const scalar_t* x = pa + at[1];
        const scalar_t* y = pb + at[2];
        scalar_t* dst = po + o;
        for (int64_t i = 0; i < len; ++i) dst[i] = c[i * sc] ? x[i * sa] : y[i * sb];
      });
    });
  }
  if (!autograd::needs_grad({a, b})) return out;
  // The gradient flows to whichever operand was picked, then sums back to its shape.
  return autograd::record(
      "where", {cond, a, b}, out,
      [c = cond.detach(), sa_shape = a.shape(), sb_shape = b.shape(), ra = a.requires_grad(),
       rb = b.requires_grad()](const std::vector<Tensor>& g) {
        const Tensor zero = Tensor::zeros({}, g[0].dtype(), g[0].device());
        return std::vector<Tensor>{Tensor(), ra ? sum_to(where(c, g[0], zero), sa_shape) : Tensor(),
                                   rb ? sum_to(where(c, zero, g[0]), sb_shape) : Tensor()};
      });
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_float(x, "masked_fill", "x");
  check_mask(mask, "masked_fill", "mask");
  check_same_device(x, "x", mask, "mask", "masked_fill");
  FORGE_CHECK(broadcasts_to(mask.shape(), x.shape()),
              "masked_fill: mask of shape {} does not broadcast to x's shape {}; each mask dim "
              "must match or be 1",
              shape_str(mask.shape()), shape_str(x.shape()));
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const auto plan = plan_broadcast<2>(x.shape(), {x.shape(), mask.shape()});
  FORGE_IF_CUDA(x) {
    cuda::masked_fill(
        x.dtype(), x.raw_device_data(), static_cast<const uint8_t*>(mask.raw_device_data()), value,
        out.raw_device_data(), out.numel(), cuda_plan(plan, "masked_fill"), x.device().index);
  }
  if (x.device().is_cpu()) {
    const int64_t sm = plan.strides[1].back();
    FORGE_DISPATCH_FLOAT(x.dtype(), "masked_fill", [&] {
      const scalar_t* px = x.data<scalar_t>();
      const uint8_t* pm = mask_data(mask);
      scalar_t* po = out.data<scalar_t>();
      const auto v = static_cast<scalar_t>(value);
      for_each_run(plan, kCheap, [&](int64_t o, const std::array<int64_t, 2>& at, int64_t len) {
        const scalar_t* src = px + at[0];
        const uint8_t* m = pm + at[1];
        scalar_t* dst = po + o;
        for (int64_t i = 0; i < len; ++i) dst[i] = m[i * sm] ? v : src[i];
      });
    });
  }
  if (!autograd::needs_grad({x})) return out;
  // Filled positions are constants: their gradient is 0.
  return autograd::record("masked_fill", {x, mask}, out,
                          [m = mask.detach()](const std::vector<Tensor>& g) {
                            return std::vector<Tensor>{masked_fill(g[0], m, 0.0), Tensor()};
                          });
}

}  // namespace forge::ops

namespace forge {

Tensor operator+(const Tensor& a, const Tensor& b) {
  return ops::add(a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return ops::sub(a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return ops::mul(a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return ops::div(a, b);
}
Tensor operator+(const Tensor& a, double s) {
  return ops::add(a, s);
}
Tensor operator-(const Tensor& a, double s) {
  return ops::add(a, -s);
}
Tensor operator*(const Tensor& a, double s) {
  return ops::mul(a, s);
}
// Multiplying by 1/s may differ from a true division in the last bit.
Tensor operator/(const Tensor& a, double s) {
  return ops::mul(a, 1.0 / s);
}
Tensor operator+(double s, const Tensor& a) {
  return ops::add(a, s);
}
Tensor operator-(double s, const Tensor& a) {
  return ops::add(ops::neg(a), s);
}
Tensor operator*(double s, const Tensor& a) {
  return ops::mul(a, s);
}
Tensor operator-(const Tensor& a) {
  return ops::neg(a);
}

}  // namespace forge
