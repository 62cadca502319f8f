// The optimizer base: parameter groups of real models, state dict round trips
// (resuming is bit-identical), strict loading, skipped parameters, grads left
// unwritten, lr and group scales, and the checks on what it is given.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>

#include "autograd/engine.h"
#include "core/safetensors.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/lamb.h"
#include "optim/sgd.h"
#include "tests/nn/nn_test_util.h"
#include "tests/optim/optim_test_util.h"
#include "tests/test_util.h"

namespace forge::optim {
namespace {

using forge::testing::expect_error;
using testing::Problem;
using Names = std::vector<std::string>;

Names names_of(const ParamGroup& g) {
  Names out;
  for (const auto& [name, _] : g.params) out.push_back(name);
  return out;
}

TEST(OptimParamGroups, TinyViT) {
  nn::ViTConfig c = forge::testing::tiny_vit_config();
  c.depth = 1;  // one block: transformer.layers.0
  nn::ViT vit(c);
  const auto groups = param_groups(vit, 0.05, true);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.05);
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  const std::string block = "transformer.layers.0.";
  EXPECT_EQ(names_of(groups[0]), (Names{"patch_embed.proj.weight", block + "attn.to_q.weight",
                                        block + "attn.to_k.weight", block + "attn.to_v.weight",
                                        block + "attn.to_out.weight", block + "ff.w1.weight",
                                        block + "ff.w2.weight", "head.weight"}));
  EXPECT_EQ(
      names_of(groups[1]),
      (Names{"cls_token", "pos_embed", "patch_embed.proj.bias", block + "attn_norm.norm.weight",
             block + "attn_norm.norm.bias", block + "attn.to_q.bias", block + "attn.to_k.bias",
             block + "attn.to_v.bias", block + "attn.to_out.bias", block + "ff_norm.norm.weight",
             block + "ff_norm.norm.bias", block + "ff.w1.bias", block + "ff.w2.bias",
             "transformer.norm.norm.weight", "transformer.norm.norm.bias", "head.bias"}));
  // The groups hold the model's own tensors.
  EXPECT_TRUE(groups[1].params[0].second.same(vit.cls_token));

  // Without the exclusion: one group, everything decays.
  const auto one = param_groups(vit, 0.05, false);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].params.size(), vit.named_parameters().size());
  EXPECT_EQ(one[0].weight_decay, 0.05);
}

TEST(OptimParamGroups, SequenceClassifierEmbeddings) {
  nn::SequenceClassifierConfig c{.vocab_size = 11, .max_len = 6, .dim = 8, .classes = 3};
  for (auto positional : {nn::PositionalKind::learned, nn::PositionalKind::axial}) {
    c.positional = positional;
    nn::SequenceClassifier clf(c);
    const auto groups = param_groups(clf, 0.1, true);
    const Names decay = names_of(groups[0]), no_decay = names_of(groups[1]);
    const auto has = [](const Names& n, const std::string& s) {
      return std::find(n.begin(), n.end(), s) != n.end();
    };
    EXPECT_TRUE(has(no_decay, "token_emb.weight"));
    EXPECT_TRUE(has(no_decay, "cls_token"));
    if (positional == nn::PositionalKind::learned) {
      EXPECT_TRUE(has(no_decay, "pos_emb.emb.weight"));
    } else {
      EXPECT_TRUE(has(no_decay, "pos_emb.weights.0"));  // (1, a0, 1, D): by name, not ndim
      EXPECT_TRUE(has(no_decay, "pos_emb.weights.1"));
    }
    EXPECT_TRUE(has(decay, "transformer.layers.0.attn.to_q.weight"));
    EXPECT_TRUE(has(decay, "head.weight"));
    EXPECT_TRUE(has(no_decay, "head.bias"));
    EXPECT_EQ(decay.size() + no_decay.size(), clf.named_parameters().size());
    for (const auto& [name, p] : groups[0].params) EXPECT_GE(p.dim(), 2) << name;
  }
}

