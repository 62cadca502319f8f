// Layer-wise lr decay: timm's ViT layer ids, the groups' lr scales and decay
// per parameter, their order and union, layer_decay = 1 as param_groups, one
// SGD step against the hand-written update, and state dict round trips.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "nn/models.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/nn/nn_test_util.h"
#include "tests/test_util.h"

namespace forge::optim {
namespace {

using forge::testing::expect_error;

// depth 2: ids stem 0, blocks 1 and 2, final norm 2, head 3 (num_layers 4).
std::shared_ptr<nn::ViT> tiny_vit(uint64_t seed = 1) {
  Generator g(seed);
  return std::make_shared<nn::ViT>(forge::testing::tiny_vit_config(DType::f64), &g);
}

std::vector<ParamGroup> vit_groups(const nn::ViT& vit, double weight_decay, bool exclude,
                                   double layer_decay) {
  const int64_t depth = vit.config.depth;
  return param_groups_layer_decay(
      vit, weight_decay, exclude, layer_decay,
      [depth](const std::string& name) { return nn::vit_layer_id(name, depth); },
      nn::vit_num_layers(depth));
}

// (lr scale, weight decay) of every parameter under `groups`.
std::map<std::string, std::pair<double, double>> settings(const std::vector<ParamGroup>& groups) {
  std::map<std::string, std::pair<double, double>> out;
  for (const ParamGroup& g : groups)
    for (const auto& [name, p] : g.params) out[name] = {g.lr_scale, g.weight_decay};
  return out;
}

TEST(LayerDecay, VitLayerIdsFollowTimmsGroupMatcher) {
  EXPECT_EQ(nn::vit_num_layers(12), 14);
  EXPECT_EQ(nn::vit_layer_id("cls_token", 12), 0);
  EXPECT_EQ(nn::vit_layer_id("pos_embed", 12), 0);
  EXPECT_EQ(nn::vit_layer_id("patch_embed.proj.weight", 12), 0);
  EXPECT_EQ(nn::vit_layer_id("transformer.layers.0.attn.to_q.weight", 12), 1);
  EXPECT_EQ(nn::vit_layer_id("transformer.layers.11.ff.w2.bias", 12), 12);
  EXPECT_EQ(nn::vit_layer_id("transformer.norm.norm.weight", 12), 12);  // with the last block
  EXPECT_EQ(nn::vit_layer_id("head.weight", 12), 13);
  EXPECT_EQ(nn::vit_layer_id("transformer.projections.E.0.weight", 12), 13);  // unmatched
  expect_error([] { nn::vit_layer_id("transformer.layers.12.ff.w1.weight", 12); },
               {"transformer.layers.12", "depth-12"});
}

TEST(LayerDecay, ScalesAndDecayPerParameterOfATinyViT) {
  auto vit = tiny_vit();
  const auto groups = vit_groups(*vit, 0.05, true, 0.5);
  // 0.5^(3 - id): stem 1/8, block 0 1/4, block 1 and the final norm 1/2, head 1.
  auto scale_of = [](const std::string& name) {
    if (name == "cls_token" || name == "pos_embed" || name.starts_with("patch_embed."))
      return 0.125;
    if (name.starts_with("transformer.layers.0.")) return 0.25;
    if (name.starts_with("transformer.layers.1.") || name.starts_with("transformer.norm."))
      return 0.5;
    EXPECT_TRUE(name.starts_with("head.")) << name;
    return 1.0;
  };
  const auto got = settings(groups);
  for (const auto& [name, p] : vit->named_parameters()) {
    SCOPED_TRACE(name);
    const bool decays = p.dim() >= 2 && name != "cls_token" && name != "pos_embed";
    EXPECT_EQ(got.at(name).first, scale_of(name));
    EXPECT_EQ(got.at(name).second, decays ? 0.05 : 0.0);
  }
  // One group per (layer, decays), in order of first appearance: the ViT's own
  // tensors (cls_token, pos_embed) come before its children's.
  std::vector<std::pair<double, double>> keys;
  for (const ParamGroup& g : groups) keys.emplace_back(g.lr_scale, g.weight_decay);
  EXPECT_EQ(keys, (std::vector<std::pair<double, double>>{{0.125, 0},
                                                          {0.125, 0.05},
                                                          {0.25, 0},
                                                          {0.25, 0.05},
                                                          {0.5, 0},
                                                          {0.5, 0.05},
                                                          {1, 0.05},
                                                          {1, 0}}));
  EXPECT_EQ(groups[4].params.back().first, "transformer.norm.norm.bias");
}

TEST(LayerDecay, GroupsHoldEveryParameterOnce) {
  auto vit = tiny_vit();
  const auto named = vit->named_parameters();
  for (bool exclude : {false, true}) {
    size_t count = 0;
    std::set<std::string> names;
    for (const ParamGroup& g : vit_groups(*vit, 0.05, exclude, 0.75)) {
      for (const auto& [name, p] : g.params) {
        ++count;
        names.insert(name);
        const auto it = std::find_if(named.begin(), named.end(),
                                     [&](const auto& np) { return np.first == name; });
        ASSERT_NE(it, named.end()) << name;
        EXPECT_TRUE(it->second.same(p)) << name;  // the model's own tensor
      }
    }
    EXPECT_EQ(count, named.size());
    EXPECT_EQ(names.size(), named.size());
  }
}

TEST(LayerDecay, LayerDecayOneIsParamGroups) {
  auto vit = tiny_vit();
  for (bool exclude : {false, true})
    EXPECT_EQ(settings(vit_groups(*vit, 0.05, exclude, 1.0)),
              settings(param_groups(*vit, 0.05, exclude)));
}

// Dyadic gradients: with lr, decay and scales powers of two every product
// below is exact, so the hand update is bit-exact however it is compiled.
void set_grads(nn::Module& m) {
  for (auto& [name, p] : m.named_parameters()) {
    std::vector<double> g(static_cast<size_t>(p.numel()));
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = static_cast<double>(static_cast<int>(i % 7) - 3) / 8;
    p.set_grad(Tensor::from_vector(g, p.shape()));
  }
}

TEST(LayerDecay, AnSgdStepScalesEachParametersLr) {
  auto vit = tiny_vit();
  const double lr = 0.5, wd = 0.5;
  const auto groups = vit_groups(*vit, wd, true, 0.5);
  const auto expected_settings = settings(groups);
  std::map<std::string, std::vector<double>> expected;
  set_grads(*vit);
  for (const auto& [name, p] : vit->named_parameters()) {
    const auto [scale, decay] = expected_settings.at(name);
    const auto pv = p.to_vector<double>(), gv = p.grad().to_vector<double>();
    auto& e = expected[name];
    for (size_t i = 0; i < pv.size(); ++i)
      e.push_back(pv[i] + (-(lr * scale)) * (gv[i] + decay * pv[i]));
  }
  SGD sgd(groups, lr);
  sgd.step();
  for (const auto& [name, p] : vit->named_parameters())
    EXPECT_EQ(p.to_vector<double>(), expected.at(name)) << name;
}

TEST(LayerDecay, OptimizerStateRoundTrips) {
  auto a = tiny_vit(), b = tiny_vit(2);
  AdamW opt_a(vit_groups(*a, 0.05, true, 0.75), 1e-2);
  for (int i = 0; i < 2; ++i) {
    set_grads(*a);
    opt_a.step();
  }
  b->load_state_dict(a->state_dict());
  AdamW opt_b(vit_groups(*b, 0.05, true, 0.75), 1e-2);
  opt_b.load_state_dict(opt_a.state_dict());
  set_grads(*a);
  set_grads(*b);
  opt_a.step();
  opt_b.step();
  const auto pb = b->named_parameters();
  size_t i = 0;
  for (const auto& [name, p] : a->named_parameters())
    EXPECT_EQ(p.to_vector<double>(), pb[i++].second.to_vector<double>()) << name;
}

TEST(LayerDecay, BadLayersAndDecaysAreNamed) {
  auto vit = tiny_vit();
  expect_error(
      [&] {
        param_groups_layer_decay(
            *vit, 0.05, true, 0.5, [](const std::string&) { return 4; }, 4);
      },
      {"parameter 'cls_token' is in layer 4", "[0, 4)"});
  expect_error([&] { vit_groups(*vit, 0.05, true, 0.0); }, {"layer_decay > 0", "got 0"});
}

}  // namespace
}  // namespace forge::optim
