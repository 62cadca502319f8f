#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <sstream>

#include "core/cuda_tensor.h"
#include "core/threading.h"

namespace forge {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string shape_str(const Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what) {
  const int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  FORGE_CHECK(dim >= lo && dim <= hi,
              "{}: dim {} is out of range for a {}-d tensor (expected {}..{})", what, dim, ndim, lo,
              hi);
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  data_ = allocator_for(device).allocate(nbytes);
}

Storage::~Storage() {
  allocator_for(device_).deallocate(data_, nbytes_);
}

TensorImpl& Tensor::impl() const {
  FORGE_CHECK(impl_ != nullptr,
              "use of an undefined tensor (default-constructed or a missing gradient)");
  return *impl_;
}

int64_t Tensor::size(int64_t d) const {
  FORGE_CHECK(dim() > 0, "size({}): a 0-d tensor has no dimensions", d);
  return shape()[static_cast<size_t>(wrap_dim(d, dim(), "size"))];
}

void* Tensor::raw_device_data() const {
  if (!impl().storage) return nullptr;
  return static_cast<char*>(impl().storage->data()) +
         impl().offset * static_cast<int64_t>(dtype_size(dtype()));
}

void* Tensor::raw_data() const {
  FORGE_CHECK(device().is_cpu(),
              "CPU data of a tensor on {} requested; copy it with .to(Device::cpu())",
              device().str());
  if (!impl().storage) return nullptr;
  return static_cast<char*>(impl().storage->data()) +
         impl().offset * static_cast<int64_t>(dtype_size(dtype()));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape) {
    FORGE_CHECK(s >= 0, "empty: negative size in shape {}", shape_str(shape));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->storage = std::make_shared<Storage>(
      static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(value);
  return t;
}

void Tensor::fill(double value) {
  FORGE_IF_CUDA(*this)
  return cuda::fill(dtype(), device().index, raw_device_data(), numel(), value);
  if (dtype() == DType::bf16 || dtype() == DType::f16) {
    const float f = static_cast<float>(value);
    const uint16_t bits = dtype() == DType::bf16 ? float_to_bf16_bits(f) : float_to_f16_bits(f);
    std::fill_n(static_cast<uint16_t*>(raw_data()), numel(), bits);
    return;
  }
  FORGE_DISPATCH_ALL(dtype(), "fill", [&] {
    scalar_t* p = data<scalar_t>();
    const auto v = static_cast<scalar_t>(value);
    const int64_t n = numel();
    parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = v;
    });
  });
}

Tensor Tensor::arange(double start, double end, double step, DType dtype) {
  FORGE_CHECK(step != 0, "arange: step must be non-zero");
  const double span = (end - start) / step;
  const int64_t n = span > 0 ? static_cast<int64_t>(std::ceil(span)) : 0;
  Tensor t = empty({n}, dtype);
  FORGE_DISPATCH_ALL(dtype, "arange", [&] {
    scalar_t* p = t.data<scalar_t>();
    for (int64_t i = 0; i < n; ++i)
      p[i] = static_cast<scalar_t>(start + static_cast<double>(i) * step);
  });
  return t;
}

Tensor Tensor::rand(const Shape& shape, DType dtype, Generator* gen) {
  Generator& g = gen ? *gen : default_generator();
  Tensor t = empty(shape, dtype);
  const int64_t n = t.numel();
  FORGE_DISPATCH_FLOAT(dtype, "rand", [&] {
    const bool wide = std::is_same_v<scalar_t, double>;
    const uint64_t seed = g.seed(), off = g.reserve(static_cast<uint64_t>(wide ? 2 * n : n));
    scalar_t* p = t.data<scalar_t>();
    // One Philox block per 4 f32 draws or 2 f64 draws (f64 draw i = words 2i, 2i + 1).
    const int64_t per = wide ? 2 : 4, blocks = (n + per - 1) / per;
    parallel_for(blocks, 20 * per, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        const Philox4x32 w = Generator::block(seed, off, static_cast<uint64_t>(k));
        for (int64_t j = 0; j < per && k * per + j < n; ++j)
          p[k * per + j] =
              wide ? static_cast<scalar_t>(Generator::words_to_unit_f64(w[2 * j], w[2 * j + 1]))
                   : static_cast<scalar_t>(Generator::word_to_unit_f32(w[j]));
      }
    });
  });
  return t;
}

