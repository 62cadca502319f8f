// The gradient reducer in one process, over a transport that stands in for
// the network: buckets in reverse parameter order, each started from the leaf
// hook as soon as its last gradient is final (before the backward ends), the
// mean written back, tied and unused parameters. The reduction over real
// processes is tested end to end in test_data_parallel.cpp.
#include <gtest/gtest.h>

#include <map>

#include "autograd/engine.h"
#include "dist/reducer.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace forge::dist {
namespace {

using testing::leaf64;

// A "job" of `ranks` processes whose others all hold the same gradients
// scaled by `others`: the mean is flat * (1 + others * (ranks - 1)) / ranks.
// An all-reduce completes on the `latency`-th poll after its start.
class FakeTransport final : public Transport {
 public:
  FakeTransport(int ranks, double others, int latency, std::vector<double>* started_numels)
      : ranks_(ranks), others_(others), latency_(latency), started_(started_numels) {}
  int64_t start(const Tensor& flat) override {
    started_->push_back(static_cast<double>(flat.numel()));
    jobs_[next_] = {flat, 0};
    return next_++;
  }
  bool done(int64_t ticket) override {
    auto it = jobs_.find(ticket);
    if (it == jobs_.end()) return true;
    if (++it->second.second < latency_) return false;
    Tensor& f = it->second.first;
    double* p = f.data<double>();
    for (int64_t i = 0; i < f.numel(); ++i) p[i] *= (1 + others_ * (ranks_ - 1)) / ranks_;
    jobs_.erase(it);
    return true;
  }
  Backend backend() const override { return Backend::mpi; }

 private:
  int ranks_;
  double others_;
  int latency_;
  std::vector<double>* started_;
  std::map<int64_t, std::pair<Tensor, int>> jobs_;
  int64_t next_ = 0;
};

// y = w3 tanh(w2 tanh(w1 x)): w3's gradient is final first, w1's last.
struct Mlp {
  Tensor w1 = leaf64({8, 8}, 1), w2 = leaf64({8, 8}, 2), w3 = leaf64({8, 8}, 3);
  Tensor x = Tensor::randn({4, 8}, DType::f64);
  Tensor loss() const {
    Tensor h = ops::tanh(ops::matmul(x, w1));
    h = ops::tanh(ops::matmul(h, w2));
    return ops::sum(ops::mul(ops::matmul(h, w3), ops::matmul(h, w3)));
  }
};

TEST(GradReducer, BucketsStartDuringTheBackwardAndTheMeanIsWrittenBack) {
  Mlp m;
  autograd::backward(m.loss());
  const std::vector<Tensor> plain = {m.w1.grad().clone(), m.w2.grad().clone(), m.w3.grad().clone()};
  for (Tensor* w : {&m.w1, &m.w2, &m.w3}) w->zero_grad();

  std::vector<double> started;
  ReducerOptions o;
  o.bucket_bytes = 64 * 8;  // one 8x8 f64 weight per bucket
  GradReducer r(Group::world(), std::make_unique<FakeTransport>(4, 3.0, 3, &started),
                {m.w1, m.w2, m.w3}, o);
  ASSERT_EQ(r.num_buckets(), 3);
  r.begin();
  autograd::backward(m.loss());
  r.finish();
  // Every bucket started from the hook; w3's (the first) was done before the
  // backward returned: later leaves' hooks polled it.
  EXPECT_EQ(r.events().started_in_backward, 3);
  EXPECT_GE(r.events().done_in_backward, 1);
  EXPECT_EQ(started, (std::vector<double>{64 + 1, 64 + 1, 64 + 1}));  // gradients + one flag
  // Mean of (g, 3g, 3g, 3g) = 2.5 g.
  testing::expect_close(m.w1.grad(), ops::mul(plain[0], 2.5), 1e-14);
  testing::expect_close(m.w2.grad(), ops::mul(plain[1], 2.5), 1e-14);
  testing::expect_close(m.w3.grad(), ops::mul(plain[2], 2.5), 1e-14);
}

TEST(GradReducer, BucketsFillInReverseParameterOrder) {
  Mlp m;
  Tensor b = leaf64({8}, 4);
  std::vector<double> started;
  ReducerOptions o;
  o.bucket_bytes = (64 + 64 + 8) * 8 - 8;  // w3, b and w2 do not fit in one: [w3 b] [w2 w1]
  GradReducer r(Group::world(), std::make_unique<FakeTransport>(1, 1.0, 1, &started),
                {m.w1, m.w2, b, m.w3}, o);
  EXPECT_EQ(r.num_buckets(), 2);
  r.begin();
  autograd::backward(m.loss());  // b is unused: it has no gradient
  r.finish();
  // [w2 w1] started from the hook; [w3 b] only after the backward (b was not
  // in it, so its bucket never filled).
  EXPECT_EQ(started, (std::vector<double>{64 + 64 + 2, 64 + 8 + 2}));
  EXPECT_EQ(r.events().started_in_backward, 1);
  // A parameter no process has a gradient for keeps none (an optimizer skips it).
  EXPECT_FALSE(b.grad().defined());
}

TEST(GradReducer, ATiedParameterIsReducedOnceAfterItsLastUse) {
  Tensor w = leaf64({6, 6}, 5), x = Tensor::randn({3, 6}, DType::f64);
  std::vector<double> started;
  GradReducer r(Group::world(), std::make_unique<FakeTransport>(2, 3.0, 1, &started), {w});
  r.begin();
  Tensor h = ops::matmul(ops::tanh(ops::matmul(x, w)), w);  // w used twice
  autograd::backward(ops::sum(ops::mul(h, h)));
  r.finish();
  ASSERT_EQ(started.size(), 1u);
  Tensor w2 = w.detach().clone();
  w2.set_requires_grad(true);
  Tensor h2 = ops::matmul(ops::tanh(ops::matmul(x, w2)), w2);
  autograd::backward(ops::sum(ops::mul(h2, h2)));
  testing::expect_close(w.grad(), ops::mul(w2.grad(), 2.0), 1e-14);  // mean of (g, 3g)
}

}  // namespace
}  // namespace forge::dist
