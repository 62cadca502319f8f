// The CUDA kernels core/tensor.cpp needs: fill and dtype conversion of device
// memory (defined in core/cuda_tensor.cu, only in builds with CUDA;
// tensor.cpp calls them under FORGE_IF_CUDA).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace forge::cuda {

// Sets n elements of type `dtype` at device pointer p to value (rounded to dtype).
void fill(DType dtype, int device, void* p, int64_t n, double value);
// dst[i] = src[i] converted, n elements on one device; any dtypes.
void convert(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n, int device);
// out[i] = a[i] + b[i] for a floating dtype, computed in f32 for bf16 / f16
// (the autograd engine's gradient accumulation; ops have their own add).
void add(DType dtype, const void* a, const void* b, void* out, int64_t n, int device);

}  // namespace forge::cuda
