// Tensor: a cheap shared handle to (shape, dtype, device, storage, offset).
// Tensors are contiguous and row-major; a view (same storage, new shape) and a
// slice of the first dimension are free, every other layout change is a copy
// made by an op in ops/. The autograd fields live here so that any tensor can
// take part in a graph; the engine that reads them is in autograd/.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"

namespace forge {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"
// Resolves a possibly negative dim against `ndim`, naming `what` on error.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what);

// A block of device memory, returned to its allocator when the last tensor
// that uses it goes away.
class Storage {
 public:
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
};

namespace autograd {
struct Node;
}

struct TensorImpl {
  Shape shape;
  DType dtype = DType::f32;
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements

  // Autograd: a leaf has requires_grad and no grad_fn; an op's output has the
  // node that made it and which of that node's outputs it is.
  bool requires_grad = false;
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;
  std::shared_ptr<TensorImpl> grad;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories ----
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  // [start, end) in steps of `step`, like Python's range.
  static Tensor arange(double start, double end, double step = 1, DType dtype = DType::i64);
  // Uniform [0, 1) and standard normal draws from the generator (the default
  // one when null); f32 or f64.
  static Tensor rand(const Shape& shape, DType dtype = DType::f32, Generator* gen = nullptr);
  static Tensor randn(const Shape& shape, DType dtype = DType::f32, Generator* gen = nullptr);
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values) {
    return from_vector(values, {static_cast<int64_t>(values.size())});
  }
  static Tensor scalar(double value, DType dtype = DType::f32) { return full({}, value, dtype); }

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage ? impl().storage->device() : Device::cpu(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }

  // ---- data (CPU tensors) ----
  void* raw_data() const;
  // The data pointer on any device: a device pointer for a CUDA tensor, for
  // handing to the CUDA launchers (ops' *_cuda.h); never dereference it on the host.
  void* raw_device_data() const;
  template <typename T>
  T* data() const;  // checks that T matches the dtype and the tensor is on the CPU
  template <typename T>
  std::vector<T> to_vector() const;
  // The single element of a one-element tensor, converted to double.
  double item() const;
  template <typename T>
  T item() const {
    return static_cast<T>(item());
  }

  // ---- copies and conversions (not recorded by autograd) ----
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor clone() const;
  // Copies src's elements into this tensor (same numel and dtype); no autograd.
  void copy_from(const Tensor& src);
  // Sets every element to value; no autograd.
  void fill(double value);

  // ---- free views (share storage; not recorded by autograd: use ops::reshape
  //      and ops::narrow in differentiable code) ----
  Tensor view(const Shape& shape) const;            // one -1 entry is inferred
  Tensor slice0(int64_t start, int64_t end) const;  // rows [start, end) of dim 0

  // ---- autograd ----
  bool requires_grad() const { return impl().requires_grad; }
  // Only on leaves (tensors no op produced); returns *this for chaining.
  Tensor& set_requires_grad(bool value);
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl().grad_fn; }
  Tensor grad() const { return Tensor(impl().grad); }
  void set_grad(const Tensor& g) { impl().grad = g.impl_; }
  void zero_grad() { impl().grad.reset(); }
  // The same data with no autograd history.
  Tensor detach() const;

  // ---- printing ----
  std::string str(int64_t max_per_dim = 6) const;

  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

template <typename T>
T* Tensor::data() const {
  FORGE_CHECK(dtype_of<T>() == dtype(), "data<{}>() called on a {} tensor",
              dtype_name(dtype_of<T>()), dtype_name(dtype()));
  return static_cast<T*>(raw_data());
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  FORGE_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
              "from_vector: {} values do not fill shape {} ({} elements)", values.size(),
              shape_str(shape), shape_numel(shape));
  Tensor t = empty(shape, dtype_of<T>());
  T* p = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = device().is_cpu() ? *this : to(Device::cpu());
  if (c.dtype() != dtype_of<T>()) c = c.to(dtype_of<T>());
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}

}  // namespace forge
