// The GPU path that softmax and local share (internal): the tiled kernels of
// flash_cuda.cu as one autograd node. The forward saves o and the logsumexp
// (in the accumulation type); the backward recomputes every score tile from
// them. Called only under FORGE_IF_CUDA; the launcher calls here sit inside
// `if constexpr (kCudaBuilt)`, so a build without CUDA compiles them away.
#pragma once

#include <vector>

#include "autograd/node.h"
#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/attention/flash_cuda.h"
#include "ops/elementwise/elementwise.h"

namespace forge::ops::attention {

// o [B, H, N, dv] for the op `name` from q, k, v on a GPU with the sizes,
// masks, band and dropout stream of `a` (a.kpm is set here from the mask).
// With `mask_queries` (local attention), rows whose own position is padding
// give 0: o is multiplied by the query mask, and so is the incoming gradient,
// which makes dP and D vanish on those rows, so they add nothing to dq, dk, dv.
inline Tensor flash_attention_cuda(const char* name, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& key_padding_mask,
                                   cuda::FlashArgs a, bool mask_queries = false) {
  FORGE_CHECK(a.d <= cuda::kFlashMaxHeadDim && a.dv <= cuda::kFlashMaxHeadDim,
              "{}: on a GPU the head dims must be <= {}, got d = {}, dv = {}", name,
              cuda::kFlashMaxHeadDim, a.d, a.dv);
  Tensor query_real;  // [B, 1, N, 1]: 1 where the query is a real token
  if (key_padding_mask.defined()) {
    a.kpm = static_cast<const uint8_t*>(key_padding_mask.raw_device_data());
    if (mask_queries)
      query_real = key_padding_mask.to(DType::boolean).to(q.dtype()).view({a.B, 1, a.N, 1});
  }
  const DType acc = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor o = Tensor::empty({a.B, a.H, a.N, a.dv}, q.dtype(), q.device());
  Tensor lse = Tensor::empty({a.B, a.H, a.N}, acc, q.device());  // logsumexp of each score row
  if constexpr (kCudaBuilt)
    cuda::flash_forward(a, q.raw_device_data(), k.raw_device_data(), v.raw_device_data(),
                        o.raw_device_data(), lse.raw_device_data(), q.device().index);
  if (query_real.defined()) o = ops::mul(o, query_real);
  if (!autograd::needs_grad({q, k, v})) return o;
  return autograd::record(
      name, {q, k, v}, o,
      [a, q = q.detach(), k = k.detach(), v = v.detach(), o = o.detach(), lse,
       mask = key_padding_mask, query_real, need_q = q.requires_grad(), need_k = k.requires_grad(),
       need_v = v.requires_grad()](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        const Tensor dout = query_real.defined() ? ops::mul(grads[0], query_real) : grads[0];
        Tensor dq = Tensor::empty(q.shape(), q.dtype(), q.device()),
               dk = Tensor::empty(k.shape(), k.dtype(), k.device()),
               dv = Tensor::empty(v.shape(), v.dtype(), v.device());
        Tensor delta = Tensor::empty({a.B * a.H * a.N}, lse.dtype(), q.device());  // rowsum(do * o)
        if constexpr (kCudaBuilt)
          cuda::flash_backward(a, q.raw_device_data(), k.raw_device_data(), v.raw_device_data(),
                               o.raw_device_data(), lse.raw_device_data(), dout.raw_device_data(),
                               delta.raw_device_data(), dq.raw_device_data(), dk.raw_device_data(),
                               dv.raw_device_data(), q.device().index);
        return {need_q ? dq : Tensor(), need_k ? dk : Tensor(), need_v ? dv : Tensor()};
      });
}

}  // namespace forge::ops::attention
