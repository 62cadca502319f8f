// TaylorShift attention on the GPU (taylorshift_cuda.cu): the direct form as
// flash-style tiles with polynomial scores, the efficient form as GEMMs whose
// d^2 outer-product features are formed inside their tiles. Neither holds
// anything N x M (or N x d^2) in memory. Defined only in builds with CUDA;
// taylorshift.cpp calls them under FORGE_IF_CUDA, after its argument checks.
//
// Per batch-head bh in [0, B*H), all tensors dense and row-major, of `dtype`
// (f32, f64, bf16, f16): q [BH, N, d], k [BH, M, d], v [BH, M, dv],
// o [BH, N, dv], tau [H]. norm [BH, N] is in the accumulation type (f64 for
// f64, f32 otherwise): the per-row normaliser the backward needs, rowsum(T)
// (direct) or Y[:, 0] (efficient), as the CPU op saves it. The function is the
// CPU op's (ATTENTION.md, "taylorshift"): the same masks, the key count n_b of
// v~ and of output_normalized's sqrt(n_b / d), and 0 for a row without keys.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace forge::cuda {

struct TaylorShiftArgs {
  int64_t B = 0, H = 0, N = 0, M = 0, d = 0, dv = 0;
  DType dtype = DType::f32;
  double a = 0.5, b = 1, c = 1;  // T(A) = a A^2 + b A + c
  bool direct = true;            // the form the op picked: direct, or efficient
  bool output_normalized = false;
  // Key padding mask [B, M] on the device, a non-zero byte = a real key; null: none.
  const uint8_t* kpm = nullptr;
};

// The largest head dims (d and dv) of the direct form's kernels.
constexpr int64_t kTaylorShiftDirectMaxDim = 256;

// Bytes of device scratch taylorshift_forward (backward = false) or
// taylorshift_backward needs for these arguments on `device`.
int64_t taylorshift_scratch_bytes(const TaylorShiftArgs& a, bool backward, int device);

// o and norm from q, k, v, tau.
void taylorshift_forward(const TaylorShiftArgs& a, const void* q, const void* k, const void* v,
                         const void* tau, void* o, void* norm, void* scratch, int device);

// dq, dk, dv, dtau (each overwritten) from the forward's inputs, its o and norm,
// and dout = the gradient of o. Deterministic: no atomics; every sum over rows
// runs in a fixed order.
void taylorshift_backward(const TaylorShiftArgs& a, const void* q, const void* k, const void* v,
                          const void* tau, const void* o, const void* norm, const void* dout,
                          void* dq, void* dk, void* dv, void* dtau, void* scratch, int device);

}  // namespace forge::cuda
