#include "dist/reducer.h"

#include "core/error.h"

namespace forge::dist {

const char* backend_name(Backend b) {
  return b == Backend::nccl ? "nccl" : "mpi";
}

GradReducer::GradReducer(Group& group, std::unique_ptr<Transport> transport,
                         std::vector<Tensor> params, ReducerOptions options)
    : group_(group), transport_(std::move(transport)), params_(std::move(params)) {
  FORGE_CHECK(options.bucket_bytes > 0, "GradReducer: bucket_bytes must be positive, got {}",
              options.bucket_bytes);
  // Reverse parameter order: the last layers' gradients are final first.
  for (int64_t i = static_cast<int64_t>(params_.size()) - 1; i >= 0; --i) {
    const Tensor& p = params_[static_cast<size_t>(i)];
    FORGE_CHECK(p.is_leaf() && p.requires_grad(),
                "GradReducer: parameter {} (shape {}) is not a leaf that requires grad", i,
                shape_str(p.shape()));
    FORGE_CHECK(
        p.device() == params_.front().device(),
        "GradReducer: parameters on {} and {}; data parallelism keeps a model on one device",
        p.device().str(), params_.front().device().str());
    FORGE_CHECK(!slot_.contains(&p.impl()), "GradReducer: parameter {} is listed twice", i);
    const int64_t bytes = p.numel() * static_cast<int64_t>(dtype_size(p.dtype()));
    if (buckets_.empty() || buckets_.back().dtype != p.dtype() ||
        (buckets_.back().numel > 0 &&
         (buckets_.back().numel * static_cast<int64_t>(dtype_size(p.dtype())) + bytes >
          options.bucket_bytes))) {
      buckets_.emplace_back();
      buckets_.back().dtype = p.dtype();
    }
    Bucket& b = buckets_.back();
    slot_[&p.impl()] = {static_cast<int64_t>(buckets_.size()) - 1,
                        static_cast<int64_t>(b.params.size())};
    b.params.push_back(i);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
  }
}

GradReducer::~GradReducer() = default;

double GradReducer::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void GradReducer::begin() {
  FORGE_CHECK(!hook_, "GradReducer::begin: the previous pass was not finished");
  t0_ = std::chrono::steady_clock::now();
  events_ = ReduceEvents{};
  events_.buckets = num_buckets();
  for (Bucket& b : buckets_) {
    b.waiting = static_cast<int64_t>(b.params.size());
    b.started = b.done = false;
    b.flat = Tensor();
    b.ticket = -1;
  }
  hook_.emplace([this](TensorImpl& leaf) { on_leaf(leaf); });
}

void GradReducer::on_leaf(TensorImpl& leaf) {
  const auto it = slot_.find(&leaf);
  if (it == slot_.end()) return;  // an input, a frozen weight: not reduced
  Bucket& b = buckets_[static_cast<size_t>(it->second.first)];
  if (--b.waiting == 0) {
    start(b);
    ++events_.started_in_backward;
  }
  poll();  // MPI progresses the started all-reduces inside its calls
}

void GradReducer::start(Bucket& b) {
  const int64_t n = static_cast<int64_t>(b.params.size());
  const Device device = params_.front().device();
  // [gradients of every slot | one flag per slot: 1 where this rank has a gradient]
  b.flat = Tensor::empty({b.numel + n}, b.dtype, device);
  for (int64_t s = 0; s < n; ++s) {
    const Tensor& p = params_[static_cast<size_t>(b.params[static_cast<size_t>(s)])];
    const int64_t off = b.offsets[static_cast<size_t>(s)];
    Tensor dst = b.flat.slice0(off, off + p.numel());
    const Tensor g = p.grad();
    if (g.defined())
      dst.copy_from(g);
    else
      dst.fill(0);
    b.flat.slice0(b.numel + s, b.numel + s + 1).fill(g.defined() ? 1 : 0);
  }
  b.ticket = transport_->start(b.flat);
  b.started = true;
  b.started_at = now();
  if (events_.first_start == 0) events_.first_start = b.started_at;
}

void GradReducer::poll() {
  for (Bucket& b : buckets_) {
    if (!b.started || b.done) continue;
    if (transport_->done(b.ticket)) {
      b.done = true;
      events_.last_done = now();
      events_.comm += events_.last_done - b.started_at;
    }
  }
}

void GradReducer::finish() {
  FORGE_CHECK(hook_.has_value(), "GradReducer::finish without begin");
  hook_.reset();
  events_.backward_end = now();
  for (const Bucket& b : buckets_) events_.done_in_backward += b.done ? 1 : 0;
  // Buckets with a gradient that never became final (a parameter this
  // backward did not reach) start now, in order: every rank starts the same
  // buckets in the same order.
  for (Bucket& b : buckets_)
    if (!b.started) start(b);
  group_.wait_until(
      [&] {
        poll();
        for (const Bucket& b : buckets_)
          if (!b.done) return false;
        return true;
      },
      "the gradient all-reduce");
  for (Bucket& b : buckets_) {
    const int64_t n = static_cast<int64_t>(b.params.size());
    const std::vector<double> flags =
        b.flat.slice0(b.numel, b.numel + n).to(Device::cpu()).to(DType::f64).to_vector<double>();
    for (int64_t s = 0; s < n; ++s) {
      Tensor& p = params_[static_cast<size_t>(b.params[static_cast<size_t>(s)])];
      const int64_t off = b.offsets[static_cast<size_t>(s)];
      if (flags[static_cast<size_t>(s)] > 0)
        p.set_grad(b.flat.slice0(off, off + p.numel()).view(p.shape()));
      else
        p.zero_grad();
    }
    b.flat = Tensor();  // the gradients hold its storage now
  }
}

}  // namespace forge::dist
