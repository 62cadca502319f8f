// The NCCL transport on a GPU, in one process (a group of one: the NCCL
// communicator of a single rank, no MPI): the reducer's buckets go through
// ncclAllReduce on NCCL's own stream, ordered after the compute stream and
// before the work that reads the gradients. The mean over one process is the
// gradient itself, so the reduced gradients must equal a plain backward's
// bit for bit; the averaging over several processes is tested on the CPU
// (tests/dist).
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "dist/reducer.h"
#include "ops/ops.h"
#include "tests/cuda/cuda_test_util.h"

namespace forge {
namespace {

using testing::gpu;

std::vector<Tensor> mlp_weights(DType dtype) {
  std::vector<Tensor> w;
  for (uint64_t i = 0; i < 4; ++i) {
    Generator g(10 + i);
    Tensor t = Tensor::randn({64, 64}, dtype, &g).to(gpu());
    t.set_requires_grad(true);
    w.push_back(t);
  }
  return w;
}

Tensor mlp_loss(const std::vector<Tensor>& w, const Tensor& x) {
  Tensor h = x;
  for (const Tensor& t : w) h = ops::tanh(ops::matmul(h, ops::mul(t, 0.1)));
  return ops::sum(ops::mul(h, h));
}

TEST(CudaDist, NcclReducesBucketsDuringTheBackwardOnOneGpu) {
  FORGE_REQUIRE_CUDA();
  for (DType dtype : {DType::f32, DType::f64}) {
    Generator g(3);
    const Tensor x = Tensor::randn({32, 64}, dtype, &g).to(gpu());
    std::vector<Tensor> plain = mlp_weights(dtype);
    autograd::backward(mlp_loss(plain, x));

    std::vector<Tensor> w = mlp_weights(dtype);
    dist::ReducerOptions o;
    o.bucket_bytes = 64 * 64 * static_cast<int64_t>(dtype_size(dtype));  // a weight per bucket
    dist::GradReducer r(dist::Group::world(), dist::make_nccl_transport(dist::Group::world(), 0), w,
                        o);
    ASSERT_EQ(r.num_buckets(), 4);
    EXPECT_EQ(r.backend(), dist::Backend::nccl);
    for (int pass = 0; pass < 3; ++pass) {  // buffers and events are reused safely
      for (Tensor& t : w) t.zero_grad();
      r.begin();
      autograd::backward(mlp_loss(w, x));
      r.finish();
      EXPECT_EQ(r.events().started_in_backward, 4);
      for (size_t i = 0; i < w.size(); ++i) {
        ASSERT_TRUE(w[i].grad().defined());
        EXPECT_TRUE(w[i].grad().device() == gpu());
        testing::expect_close(w[i].grad().to(Device::cpu()), plain[i].grad().to(Device::cpu()), 0);
      }
    }
  }
}

}  // namespace
}  // namespace forge
