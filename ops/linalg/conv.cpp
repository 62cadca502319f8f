// patch_embed: on the CPU, the patches are the image's (C, p, p) blocks, so the
// convolution is a reshape / permute and one linear (the GEMM does the work).
// On a GPU, one node on cuDNN: the convolution gives (B, D, h, w), which one
// transpose (adding the bias) turns into tokens (B, h w, D); the backward
// transposes the gradient back and runs cuDNN's backward data / filter, and
// the bias gradient sums the tokens.
#include "ops/linalg/conv.h"

#include "autograd/node.h"
#include "ops/autocast.h"
#include "ops/elementwise/elementwise.h"
#include "ops/layout/layout.h"
#include "ops/linalg/conv_cuda.h"
#include "ops/linalg/matmul.h"
#include "ops/linalg/matmul_cuda.h"

namespace forge::ops {

Tensor patch_embed(const Tensor& images, const Tensor& weight, const Tensor& bias, int64_t patch) {
  FORGE_CHECK(images.dim() == 4, "patch_embed: expected images (B, C, H, W), got {}",
              shape_str(images.shape()));
  const int64_t B = images.size(0), C = images.size(1), H = images.size(2), W = images.size(3);
  const int64_t p = patch;
  FORGE_CHECK(p > 0 && H % p == 0 && W % p == 0,
              "patch_embed: expected a patch size > 0 dividing H and W, got patch {} for images "
              "{}; resize or pad the images",
              p, shape_str(images.shape()));
  FORGE_CHECK(
      weight.dim() == 4 && weight.size(1) == C && weight.size(2) == p && weight.size(3) == p,
      "patch_embed: expected weight (D, {}, {}, {}) for images {}, got {}", C, p, p,
      shape_str(images.shape()), shape_str(weight.shape()));
  const int64_t D = weight.size(0), h = H / p, w = W / p;
  FORGE_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == D),
              "patch_embed: expected bias ({}) for weight {}, got {}", D, shape_str(weight.shape()),
              shape_str(bias.shape()));
  FORGE_CHECK(weight.dtype() == images.dtype() && weight.device() == images.device(),
              "patch_embed: images are {} on {} but the weight is {} on {}; expected one dtype and "
              "device",
              dtype_name(images.dtype()), images.device().str(), dtype_name(weight.dtype()),
              weight.device().str());
  FORGE_CHECK(
      !bias.defined() || (bias.dtype() == images.dtype() && bias.device() == images.device()),
      "patch_embed: images are {} on {} but the bias is {} on {}; expected one dtype and "
      "device",
      dtype_name(images.dtype()), images.device().str(), dtype_name(bias.dtype()),
      bias.device().str());
  // Empty problems (no images, channels or pixels, or D = 0), which cuDNN's
  // descriptors reject, take the composed path below on any device.
  const bool empty = images.numel() == 0 || D == 0;
  FORGE_IF_CUDA(images) if (!empty) {
    const bool cast = autocasts(images) && autocasts(weight);
    const DType dtype = images.dtype(), low = cast ? autocast_dtype() : dtype;
    const Tensor x_in = cast ? images.to(low) : images.detach();
    const Tensor w_in = cast ? weight.to(low) : weight.detach();
    const cuda::PatchConv s{
        .B = B, .C = C, .H = H, .W = W, .D = D, .p = p, .dtype = low, .tf32 = allow_tf32()};
    const int device = images.device().index;
    const Tensor y = Tensor::empty({B, D, h, w}, low, images.device());  // channels first
    cuda::patch_conv_forward(s, x_in.raw_device_data(), w_in.raw_device_data(), y.raw_device_data(),
                             device);
    const Tensor out = Tensor::empty({B, h * w, D}, dtype, images.device());
    cuda::transpose_batched(low, y.raw_device_data(), dtype, out.raw_device_data(),
                            bias.defined() ? bias.raw_device_data() : nullptr, B, D, h * w, device);
    const bool need_x = images.requires_grad(), need_w = weight.requires_grad();
    return autograd::record(
        "patch_embed", {images, weight, bias}, out,
        [x_saved = need_w ? x_in : Tensor(), w_saved = need_x ? w_in : Tensor(), s, dtype, need_x,
         need_w, need_b = bias.defined() && bias.requires_grad()](
            const std::vector<Tensor>& grads) -> std::vector<Tensor> {
          const Tensor& dout = grads[0];  // (B, h w, D), dtype
          const int64_t tokens = (s.H / s.p) * (s.W / s.p);
          const int device = dout.device().index;
          Tensor dx, dw, db;
          if (need_x || need_w) {
            // The forward's transpose undone: (B, h w, D) -> (B, D, h, w) in the
            // convolution's dtype.
            const Tensor dy =
                Tensor::empty({s.B, s.D, s.H / s.p, s.W / s.p}, s.dtype, dout.device());
            cuda::transpose_batched(dtype, dout.raw_device_data(), s.dtype, dy.raw_device_data(),
                                    nullptr, s.B, tokens, s.D, device);
            if (need_x) {
              dx = Tensor::empty({s.B, s.C, s.H, s.W}, s.dtype, dout.device());
              cuda::patch_conv_backward_data(s, w_saved.raw_device_data(), dy.raw_device_data(),
                                             dx.raw_device_data(), device);
              if (dx.dtype() != dtype) dx = dx.to(dtype);
            }
            if (need_w) {
              dw = Tensor::empty({s.D, s.C, s.p, s.p}, s.dtype, dout.device());
              cuda::patch_conv_backward_filter(s, x_saved.raw_device_data(), dy.raw_device_data(),
                                               dw.raw_device_data(), device);
              if (dw.dtype() != dtype) dw = dw.to(dtype);
            }
          }
          if (need_b) db = sum_to(dout.view({s.B * tokens, s.D}), {s.D});
          return {dx, dw, db};
        });
  }
  // (B, C, h, p, w, p) -> (B, h, w, C, p, p): each patch's pixels in the
  // weight's (C, p, p) order, so the convolution is a linear map per patch.
  const Tensor patches = permute(reshape(images, {B, C, h, p, w, p}), {0, 2, 4, 1, 3, 5});
  return linear(reshape(patches, {B, h * w, C * p * p}), reshape(weight, {D, C * p * p}), bias);
}

}  // namespace forge::ops
