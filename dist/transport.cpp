// The MPI transport (transport.h); the NCCL one is in nccl.cpp.
#include "dist/transport.h"

#include <map>

#include "core/error.h"
#include "core/threading.h"

namespace forge::dist {

namespace {

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(Group& group) : group_(group) {}

  int64_t start(const Tensor& flat) override {
    Job job;
    job.flat = flat;
    // MPI reads host memory: a CUDA buffer goes through a host copy.
    job.host = flat.device().is_cpu() ? flat : flat.to(Device::cpu());
    job.request = group_.start_sum(job.host.raw_data(), job.host.numel(), job.host.dtype());
    const int64_t ticket = next_++;
    jobs_.emplace(ticket, std::move(job));
    return ticket;
  }

  bool done(int64_t ticket) override {
    auto it = jobs_.find(ticket);
    if (it == jobs_.end()) return true;
    Job& job = it->second;
    if (!group_.test(job.request)) return false;
    const double inv = 1.0 / static_cast<double>(group_.size());
    FORGE_DISPATCH_FLOAT(job.host.dtype(), "all-reduce mean", [&] {
      scalar_t* p = job.host.data<scalar_t>();
      const auto s = static_cast<scalar_t>(inv);
      parallel_for(job.host.numel(), 1 << 14, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) p[i] *= s;
      });
    });
    if (!job.flat.device().is_cpu()) job.flat.copy_from(job.host);
    jobs_.erase(it);
    return true;
  }

  Backend backend() const override { return Backend::mpi; }

 private:
  struct Job {
    Tensor flat, host;
    Group::Request request = -1;
  };
  Group& group_;
  std::map<int64_t, Job> jobs_;
  int64_t next_ = 0;
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(Group& group) {
  FORGE_CHECK(group.uses_mpi(), "distributed: the MPI transport needs a job started by mpirun");
  return std::make_unique<MpiTransport>(group);
}

}  // namespace forge::dist
