// All-reduce bandwidth against message size, over the transport that
// data-parallel training uses (dist/transport.h): run under mpirun, e.g.
//   mpirun -np 2 build/bench/bench_allreduce [--device cuda]
// Prints, for f32 buffers of 4 KiB .. 64 MiB, the median time of one
// all-reduce (mean) and the bus bandwidth 2 (N-1)/N x bytes / time (NCCL's
// convention: what each process sends and receives), from rank 0; beside it,
// on the CPU, a blocking MPI_Allreduce (sum) of the same buffer: what a
// program that does not overlap its all-reduce with the backward would call.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "dist/group.h"
#include "dist/transport.h"

int main(int argc, char** argv) {
  using namespace forge;
  dist::Group& group = dist::Group::world();
  if (group.size() < 2) {
    fmt::print(stderr, "bench_allreduce: start it under mpirun with 2 or more processes\n");
    return 2;
  }
  const bool cuda =
      argc > 2 && std::string(argv[1]) == "--device" && std::string(argv[2]) == "cuda";
  const Device device =
      cuda ? Device::cuda(group.local_rank() % cuda_device_count()) : Device::cpu();
  auto transport =
      cuda ? dist::make_nccl_transport(group, device.index) : dist::make_mpi_transport(group);
  if (group.root())
    fmt::print("all-reduce (mean) of f32 buffers over {} processes, {} ({})\n", group.size(),
               dist::backend_name(transport->backend()), device.str());
  if (group.root())
    fmt::print(
        "| size | median time | bus bandwidth | blocking MPI_Allreduce | its bus bandwidth |\n"
        "|---|---|---|---|---|\n");
  for (int64_t bytes = 4 << 10; bytes <= (64ll << 20); bytes *= 4) {
    Tensor buf = Tensor::ones({bytes / 4}, DType::f32, device);
    const int reps = bytes <= (1 << 20) ? 50 : 10;
    std::vector<double> times;
    for (int i = 0; i < reps + 2; ++i) {
      group.barrier("the benchmark's barrier");
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t ticket = transport->start(buf);
      group.wait_until([&] { return transport->done(ticket); }, "the benchmark's all-reduce");
      if (cuda) buf.to(Device::cpu());  // waits for the device
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i >= 2) times.push_back(s);  // two warm-ups
    }
    std::vector<double> blocking;
    if (!cuda) {
      for (int i = 0; i < reps + 2; ++i) {
        group.barrier("the benchmark's barrier");
        const auto t0 = std::chrono::steady_clock::now();
        MPI_Allreduce(MPI_IN_PLACE, buf.raw_data(), static_cast<int>(buf.numel()), MPI_FLOAT,
                      MPI_SUM, MPI_COMM_WORLD);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (i >= 2) blocking.push_back(s);
      }
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    const double t = median(times), tb = median(blocking);
    const double traffic = 2.0 * (group.size() - 1) / group.size() * static_cast<double>(bytes);
    if (group.root())
      fmt::print("| {} KiB | {:.1f} us | {:.2f} GB/s | {} | {} |\n", bytes >> 10, t * 1e6,
                 traffic / t / 1e9, cuda ? "-" : fmt::format("{:.1f} us", tb * 1e6),
                 cuda ? "-" : fmt::format("{:.2f} GB/s", traffic / tb / 1e9));
  }
  group.finalize();
  return 0;
}
