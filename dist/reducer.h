// Data-parallel gradient averaging overlapped with the backward pass (the
// scheme of PyTorch's DDP and Horovod): the parameters are grouped into
// buckets of about `bucket_bytes`, in reverse order (gradients become final
// roughly from the last layer back), and each bucket's all-reduce starts from
// autograd's leaf hook the moment its last gradient is final, so that the
// communication runs behind the rest of the backward.
//
//   reducer.begin();              // before the backward of the last micro-batch
//   autograd::backward(loss);     // buckets start as their gradients finish
//   reducer.finish();             // the rest start; wait; .grad = mean over processes
//
// A tied parameter (one tensor used twice) is one leaf, so one slot: reduced
// once, after its last use. A parameter without a gradient on a rank counts
// as zero there; one without a gradient on every rank keeps none (a flag per
// parameter travels in the bucket), so an optimizer skips it as in one process.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "autograd/engine.h"
#include "core/tensor.h"
#include "dist/group.h"
#include "dist/transport.h"

namespace forge::dist {

struct ReducerOptions {
  int64_t bucket_bytes = 25ll << 20;  // PyTorch DDP's default bucket_cap_mb
};

// What the last reduction did, in seconds since begin().
struct ReduceEvents {
  int64_t buckets = 0;
  int64_t started_in_backward = 0;  // buckets started from the hook, before the backward ended
  int64_t done_in_backward = 0;     // buckets whose all-reduce had completed by then
  double backward_end = 0;          // when finish() was called
  double first_start = 0, last_done = 0;
  double comm = 0;  // sum over buckets of start .. seen done
  // Time the all-reduce added after the backward: last_done - backward_end.
  double exposed() const { return last_done > backward_end ? last_done - backward_end : 0; }
};

class GradReducer {
 public:
  // `params`: the trained parameters (leaves), all on one device.
  GradReducer(Group& group, std::unique_ptr<Transport> transport, std::vector<Tensor> params,
              ReducerOptions options = {});
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  void begin();
  void finish();

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  const ReduceEvents& events() const { return events_; }
  Backend backend() const { return transport_->backend(); }

 private:
  struct Bucket {
    std::vector<int64_t> params;   // indices into params_, in slot order
    std::vector<int64_t> offsets;  // element offset of each slot in the flat buffer
    int64_t numel = 0;             // gradient elements (the flags follow)
    DType dtype = DType::f32;
    int64_t waiting = 0;  // gradients not final yet in this pass
    bool started = false, done = false;
    Tensor flat;
    int64_t ticket = -1;
    double started_at = 0;
  };

  void on_leaf(TensorImpl& leaf);
  void start(Bucket& b);
  void poll();
  double now() const;

  Group& group_;
  std::unique_ptr<Transport> transport_;
  std::vector<Tensor> params_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const TensorImpl*, std::pair<int64_t, int64_t>> slot_;  // bucket, slot
  std::optional<autograd::LeafGradHookGuard> hook_;
  std::chrono::steady_clock::time_point t0_;
  ReduceEvents events_;
};

}  // namespace forge::dist
