// The pinned-buffer ring behind Uploader (see upload.h).
#include "core/upload.h"

#include <cstring>
#include <vector>

#include "core/error.h"

#ifdef FORGE_WITH_CUDA
#include "core/cuda_context.h"
#endif

namespace forge {

#ifdef FORGE_WITH_CUDA

struct Uploader::Ring {
  struct Buffer {
    void* host = nullptr;  // cudaHostAlloc'd, `capacity` bytes
    size_t capacity = 0;
    cudaEvent_t done = nullptr;  // recorded behind the buffer's last copy
    bool in_flight = false;
  };
  int index = 0;
  std::vector<Buffer> buffers;
  size_t next = 0;

  ~Ring() {
    cuda::DeviceGuard guard(index);
    for (Buffer& b : buffers) {
      // Errors here cannot be reported from a destructor; the copies are
      // waited for so no DMA reads freed memory.
      if (b.done) {
        if (b.in_flight) cudaEventSynchronize(b.done);
        cudaEventDestroy(b.done);
      }
      if (b.host) cudaFreeHost(b.host);
    }
  }

  // The next buffer of the ring, idle and at least `bytes` large.
  Buffer& take(size_t bytes) {
    Buffer& b = buffers[next];
    next = (next + 1) % buffers.size();
    if (b.in_flight) FORGE_CUDA_CHECK(cudaEventSynchronize(b.done));
    b.in_flight = false;
    if (b.capacity < bytes) {
      if (b.host) FORGE_CUDA_CHECK(cudaFreeHost(b.host));
      b.host = nullptr;
      b.capacity = 0;
      FORGE_CUDA_CHECK(cudaHostAlloc(&b.host, bytes, cudaHostAllocDefault));
      b.capacity = bytes;
    }
    if (!b.done) FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
    return b;
  }
};

Uploader::Uploader(Device device, int buffers) : device_(device) {
  FORGE_CHECK(buffers >= 1, "Uploader: needs at least one buffer, got {}", buffers);
  if (!device.is_cuda()) return;
  ring_ = std::make_unique<Ring>();
  ring_->index = device.index;
  ring_->buffers.resize(static_cast<size_t>(buffers));
}

Tensor Uploader::upload(const Tensor& t) {
  if (!ring_ || !t.defined() || t.device() == device_ || !t.device().is_cpu())
    return t.defined() ? t.to(device_) : t;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), device_);
  const size_t bytes = t.nbytes();
  if (bytes == 0) return out;
  cuda::DeviceGuard guard(ring_->index);
  Ring::Buffer& b = ring_->take(bytes);
  std::memcpy(b.host, t.raw_data(), bytes);
  cudaStream_t s = cuda::stream(ring_->index);
  FORGE_CUDA_CHECK(
      cudaMemcpyAsync(out.raw_device_data(), b.host, bytes, cudaMemcpyHostToDevice, s));
  FORGE_CUDA_CHECK(cudaEventRecord(b.done, s));
  b.in_flight = true;
  return out;
}

int64_t Uploader::pinned_bytes() const {
  int64_t sum = 0;
  if (ring_)
    for (const auto& b : ring_->buffers) sum += static_cast<int64_t>(b.capacity);
  return sum;
}

#else  // without CUDA every target is the CPU

struct Uploader::Ring {};

Uploader::Uploader(Device device, int buffers) : device_(device) {
  FORGE_CHECK(buffers >= 1, "Uploader: needs at least one buffer, got {}", buffers);
}

Tensor Uploader::upload(const Tensor& t) {
  return t.defined() ? t.to(device_) : t;
}

int64_t Uploader::pinned_bytes() const {
  return 0;
}

#endif

Uploader::~Uploader() = default;

}  // namespace forge
