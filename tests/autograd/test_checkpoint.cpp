// checkpoint: same outputs, same gradients, same dropout masks as a plain run,
// and the generator ends where a plain run leaves it.
#include <gtest/gtest.h>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/node.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace forge {
namespace {

// A small block with dropout in the middle: tanh(dropout(x W^T + b)) W2^T.
std::vector<Tensor> block(const std::vector<Tensor>& in, Generator* gen) {
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  const Tensor& b = in[2];
  const Tensor& w2 = in[3];
  Tensor h = ops::dropout(ops::linear(x, w, b), 0.5, true, gen);
  return {ops::linear(ops::tanh(h), w2)};
}

TEST(Checkpoint, SameGradientsAndDropoutMasksAsAPlainRun) {
  std::vector<Tensor> params = {testing::leaf64({4, 6}, 1), testing::leaf64({8, 6}, 2),
                                testing::leaf64({8}, 3), testing::leaf64({5, 8}, 4)};
  Generator plain_gen(42), ckpt_gen(42);

  std::vector<Tensor> plain_in, ckpt_in;
  for (const Tensor& p : params) {
    plain_in.push_back(p.detach().clone().set_requires_grad(true));
    ckpt_in.push_back(p.detach().clone().set_requires_grad(true));
  }
  Tensor y_plain = block(plain_in, &plain_gen)[0];
  Tensor y_ckpt = autograd::checkpoint(
      [&](const std::vector<Tensor>& in) { return block(in, &ckpt_gen); }, ckpt_in, &ckpt_gen)[0];
  // Same dropout mask in the forward: identical outputs, bit for bit.
  EXPECT_EQ(y_plain.to_vector<double>(), y_ckpt.to_vector<double>());
  EXPECT_EQ(plain_gen.state(), ckpt_gen.state());
  EXPECT_EQ(y_ckpt.grad_fn()->name, "checkpoint");

  Tensor seed = testing::leaf64({4, 5}, 5).detach();
  autograd::backward({y_plain}, {seed});
  autograd::backward({y_ckpt}, {seed});
  // The recompute replayed the same mask: identical gradients, bit for bit.
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(ckpt_in[i].grad().defined()) << "input " << i;
    EXPECT_EQ(plain_in[i].grad().to_vector<double>(), ckpt_in[i].grad().to_vector<double>())
        << "input " << i;
  }
  // The recompute put the generator back.
  EXPECT_EQ(plain_gen.state(), ckpt_gen.state());
}

TEST(Checkpoint, CapturedParametersReceiveGradients) {
  Tensor w = testing::leaf64({3, 3}, 6);
  Tensor x = testing::leaf64({2, 3}, 7);
  auto fn = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ops::tanh(ops::matmul(in[0], w))};
  };
  Tensor y = autograd::checkpoint(fn, {x})[0];
  autograd::backward(ops::sum(y));
  Tensor gx = x.grad(), gw = w.grad();
  x.zero_grad();
  w.zero_grad();
  autograd::backward(ops::sum(fn({x})[0]));
  testing::expect_close(gx, x.grad(), 1e-12);
  testing::expect_close(gw, w.grad(), 1e-12);
}

TEST(Checkpoint, StoresNoIntermediates) {
  // A chain of 8 exps on a 256 KiB input: a plain graph keeps each output alive
  // for its backward, the checkpointed one keeps only the input.
  Tensor x = Tensor::rand({256, 256}).set_requires_grad(true);
  auto chain = [](const std::vector<Tensor>& in) {
    Tensor h = in[0];
    for (int i = 0; i < 8; ++i) h = ops::exp(ops::mul(h, 0.1));
    return std::vector<Tensor>{h};
  };
  const int64_t bytes = x.numel() * 4;
  const int64_t base = memory_stats().current;
  Tensor plain = chain({x})[0];
  const int64_t plain_held = memory_stats().current - base;
  plain = Tensor();
  const int64_t base2 = memory_stats().current;
  Tensor ckpt = autograd::checkpoint(chain, {x})[0];
  const int64_t ckpt_held = memory_stats().current - base2;
  EXPECT_GE(plain_held, 8 * bytes);
  EXPECT_LE(ckpt_held, 1 * bytes);
}

}  // namespace
}  // namespace forge
