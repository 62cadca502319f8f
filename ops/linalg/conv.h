// The patch embedding of a vision transformer as one op: timm's PatchEmbed
// projection, a Conv2d with kernel = stride = patch, flattened to tokens.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace forge::ops {

// images (B, C, H, W), weight (D, C, p, p), bias (D) or undefined, p = patch
// dividing H and W -> (B, (H/p)(W/p), D), the patches in row-major order:
// torch's conv2d(images, weight, bias, stride=p).flatten(2).transpose(1, 2).
// On the CPU a reshape / permute and a linear; on a GPU one node on cuDNN's
// convolution (f32, f64, bf16, f16; under autocast f32 inputs are convolved
// as bf16 / f16 copies and the result and the gradients are f32).
Tensor patch_embed(const Tensor& images, const Tensor& weight, const Tensor& bias, int64_t patch);

}  // namespace forge::ops
