#include "ops/attention/common.h"

#include "ops/autocast.h"

namespace forge::ops::attention {

Dims4 check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& key_padding_mask, bool self_only, bool cuda_ok) {
  const char* names[] = {"q", "k", "v"};
  const Tensor* ts[] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    const Tensor& t = *ts[i];
    FORGE_CHECK(t.defined(), "attention::{}: {} is undefined", op, names[i]);
    FORGE_CHECK(t.dim() == 4, "attention::{}: {} must be [B, H, len, dim], got {}", op, names[i],
                shape_str(t.shape()));
    FORGE_CHECK(t.device() == q.device(), "attention::{}: {} is on {} but q is on {}", op, names[i],
                t.device().str(), q.device().str());
    FORGE_CHECK(cuda_ok || t.device().is_cpu(),
                "attention::{}: {} is on {}, and this mechanism runs on the CPU only so far (its "
                "fused CUDA kernels are not written yet); on the GPU use the softmax mechanism, "
                "or run on the CPU",
                op, names[i], t.device().str());
    const bool half = t.device().is_cuda() && (t.dtype() == DType::bf16 || t.dtype() == DType::f16);
    FORGE_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64 || half,
                "attention::{}: {} must be f32 or f64 (or bf16 / f16 on a GPU), got {}", op,
                names[i], dtype_name(t.dtype()));
    FORGE_CHECK(t.dtype() == q.dtype(), "attention::{}: {} is {} but q is {}", op, names[i],
                dtype_name(t.dtype()), dtype_name(q.dtype()));
  }
  Dims4 s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  FORGE_CHECK(k.size(0) == s.B && k.size(1) == s.H && k.size(3) == s.d,
              "attention::{}: k {} does not match q {} (expected [{}, {}, M, {}])", op,
              shape_str(k.shape()), shape_str(q.shape()), s.B, s.H, s.d);
  FORGE_CHECK(v.size(0) == s.B && v.size(1) == s.H && v.size(2) == s.M,
              "attention::{}: v {} does not match k {} (expected [{}, {}, {}, dv])", op,
              shape_str(v.shape()), shape_str(k.shape()), s.B, s.H, s.M);
  FORGE_CHECK(!self_only || s.N == s.M,
              "attention::{}: needs keys as long as queries here (causal or self-attention only), "
              "got N = {}, "
              "M = {}",
              op, s.N, s.M);
  if (key_padding_mask.defined()) {
    FORGE_CHECK(key_padding_mask.dtype() == DType::boolean || key_padding_mask.dtype() == DType::u8,
                "attention::{}: key_padding_mask must be bool or u8, got {}", op,
                dtype_name(key_padding_mask.dtype()));
    FORGE_CHECK(key_padding_mask.shape() == Shape({s.B, s.M}),
                "attention::{}: key_padding_mask must be [B, M] = [{}, {}], got {}", op, s.B, s.M,
                shape_str(key_padding_mask.shape()));
    FORGE_CHECK(key_padding_mask.device() == q.device(),
                "attention::{}: key_padding_mask is on {} but q is on {}", op,
                key_padding_mask.device().str(), q.device().str());
  }
  return s;
}

const uint8_t* mask_bytes(const Tensor& key_padding_mask) {
  return key_padding_mask.defined() ? static_cast<const uint8_t*>(key_padding_mask.raw_data())
                                    : nullptr;
}

CpuOperands cpu_operands(const Tensor& q, const Tensor& k, const Tensor& v, int64_t keys) {
  const bool low = autocasts(q) && autocasts(k) && autocasts(v) && keys >= kMinBf16Keys;
  if (!low) return {q.detach(), k.detach(), v.detach(), false};
  return {q.to(DType::bf16), k.to(DType::bf16), v.to(DType::bf16), true};
}

}  // namespace forge::ops::attention
