// Per-device cuBLAS and cuDNN handles (see handles_cuda.h).
#include "ops/linalg/handles_cuda.h"

#include <mutex>
#include <vector>

#include "core/error.h"

namespace forge::cuda {

namespace {

// cuBLAS's recommended workspace on Hopper. Taken with cudaMalloc, outside the
// caching allocator, once per device and never freed (like the handle).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// The slot of device `index` in a per-device table, sized on first use.
template <typename Handle>
Handle& slot(std::vector<Handle>& table, int index, const char* library) {
  if (table.empty()) table.assign(static_cast<size_t>(cuda_device_count()), nullptr);
  FORGE_CHECK(index >= 0 && static_cast<size_t>(index) < table.size(),
              "{}: cuda:{} requested but {} CUDA device(s) are visible", library, index,
              table.size());
  return table[static_cast<size_t>(index)];
}

}  // namespace

cublasHandle_t cublas_handle(int index) {
  static std::mutex mu;
  static std::vector<cublasHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  cublasHandle_t& h = slot(handles, index, "cuBLAS");
  if (h == nullptr) {
    DeviceGuard guard(index);
    cublasHandle_t made = nullptr;
    FORGE_CUBLAS_CHECK(cublasCreate(&made));
    // cublasSetStream resets the workspace to the default pool, so the
    // workspace is set after it.
    FORGE_CUBLAS_CHECK(cublasSetStream(made, stream(index)));
    void* workspace = nullptr;
    FORGE_CUDA_CHECK(cudaMalloc(&workspace, kCublasWorkspaceBytes));
    FORGE_CUBLAS_CHECK(cublasSetWorkspace(made, workspace, kCublasWorkspaceBytes));
    h = made;
  }
  return h;
}

cudnnHandle_t cudnn_handle(int index) {
  static std::mutex mu;
  static std::vector<cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  cudnnHandle_t& h = slot(handles, index, "cuDNN");
  if (h == nullptr) {
    DeviceGuard guard(index);
    cudnnHandle_t made = nullptr;
    FORGE_CUDNN_CHECK(cudnnCreate(&made));
    FORGE_CUDNN_CHECK(cudnnSetStream(made, stream(index)));
    h = made;
  }
  return h;
}

}  // namespace forge::cuda
