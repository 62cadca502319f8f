// matmul and linear on OpenBLAS. Shapes: a (..., n, k) [or (..., k, n) with
// trans_a], b (..., k, m) [or (..., m, k) with trans_b] -> c (..., n, m), the
// batch dims broadcast. The backward is two more matmuls with flipped
// transpose flags, so no kernel ever needs a strided layout.
#include "ops/linalg/matmul.h"

#include "autograd/node.h"
#include "core/threading.h"
#include "ops/blas.h"
#include "ops/elementwise/elementwise.h"
#include "ops/layout/layout.h"
#include "ops/reduce/reduce.h"

namespace forge::ops {

namespace {

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

Tensor matmul_forward(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  FORGE_CHECK(a.dim() >= 2 && b.dim() >= 2,
              "matmul: both operands need at least 2 dims, got {} and {}", shape_str(a.shape()),
              shape_str(b.shape()));
  FORGE_CHECK(a.dtype() == b.dtype(), "matmul: dtypes differ ({} and {})", dtype_name(a.dtype()),
              dtype_name(b.dtype()));
  FORGE_CHECK(a.device().is_cpu() && b.device().is_cpu(),
              "matmul: CPU tensors expected, got {} and {}", a.device().str(), b.device().str());
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
  Tensor c = Tensor::empty(out_shape, a.dtype());
  if (c.numel() == 0) return c;
  if (ka == 0) {
    c.fill(0.0);
    return c;
  }
  const int64_t batches = shape_numel(batch);
  FORGE_DISPATCH_FLOAT(a.dtype(), "matmul", [&] {
    const scalar_t* ap = a.data<scalar_t>();
    const scalar_t* bp = b.data<scalar_t>();
    scalar_t* cp = c.data<scalar_t>();
    if (!ta && shape_numel(b_batch) == 1 && a_batch == batch) {
      // b is one matrix shared by every batch: fold a's batch into its rows, one GEMM.
      gemm(false, tb, batches * n, m, ka, scalar_t(1), ap, bp, scalar_t(0), cp);
      return;
    }
    const int64_t a_mat = n * ka, b_mat = ka * m, c_mat = n * m;
    auto one = [&](int64_t i) {
      gemm(ta, tb, n, m, ka, scalar_t(1), ap + broadcast_batch_offset(i, batch, a_batch) * a_mat,
           bp + broadcast_batch_offset(i, batch, b_batch) * b_mat, scalar_t(0), cp + i * c_mat);
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
  });
  return c;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  Tensor c = matmul_forward(a, b, trans_a, trans_b);
  return autograd::record(
      "matmul", {a, b}, c,
      [a = a.detach(), b = b.detach(), ta = trans_a, tb = trans_b, need_a = a.requires_grad(),
       need_b = b.requires_grad()](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        // In the forward c = op(a) op(b), so d op(a) = dc op(b)^T and d op(b) = op(a)^T dc;
        // undoing op() turns each into one matmul with flipped flags.
        const Tensor& dc = grads[0];
        Tensor da, db;
        if (need_a) {
          da = ta ? matmul_forward(b, dc, tb, true) : matmul_forward(dc, b, false, !tb);
          da = sum_to(da, a.shape());
        }
        if (need_b) {
          if (b.dim() == 2 && a.dim() > 2 && !ta) {
            // A shared weight: fold the batch into the rows, one GEMM instead of
            // a (batch, k, m) product summed afterwards.
            const Tensor a2 = a.view({-1, a.size(-1)}), dc2 = dc.view({-1, dc.size(-1)});
            db = tb ? matmul_forward(dc2, a2, true, false) : matmul_forward(a2, dc2, true, false);
          } else {
            db = tb ? matmul_forward(dc, a, true, ta) : matmul_forward(a, dc, !ta, false);
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
  Tensor x2 = x.dim() == 1 ? unsqueeze(x, 0) : x;
  Tensor y = matmul(x2, weight, false, true);
  if (bias.defined()) {
    FORGE_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0),
                "linear: bias must be ({}), got {}", weight.size(0), shape_str(bias.shape()));
    y = add(y, bias);
  }
  return x.dim() == 1 ? squeeze(y, 0) : y;
}

}  // namespace forge::ops
