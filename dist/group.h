// The processes of a data-parallel job, over MPI (dist/ is the only layer that
// includes MPI; the library below it knows nothing of processes).
//
// `mpirun -np N attnforge ...` starts N processes; MPI bootstraps everything:
// ranks, the processes sharing a host (local rank, for thread and GPU
// placement), the host collectives the trainer needs (sums of metric counters,
// a stop decision all ranks agree on, barriers around checkpoint writes), the
// NCCL unique id's broadcast, and the gradient all-reduce on CPUs
// (MPI_Iallreduce). A process not started by an MPI launcher is a group of one
// and never initialises MPI.
//
// Every wait is bounded: a collective that does not complete within the
// group's timeout throws forge::Error naming what it waited for (a rank that
// hangs rather than fails). A rank that fails calls abort(), which ends every
// rank of the job.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "core/dtype.h"

namespace forge::dist {

class Group {
 public:
  // The job's group: MPI_COMM_WORLD when this process was started by an MPI
  // launcher (mpirun sets OMPI_COMM_WORLD_SIZE, MPICH's Hydra PMI_SIZE,
  // PMIx launchers PMIX_RANK), else a group of one. The first call initialises MPI.
  static Group& world();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the processes on this host
  int local_size() const { return local_size_; }
  bool root() const { return rank_ == 0; }
  bool uses_mpi() const { return mpi_; }

  // How long a collective waits for the other ranks before it throws.
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }

  // Blocking host collectives; `what` names the wait in a timeout's message.
  void sum(std::span<double> values, const char* what);
  void max(std::span<double> values, const char* what);
  bool any(bool flag, const char* what);  // true on every rank when true on one
  void barrier(const char* what);
  void broadcast(void* data, size_t bytes, int root, const char* what);

  // A non-blocking sum of a host buffer of `count` elements of `dtype` in
  // place; progress happens in test() (MPI progresses non-blocking collectives
  // inside its calls).
  using Request = int64_t;
  Request start_sum(void* data, int64_t count, DType dtype);
  bool test(Request request);  // true once complete (and then the request is gone)
  // Polls `done` until it returns true, sleeping a little between polls once
  // the first few fail; throws when the timeout passes first.
  void wait_until(const std::function<bool()>& done, const char* what) const;

  // Ends every process of the job with `code` (MPI_Abort), or this one when
  // the group is a single process. For a rank that failed: print first.
  [[noreturn]] void abort(int code);

  // MPI_Finalize, once, at a normal exit (a no-op without MPI).
  void finalize();

  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

 private:
  Group();
  ~Group() = default;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool mpi_ = false, finalized_ = false;
  double timeout_s_ = 600;
  struct Pending;
  Pending* pending_ = nullptr;  // outstanding non-blocking requests (MPI only)
};

// Whether the environment says an MPI launcher started this process.
bool launched_by_mpi();

}  // namespace forge::dist
