// The tiled ("flash") softmax-attention kernels on the GPU, shared by the
// softmax, local and linformer ops (flash_cuda.cu). Defined only in builds
// with CUDA; called under FORGE_IF_CUDA.
//
// Per batch-head bh in [0, B*H), all tensors dense and row-major:
//   q [BH, N, d], k [BH, M, d], v [BH, M, dv], o [BH, N, dv], of `dtype`
//   (f32, f64, bf16, f16); lse [BH, N] in the accumulation type (f64 for f64,
//   f32 otherwise).
//   S = scale q k^T; S[i, j] = -inf where key j is masked (kpm), outside the
//   band, or (causal) j > i; P = softmax_j(S); P = dropout(P); o = P v.
// A row with every key masked gets o = 0 and lse = -inf; its gradients are 0.
// Nothing of size N x M is ever written to memory: the forward keeps a
// running max and sum per row (online softmax) and saves lse; the backward
// recomputes each score tile from q, k and lse.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace forge::cuda {

// The widest head (d, dv) the kernels take: their shared-memory tiles hold
// whole rows of q, k, v. The ops check it and name themselves in the error.
constexpr int64_t kFlashMaxHeadDim = 256;

// The kernels. `tiled` (the default): the kernels of flash_cuda.cu's first
// part, every case. `mma` (issue 29; not yet run on a GPU, docs/GPU.md):
// FlashAttention-2's forward and backward on the tensor-core tile engine
// (tile_engine.cuh) for bf16 / f16 with d = dv = 64 or 128 and no dropout;
// other cases still take `tiled`. `cudnn` (issue 29; not yet run): cuDNN's
// fused attention (sdpa_cudnn_cuda.cpp) where it takes the case (bf16 / f16,
// d = dv <= 128, no mask, band, causality or dropout, cuDNN >= 9.13.1, an
// engine from its heuristics), else as `mma`. All save the same o and lse,
// so any backward follows any forward.
enum class FlashEngine { tiled, mma, cudnn };

struct FlashArgs {
  int64_t B = 0, H = 0, N = 0, M = 0, d = 0, dv = 0;
  DType dtype = DType::f32;
  double scale = 0;     // the op resolves its default (d^-1/2) before the call
  bool causal = false;  // query i sees keys j <= i (N == M)
  // Key padding mask [B, M] on the device, a non-zero byte = a real token; null: none.
  const uint8_t* kpm = nullptr;
  // Band (local attention; window 0: no band). Query i lies in window
  // u = i / window and sees keys [(u - look_backward) window, (u + look_forward + 1) window)
  // clipped to [0, M).
  int64_t window = 0, look_backward = 0, look_forward = 0;
  // Dropout on P with probability p (0: none), from the reserved Philox stream
  // (seed, offset): element (bh, i, j) keeps iff
  //   philox uniform_f32 draw number first + (bh * N + i) * drop_row + (j - drop_col0(i))  >=  p
  // where drop_row = M and drop_col0 = 0 without a band, and drop_row =
  // window * (look_backward + 1 + look_forward), drop_col0(i) =
  // (i / window - look_backward) * window with one: the same draws as the CPU
  // ops (Generator::uniform_f32(seed, offset, n)). Kept entries are scaled by 1 / (1 - p).
  // `first` is this batch shard's first draw (Generator::reserve_rows; 0 in a
  // single process): bh counts the local batch-heads.
  double dropout = 0;
  uint64_t seed = 0, offset = 0, first = 0;
  FlashEngine engine = FlashEngine::tiled;
};

// o and lse from q, k, v.
void flash_forward(const FlashArgs& a, const void* q, const void* k, const void* v, void* o,
                   void* lse, int device);

// cuDNN's fused attention (FlashEngine::cudnn; sdpa_cudnn_cuda.cpp): whether
// it may take the case (engine, cuDNN version, dtype, shape, no mask, band,
// causality or dropout), and the forward / backward, which return false,
// doing nothing, when cuDNN has no engine for it. lse, as the flash kernels'.
bool cudnn_sdpa_takes(const FlashArgs& a);
bool cudnn_sdpa_forward(const FlashArgs& a, const void* q, const void* k, const void* v, void* o,
                        void* lse, int device);
bool cudnn_sdpa_backward(const FlashArgs& a, const void* q, const void* k, const void* v,
                         const void* o, const void* lse, const void* dout, void* dq, void* dk,
                         void* dv, int device);

// dq, dk, dv (each overwritten) from the forward's inputs, its o and lse, and
// do = the gradient of o. `scratch` holds BH * N accumulation-type values
// (rowsum(do * o) per row). Deterministic: no atomics.
void flash_backward(const FlashArgs& a, const void* q, const void* k, const void* v, const void* o,
                    const void* lse, const void* dout, void* scratch, void* dq, void* dk, void* dv,
                    int device);

}  // namespace forge::cuda
