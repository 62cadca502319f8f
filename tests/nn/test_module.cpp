// Module system: dotted names, counting, modes, state dicts and checkpoints.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "autograd/engine.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace forge::nn {
namespace {

using forge::testing::expect_close;

// A two-level model: embed -> block.{norm, ff} -> head, plus a buffer at two levels.
struct Block : Module {
  Block() {
    norm = register_module("norm", std::make_shared<LayerNorm>(Shape{8}));
    ff = register_module("ff", std::make_shared<FeedForward>(
                                   FeedForwardOptions{.dim = 8, .mult = 2, .dropout = 0.5}));
    scale = Tensor::ones({1});
    register_buffer("scale", scale);
  }
  Tensor forward(const Tensor& x) { return x + ff->forward(norm->forward(x)); }
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<FeedForward> ff;
  Tensor scale;
};

struct Net : Module {
  explicit Net(uint64_t seed) {
    Generator g(seed);
    embed = register_module("embed", std::make_shared<Embedding>(10, 8, -1, DType::f32, &g));
    block = register_module("block", std::make_shared<Block>());
    head = register_module("head", std::make_shared<Linear>(8, 3, true, DType::f32, &g));
    init::normal_(block->ff->w1->weight, 0.0, 0.3, &g);
    steps = Tensor::zeros({}, DType::i64);
    register_buffer("steps", steps);
  }
  Tensor forward(const Tensor& ids) { return head->forward(block->forward(embed->forward(ids))); }
  std::shared_ptr<Embedding> embed;
  std::shared_ptr<Block> block;
  std::shared_ptr<Linear> head;
  Tensor steps;
};

Tensor some_ids() {
  return Tensor::from_vector<int64_t>({1, 4, 7, 2, 9, 0}, {2, 3});
}

TEST(NnModule, DottedNames) {
  Net net(1);
  std::vector<std::string> names;
  for (const auto& [n, t] : net.named_parameters()) {
    names.push_back(n);
    EXPECT_TRUE(t.requires_grad() && t.is_leaf()) << n;
  }
  const std::vector<std::string> expected = {
      "embed.weight",       "block.norm.weight", "block.norm.bias",
      "block.ff.w1.weight", "block.ff.w1.bias",  "block.ff.w2.weight",
      "block.ff.w2.bias",   "head.weight",       "head.bias"};
  EXPECT_EQ(names, expected);
  std::vector<std::string> buffers;
  for (const auto& [n, t] : net.named_buffers()) {
    buffers.push_back(n);
    EXPECT_FALSE(t.requires_grad()) << n;
  }
  EXPECT_EQ(buffers, (std::vector<std::string>{"steps", "block.scale"}));
  EXPECT_EQ(net.state_dict().size(), expected.size() + 2);
}

TEST(NnModule, CountsParametersOnceWhenTied) {
  Net net(1);
  const int64_t n = 10 * 8 + 8 + 8 + (8 * 16 + 16) + (16 * 8 + 8) + (8 * 3 + 3);
  EXPECT_EQ(net.num_parameters(), n);
  EXPECT_EQ(net.parameters().size(), 9u);
  // Rebinding a slot to another slot's tensor ties them: listed once, named twice.
  net.head->weight = net.block->ff->w2->weight;
  EXPECT_EQ(net.parameters().size(), 8u);
  EXPECT_EQ(net.state_dict().size(), 11u);  // both names stay in the state dict
}

TEST(NnModule, TrainEvalPropagates) {
  Net net(1);
  EXPECT_TRUE(net.block->ff->dropout->is_training());
  net.eval();
  EXPECT_FALSE(net.is_training());
  EXPECT_FALSE(net.block->ff->dropout->is_training());
  EXPECT_FALSE(net.head->is_training());
  net.train();
  EXPECT_TRUE(net.block->norm->is_training());
  Generator g(3);
  net.set_generator(&g);
  EXPECT_EQ(net.block->ff->dropout->generator(), &g);
}

TEST(NnModule, ZeroGrad) {
  Net net(1);
  net.eval();
  autograd::backward(ops::sum(net.forward(some_ids())));
  for (const auto& [n, t] : net.named_parameters()) EXPECT_TRUE(t.grad().defined()) << n;
  net.zero_grad();
  for (const auto& [n, t] : net.named_parameters()) EXPECT_FALSE(t.grad().defined()) << n;
}

TEST(NnModule, SafetensorsRoundTripGivesIdenticalOutputs) {
  Net a(1), b(2);
  a.eval();
  b.eval();
  a.steps.fill(17);
  const Tensor ya = a.forward(some_ids());
  EXPECT_GT(forge::testing::max_abs_diff(ya, b.forward(some_ids())), 1e-3);
  const std::string path =
      (std::filesystem::temp_directory_path() / "forge_nn_roundtrip.safetensors").string();
  a.save(path);
  const LoadReport r = b.load(path);
  std::remove(path.c_str());
  EXPECT_TRUE(r.ok()) << r.str();
  EXPECT_EQ(b.steps.item<int64_t>(), 17);
  EXPECT_EQ(forge::testing::max_abs_diff(ya, b.forward(some_ids())), 0.0);
  // Copied in place: the parameters are still the module's own leaves.
  EXPECT_TRUE(b.head->weight.requires_grad() && b.head->weight.is_leaf());
}

TEST(NnModule, StrictLoadListsEveryProblemAndChangesNothing) {
  Net a(1), b(2);
  auto state = a.state_dict();
  state.erase("head.bias");
  state.erase("block.scale");
  state["extra.weight"] = Tensor::zeros({2});
  state["block.ff.w1.weight"] = Tensor::zeros({3, 8});
  state["steps"] = Tensor::zeros({}, DType::f32);
  const auto before = b.state_dict();
  std::map<std::string, Tensor> saved;
  for (const auto& [n, t] : before) saved[n] = t.clone();
  try {
    b.load_state_dict(state);
    FAIL() << "strict load accepted a mismatched state dict";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* want :
         {"missing: head.bias", "missing: block.scale", "unexpected: extra.weight",
          "block.ff.w1.weight: expected [16, 8] f32, found [3, 8] f32",
          "steps: expected [] i64, found [] f32"})
      EXPECT_NE(msg.find(want), std::string::npos) << "no '" << want << "' in:\n" << msg;
  }
  for (const auto& [n, t] : b.state_dict())
    EXPECT_EQ(forge::testing::max_abs_diff(t, saved[n]), 0.0) << n;
}

