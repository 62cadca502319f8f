#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace forge {

MemoryStats Allocator::stats() const {
  return {current_.load(), peak_.load(), allocations_.load()};
}

void Allocator::reset_peak() {
  peak_.store(current_.load());
}

void Allocator::count_alloc(size_t nbytes) {
  const int64_t now =
      current_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t seen = peak_.load();
  while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
  }
  allocations_.fetch_add(1);
}

void Allocator::count_free(size_t nbytes) {
  current_.fetch_sub(static_cast<int64_t>(nbytes));
}

namespace {

// Large blocks are kept on size-class free lists when freed and handed out
// again: a fresh block costs a page fault per 4 KiB on first touch, which on
// these machines is slower than the kernel that fills it. Small blocks go
// straight to malloc, which caches them itself. The counters always report
// the bytes tensors asked for, not what the cache holds. Under AddressSanitizer
// nothing is cached, so a use after free is still caught.
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t block = block_size(nbytes);
    void* p = nullptr;
    if (block >= kCacheMin) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(block);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= block;
      }
    }
    if (p == nullptr) {
      p = std::aligned_alloc(kCpuAlignment, block);
      FORGE_CHECK(p != nullptr, "out of CPU memory: could not allocate {} bytes", nbytes);
    }
    count_alloc(nbytes);
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    count_free(nbytes);
    const size_t block = block_size(nbytes);
    if (kCaching && block >= kCacheMin) {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_bytes_ + block <= kCacheMax) {
        free_[block].push_back(ptr);
        cached_bytes_ += block;
        return;
      }
    }
    std::free(ptr);
  }

  void copy_to_host(void* dst, const void* src, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
  void copy_from_host(void* dst, const void* src, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
  void copy_within(void* dst, const void* src, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }

  size_t cached_bytes() override {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_bytes_;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) std::free(p);
    }
    free_.clear();
    cached_bytes_ = 0;
  }

 private:
#if defined(__SANITIZE_ADDRESS__)
  static constexpr bool kCaching = false;
#else
  static constexpr bool kCaching = true;
#endif
  static constexpr size_t kCacheMin = size_t{1} << 16;  // 64 KiB
  static constexpr size_t kCacheMax = size_t{4} << 30;  // 4 GiB held for reuse at most

  // Below 64 KiB: the request rounded to the alignment. Above: one of four
  // classes per power of two (2^k, 1.25, 1.5, 1.75 x 2^k), so a reused block
  // wastes under 25% and similar sizes share a list.
  static size_t block_size(size_t nbytes) {
    const size_t aligned = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (aligned < kCacheMin) return aligned;
    size_t pow2 = kCacheMin;
    while (pow2 * 2 <= aligned) pow2 *= 2;
    const size_t step = pow2 / 4;
    return (aligned + step - 1) / step * step;
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_bytes_ = 0;
};

}  // namespace

Allocator& cpu_allocator() {
  // Never destroyed: tensors in static storage may outlive any exit-time destructor.
  static CpuAllocator* a = new CpuAllocator;
  return *a;
}

#ifdef FORGE_WITH_CUDA
Allocator& cuda_allocator(int index);  // core/cuda_allocator.cpp
#endif

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
#ifdef FORGE_WITH_CUDA
  return cuda_allocator(device.index);
#else
  FORGE_FAIL(
      "{}: this build has no CUDA backend (configure with -DFORGE_CUDA=ON where nvcc is found)",
      device.str());
#endif
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

#ifndef FORGE_WITH_CUDA
bool cuda_built() {
  return false;
}
int cuda_device_count() {
  return 0;
}
void cuda_synchronize(Device) {}
#endif

}  // namespace forge
