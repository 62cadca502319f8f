// The shared GPU core of the linear-attention family (linear, efficient,
// favor, taylor_linear): attention on feature maps that the mechanism has
// already computed, as fused reductions + GEMMs (non-causal) or a chunkwise
// scan (causal). Kernels in linear_core_cuda.cu; defined only in builds with
// CUDA and called under FORGE_IF_CUDA. Each mechanism computes its own feature
// maps (and their backward) and calls these two launchers in between.
//
// Per batch-head bh in [0, B*H), all dense row-major:
//   Qf [BH, N, F], Kf [BH, M, F]: feature maps in the accumulation type
//     (f64 for f64, f32 otherwise); Kf rows of padding keys are already 0.
//   V [BH, M, dv], O [BH, N, dv] of `dtype` (f32, f64, bf16, f16).
//   z0 [F] (accumulation type, on the device) or null (zeros): where the
//     normaliser state starts (taylor_linear adds its eps there).
// With J(i) the keys query i sees:
//   non-causal:          every key j < M
//   causal, bucket 1:    j <= i
//   causal, bucket s>1:  the keys of the buckets of s positions before i's
//                        bucket, j < (i / s) * s (the first bucket sees none)
//   S_i = sum_{j in J(i)} Kf_j V_j^T  [F, dv],   z_i = z0 + sum_{j in J(i)} Kf_j  [F]
//   num_i = Qf_i S_i  [dv]
//   o_i = num_i / den_i with den_i = max(Qf_i . z_i + eps, den_min)   (normalise)
//   o_i = num_i                                                         (!normalise)
// Sums accumulate in the accumulation type. The causal form keeps one state
// per chunk of positions and never holds an [N, F, dv] buffer, forward or
// backward (the backward is a reverse scan).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>

#include "core/dtype.h"

namespace forge::cuda {

struct LinearCoreArgs {
  int64_t BH = 0, N = 0, M = 0, F = 0, dv = 0;
  DType dtype = DType::f32;  // of V and O; Qf, Kf, z0, dQf, dKf are the accumulation type
  bool causal = false;       // needs N == M
  int64_t bucket = 1;        // causal only; N % bucket == 0
  bool normalise = true;
  double eps = 0;
  double den_min = -std::numeric_limits<double>::infinity();
  const void* z0 = nullptr;
};

// O from Qf, Kf, V.
void linear_core_forward(const LinearCoreArgs& a, const void* Qf, const void* Kf, const void* V,
                         void* O, int device);

// dQf, dKf (accumulation type) and dV (`dtype`), each overwritten, from the
// forward's inputs and dO = the gradient of O. Where the den_min floor holds,
// den carries no gradient. Deterministic: no atomics.
void linear_core_backward(const LinearCoreArgs& a, const void* Qf, const void* Kf, const void* V,
                          const void* dO, void* dQf, void* dKf, void* dV, int device);

// ---- the tensor-core engine (linear_core_mma_cuda.cu) ----
// `fma` (the default): the kernels above, every case. `mma` (issue 30; not yet
// run on a GPU, docs/GPU.md): m16n8k16 tensor-core kernels for the cases
// linear_mma_takes accepts, the key-state reduction split over N into about
// 264 blocks (sized from the shapes, so bit-identical runs on any GPU), the
// feature map applied as tiles are staged; other cases stay on `fma`.
enum class LinearEngine { fma, mma };

// How the mma kernels get the feature maps: precomputed (`none`: Qf, Kf are
// features in f32 and dQf, dKf their f32 gradients, as for the launchers
// above), or computed from raw rows as they are staged (`elu_plus_one`: Qf,
// Kf are q, k [BH, len, F] of `dtype`, phi = elu + 1, zero on the keys that
// `keep` pads, and dQf, dKf are dq, dk of `dtype`: phi' applied).
enum class FusedMap { none, elu_plus_one };

struct LinearMmaArgs {
  LinearCoreArgs core;
  FusedMap map = FusedMap::none;
  // elu_plus_one only: the key padding mask [B, M] on the device (non-zero =
  // a real key; batch-head bh is batch bh / H), or null.
  const uint8_t* keep = nullptr;
  int64_t H = 1;
};

// bf16 / f16, non-causal, F and dv of 64 or 128, z0 null and no den_min
// floor (normalised or not, any eps).
// `tensors`: the device pointers the call reads and writes, which must be
// 16-byte aligned (the kernels move 16 bytes a load).
bool linear_mma_takes(const LinearCoreArgs& a, std::initializer_list<const void*> tensors = {});
void linear_mma_forward(const LinearMmaArgs& m, const void* Qf, const void* Kf, const void* V,
                        void* O, int device);
void linear_mma_backward(const LinearMmaArgs& m, const void* Qf, const void* Kf, const void* V,
                         const void* dO, void* dQf, void* dKf, void* dV, int device);

}  // namespace forge::cuda
