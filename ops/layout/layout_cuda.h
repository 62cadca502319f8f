// The CUDA kernels of ops/layout (defined in layout_cuda.cu, only in builds
// with CUDA; layout.cpp and reduce.cpp call them under FORGE_IF_CUDA). Copies
// move elements as raw bytes, so they serve every dtype; the scatter-adds of
// the backwards take floating gradients (f32, f64, bf16, f16) and accumulate
// into a buffer of their compute type: f32, or f64 for f64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace forge::cuda {

// The most dims a copy may keep after merging (copies) or an index may have (gather).
constexpr int kMaxLayoutDims = 8;

// dst[i] = src[i] for every multi-index i of `sizes`, where element i lies
// sum_k i_k * strides[k] elements past each pointer; elements are esize bytes.
// The dims are merged as layout.cpp's merge_dims makes them (at least one, no
// size 0 or 1 unless the only one) and at most kMaxLayoutDims.
void strided_copy(int device, size_t esize, const std::vector<int64_t>& sizes, const void* src,
                  const std::vector<int64_t>& src_strides, void* dst,
                  const std::vector<int64_t>& dst_strides);

// Writes to *bad (an i64 holding -1 beforehand) the first position p of
// index (count i32 / i64 values) whose value is outside [0, n); leaves it
// otherwise. The index launchers below expect indices checked this way, and
// skip any out-of-range one rather than touch memory outside their tensors.
void find_bad_index(DType index_dtype, int device, const void* index, int64_t count, int64_t n,
                    int64_t* bad);

// out (outer, J, inner) = x (outer, n, inner) at rows index[j] of its middle
// dim; index holds J values; elements are esize bytes.
void index_rows(DType index_dtype, int device, size_t esize, const void* x, const void* index,
                void* out, int64_t outer, int64_t n, int64_t J, int64_t inner);
// gx (outer, n, inner), of the compute type of `dtype` and zero beforehand:
// gx[o, index[j], k] += g[o, j, k] for every j with index[j] != skip.
void index_rows_backward(DType dtype, DType index_dtype, int device, const void* g,
                         const void* index, void* gx, int64_t outer, int64_t n, int64_t J,
                         int64_t inner, int64_t skip);

// out (index_shape) = x at the index's position with its coordinate along
// `dim` replaced by the index value; x_strides are x's contiguous strides (x
// has index_shape's rank, at most kMaxLayoutDims); elements are esize bytes.
void gather(DType index_dtype, int device, size_t esize, const void* x, const void* index,
            void* out, const std::vector<int64_t>& index_shape,
            const std::vector<int64_t>& x_strides, int64_t dim, int64_t n);
// gx (x's shape, of the compute type of `dtype`, zero beforehand) += g
// (index_shape) at the positions gather read.
void gather_backward(DType dtype, DType index_dtype, int device, const void* g, const void* index,
                     void* gx, const std::vector<int64_t>& index_shape,
                     const std::vector<int64_t>& x_strides, int64_t dim, int64_t n);

}  // namespace forge::cuda
