// The patch-embedding convolution on cuDNN (conv_cuda.cpp), on raw device
// pointers: kernel = stride = p, no padding, NCHW tensors of one dtype.
// Defined only in builds with CUDA; called under FORGE_IF_CUDA.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace forge::cuda {

// x (B, C, H, W), w (D, C, p, p), y (B, D, H / p, W / p), with p dividing H and
// W; dtype f32, f64, bf16 or f16 (tensor cores for bf16 / f16), summed in f32
// (f64 for f64). tf32: f32 may use TF32 tensor cores.
struct PatchConv {
  int64_t B = 0, C = 0, H = 0, W = 0, D = 0, p = 1;
  DType dtype = DType::f32;
  bool tf32 = false;
};

// y = conv(x, w).
void patch_conv_forward(const PatchConv& s, const void* x, const void* w, void* y, int device);
// dx = the gradient of conv(x, w) for x, given dy.
void patch_conv_backward_data(const PatchConv& s, const void* w, const void* dy, void* dx,
                              int device);
// dw = the gradient of conv(x, w) for w, given dy.
void patch_conv_backward_filter(const PatchConv& s, const void* x, const void* dy, void* dw,
                                int device);

}  // namespace forge::cuda
