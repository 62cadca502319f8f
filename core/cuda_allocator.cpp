// The CUDA device slot: one allocator per visible GPU, on cudaMalloc/cudaFree,
// with the same byte counters as the CPU. Built only with FORGE_CUDA; the
// caching allocator and streams come with the CUDA backend.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"

#define FORGE_CUDA_CHECK(call)                                                            \
  do {                                                                                    \
    cudaError_t err_ = (call);                                                            \
    FORGE_CHECK(err_ == cudaSuccess, "{} failed: {} ({})", #call, cudaGetErrorName(err_), \
                cudaGetErrorString(err_));                                                \
  } while (0)

namespace forge {

bool cuda_built() {
  return true;
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no GPU: clear the sticky error, report none
    return 0;
  }
  return n;
}

namespace {

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    FORGE_CUDA_CHECK(cudaSetDevice(index_));
    void* p = nullptr;
    FORGE_CUDA_CHECK(cudaMalloc(&p, nbytes));
    count_alloc(nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    cudaSetDevice(index_);
    cudaFree(ptr);  // never throws from a destructor path
    count_free(nbytes);
  }
  void copy_to_host(void* dst, const void* src, size_t nbytes) override {
    if (nbytes) FORGE_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost));
  }
  void copy_from_host(void* dst, const void* src, size_t nbytes) override {
    if (nbytes) FORGE_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice));
  }

 private:
  int index_;
};

}  // namespace

Allocator& cuda_allocator(int index) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<CudaAllocator>> allocators;
  std::lock_guard<std::mutex> lock(mu);
  const int n = cuda_device_count();
  FORGE_CHECK(index >= 0 && index < n, "cuda:{} requested but {} CUDA device(s) are visible", index,
              n);
  if (allocators.empty()) {
    for (int i = 0; i < n; ++i) allocators.push_back(std::make_unique<CudaAllocator>(i));
  }
  return *allocators[static_cast<size_t>(index)];
}

}  // namespace forge
