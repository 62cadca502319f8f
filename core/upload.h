// Uploader: host-to-device copies of training batches through pinned memory.
//
// Tensor::to(cuda) copies from pageable memory and then waits for the device's
// stream to drain, so that the host buffer's lifetime stays the caller's
// business; a loop that uploads a batch per step would stall the host behind
// the previous step's kernels. upload() instead copies the tensor into one of
// a few page-locked (pinned) host buffers and queues cudaMemcpyAsync on the
// device's stream: the copy runs at full DMA speed, ordered before the
// kernels queued after it, and the host goes on at once. A buffer is reused
// only after the event recorded behind its last copy has completed, so the
// data in flight is never overwritten; the source tensor may change as soon as
// upload() returns. Buffers grow to the largest tensor they have carried.
//
// For a CPU target (and in a build without CUDA) upload(t) is t.to(device).
#pragma once

#include <cstdint>
#include <memory>

#include "core/device.h"
#include "core/tensor.h"

namespace forge {

class Uploader {
 public:
  // `buffers` pinned buffers in a ring (>= 1): a batch of k tensors in flight
  // at once wants k of them.
  explicit Uploader(Device device, int buffers = 8);
  ~Uploader();
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  // A contiguous copy of CPU tensor `t` on device() (same shape and dtype);
  // a tensor already there is returned as it is.
  Tensor upload(const Tensor& t);

  Device device() const { return device_; }
  // Page-locked host bytes held by the ring.
  int64_t pinned_bytes() const;

 private:
  struct Ring;
  Device device_;
  std::unique_ptr<Ring> ring_;  // null for a CPU target or without CUDA
};

}  // namespace forge
