// The NCCL transport (transport.h): ncclAllReduce with ncclAvg on a stream of
// its own, ordered after the compute stream by events, so the all-reduce of
// one bucket runs while the backward keeps computing the next.
#include <map>
#include <utility>

#include "core/error.h"
#include "dist/transport.h"

#if defined(FORGE_WITH_CUDA)
#include <nccl.h>

#include "core/cuda_context.h"
#endif

namespace forge::dist {

#if defined(FORGE_WITH_CUDA)

namespace {

#define FORGE_NCCL_CHECK(call)                                                                \
  do {                                                                                        \
    const ncclResult_t forge_nccl_ = (call);                                                  \
    FORGE_CHECK(forge_nccl_ == ncclSuccess || forge_nccl_ == ncclInProgress, "{}: {}", #call, \
                ncclGetErrorString(forge_nccl_));                                             \
  } while (0)

// The NCCL type of each DType the all-reduce sums.
constexpr std::pair<DType, ncclDataType_t> kNcclTypes[] = {{DType::f32, ncclFloat32},
                                                           {DType::f64, ncclFloat64},
                                                           {DType::bf16, ncclBfloat16},
                                                           {DType::f16, ncclFloat16}};

ncclDataType_t nccl_type(DType dtype) {
  for (const auto& [d, t] : kNcclTypes)
    if (d == dtype) return t;
  FORGE_FAIL("distributed: no NCCL all-reduce for {} buffers", dtype_name(dtype));
}

class NcclTransport final : public Transport {
 public:
  NcclTransport(Group& group, int device) : group_(group), device_(device) {
    cuda::DeviceGuard guard(device_);
    ncclUniqueId id;
    if (group.root()) FORGE_NCCL_CHECK(ncclGetUniqueId(&id));
    group.broadcast(&id, sizeof(id), 0, "the NCCL unique id's broadcast");
    FORGE_NCCL_CHECK(ncclCommInitRank(&comm_, group.size(), id, group.rank()));
    FORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }

  ~NcclTransport() override {
    cuda::DeviceGuard guard(device_);
    for (auto& [t, job] : jobs_) {
      cudaEventDestroy(job.ready);
      cudaEventDestroy(job.done);
    }
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int64_t start(const Tensor& flat) override {
    FORGE_CHECK(flat.device().is_cuda() && flat.device().index == device_,
                "distributed: NCCL reduces buffers on cuda:{}, got one on {}", device_,
                flat.device().str());
    cuda::DeviceGuard guard(device_);
    Job job;
    job.flat = flat;
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&job.ready, cudaEventDisableTiming));
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&job.done, cudaEventDisableTiming));
    // The buffer is written on the compute stream: NCCL's stream waits for it.
    FORGE_CUDA_CHECK(cudaEventRecord(job.ready, cuda::stream(device_)));
    FORGE_CUDA_CHECK(cudaStreamWaitEvent(stream_, job.ready, 0));
    FORGE_NCCL_CHECK(ncclAllReduce(flat.raw_device_data(), flat.raw_device_data(),
                                   static_cast<size_t>(flat.numel()), nccl_type(flat.dtype()),
                                   ncclAvg, comm_, stream_));
    FORGE_CUDA_CHECK(cudaEventRecord(job.done, stream_));
    const int64_t ticket = next_++;
    jobs_.emplace(ticket, job);
    return ticket;
  }

  bool done(int64_t ticket) override {
    auto it = jobs_.find(ticket);
    if (it == jobs_.end()) return true;
    Job& job = it->second;
    const cudaError_t q = cudaEventQuery(job.done);
    if (q == cudaErrorNotReady) {
      ncclResult_t async = ncclSuccess;
      FORGE_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      FORGE_CHECK(async == ncclSuccess || async == ncclInProgress,
                  "distributed: NCCL all-reduce failed: {}", ncclGetErrorString(async));
      return false;
    }
    FORGE_CUDA_CHECK(q);
    cuda::DeviceGuard guard(device_);
    // Later work on the compute stream (the optimizer) reads the mean.
    FORGE_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(device_), job.done, 0));
    cudaEventDestroy(job.ready);
    cudaEventDestroy(job.done);
    jobs_.erase(it);
    return true;
  }

  Backend backend() const override { return Backend::nccl; }

 private:
  struct Job {
    Tensor flat;
    cudaEvent_t ready = nullptr, done = nullptr;
  };
  Group& group_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::map<int64_t, Job> jobs_;
  int64_t next_ = 0;
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(Group& group, int device) {
  return std::make_unique<NcclTransport>(group, device);
}

#else

std::unique_ptr<Transport> make_nccl_transport(Group&, int) {
  FORGE_FAIL("distributed.backend nccl: this attnforge was built without CUDA (and NCCL)");
}

#endif

}  // namespace forge::dist
