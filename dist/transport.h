// How a gradient bucket is averaged over the processes: MPI for host buffers
// (and, staged through the host, for CUDA ones when a recipe asks for MPI on a
// GPU), NCCL for CUDA buffers. The reducer (reducer.h) starts a bucket as soon
// as it is full and polls for its end; nothing here blocks.
#pragma once

#include <cstdint>
#include <memory>

#include "core/tensor.h"
#include "dist/group.h"

namespace forge::dist {

enum class Backend { mpi, nccl };
const char* backend_name(Backend b);

class Transport {
 public:
  virtual ~Transport() = default;
  // Starts replacing the contiguous buffer `flat` by its mean over the
  // group's processes; `flat` must stay alive until done() says so.
  virtual int64_t start(const Tensor& flat) = 0;
  // True once the mean is in `flat` (and ordered before any later work on its device).
  virtual bool done(int64_t ticket) = 0;
  virtual Backend backend() const = 0;
};

// MPI_Iallreduce (sum) then a scale by 1 / size; a CUDA buffer is copied to
// the host and back.
std::unique_ptr<Transport> make_mpi_transport(Group& group);

// ncclAllReduce with ncclAvg on its own stream of CUDA device `device`, after
// the device's compute stream has produced the buffer. The communicator's
// unique id is broadcast over the group's MPI. Throws in a build without CUDA.
std::unique_ptr<Transport> make_nccl_transport(Group& group, int device);

}  // namespace forge::dist
