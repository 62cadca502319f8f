// Allocators: one per device, each counting its bytes in use (current) and the
// most ever in use since the last reset (peak). Memory claims in tests and
// benchmarks are read from these counters.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace forge {

struct MemoryStats {
  int64_t current = 0;  // bytes handed out and not yet returned
  int64_t peak = 0;     // highest `current` since the last reset_peak
  int64_t allocations = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  // Copies between host memory and memory of this allocator's device.
  virtual void copy_to_host(void* dst_host, const void* src, size_t nbytes) = 0;
  virtual void copy_from_host(void* dst, const void* src_host, size_t nbytes) = 0;
  // Copies between two blocks of this allocator's device (queued on the
  // device's stream for CUDA).
  virtual void copy_within(void* dst, const void* src, size_t nbytes) = 0;

  // Bytes held for reuse (not counted in stats), and giving them back.
  virtual size_t cached_bytes() { return 0; }
  virtual void empty_cache() {}

  MemoryStats stats() const;
  void reset_peak();  // peak := current

 protected:
  void count_alloc(size_t nbytes);
  void count_free(size_t nbytes);

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocations_{0};
};

// The allocator of a device; throws for a CUDA device in a build without CUDA
// or an index past the visible devices.
Allocator& allocator_for(Device device);

inline MemoryStats memory_stats(Device device = Device::cpu()) {
  return allocator_for(device).stats();
}
inline void reset_peak_memory(Device device = Device::cpu()) {
  allocator_for(device).reset_peak();
}
inline void empty_cache(Device device = Device::cpu()) {
  allocator_for(device).empty_cache();
}

// CPU memory is 64-byte aligned (a cache line, a full AVX-512 register).
constexpr size_t kCpuAlignment = 64;

}  // namespace forge
