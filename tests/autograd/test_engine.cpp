// The backward engine: graph shapes, accumulation, grad mode, retain_graph,
// and that gradcheck itself catches a wrong backward.
#include <gtest/gtest.h>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using autograd::backward;
using namespace testing;

TEST(AutogradEngine, DiamondGraphSumsBothPaths) {
  Tensor x = leaf64({3}, 1);
  Tensor a = ops::mul(x, 2.0), b = ops::mul(x, 3.0);
  Tensor loss = ops::sum(ops::mul(a, b));  // 6 x^2
  backward(loss);
  expect_close(x.grad(), ops::mul(x.detach(), 12.0), 1e-12);
}

TEST(AutogradEngine, SameTensorUsedTwiceInOneOp) {
  Tensor x = leaf64({4}, 2);
  backward(ops::sum(ops::mul(x, x)));
  expect_close(x.grad(), ops::mul(x.detach(), 2.0), 1e-12);
}

TEST(AutogradEngine, SharedSubexpression) {
  Tensor x = leaf64({2, 3}, 3);
  Tensor s = ops::exp(x);
  backward(ops::sum(ops::add(s, ops::mul(s, s))));  // d/dx (s + s^2) = s (1 + 2 s)
  Tensor sv = ops::exp(x.detach());
  expect_close(x.grad(), ops::mul(sv, ops::add(ops::mul(sv, 2.0), 1.0)), 1e-12);
}

TEST(AutogradEngine, LeafGradientsAccumulateAcrossBackwards) {
  Tensor x = leaf64({3}, 4);
  backward(ops::sum(ops::mul(x, 5.0)));
  backward(ops::sum(ops::mul(x, 5.0)));
  testing::expect_values(x.grad(), {10, 10, 10}, 1e-12);
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(AutogradEngine, NoGradRecordsNothing) {
  Tensor x = leaf64({3}, 5);
  {
    NoGradGuard guard;
    Tensor y = ops::mul(x, x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
  }
  EXPECT_TRUE(autograd::grad_enabled());
  EXPECT_TRUE(ops::mul(x, x).requires_grad());
}

TEST(AutogradEngine, DetachStopsGradient) {
  Tensor x = leaf64({3}, 6);
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.raw_data(), x.raw_data());  // same storage
  backward(ops::sum(ops::mul(d, x)));
  expect_close(x.grad(), d, 0);
}

TEST(AutogradEngine, SecondBackwardWithoutRetainGraphIsAnError) {
  Tensor x = leaf64({3}, 7);
  Tensor loss = ops::sum(ops::exp(x));
  backward(loss);
  try {
    backward(loss);
    FAIL() << "a second backward through a freed graph must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(AutogradEngine, RetainGraphAllowsASecondBackward) {
  Tensor x = leaf64({3}, 8);
  Tensor loss = ops::sum(ops::exp(x));
  backward(loss, {.retain_graph = true});
  backward(loss);
  expect_close(x.grad(), ops::mul(ops::exp(x.detach()), 2.0), 1e-12);
}

TEST(AutogradEngine, UnusedOutputOfAMultiOutputOpGetsZeros) {
  Tensor x = leaf64({6}, 9);
  auto parts = ops::split(x, 2, 0);
  backward(ops::sum(ops::mul(parts[1], 3.0)));
  testing::expect_values(x.grad(), {0, 0, 3, 3, 0, 0}, 1e-12);
}

TEST(AutogradEngine, NonScalarRootNeedsAGradient) {
  Tensor x = leaf64({3}, 10);
  Tensor y = ops::mul(x, 2.0);
  EXPECT_THROW(backward(y), Error);
  backward({y}, {Tensor::ones({3}, DType::f64)});
  testing::expect_values(x.grad(), {2, 2, 2}, 1e-12);
}

TEST(AutogradEngine, RootWithoutGraphIsAnError) {
  Tensor x = Tensor::ones({1}, DType::f64);
  EXPECT_THROW(backward(x), Error);
}

TEST(AutogradEngine, OnlyLeavesCanChangeRequiresGrad) {
  Tensor x = leaf64({3}, 11);
  Tensor y = ops::mul(x, 2.0);
  EXPECT_THROW(y.set_requires_grad(false), Error);
  EXPECT_THROW(Tensor::zeros({2}, DType::i64).set_requires_grad(true), Error);
}

TEST(AutogradEngine, DeepChainDoesNotRecurse) {
  // 200000 nodes: the engine walks the graph, and the graph is freed, iteratively.
  Tensor x = leaf64({1}, 12);
  Tensor y = x;
  for (int i = 0; i < 200000; ++i) y = ops::add(y, 1.0);
  backward(ops::sum(y));
  testing::expect_values(x.grad(), {1}, 0);
}

// An op whose backward is deliberately wrong (d/dx x^2 reported as x):
// gradcheck must reject it and name the input and element.
Tensor wrong_square(const Tensor& x) {
  Tensor y;
  {
    NoGradGuard g;
    y = ops::mul(x, x);
  }
  return autograd::record("wrong_square", {x}, y,
                          [xd = x.detach()](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                            return {ops::mul(g[0], xd)};
                          });
}

TEST(Gradcheck, CatchesAWrongBackwardAndNamesTheElement) {
  Tensor x = leaf64({3}, 13, 0.5, 1.0);
  auto result =
      autograd::gradcheck([](const std::vector<Tensor>& in) { return wrong_square(in[0]); }, {x});
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.message.find("input 0"), std::string::npos) << result.message;
  EXPECT_NE(result.message.find("analytic"), std::string::npos) << result.message;
  EXPECT_GT(result.max_abs_error, 0.4);
}

TEST(Gradcheck, PassesACorrectBackwardAndLeavesInputsAlone) {
  Tensor x = leaf64({2, 3}, 14);
  const auto before = x.to_vector<double>();
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return ops::mul(in[0], in[0]); }, {x});
  EXPECT_EQ(x.to_vector<double>(), before);
  EXPECT_FALSE(x.grad().defined());
}