TEST(OptimParamGroups, NameRule) {
  const Tensor matrix = Tensor::zeros({2, 2}), vector = Tensor::zeros({2});
  EXPECT_TRUE(is_no_decay("blocks.0.g", vector));
  EXPECT_TRUE(is_no_decay("encoder.token_emb.weight", matrix));
  EXPECT_TRUE(is_no_decay("decoder.pos_emb.emb.weight", matrix));
  EXPECT_FALSE(is_no_decay("encoder.token_embx.weight", matrix));  // whole components only
  EXPECT_FALSE(is_no_decay("to_logits.weight", matrix));
  EXPECT_FALSE(is_no_decay("patch_embed.proj.weight", matrix));  // timm decays the projection
}

// ---- state dicts ----

using Make = std::function<std::unique_ptr<Optimizer>(Problem&)>;

std::vector<std::pair<std::string, Make>> all_optimizers() {
  return {
      {"sgd",
       [](Problem& p) {
         return std::make_unique<SGD>(p.groups(0.01), 0.1, SGDOptions{0.9, 0.1});
       }},
      {"nesterov",
       [](Problem& p) {
         return std::make_unique<SGD>(p.groups(0.01), 0.1, SGDOptions{0.9, 0, true});
       }},
      {"adam", [](Problem& p) { return std::make_unique<Adam>(p.groups(0.1), 0.1); }},
      {"adamw", [](Problem& p) { return std::make_unique<AdamW>(p.groups(0.1), 0.1); }},
      {"lamb", [](Problem& p) { return std::make_unique<Lamb>(p.groups(0.1), 0.1); }},
  };
}

