// matmul and linear on OpenBLAS (CPU) and cuBLAS (GPU). Shapes: a (..., n, k)
// [or (..., k, n) with trans_a], b (..., k, m) [or (..., m, k) with trans_b]
// -> c (..., n, m), the batch dims broadcast. The backward is two more
// matmuls with flipped transpose flags, so no kernel ever needs a strided
// layout. Under autocast the product runs on bf16 / f16 copies of the f32
// operands, which the backward reuses (half the memory of saving the f32
// ones); every result and gradient is f32.
#include "ops/linalg/matmul.h"

#include <atomic>

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/autocast.h"
#include "ops/blas.h"
#include "ops/elementwise/elementwise.h"
#include "ops/layout/layout.h"
#include "ops/linalg/matmul_cuda.h"
#include "ops/reduce/reduce.h"

namespace forge::ops {

namespace {

std::atomic<bool> tf32_allowed{false};

// Offset (in matrices) of batch index `i` of `out_batch` inside a tensor whose
// batch shape `in_batch` broadcasts to it (right-aligned, size-1 dims repeat).
int64_t broadcast_batch_offset(int64_t i, const Shape& out_batch, const Shape& in_batch) {
  int64_t offset = 0, stride = 1;
  const size_t shift = out_batch.size() - in_batch.size();
  for (size_t d = out_batch.size(); d-- > 0;) {
    const int64_t idx = i % out_batch[d];
    i /= out_batch[d];
    if (d >= shift) {
      const int64_t size = in_batch[d - shift];
      if (size != 1) offset += idx * stride;
      stride *= size;
    }
  }
  return offset;
}

// c = op(a) op(b) [+ bias on every row] of out_dtype: a's dtype, or f32 for
// bf16 / f16 operands (autocast; on the CPU bf16 only, ops/blas.h). With a `bias` (m, out_dtype) the
// GEMM accumulates (beta = 1) into rows that start as the bias: no separate
// pass adds it, and none zeroes c first.
Tensor product(const Tensor& a, const Tensor& b, bool ta, bool tb, DType out_dtype,
               const Tensor& bias = Tensor()) {
  FORGE_CHECK(a.dim() >= 2 && b.dim() >= 2,
              "matmul: both operands need at least 2 dims, got {} and {}", shape_str(a.shape()),
              shape_str(b.shape()));
  FORGE_CHECK(a.dtype() == b.dtype(), "matmul: dtypes differ ({} and {})", dtype_name(a.dtype()),
              dtype_name(b.dtype()));
  FORGE_CHECK(a.device() == b.device(), "matmul: operands on different devices ({} and {})",
              a.device().str(), b.device().str());
  const int64_t n = a.size(ta ? -1 : -2), ka = a.size(ta ? -2 : -1);
  const int64_t kb = b.size(tb ? -1 : -2), m = b.size(tb ? -2 : -1);
  FORGE_CHECK(ka == kb, "matmul: inner dims differ: a {}{} has k = {}, b {}{} has k = {}",
              shape_str(a.shape()), ta ? " (transposed)" : "", ka, shape_str(b.shape()),
              tb ? " (transposed)" : "", kb);
  const Shape a_batch(a.shape().begin(), a.shape().end() - 2),
      b_batch(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = broadcast_shapes(a_batch, b_batch);
  Shape out_shape = batch;
  out_shape.push_back(n);
  out_shape.push_back(m);
  Tensor c = Tensor::empty(out_shape, out_dtype, a.device());
  if (c.numel() == 0) return c;
  const int64_t batches = shape_numel(batch);
  FORGE_IF_CUDA(a) {
    const int device = a.device().index;
    if (bias.defined())
      cuda::fill_rows(out_dtype, bias.raw_device_data(), c.raw_device_data(), batches * n, m,
                      device);
    cuda::GemmArgs g{.ta = ta,
                     .tb = tb,
                     .n = n,
                     .m = m,
                     .k = ka,
                     .batch = batches,
                     .ab_dtype = a.dtype(),
                     .a = a.raw_device_data(),
                     .stride_a = n * ka,
                     .b = b.raw_device_data(),
                     .stride_b = ka * m,
                     .c_dtype = out_dtype,
                     .c = c.raw_device_data(),
                     .accumulate = bias.defined(),
                     .tf32 = allow_tf32()};
    const int64_t a_count = shape_numel(a_batch), b_count = shape_numel(b_batch);
    if (!ta && b_count == 1 && a_count == batches) {
      // One matrix of b for every batch: a's batch folds into its rows, one GEMM.
      g.n = batches * n;
      g.batch = 1;
      cuda::gemm(g, device);
      return c;
    }
    // A strided batch: an operand with one matrix repeats it (stride 0); one
    // broadcast in a pattern no single stride expresses (say [2, 1] against
    // [2, 3]) is materialised first.
    Tensor a_full, b_full;  // materialised operands, alive until the GEMM is queued
    const auto full_shape = [&](const Tensor& t) {
      Shape s = batch;
      s.push_back(t.size(-2));
      s.push_back(t.size(-1));
      return s;
    };
    if (a_count == 1) {
      g.stride_a = 0;
    } else if (a_count != batches) {
      a_full = expand(a.detach(), full_shape(a));
      g.a = a_full.raw_device_data();
    }
    if (b_count == 1) {
      g.stride_b = 0;
    } else if (b_count != batches) {
      b_full = expand(b.detach(), full_shape(b));
      g.b = b_full.raw_device_data();
    }
    cuda::gemm(g, device);
    return c;
  }
  const bool low = a.dtype() == DType::bf16;  // autocast on the CPU: bf16 operands, f32 result
  FORGE_CHECK(out_dtype == (low ? DType::f32 : a.dtype()),
              "matmul (CPU): expected a {} result for {} operands, got {}",
              dtype_name(low ? DType::f32 : a.dtype()), dtype_name(a.dtype()),
              dtype_name(out_dtype));
  FORGE_CHECK(!bias.defined() || (!ta && shape_numel(b_batch) == 1 && a_batch == batch),
              "matmul (CPU): a fused bias needs one matrix b for every batch");
  if (ka == 0 && !bias.defined()) {
    c.fill(0.0);
    return c;
  }
  // AB: the operands' element type; C: the result's.
  const auto run = [&]<typename AB, typename C>() {
    const AB* ap = a.data<AB>();
    const AB* bp = b.data<AB>();
    C* cp = c.data<C>();
    if (!ta && shape_numel(b_batch) == 1 && a_batch == batch) {
      // b is one matrix shared by every batch: fold a's batch into its rows, one GEMM.
      C beta(0);
      if (bias.defined()) {
        const C* bias_p = bias.data<C>();
        parallel_for(batches * n, m, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) std::copy(bias_p, bias_p + m, cp + r * m);
        });
        beta = C(1);
      }
      if (ka > 0) gemm(false, tb, batches * n, m, ka, C(1), ap, bp, beta, cp);
      return;
    }
    const int64_t a_mat = n * ka, b_mat = ka * m, c_mat = n * m;
    auto one = [&](int64_t i) {
      gemm(ta, tb, n, m, ka, C(1), ap + broadcast_batch_offset(i, batch, a_batch) * a_mat,
           bp + broadcast_batch_offset(i, batch, b_batch) * b_mat, C(0), cp + i * c_mat);
    };
    // Many small products: one per thread (BLAS runs single-threaded inside an
    // OpenMP region); few large ones: one after another, BLAS uses every thread.
    if (batches >= num_threads() && n * m * ka < 64 * 64 * 64 * 8) {
      parallel_for(batches, n * m * ka, [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) one(i);
      });
    } else {
      for (int64_t i = 0; i < batches; ++i) one(i);
    }
  };
  if (low) {
    run.template operator()<BF16, float>();
  } else {
    FORGE_DISPATCH_FLOAT(a.dtype(), "matmul", [&] { run.template operator()<scalar_t, scalar_t>(); });
  }
  return c;
}

}  // namespace

