// Global-norm gradient clipping (see clip.h).
#include "optim/clip.h"

#include <cmath>
#include <map>

#include "optim/kernels.h"
#include "optim/update_cuda.h"

namespace forge::optim {
namespace {

double sum_of_squares(const Tensor& g) {
  return FORGE_DISPATCH_FLOAT(g.dtype(), "grad_norm", [&] {
    const scalar_t* x = g.data<scalar_t>();
    return detail::blocked_sum(g.numel(), [&](int64_t i) {
      const double v = static_cast<double>(x[i]);
      return v * v;
    });
  });
}

// The sum of squares of each param's grad (0 where it has none), in params
// order: a CPU grad's on the host; the GPU grads of one device each into a
// slot of a device buffer, read back with one copy per device.
std::vector<double> sums_of_squares(const std::vector<Tensor>& params) {
  std::vector<double> sums(params.size(), 0.0);
  std::map<int, std::vector<size_t>> on_gpu;  // device index -> params with a grad there
  for (size_t k = 0; k < params.size(); ++k) {
    FORGE_CHECK(params[k].defined(), "grad_norm: parameter {} is an undefined tensor", k);
    const Tensor g = params[k].grad();
    if (!g.defined()) continue;
    FORGE_IF_CUDA(g) {
      on_gpu[g.device().index].push_back(k);
      continue;
    }
    sums[k] = sum_of_squares(g);
  }
  if constexpr (kCudaBuilt) {  // on_gpu is empty in a build without CUDA
    for (const auto& [index, ks] : on_gpu) {
      const Device device = Device::cuda(index);
      const Tensor out = Tensor::empty({static_cast<int64_t>(ks.size())}, DType::f64, device);
      const Tensor scratch =
          Tensor::empty({cuda::optim::reduce_scratch_size(index)}, DType::f64, device);
      double* out_data = static_cast<double*>(out.raw_device_data());
      for (size_t j = 0; j < ks.size(); ++j) {
        const Tensor g = params[ks[j]].grad();
        cuda::optim::sum_of_squares(g.dtype(), index, g.raw_device_data(), g.numel(),
                                    static_cast<double*>(scratch.raw_device_data()), out_data + j);
      }
      const std::vector<double> host = out.to_vector<double>();
      for (size_t j = 0; j < ks.size(); ++j) sums[ks[j]] = host[j];
    }
  }
  return sums;
}

// A new tensor holding g * coef, coef rounded to g's dtype.
Tensor scaled_copy(const Tensor& g, double coef) {
  Tensor scaled = Tensor::empty(g.shape(), g.dtype(), g.device());
  FORGE_IF_CUDA(g) {
    cuda::optim::scale(g.dtype(), g.device().index, g.raw_device_data(), scaled.raw_device_data(),
                       g.numel(), coef);
    return scaled;
  }
  FORGE_DISPATCH_FLOAT(g.dtype(), "clip_grad_norm", [&] {
    const scalar_t* src = g.data<scalar_t>();
    scalar_t* dst = scaled.data<scalar_t>();
    const auto c = static_cast<scalar_t>(coef);
    detail::elementwise(g.numel(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dst[i] = src[i] * c;
    });
  });
  return scaled;
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  double total = 0;
  for (double s : sums_of_squares(params)) total += s;
  return std::sqrt(total);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  FORGE_CHECK(max_norm > 0, "clip_grad_norm: expected max_norm > 0, got {}", max_norm);
  const double norm = grad_norm(params);
  if (!std::isfinite(norm)) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1) return norm;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor handle = p;  // shares p's impl, so set_grad reaches the parameter
    handle.set_grad(scaled_copy(g, coef));
  }
  return norm;
}

}  // namespace forge::optim
