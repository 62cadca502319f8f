// The optimizers', clipping's and the gradient scaler's kernels on a GPU
// (defined in optim/update_cuda.cu, only in builds with CUDA; the optimizers'
// .cpp files call them under FORGE_IF_CUDA). Every launcher takes device
// pointers to n contiguous elements of `dtype` on CUDA device `device`, and
// issues its work on that device's stream.
//
// The updates follow the CPU loops of optim/*.cpp operation for operation, in
// the parameter's dtype (f32 or f64), with the coefficients formed in f64 on
// the host and rounded to the dtype as the CPU code does; one fused kernel per
// parameter (LAMB: the moments and norms, the trust ratio, the scaled step).
// Sums of squares are taken in f64: per-block partial sums, then one pass over
// the partials in block order, so a result is the same on every run on one
// device (its order differs from the CPU's blocked_sum, so the last bits may).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace forge::cuda::optim {

// The device scratch, in doubles, that lamb_update and sum_of_squares need on
// `device` for any n.
int64_t reduce_scratch_size(int device);

// SGD (optim/sgd.h); `buf` (the momentum buffer) is null without momentum, and
// `first` says it starts at g on this update. f32 or f64.
struct SgdCoefficients {
  double lr = 0, weight_decay = 0, momentum = 0, one_minus_dampening = 1;
  bool nesterov = false;
};
void sgd_update(DType dtype, int device, void* p, const void* grad, void* buf, int64_t n,
                bool first, const SgdCoefficients& c);

// Adam and AdamW (optim/adam.h): when `decay`, p = p * keep first (AdamW's
// decoupled decay); l2 is Adam's decay added to the gradient (0 for AdamW).
// m and v are exp_avg and exp_avg_sq. f32 or f64.
struct AdamCoefficients {
  bool decay = false;
  double keep = 1, l2 = 0;
  double beta1 = 0, one_minus_beta1 = 1, beta2 = 0, one_minus_beta2 = 1;
  double bias_correction2_sqrt = 1, eps = 0, step_size = 0;
};
void adam_update(DType dtype, int device, void* p, const void* grad, void* m, void* v, int64_t n,
                 const AdamCoefficients& c);

// Many parameters of one dtype on one device in few launches (issue 31; off
// by default, optim::set_multi_tensor; not yet run on a GPU): each tensor's
// update is adam_update's, element for element, so the results are the same
// bits. Up to kAdamTensorsPerLaunch tensors go into one launch, their
// pointers and coefficients in the kernel's parameters (no table upload, no
// host synchronisation); c.beta1, beta2 and eps must be the same for all.
struct AdamTensor {
  void* p = nullptr;
  const void* grad = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  int64_t n = 0;
  AdamCoefficients c;
};
constexpr int kAdamTensorsPerLaunch = 32;
void adam_update_many(DType dtype, int device, const std::vector<AdamTensor>& tensors);

// LAMB (optim/lamb.h) on parameter w: m, v and r (a buffer of n elements for
// the update direction) in one pass with the partial sums of w^2 and r^2, then
// the trust ratio ||w|| / ||r|| on the device (1 when either is 0), then
// w = w + (-lr trust) r. `scratch` holds reduce_scratch_size(device) doubles.
// f32 or f64.
struct LambCoefficients {
  double beta1 = 0, one_minus_beta1 = 1, beta2 = 0, one_minus_beta2 = 1;
  double bias_correction1 = 1, bias_correction2 = 1, eps = 0, weight_decay = 0, lr = 0;
};
void lamb_update(DType dtype, int device, void* w, const void* grad, void* m, void* v, void* r,
                 double* scratch, int64_t n, const LambCoefficients& c);

// *out (a device pointer) = the sum of x[i]^2 in f64; 0 for n = 0. `scratch`
// holds reduce_scratch_size(device) doubles. f32, f64, bf16 or f16.
void sum_of_squares(DType dtype, int device, const void* x, int64_t n, double* scratch,
                    double* out);

// dst = src * coef, coef rounded to the dtype (to f32 for bf16 / f16, where the
// product is taken in f32 and rounded once). f32, f64, bf16 or f16.
void scale(DType dtype, int device, const void* src, void* dst, int64_t n, double coef);

// dst = src * inv_scale as `scale`, and *found_inf (a device f32, left as it is
// otherwise) = 1 if any element of src or dst is not finite.
void unscale(DType dtype, int device, const void* src, void* dst, int64_t n, double inv_scale,
             float* found_inf);

}  // namespace forge::cuda::optim