// k = 3 steps, a state dict through a safetensors file, a fresh optimizer on
// copies of the parameters, 4 more steps: the same bits as 7 steps in one go.
TEST(OptimStateDict, ResumeIsBitIdentical) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("forge_optim_resume_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (DType dtype : {DType::f64, DType::f32}) {
    for (const auto& [name, make] : all_optimizers()) {
      SCOPED_TRACE(name + " " + dtype_name(dtype));
      Problem straight(dtype);
      auto a = make(straight);
      straight.run(*a, 1, 7);

      Problem first(dtype);
      auto b = make(first);
      first.run(*b, 1, 3);
      b->set_lr(0.07);  // a schedule's lr travels with the state
      const std::string path = (dir / (name + ".safetensors")).string();
      safetensors::save(path, b->state_dict());

      Problem second(dtype);
      second.w.copy_from(first.w);
      second.b.copy_from(first.b);
      auto c = make(second);
      c->load_state_dict(safetensors::load(path).tensors);
      EXPECT_EQ(c->steps(), 3);
      EXPECT_EQ(c->lr(), 0.07);
      c->set_lr(0.1);
      second.run(*c, 4, 4);
      EXPECT_EQ(second.values(), straight.values());
      EXPECT_EQ(c->steps(), 7);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(OptimStateDict, Contents) {
  Problem p;
  Adam opt(p.groups(0.1), 0.1);
  p.run(opt, 1, 2);
  const auto state = opt.state_dict();
  Names keys;
  for (const auto& [k, _] : state) keys.push_back(k);
  EXPECT_EQ(keys, (Names{"exp_avg.b", "exp_avg.w", "exp_avg_sq.b", "exp_avg_sq.w", "lr", "step.b",
                         "step.w", "steps"}));
  EXPECT_EQ(state.at("steps").dtype(), DType::i64);
  EXPECT_EQ(state.at("steps").dim(), 0);
  EXPECT_EQ(state.at("steps").item(), 2);
  EXPECT_EQ(state.at("lr").item(), 0.1);
  EXPECT_EQ(state.at("exp_avg.w").shape(), (Shape{2, 3}));
  // A copy: stepping on does not change a saved state.
  const auto before = state.at("exp_avg.w").to_vector<double>();
  p.run(opt, 3, 1);
  EXPECT_EQ(state.at("exp_avg.w").to_vector<double>(), before);
}

TEST(OptimStateDict, StrictLoadListsEveryProblemAndChangesNothing) {
  Problem p;
  Adam opt(p.groups(0.1), 0.1);
  p.run(opt, 1, 2);
  const auto good = opt.state_dict();

  auto bad = good;
  bad.erase("exp_avg.w");                                   // missing
  bad["exp_avg.bias"] = Tensor::zeros({3}, DType::f64);     // unexpected
  bad["exp_avg_sq.b"] = Tensor::zeros({4}, DType::f64);     // wrong shape
  bad["exp_avg_sq.w"] = Tensor::zeros({2, 3}, DType::f32);  // wrong dtype
  bad["step.w"] = Tensor::scalar(-1, DType::i64);           // bad value
  Problem q;
  Adam fresh(q.groups(0.1), 0.5);
  const auto before = fresh.state_dict();
  expect_error([&] { fresh.load_state_dict(bad); },
               {"adam.load_state_dict", "missing: exp_avg.w", "unexpected: exp_avg.bias",
                "exp_avg_sq.b: expected [3] f64, found [4] f64",
                "exp_avg_sq.w: expected [2, 3] f64, found [2, 3] f32", "step.w"});
  const auto after = fresh.state_dict();
  EXPECT_EQ(fresh.steps(), 0);
  EXPECT_EQ(fresh.lr(), 0.5);
  for (const auto& [k, t] : before)
    EXPECT_EQ(t.to_vector<double>(), after.at(k).to_vector<double>()) << k;

  // A state from another optimizer kind does not fit either.
  SGD sgd(q.groups(0), 0.1, {0.9});
  expect_error([&] { sgd.load_state_dict(good); },
               {"sgd.load_state_dict", "missing: momentum_buffer.w", "unexpected: exp_avg.w"});
}

// ---- stepping ----

// A parameter without a grad is skipped and its own step count (Adam's bias
// correction) does not advance: b updated at t = 2, 3 follows a separate Adam
// that saw only those two grads.
TEST(OptimStep, ParametersWithoutGradAreSkipped) {
  Problem p;
  Adam opt(p.groups(0.1), 0.1);
  const auto b0 = p.b.to_vector<double>();
  p.set_grads(1);
  p.b.zero_grad();
  opt.step();
  EXPECT_EQ(p.b.to_vector<double>(), b0);
  EXPECT_EQ(opt.state_dict().at("step.b").item(), 0);
  EXPECT_EQ(opt.state_dict().at("step.w").item(), 1);
  p.run(opt, 2, 2);

  Problem alone;
  Tensor b = alone.b;
  Adam solo({ParamGroup{{{"b", b}}, 0, testing::kGroup1Scale}}, 0.1);
  for (int64_t t = 2; t <= 3; ++t) {
    alone.set_grads(t);
    solo.step();
  }
  EXPECT_EQ(p.b.to_vector<double>(), b.to_vector<double>());
  EXPECT_EQ(opt.steps(), 3);
}

// The optimizer reads grads and never writes them, even when a grad shares its
// storage with another tensor.
TEST(OptimStep, GradsAreNotWritten) {
  for (const auto& [name, make] : all_optimizers()) {
    SCOPED_TRACE(name);
    Problem p;
    auto opt = make(p);
    p.set_grads(1);
    const Tensor shared = p.w.grad();
    const auto before = shared.to_vector<double>();
    opt->step();
    EXPECT_TRUE(p.w.grad().same(shared));
    EXPECT_EQ(shared.to_vector<double>(), before);
    opt->zero_grad();
    EXPECT_FALSE(p.w.grad().defined());
    EXPECT_FALSE(p.b.grad().defined());
  }
}

// lr() * lr_scale is the group's lr: plain SGD moves w by lr g and b by lr / 2 g;
// set_lr changes the next step.
TEST(OptimStep, LrAndGroupScale) {
  Problem p;
  SGD opt(p.groups(0), 0.2);
  const auto w0 = p.w.to_vector<double>(), b0 = p.b.to_vector<double>();
  p.set_grads(1);
  const auto gw = p.w.grad().to_vector<double>(), gb = p.b.grad().to_vector<double>();
  opt.step();
  for (size_t i = 0; i < w0.size(); ++i)
    EXPECT_DOUBLE_EQ(p.w.to_vector<double>()[i], w0[i] - 0.2 * gw[i]);
  for (size_t i = 0; i < b0.size(); ++i)
    EXPECT_DOUBLE_EQ(p.b.to_vector<double>()[i], b0[i] - 0.1 * gb[i]);
  opt.set_lr(0);
  const auto frozen = p.values();
  p.run(opt, 2, 1);
  EXPECT_EQ(p.values(), frozen);
  expect_error([&] { opt.set_lr(-0.1); }, {"set_lr", "-0.1"});
}

TEST(OptimStep, GradMismatchIsCaughtBeforeAnyUpdate) {
  Problem p;
  SGD opt(p.groups(0), 0.1);
  p.set_grads(1);
  p.b.set_grad(Tensor::zeros({4}, DType::f64));
  const auto before = p.values();
  expect_error([&] { opt.step(); }, {"sgd.step", "'b'", "[4] f64", "[3] f64"});
  EXPECT_EQ(p.values(), before);  // w, checked first, was not updated either
  p.b.set_grad(Tensor::zeros({3}, DType::f32));
  expect_error([&] { opt.step(); }, {"'b'", "[3] f32"});
  EXPECT_EQ(opt.steps(), 0);
}

TEST(OptimStep, ConstructionChecks) {
  Problem p;
  const Tensor ids = Tensor::zeros({3}, DType::i64);
  expect_error([&] { SGD bad({ParamGroup{{{"ids", ids}}}}, 0.1); }, {"'ids'", "i64", "f32 or f64"});
  expect_error(
      [&] {
        SGD bad({ParamGroup{{{"w", p.w}, {"w", p.b}}}}, 0.1);
      },
      {"'w'", "listed twice"});
  expect_error(
      [&] {
        SGD bad({ParamGroup{{{"w", p.w}}}, ParamGroup{{{"v", p.w}}}}, 0.1);
      },
      {"group 1", "'v'", "already listed"});
  expect_error([&] { SGD bad({ParamGroup{{{"w", p.w}}, -0.1}}, 0.1); }, {"weight_decay", "-0.1"});
  expect_error([&] { SGD bad({ParamGroup{{{"w", p.w}}, 0, -2}}, 0.1); }, {"lr_scale", "-2"});
  expect_error([&] { param_groups(nn::Linear(2, 2), -1, true); }, {"weight_decay", "-1"});
  EXPECT_EQ(SGD(p.groups(0), 0.1).parameters().size(), 2u);
}

// ---- end to end: fit y = x A^T + c with a Linear layer, each optimizer ----

TEST(OptimTraining, EveryOptimizerFitsALinearMap) {
  Generator gen(7);
  const Tensor x = Tensor::randn({32, 4}, DType::f64, &gen);
  const Tensor a = Tensor::from_vector<double>({1, -2, 0.5, 3, 0, 1, -1, 2}, {2, 4});
  const Tensor c = Tensor::from_vector<double>({0.5, -1});
  const Tensor y = ops::matmul(x, a, false, true) + c;
  const auto loss_of = [&](nn::Linear& m) { return ops::mse_loss(m.forward(x), y); };
  const std::vector<std::pair<std::string, std::function<std::unique_ptr<Optimizer>(nn::Linear&)>>>
      makers = {
          {"sgd",
           [](nn::Linear& m) {
             return std::make_unique<SGD>(param_groups(m, 0, false), 0.1, SGDOptions{0.9});
           }},
          {"adam",
           [](nn::Linear& m) { return std::make_unique<Adam>(param_groups(m, 0, false), 0.05); }},
          {"adamw",
           [](nn::Linear& m) {
             return std::make_unique<AdamW>(param_groups(m, 1e-4, true), 0.05);
           }},
          {"lamb",
           [](nn::Linear& m) { return std::make_unique<Lamb>(param_groups(m, 0, false), 0.05); }},
      };
  for (const auto& [name, make] : makers) {
    SCOPED_TRACE(name);
    Generator init(3);
    nn::Linear model(4, 2, true, DType::f64, &init);
    auto opt = make(model);
    const double start = loss_of(model).item();
    for (int i = 0; i < 150; ++i) {
      opt->zero_grad();
      autograd::backward(loss_of(model));
      opt->step();
    }
    const double end = loss_of(model).item();
    EXPECT_LT(end, 1e-2 * start) << "start " << start << ", end " << end;
  }
}

}  // namespace
}  // namespace forge::optim
