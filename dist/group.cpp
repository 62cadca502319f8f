#include "dist/group.h"

#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/fault.h"

namespace forge::dist {

namespace {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  FORGE_FAIL("{} failed: {}", call, std::string(text, static_cast<size_t>(len)));
}

// The MPI type of each DType the all-reduce sums.
const std::pair<DType, MPI_Datatype> kMpiTypes[] = {
    {DType::f32, MPI_FLOAT}, {DType::f64, MPI_DOUBLE},
    {DType::i64, MPI_INT64_T}, {DType::i32, MPI_INT32_T}};

MPI_Datatype mpi_type(DType dtype) {
  for (const auto& [d, t] : kMpiTypes)
    if (d == dtype) return t;
  FORGE_FAIL("distributed: no MPI sum for {} buffers", dtype_name(dtype));
}

// Waits (bounded, see Group::wait_until) for a non-blocking request.
void wait_request(const Group& group, MPI_Request& req, const char* what) {
  group.wait_until(
      [&] {
        int flag = 0;
        check_mpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
        return flag != 0;
      },
      what);
}

}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

struct Group::Pending {
  std::map<Request, MPI_Request> requests;
  Request next = 0;
};

Group& Group::world() {
  static Group* group = new Group();  // never destroyed: MPI is finalised explicitly
  return *group;
}

Group::Group() {
  if (!launched_by_mpi()) return;
  int provided = 0;
  // Only the thread that runs the trainer calls MPI (the loader's workers and
  // OpenMP's threads never do).
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  mpi_ = true;
  // Errors come back as codes (then forge::Error), not as MPI's own abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  fault::set_rank(rank_);  // for faults armed for one rank (core/fault.h)
  MPI_Comm host;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host),
            "MPI_Comm_split_type");
  check_mpi(MPI_Comm_rank(host, &local_rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(host, &local_size_), "MPI_Comm_size");
  MPI_Comm_free(&host);
  pending_ = new Pending();
}

void Group::wait_until(const std::function<bool()>& done, const char* what) const {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  while (!done()) {
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    FORGE_CHECK(waited < timeout_s_,
                "{} did not complete within {} s (distributed.timeout_s): another process of the "
                "job stopped answering",
                what, timeout_s_);
    // MPI moves a collective's data forward only inside its calls, so polling
    // is what makes it progress: poll flat out for the first 50 ms (yielding
    // the core to a process that shares it), then, for a wait on a process
    // that is busy elsewhere (a checkpoint write, data preparation), every
    // 200 us.
    if (waited < 0.05)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

Group::Request Group::start_sum(void* data, int64_t count, DType dtype) {
  FORGE_CHECK(mpi_, "distributed: start_sum in a group without MPI");
  MPI_Request req;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), mpi_type(dtype), MPI_SUM,
                           MPI_COMM_WORLD, &req),
            "MPI_Iallreduce");
  const Request id = pending_->next++;
  pending_->requests.emplace(id, req);
  return id;
}

bool Group::test(Request request) {
  auto it = pending_->requests.find(request);
  FORGE_CHECK(it != pending_->requests.end(), "distributed: unknown request {}", request);
  int flag = 0;
  check_mpi(MPI_Test(&it->second, &flag, MPI_STATUS_IGNORE), "MPI_Test");
  if (flag) pending_->requests.erase(it);
  return flag != 0;
}

void Group::sum(std::span<double> values, const char* what) {
  if (!mpi_ || size_ == 1 || values.empty()) return;
  const Request r = start_sum(values.data(), static_cast<int64_t>(values.size()), DType::f64);
  wait_until([&] { return test(r); }, what);
}

void Group::max(std::span<double> values, const char* what) {
  if (!mpi_ || size_ == 1 || values.empty()) return;
  MPI_Request req;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE,
                           MPI_MAX, MPI_COMM_WORLD, &req),
            "MPI_Iallreduce");
  wait_request(*this, req, what);
}

bool Group::any(bool flag, const char* what) {
  double v = flag ? 1 : 0;
  max(std::span<double>(&v, 1), what);
  return v > 0;
}

void Group::barrier(const char* what) {
  if (!mpi_ || size_ == 1) return;
  MPI_Request req;
  check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Ibarrier");
  wait_request(*this, req, what);
}

void Group::broadcast(void* data, size_t bytes, int root, const char* what) {
  if (!mpi_ || size_ == 1) return;
  MPI_Request req;
  check_mpi(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &req),
            "MPI_Ibcast");
  wait_request(*this, req, what);
}

void Group::abort(int code) {
  if (mpi_ && !finalized_) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void Group::finalize() {
  if (!mpi_ || finalized_) return;
  finalized_ = true;
  MPI_Finalize();
}

}  // namespace forge::dist
