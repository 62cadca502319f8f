// Mixed precision (autocast). While an AutocastGuard(bf16 or f16) is alive on
// a thread, the GEMM-shaped ops given f32 tensors compute in that dtype with
// f32 accumulation and return f32 (gradients too):
// - on a GPU: matmul, linear, the patch-embedding convolution, and the softmax
//   and local attention ops (whose tiled kernels are two GEMMs per tile), on
//   the tensor cores, in bf16 or f16;
// - on the CPU: matmul, linear, the patch embedding (a linear map there) and
//   softmax and local attention once their tiles hold 128 keys (smaller
//   tiles cost more in oneDNN calls than they gain), in bf16 only (oneDNN,
//   ops/blas.h); the other attention kernels compute in f32, and f16 leaves
//   the CPU in f32.
// Every other op, the parameters (the f32 master weights), their gradients
// and the optimizer state stay f32. f64 is never autocast.
#pragma once

#include "core/dtype.h"
#include "core/tensor.h"

namespace forge::ops {

// bf16 or f16 while autocast is on, f32 when off.
DType autocast_dtype();

// Whether a GEMM-shaped op on `t` computes in autocast_dtype(): autocast is on
// and t is an f32 tensor on a GPU, or on the CPU with autocast in bf16.
bool autocasts(const Tensor& t);

class AutocastGuard {
 public:
  // dtype: bf16 or f16 turns autocast on, f32 turns it off (for a region
  // inside an autocast one).
  explicit AutocastGuard(DType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType previous_;
};

}  // namespace forge::ops
