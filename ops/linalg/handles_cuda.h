// The cuBLAS and cuDNN handles of each GPU, for the *_cuda.cpp files (this
// header needs the CUDA library headers). A device's handles are created on
// first use and live until exit; they issue all their work on
// cuda::stream(device), so library calls stay in order with our kernels and the
// caching allocator's stream-ordered reuse covers their buffers too.
#pragma once

#include <cublas_v2.h>
#include <cudnn.h>

#include "core/cuda_context.h"

// Checks a cuBLAS / cuDNN status, naming the call and the library's status name.
#define FORGE_CUBLAS_CHECK(call) \
  FORGE_CUDA_CHECK_STATUS(call, CUBLAS_STATUS_SUCCESS, cublasGetStatusName)
#define FORGE_CUDNN_CHECK(call) \
  FORGE_CUDA_CHECK_STATUS(call, CUDNN_STATUS_SUCCESS, cudnnGetErrorString)

namespace forge::cuda {

// Device `index`'s cuBLAS handle, with its own workspace (cuBLAS's default
// pool would be shared by every stream of the process).
cublasHandle_t cublas_handle(int index);

// Device `index`'s cuDNN handle.
cudnnHandle_t cudnn_handle(int index);

}  // namespace forge::cuda
