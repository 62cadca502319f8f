// Performer FAVOR+ attention on the GPU (favor_cuda.cu): the random-feature
// maps fused with their projection GEMM, attention on the features through
// the linear-attention core (linear_core_cuda.h) or, for the causal softmax
// map with the prefix stabiliser, through favor's own chunkwise scan, and the
// backward of both. Defined only in builds with CUDA; ops/attention/favor.cpp
// calls it under FORGE_IF_CUDA after checking the arguments. The math is the
// CPU op's (favor.cpp, ATTENTION.md "favor").
//
// All tensors dense and row-major, per batch-head bh in [0, B*H):
//   q [BH, N, d], k [BH, M, d], v [BH, M, dv], o / dO [BH, N, dv], W [m, d]
//   (null for the no_projection map), all of `dtype` (f32, f64, bf16, f16);
//   mask [B, M] bytes on the device (non-zero = a real key) or null;
//   den [BH, N] in the accumulation type (f64 for f64, f32 otherwise): the
//   normaliser of each output row, written by the forward of the prefix scan
//   and read by its backward (null for every other option).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace forge::cuda {

// The reference's constants, shared with the CPU op.
inline constexpr double kFavorSoftmaxEps = 1e-4;  // kernel_epsilon of the softmax map
inline constexpr double kFavorReluEps = 1e-3;     // kernel_epsilon of the generalized (relu) map
inline constexpr double kFavorCausalEps = 1e-6;   // added to every entry of the causal normaliser

enum class FavorMap { softmax, relu, no_projection };

struct FavorArgs {
  int64_t B = 0, H = 0, N = 0, M = 0, d = 0, dv = 0;
  int64_t F = 0;  // feature count: W's rows m, or d for no_projection
  DType dtype = DType::f32;
  FavorMap map = FavorMap::softmax;
  bool causal = false;  // query i sees keys j <= i (N == M)
  bool prefix = false;  // causal softmax map with the prefix stabiliser (false: global)
};

// Accumulation-type elements of the scratch buffer favor_forward (backward
// false) or favor_backward (true) needs: the [N, F] / [M, F] feature maps
// and per-row values, plus the chunk states of the prefix scan.
int64_t favor_workspace_elems(const FavorArgs& a, bool backward);

// o from q, k, v (and den for the prefix scan).
void favor_forward(const FavorArgs& a, const void* q, const void* k, const void* v, const void* W,
                   const uint8_t* mask, void* o, void* den, void* workspace, int device);

// dq, dk, dv (each overwritten, of `dtype`) from the forward's inputs, its o
// and den, and dO = the gradient of o. W gets no gradient (a buffer).
void favor_backward(const FavorArgs& a, const void* q, const void* k, const void* v, const void* W,
                    const uint8_t* mask, const void* o, const void* den, const void* dO, void* dq,
                    void* dk, void* dv, void* workspace, int device);

}  // namespace forge::cuda