void set_allow_tf32(bool allow) {
  tf32_allowed = allow;
}

bool allow_tf32() {
  return tf32_allowed;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const bool cast = autocasts(a) && autocasts(b);
  const Tensor a_in = cast ? a.to(autocast_dtype()) : a.detach();
  const Tensor b_in = cast ? b.to(autocast_dtype()) : b.detach();
  Tensor c = product(a_in, b_in, trans_a, trans_b, a.dtype());
  return autograd::record(
      "matmul", {a, b}, c,
      [a = a_in, b = b_in, ta = trans_a, tb = trans_b, out = a.dtype(), need_a = a.requires_grad(),
       need_b = b.requires_grad()](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        // In the forward c = op(a) op(b), so d op(a) = dc op(b)^T and d op(b) = op(a)^T dc;
        // undoing op() turns each into one matmul with flipped flags. Under autocast a and b
        // are the low-precision copies: dc is cast to match, the gradients come out f32.
        const Tensor dc = grads[0].dtype() == a.dtype() ? grads[0] : grads[0].to(a.dtype());
        Tensor da, db;
        if (need_a) {
          da = ta ? product(b, dc, tb, true, out) : product(dc, b, false, !tb, out);
          da = sum_to(da, a.shape());
        }
        if (need_b) {
          if (b.dim() == 2 && a.dim() > 2 && !ta) {
            // A shared weight: fold the batch into the rows, one GEMM instead of
            // a (batch, k, m) product summed afterwards.
            const Tensor a2 = a.view({-1, a.size(-1)}), dc2 = dc.view({-1, dc.size(-1)});
            db = tb ? product(dc2, a2, true, false, out) : product(a2, dc2, true, false, out);
          } else {
            db = tb ? product(dc, a, true, ta, out) : product(a, dc, !ta, false, out);
            db = sum_to(db, b.shape());
          }
        }
        return {da, db};
      });
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  FORGE_CHECK(weight.dim() == 2, "linear: weight must be (out, in), got {}",
              shape_str(weight.shape()));
  FORGE_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1),
              "linear: input {} has last dim {}, weight {} expects {}", shape_str(x.shape()),
              x.dim() >= 1 ? x.size(-1) : 0, shape_str(weight.shape()), weight.size(1));
  FORGE_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
              "linear: bias must be ({}), got {}", weight.size(0), shape_str(bias.shape()));
  // One node, the bias added inside the GEMM (its rows start as the bias).
  // Under autocast x and the weight are multiplied as low-precision
  // copies (kept for the backward); y and every gradient are f32, as the bias.
  for (const Tensor& t : {weight, bias})
    FORGE_CHECK(!t.defined() || (t.dtype() == x.dtype() && t.device() == x.device()),
                "linear: the input is {} on {} but the {} is {} on {}; expected one dtype and "
                "device",
                dtype_name(x.dtype()), x.device().str(), t.same(weight) ? "weight" : "bias",
                dtype_name(t.dtype()), t.device().str());
  const int64_t in = weight.size(1), out = weight.size(0);
  const int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  const bool cast = autocasts(x) && autocasts(weight);
  const DType dtype = x.dtype();
  const Tensor x_in = (cast ? x.to(autocast_dtype()) : x.detach()).view({rows, in});
  const Tensor w_in = cast ? weight.to(autocast_dtype()) : weight.detach();
  Shape y_shape = x.shape();
  y_shape.back() = out;
  const Tensor y =
      product(x_in, w_in, false, true, dtype, bias.defined() ? bias.detach() : Tensor())
          .view(y_shape);  // (rows, in) (out, in)^T
  return autograd::record(
      "linear", {x, weight, bias}, y,
      [x_saved = weight.requires_grad() ? x_in : Tensor(),
       w_saved = x.requires_grad() ? w_in : Tensor(), low = w_in.dtype(), dtype, rows, out,
       x_shape = x.shape(), need_x = x.requires_grad(), need_w = weight.requires_grad(),
       need_b = bias.defined() &&
                bias.requires_grad()](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        const Tensor dy = grads[0].view({rows, out});
        const Tensor g = dy.dtype() == low ? dy : dy.to(low);
        Tensor dx, dw, db;
        if (need_x) dx = product(g, w_saved, false, false, dtype).view(x_shape);  // (rows, in)
        if (need_w) dw = product(g, x_saved, true, false, dtype);                 // (out, in)
        if (need_b) db = sum_to(dy, {out});
        return {dx, dw, db};
      });
}

}  // namespace forge::ops
