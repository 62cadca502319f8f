// The CUDA device layer: device discovery, one stream per device, and the
// caching allocator with the same current / peak byte counters as the CPU.
//
// The caching allocator keeps freed blocks in free lists by size class and
// hands them out again without cudaMalloc / cudaFree (each of which
// synchronises the device). Classes: requests up to 1 MiB round up to 512
// bytes; larger ones to 2 MiB. Reuse is stream-ordered: all work of a device
// runs on its one stream, so a block freed by the host after issuing the
// kernels that use it can be handed to the next request at once: any kernel
// that writes it later is queued behind those that read it. When cudaMalloc
// runs out of memory, every cached block is released and the request tried
// again; if that fails too, the error names the request and the counters.
// The counters count requested bytes (as the CPU allocator), cached_bytes()
// the bytes held in the free lists.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_context.h"
#include "core/error.h"

namespace forge {

bool cuda_built() {
  return true;
}

int cuda_device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // no driver or no GPU: clear the error, report none
      return 0;
    }
    return n;
  }();
  return count;
}

void cuda_synchronize(Device d) {
  if (!d.is_cuda()) return;
  cuda::DeviceGuard guard(d);
  FORGE_CUDA_CHECK(cudaStreamSynchronize(cuda::stream(d)));
}

namespace cuda {

void fail_call(cudaError_t err, const char* kind, const char* what, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so the process can go on
  throw_error(file, line,
              fmt::format("{} {} failed: {} ({})", kind, what, cudaGetErrorName(err),
                          cudaGetErrorString(err)));
}

void fail_status(const char* call, const char* status, long long code, const char* file, int line) {
  throw_error(file, line, fmt::format("{} failed: {} (status {})", call, status, code));
}

void fail_dtype(const char* op, DType dtype) {
  FORGE_FAIL("{} (CUDA): dtype {} is not supported by this kernel", op, dtype_name(dtype));
}

void fail(const char* message) {
  FORGE_FAIL("{}", message);
}

namespace {

void check_index(int index) {
  const int n = cuda_device_count();
  FORGE_CHECK(index >= 0 && index < n, "cuda:{} requested but {} CUDA device(s) are visible{}",
              index, n, n == 0 ? " (no GPU or no driver on this machine)" : "");
}

}  // namespace

cudaStream_t stream(int index) {
  static std::mutex mu;
  static std::vector<cudaStream_t> streams;  // the streams are never destroyed: used until exit
  std::lock_guard<std::mutex> lock(mu);
  check_index(index);
  if (streams.empty()) streams.assign(static_cast<size_t>(cuda_device_count()), nullptr);
  cudaStream_t& s = streams[static_cast<size_t>(index)];
  if (s == nullptr) {
    DeviceGuard guard(index);
    FORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  return s;
}

DeviceGuard::DeviceGuard(int index) {
  FORGE_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) FORGE_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  int now = previous_;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

int multiprocessor_count(int index) {
  static std::mutex mu;
  static std::unordered_map<int, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(index);
  if (it != cache.end()) return it->second;
  int n = 0;
  FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, index));
  cache[index] = n;
  return n;
}

}  // namespace cuda

namespace {

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int index) : index_(index) {}

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t size = size_class(nbytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= size;
        count_alloc(nbytes);
        return p;
      }
    }
    cuda::DeviceGuard guard(index_);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      empty_cache();
      err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      const MemoryStats s = stats();
      FORGE_FAIL(
          "cuda:{}: cudaMalloc of {} bytes failed: {} ({}); {} bytes in use by tensors, peak {}",
          index_, size, cudaGetErrorName(err), cudaGetErrorString(err), s.current, s.peak);
    }
    count_alloc(nbytes);
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    const size_t size = size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    free_[size].push_back(ptr);
    cached_ += size;
    count_free(nbytes);
  }

  void copy_to_host(void* dst, const void* src, size_t nbytes) override {
    if (nbytes == 0) return;
    cuda::DeviceGuard guard(index_);
    cudaStream_t s = cuda::stream(index_);
    FORGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s));
    FORGE_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  void copy_from_host(void* dst, const void* src, size_t nbytes) override {
    if (nbytes == 0) return;
    cuda::DeviceGuard guard(index_);
    cudaStream_t s = cuda::stream(index_);
    // From pageable memory the copy is staged by the driver; synchronising
    // keeps the host buffer's lifetime the caller's business only.
    FORGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s));
    FORGE_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  void copy_within(void* dst, const void* src, size_t nbytes) override {
    if (nbytes == 0) return;
    cuda::DeviceGuard guard(index_);
    FORGE_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, cuda::stream(index_)));
  }

  size_t cached_bytes() override {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }

  void empty_cache() override {
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [size, list] : free_) blocks.insert(blocks.end(), list.begin(), list.end());
      free_.clear();
      cached_ = 0;
    }
    if (blocks.empty()) return;
    cuda::DeviceGuard guard(index_);
    // The blocks may still be read by queued kernels: wait for them first.
    cudaStreamSynchronize(cuda::stream(index_));
    for (void* p : blocks) cudaFree(p);
  }

  static size_t size_class(size_t nbytes) {
    constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kSmallLimit = size_t{1} << 20;
    const size_t step = nbytes <= kSmallLimit ? kSmall : kLarge;
    return (nbytes + step - 1) / step * step;
  }

 private:
  int index_;
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

}  // namespace

Allocator& cuda_allocator(int index) {
  static std::mutex mu;
  // Never destroyed: tensors in static storage may outlive exit-time destructors.
  static std::vector<CudaCachingAllocator*>* allocators = new std::vector<CudaCachingAllocator*>;
  std::lock_guard<std::mutex> lock(mu);
  cuda::check_index(index);
  if (allocators->empty()) {
    for (int i = 0; i < cuda_device_count(); ++i)
      allocators->push_back(new CudaCachingAllocator(i));
  }
  return *(*allocators)[static_cast<size_t>(index)];
}

}  // namespace forge