Tensor Tensor::randn(const Shape& shape, DType dtype, Generator* gen) {
  // Box-Muller on pairs of f64 uniforms: value i uses uniforms 2*(i/2), 2*(i/2)+1
  // and takes the cosine or the sine branch by parity.
  Generator& g = gen ? *gen : default_generator();
  Tensor t = empty(shape, dtype);
  const int64_t n = t.numel();
  const int64_t pairs = (n + 1) / 2;
  const uint64_t seed = g.seed(), off = g.reserve(static_cast<uint64_t>(4 * pairs));
  FORGE_DISPATCH_FLOAT(dtype, "randn", [&] {
    scalar_t* p = t.data<scalar_t>();
    // Pair k uses the f64 uniforms 2k, 2k + 1: words 4k .. 4k + 3, one Philox block.
    parallel_for(pairs, 80, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        const Philox4x32 w = Generator::block(seed, off, static_cast<uint64_t>(k));
        const double u1 = 1.0 - Generator::words_to_unit_f64(w[0], w[1]);  // (0, 1]
        const double u2 = Generator::words_to_unit_f64(w[2], w[3]);
        const double r = std::sqrt(-2.0 * std::log(u1)), theta = 2.0 * M_PI * u2;
        p[2 * k] = static_cast<scalar_t>(r * std::cos(theta));
        if (2 * k + 1 < n) p[2 * k + 1] = static_cast<scalar_t>(r * std::sin(theta));
      }
    });
  });
  return t;
}

double Tensor::item() const {
  FORGE_CHECK(numel() == 1, "item: expected a tensor with one element, got shape {}",
              shape_str(shape()));
  Tensor c = device().is_cpu() ? *this : to(Device::cpu());
  if (c.dtype() == DType::bf16 || c.dtype() == DType::f16) c = c.to(DType::f32);
  return FORGE_DISPATCH_ALL(c.dtype(), "item",
                            [&] { return static_cast<double>(c.data<scalar_t>()[0]); });
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = empty(shape(), target, device());
  FORGE_IF_CUDA(*this) {
    cuda::convert(dtype(), raw_device_data(), target, out.raw_device_data(), numel(),
                  device().index);
    return out;
  }
  const int64_t n = numel();
  // bf16 / f16 go through f32 (exact both ways for the widening).
  const auto half_bits = [](DType t) { return t == DType::bf16 || t == DType::f16; };
  if (half_bits(dtype())) {
    Tensor wide = empty(shape(), DType::f32);
    const uint16_t* s = static_cast<const uint16_t*>(raw_data());
    float* d = wide.data<float>();
    if (dtype() == DType::bf16) {
      parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) d[i] = bf16_bits_to_float(s[i]);
      });
    } else {
      for (int64_t i = 0; i < n; ++i) d[i] = f16_bits_to_float(s[i]);
    }
    return wide.to(target);
  }
  if (half_bits(target)) {
    const Tensor narrowed = to(DType::f32);
    const float* s = narrowed.data<float>();
    uint16_t* d = static_cast<uint16_t*>(out.raw_data());
    if (target == DType::bf16) {
      parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) d[i] = float_to_bf16_bits(s[i]);
      });
    } else {
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_f16_bits(s[i]);
    }
    return out;
  }
  FORGE_DISPATCH_ALL(dtype(), "to", [&] {
    using src_t = scalar_t;
    const src_t* s = data<src_t>();
    FORGE_DISPATCH_ALL(target, "to", [&] {
      scalar_t* d = out.data<scalar_t>();
      parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) d[i] = static_cast<scalar_t>(s[i]);
      });
    });
  });
  return out;
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor out = empty(shape(), dtype(), target);
  const size_t bytes = nbytes();
  if (bytes == 0) return out;
  const size_t esize = dtype_size(dtype());
  const void* src = static_cast<const char*>(impl().storage->data()) +
                    impl().offset * static_cast<int64_t>(esize);
  void* dst = out.impl().storage->data();
  if (device().is_cpu()) {
    allocator_for(target).copy_from_host(dst, src, bytes);
  } else if (target.is_cpu()) {
    allocator_for(device()).copy_to_host(dst, src, bytes);
  } else {
    std::vector<char> staging(bytes);
    allocator_for(device()).copy_to_host(staging.data(), src, bytes);
    allocator_for(target).copy_from_host(dst, staging.data(), bytes);
  }
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  FORGE_CHECK(src.numel() == numel() && src.dtype() == dtype(),
              "copy_from: expected {} {} elements, got {} of {}", numel(), dtype_name(dtype()),
              src.numel(), dtype_name(src.dtype()));
  if (nbytes() == 0) return;
  const size_t esize = dtype_size(dtype());
  void* dst =
      static_cast<char*>(impl().storage->data()) + impl().offset * static_cast<int64_t>(esize);
  const void* from = static_cast<const char*>(src.impl().storage->data()) +
                     src.impl().offset * static_cast<int64_t>(esize);
  if (device() == src.device()) {
    allocator_for(device()).copy_within(dst, from, nbytes());
  } else if (src.device().is_cpu()) {
    allocator_for(device()).copy_from_host(dst, from, nbytes());
  } else if (device().is_cpu()) {
    allocator_for(src.device()).copy_to_host(dst, from, nbytes());
  } else {
    copy_from(src.to(Device::cpu()));  // GPU to GPU through the host
  }
}