TEST(Gradcheck, RejectsF32Inputs) {
  Tensor x = Tensor::ones({2});
  x.set_requires_grad(true);
  EXPECT_THROW(autograd::gradcheck([](const std::vector<Tensor>& in) { return in[0]; }, {x}),
               Error);
}

// The leaf hook (what data-parallel training starts its all-reduces from):
// once per leaf, with the leaf's final gradient already in .grad.
TEST(AutogradEngine, LeafHookRunsOncePerLeafWhenItsGradientIsFinal) {
  Tensor w1 = leaf64({3}, 1), w2 = leaf64({3}, 2), x = leaf64({3}, 3);
  std::vector<std::pair<TensorImpl*, Tensor>> calls;
  {
    autograd::LeafGradHookGuard guard(
        [&](TensorImpl& leaf) { calls.emplace_back(&leaf, Tensor(leaf.grad).clone()); });
    // w1 is used twice (a tied weight): first near the loss, then deep in the graph.
    Tensor h = ops::mul(ops::mul(x, w1), w2);
    backward(ops::sum(ops::mul(h, w1)));
  }
  ASSERT_EQ(calls.size(), 3u);
  for (const Tensor& t : {w1, w2, x}) {
    int seen = 0;
    for (const auto& [leaf, grad] : calls) {
      if (leaf != &t.impl()) continue;
      ++seen;
      expect_close(grad, t.grad(), 0);  // the gradient at the call is the final one
    }
    EXPECT_EQ(seen, 1);
  }
  // w2 is final before x and w1 (its one use is the second-last op to run).
  EXPECT_EQ(calls.front().first, &w2.impl());
}

TEST(AutogradEngine, LeafHookSkipsNestedBackwardsAndIsScoped) {
  Tensor w = leaf64({4}, 4), x = leaf64({4}, 5);
  int calls = 0;
  Tensor final_at_call;
  {
    autograd::LeafGradHookGuard guard([&](TensorImpl& leaf) {
      ++calls;
      if (&leaf == &w.impl()) final_at_call = Tensor(leaf.grad).clone();
    });
    // The checkpoint replays fn in a nested backward that accumulates into w;
    // the hook runs once, from the outer backward, after the replay.
    auto fn = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ops::mul(ops::exp(in[0]), w)};
    };
    Tensor y = autograd::checkpoint(fn, {x}, nullptr, {w})[0];
    backward(ops::sum(ops::mul(y, y)));
  }
  EXPECT_EQ(calls, 2);
  expect_close(final_at_call, w.grad(), 0);
  w.zero_grad();
  backward(ops::sum(ops::mul(w, 2.0)));  // the guard is gone: no call
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

// Turns check-nan on for one test and off again, whatever happens.
struct CheckNanScope {
  CheckNanScope() { autograd::set_check_nan(true); }
  ~CheckNanScope() { autograd::set_check_nan(false); }
};

TEST(CheckNan, NamesTheFirstOpWhoseOutputIsNotFinite) {
  Tensor x = Tensor::from_vector<double>({1.0, -1.0, 2.0});
  x.set_requires_grad(true);
  CheckNanScope on;
  Tensor y = ops::mul(x, 2.0);  // finite: passes
  try {
    Tensor z = ops::sqrt(y);  // sqrt(-2) = NaN
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("op 'sqrt'"), std::string::npos) << m;
    EXPECT_NE(m.find("element 1"), std::string::npos) << m;
  }
}

TEST(CheckNan, NamesTheBackwardThatMadeANonFiniteGradient) {
  Tensor x = Tensor::from_vector<double>({0.0, 4.0});
  x.set_requires_grad(true);
  CheckNanScope on;
  Tensor y = ops::sum(ops::sqrt(x));  // sqrt(0) = 0 is finite; its gradient 1/(2 sqrt 0) is not
  try {
    autograd::backward(y);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("backward of op 'sqrt'"), std::string::npos) << m;
  }
}

TEST(CheckNan, OffByDefaultAndNaNsFlowThrough) {
  EXPECT_FALSE(autograd::check_nan_enabled());
  Tensor x = Tensor::from_vector<double>({-1.0});
  x.set_requires_grad(true);
  EXPECT_TRUE(std::isnan(ops::sqrt(x).item()));
}

}  // namespace
}  // namespace forge