TEST(NnModule, NonStrictLoadsWhatMatches) {
  Net a(1), b(2);
  auto state = a.state_dict();
  state.erase("head.bias");
  state["extra"] = Tensor::zeros({2});
  state["block.ff.w1.weight"] = Tensor::zeros({3, 8});
  const Tensor head_bias = b.head->bias.clone(), w1 = b.block->ff->w1->weight.clone();
  const LoadReport r = b.load_state_dict(state, false);
  EXPECT_EQ(r.missing, std::vector<std::string>{"head.bias"});
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"extra"});
  ASSERT_EQ(r.mismatched.size(), 1u);
  EXPECT_NE(r.mismatched[0].find("block.ff.w1.weight"), std::string::npos);
  expect_close(b.head->weight, a.head->weight, 0.0);
  expect_close(b.embed->weight, a.embed->weight, 0.0);
  expect_close(b.head->bias, head_bias, 0.0);
  expect_close(b.block->ff->w1->weight, w1, 0.0);
}

TEST(NnModule, RejectsBadNames) {
  struct Bad : Module {
    Bad() {
      w = Tensor::zeros({2});
      register_parameter("w", w);
    }
    void add(const std::string& name) { register_parameter(name, w); }
    Tensor w;
  };
  Bad m;
  EXPECT_THROW(m.add("w"), Error);
  EXPECT_THROW(m.add("a.b"), Error);
  EXPECT_THROW(m.add(""), Error);
}

}  // namespace
}  // namespace forge::nn