Tensor Tensor::view(const Shape& new_shape) const {
  Shape s = new_shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      FORGE_CHECK(infer < 0, "view: only one -1 allowed, got {}", shape_str(new_shape));
      infer = static_cast<int64_t>(i);
    } else {
      FORGE_CHECK(s[i] >= 0, "view: negative size in {}", shape_str(new_shape));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    FORGE_CHECK(known != 0 && numel() % known == 0, "view: cannot infer -1 in {} for {} elements",
                shape_str(new_shape), numel());
    s[static_cast<size_t>(infer)] = numel() / known;
  }
  FORGE_CHECK(shape_numel(s) == numel(), "view: shape {} has {} elements but the tensor {} has {}",
              shape_str(s), shape_numel(s), shape_str(shape()), numel());
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = std::move(s);
  impl->dtype = dtype();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  return Tensor(std::move(impl));
}

Tensor Tensor::slice0(int64_t start, int64_t end) const {
  FORGE_CHECK(dim() >= 1, "slice0: needs at least one dimension, got a scalar");
  const int64_t n = shape()[0];
  FORGE_CHECK(0 <= start && start <= end && end <= n,
              "slice0: rows [{}, {}) out of range for size {}", start, end, n);
  Shape s = shape();
  s[0] = end - start;
  const int64_t row = n == 0 ? 0 : numel() / n;
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = std::move(s);
  impl->dtype = dtype();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset + start * row;
  return Tensor(std::move(impl));
}

Tensor& Tensor::set_requires_grad(bool value) {
  FORGE_CHECK(
      is_leaf(),
      "set_requires_grad: only leaf tensors can change requires_grad (this one was made by an op; "
      "use detach() first)");
  FORGE_CHECK(!value || is_floating(dtype()),
              "set_requires_grad: only floating tensors can require grad, got {}",
              dtype_name(dtype()));
  impl().requires_grad = value;
  return *this;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape();
  impl->dtype = dtype();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  return Tensor(std::move(impl));
}

namespace {

template <typename T>
void print_rec(std::ostringstream& os, const T* p, const Shape& shape, size_t d,
               int64_t stride_base, int64_t max_per_dim, int indent) {
  const int64_t n = shape[d];
  int64_t inner = 1;
  for (size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  os << '[';
  for (int64_t i = 0; i < n; ++i) {
    if (n > max_per_dim && i == max_per_dim / 2) {
      os << "...";
      i = n - max_per_dim / 2 - 1;
      os << (d + 1 == shape.size() ? ", "
                                   : ",\n" + std::string(static_cast<size_t>(indent + 1), ' '));
      continue;
    }
    if (d + 1 == shape.size()) {
      if constexpr (std::is_floating_point_v<T>) {
        os << fmt::format("{:.6g}", p[stride_base + i]);
      } else {
        os << static_cast<int64_t>(p[stride_base + i]);
      }
    } else {
      print_rec(os, p, shape, d + 1, stride_base + i * inner, max_per_dim, indent + 1);
    }
    if (i + 1 < n)
      os << (d + 1 == shape.size() ? ", "
                                   : ",\n" + std::string(static_cast<size_t>(indent + 1), ' '));
  }
  os << ']';
}

}  // namespace

std::string Tensor::str(int64_t max_per_dim) const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(" << dtype_name(dtype()) << ", " << shape_str(shape());
  if (!device().is_cpu()) os << ", " << device().str();
  if (requires_grad()) os << ", requires_grad";
  os << ")\n";
  Tensor c = device().is_cpu() ? *this : to(Device::cpu());
  if (c.dtype() == DType::bf16 || c.dtype() == DType::f16) c = c.to(DType::f32);
  if (dim() == 0) {
    os << fmt::format("{:.6g}", c.item());
    return os.str();
  }
  FORGE_DISPATCH_ALL(c.dtype(), "print", [&] {
    print_rec<scalar_t>(os, c.data<scalar_t>(), shape(), 0, 0, max_per_dim, 0);
  });
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  return os << t.str();
}

}  // namespace forge
