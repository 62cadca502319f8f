// The CUDA kernels of ops/reduce (defined in reduce_cuda.cu, only in builds
// with CUDA; reduce.cpp calls them under FORGE_IF_CUDA). Every launcher sees a
// contiguous x as (outer, R, inner): output element (o, i) reduces x[o, :, i].
// Floating dtypes only (f32, f64, bf16, f16), computed in f32 (f64 for f64).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace forge::cuda {

// y (outer, inner) = scale * sum_r x (outer, R, inner).
void reduce_sum(DType dtype, int device, const void* x, void* y, int64_t outer, int64_t R,
                int64_t inner, double scale);
// gx (outer, R, inner) = scale * g (outer, inner), broadcast over r.
void reduce_sum_backward(DType dtype, int device, const void* g, void* gx, int64_t outer, int64_t R,
                         int64_t inner, double scale);

// y (outer, inner) = max_r x; arg (outer, inner, may be null) = the first r
// attaining it (the first NaN when there is one). Needs R > 0.
void reduce_max(DType dtype, int device, const void* x, void* y, int64_t* arg, int64_t outer,
                int64_t R, int64_t inner);
// gx (outer, R, inner) = g (outer, inner) where r == arg, else 0.
void reduce_max_backward(DType dtype, int device, const void* g, const int64_t* arg, void* gx,
                         int64_t outer, int64_t R, int64_t inner);

// y (outer, inner) = log sum_r exp x (outer, R, inner).
void logsumexp(DType dtype, int device, const void* x, void* y, int64_t outer, int64_t R,
               int64_t inner);
// gx (outer, R, inner) = g * exp(x - y), g and y (outer, inner) broadcast over r.
void logsumexp_backward(DType dtype, int device, const void* x, const void* y, const void* g,
                        void* gx, int64_t outer, int64_t R, int64_t inner);

// y (outer, R, inner) = inclusive prefix sums of x over r (suffix sums when reverse).
void cumsum(DType dtype, int device, const void* x, void* y, int64_t outer, int64_t R,
            int64_t inner, bool reverse);

}  // namespace forge::cuda
