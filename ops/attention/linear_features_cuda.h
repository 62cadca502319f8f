// The feature maps of the linear-attention ops on the GPU (linear, efficient,
// taylor_linear) and their backward, computed around the shared core
// (linear_core_cuda.h). Kernels in linear_features_cuda.cu; defined only in
// builds with CUDA and called under FORGE_IF_CUDA.
//
// x [BH, L, d] of `dtype` (f32, f64, bf16, f16) holds query or key rows; the
// features f [BH, L, F] and their gradients df are in the accumulation type
// (f64 for f64, f32 otherwise); dx [BH, L, d] is of `dtype` and overwritten.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace forge::cuda {

struct FeatureRows {
  int64_t BH = 0, L = 0, d = 0;
  int64_t H = 1;  // heads: batch-head bh belongs to batch bh / H
  // The key padding mask [B, L] on the device (a non-zero byte = a real
  // token): row j of batch-head bh reads keep[(bh / H) * L + j]. Null: every
  // row is real.
  const uint8_t* keep = nullptr;
};

// linear: f = (elu(x) + 1) * keep (F = d); dx = df * phi'(x) * keep.
void elu_features(DType dtype, const FeatureRows& r, const void* x, void* f, int device);
void elu_features_backward(DType dtype, const FeatureRows& r, const void* x, const void* df,
                           void* dx, int device);

// efficient queries: f = softmax over the d features of each row, times
// d^-1/2 (keep is ignored; F = d); dx is the softmax's backward of df.
void row_softmax_features(DType dtype, const FeatureRows& r, const void* x, void* f, int device);
void row_softmax_features_backward(DType dtype, const FeatureRows& r, const void* x, const void* df,
                                   void* dx, int device);

// efficient causal keys: f = exp(x) on real rows, 0 on padding (F = d);
// dx = f * df.
void exp_features(DType dtype, const FeatureRows& r, const void* x, void* f, int device);
void exp_features_backward(DType dtype, const FeatureRows& r, const void* x, const void* df,
                           void* dx, int device);

// efficient non-causal keys: f = softmax over the rows j of each feature
// column of a batch-head, over the real rows only (padding rows 0; a column
// with no real row is 0) (F = d). The backward takes these features f:
// dx[j, c] = f[j, c] (df[j, c] - sum_j' f[j', c] df[j', c]). `scratch` holds
// 2 BH d accumulation-type values of device memory (the column statistics).
void column_softmax_features(DType dtype, const FeatureRows& r, const void* x, void* f,
                             void* scratch, int device);
void column_softmax_features_backward(DType dtype, const FeatureRows& r, const void* f,
                                      const void* df, void* dx, void* scratch, int device);

// taylor_linear: f = [1, x / ||x||] on real rows, 0 on padding (F = d + 1);
// dx = (g - x' (x' . g)) / ||x|| with x' = x / ||x||, g = df[:, 1:] (0 on padding).
void unit_features(DType dtype, const FeatureRows& r, const void* x, void* f, int device);
void unit_features_backward(DType dtype, const FeatureRows& r, const void* x, const void* df,
                            void* dx, int device);

}  // namespace forge::cuda
