// The CUDA runtime context shared by every CUDA source: error checks that name
// the failing call, the current device, and each device's one stream. Included
// only by files built with FORGE_WITH_CUDA (it needs the CUDA headers). Free of
// fmt (nvcc cannot compile fmt 9's headers): failures are reported through
// functions defined in core/cuda_allocator.cpp, which format the message.
//
// Streams: every kernel, copy and library call of device i is issued on
// stream(i), a non-blocking stream created once per device. One stream per
// device keeps work in issue order, which is what makes the caching allocator's
// immediate reuse of a freed block safe (see core/cuda_allocator.cpp).
#pragma once

#include <cuda_runtime.h>

#include "core/device.h"
#include "core/dtype.h"

// Checks a CUDA runtime call: a forge::Error names the call, the error and
// where it was made.
#define FORGE_CUDA_CHECK(call)                                                      \
  do {                                                                              \
    const cudaError_t forge_err_ = (call);                                          \
    if (forge_err_ != cudaSuccess) [[unlikely]]                                     \
      ::forge::cuda::fail_call(forge_err_, "CUDA call", #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports a bad launch configuration (or an earlier
// asynchronous fault) naming the kernel.
#define FORGE_CUDA_CHECK_LAUNCH(kernel_name)                                                \
  do {                                                                                      \
    const cudaError_t forge_err_ = cudaGetLastError();                                      \
    if (forge_err_ != cudaSuccess) [[unlikely]]                                             \
      ::forge::cuda::fail_call(forge_err_, "CUDA kernel", kernel_name, __FILE__, __LINE__); \
  } while (0)

// Checks a library status (cuBLAS, cuDNN): `ok` is the success value and
// `name` the library's name for the status.
#define FORGE_CUDA_CHECK_STATUS(call, ok, status_name)                                       \
  do {                                                                                       \
    const auto forge_status_ = (call);                                                       \
    if (forge_status_ != (ok)) [[unlikely]]                                                  \
      ::forge::cuda::fail_status(#call, status_name(forge_status_),                          \
                                 static_cast<long long>(forge_status_), __FILE__, __LINE__); \
  } while (0)

namespace forge::cuda {

// Throw forge::Error (formatted in a .cpp, away from nvcc).
[[noreturn]] void fail_call(cudaError_t err, const char* kind, const char* what, const char* file,
                            int line);
[[noreturn]] void fail_status(const char* call, const char* status, long long code,
                              const char* file, int line);
[[noreturn]] void fail_dtype(const char* op, DType dtype);
[[noreturn]] void fail(const char* message);

// The stream all work of CUDA device `index` is issued on.
cudaStream_t stream(int index);
inline cudaStream_t stream(Device d) {
  return stream(d.index);
}

// Makes `index` the calling thread's current device for its lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  explicit DeviceGuard(Device d) : DeviceGuard(d.index) {}
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// Properties used for launch configuration.
int multiprocessor_count(int index);

}  // namespace forge::cuda
