// The GPU path that softmax and local share (internal): the tiled kernels of
// flash_cuda.cu as one autograd node. The forward saves o and the logsumexp
// (in the accumulation type); the backward recomputes every score tile from
// them. Under autocast (ops/autocast.h) f32 inputs are computed on as bf16 /
// f16 copies, on the tensor cores, and the output and the gradients come back
// in f32, as for the GEMMs. Called only under FORGE_IF_CUDA; the launcher
// calls here sit inside
// `if constexpr (kCudaBuilt)`, so a build without CUDA compiles them away.
#pragma once

#include <vector>

#include "autograd/node.h"
#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/attention/attention.h"
#include "ops/attention/flash_cuda.h"
#include "ops/autocast.h"
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
  Tensor query_real;  // [B, 1, N, 1] bool: true where the query is a real token
  if (key_padding_mask.defined()) {
    a.kpm = static_cast<const uint8_t*>(key_padding_mask.raw_device_data());
    if (mask_queries) query_real = key_padding_mask.to(DType::boolean).view({a.B, 1, a.N, 1});
  }
  a.engine = flash_engine();
  // The dtype the kernels compute in (with autocast, the low copies of q, k, v).
  const bool cast = autocasts(q) && autocasts(k) && autocasts(v);
  a.dtype = cast ? autocast_dtype() : q.dtype();
  const Tensor qc = cast ? q.to(a.dtype) : q.detach(), kc = cast ? k.to(a.dtype) : k.detach(),
               vc = cast ? v.to(a.dtype) : v.detach();
  const DType acc = a.dtype == DType::f64 ? DType::f64 : DType::f32;
  Tensor oc = Tensor::empty({a.B, a.H, a.N, a.dv}, a.dtype, q.device());
  Tensor lse = Tensor::empty({a.B, a.H, a.N}, acc, q.device());  // logsumexp of each score row
  if constexpr (kCudaBuilt)
    cuda::flash_forward(a, qc.raw_device_data(), kc.raw_device_data(), vc.raw_device_data(),
                        oc.raw_device_data(), lse.raw_device_data(), q.device().index);
  if (query_real.defined()) oc = ops::mul(oc, query_real.to(a.dtype));
  const Tensor o = cast ? oc.to(q.dtype()) : oc;
  if (!autograd::needs_grad({q, k, v})) return o;
  return autograd::record(
      name, {q, k, v}, o,
      [a, qc, kc, vc, oc, lse, mask = key_padding_mask, query_real, out_dtype = q.dtype(),
       need_q = q.requires_grad(), need_k = k.requires_grad(),
       need_v = v.requires_grad()](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        Tensor dout = grads[0].dtype() == a.dtype ? grads[0] : grads[0].to(a.dtype);
        if (query_real.defined()) dout = ops::mul(dout, query_real.to(a.dtype));
        Tensor dq = Tensor::empty(qc.shape(), a.dtype, qc.device()),
               dk = Tensor::empty(kc.shape(), a.dtype, kc.device()),
               dv = Tensor::empty(vc.shape(), a.dtype, vc.device());
        Tensor delta =
            Tensor::empty({a.B * a.H * a.N}, lse.dtype(), qc.device());  // rowsum(do * o)
        if constexpr (kCudaBuilt)
          cuda::flash_backward(a, qc.raw_device_data(), kc.raw_device_data(), vc.raw_device_data(),
                               oc.raw_device_data(), lse.raw_device_data(), dout.raw_device_data(),
                               delta.raw_device_data(), dq.raw_device_data(), dk.raw_device_data(),
                               dv.raw_device_data(), qc.device().index);
        // Gradients in the inputs' dtype (f32 under autocast).
        auto back = [&](const Tensor& g, bool need) {
          return !need ? Tensor() : g.dtype() == out_dtype ? g : g.to(out_dtype);
        };
        return {back(dq, need_q), back(dk, need_k), back(dv, need_v)};
      });
}

}  // namespace forge::ops::attention
