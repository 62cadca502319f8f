#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"

namespace forge {

MemoryStats Allocator::stats() const {
  return {current_.load(), peak_.load(), allocations_.load()};
}

void Allocator::reset_peak() { peak_.store(current_.load()); }

void Allocator::count_alloc(size_t nbytes) {
  const int64_t now = current_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t seen = peak_.load();
  while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
  }
  allocations_.fetch_add(1);
}

void Allocator::count_free(size_t nbytes) { current_.fetch_sub(static_cast<int64_t>(nbytes)); }

namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    FORGE_CHECK(p != nullptr, "out of CPU memory: could not allocate {} bytes", nbytes);
    count_alloc(nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    std::free(ptr);
    count_free(nbytes);
  }
  void copy_to_host(void* dst, const void* src, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
  void copy_from_host(void* dst, const void* src, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

#ifdef FORGE_WITH_CUDA
Allocator& cuda_allocator(int index);  // core/cuda_allocator.cpp
#endif

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
#ifdef FORGE_WITH_CUDA
  return cuda_allocator(device.index);
#else
  FORGE_FAIL("{}: this build has no CUDA backend (configure with -DFORGE_CUDA=ON where nvcc is found)",
             device.str());
#endif
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

#ifndef FORGE_WITH_CUDA
bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
#endif

}  // namespace forge
