// The weight EMA: timm's decay schedule, the lerp of parameters and the copy
// of buffers, tied weights, state round trips and bit-identical resuming,
// swapping into the model, and errors that name the mismatched entries.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "optim/ema.h"
#include "tests/test_util.h"

namespace forge::optim {
namespace {

using forge::testing::expect_error;

// A parameter w (2, 2) tied under a second name, and a buffer proj (2).
class Tiny : public nn::Module {
 public:
  explicit Tiny(DType dt = DType::f64) {
    w = Tensor::from_vector<double>({1, 2, -4, 0}, {2, 2}).to(dt);
    register_parameter("w", w);
    alias = w;
    register_parameter("alias", alias);
    proj = Tensor::from_vector<double>({0.5, 0.25}).to(dt);
    register_buffer("proj", proj);
  }
  void set(const std::vector<double>& wv, const std::vector<double>& pv) {
    w.copy_from(Tensor::from_vector(wv, {2, 2}).to(w.dtype()));
    proj.copy_from(Tensor::from_vector(pv).to(proj.dtype()));
  }
  Tensor w, alias, proj;
};

std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

TEST(ModelEma, DecayFollowsTimmsSchedule) {
  Tiny m;
  EmaOptions o;  // decay 0.9998, no warmup
  ModelEma plain(m, o);
  EXPECT_EQ(plain.decay(0), 0.0);  // max(0, step - 1) = 0: a plain copy
  EXPECT_EQ(plain.decay(1), 0.0);
  EXPECT_EQ(plain.decay(2), 0.9998);
  EXPECT_EQ(plain.decay(100000), 0.9998);

  o.warmup = true;
  o.decay = 0.9;
  o.warmup_power = 1;  // 1 - 1 / (1 + s)
  ModelEma linear(m, o);
  EXPECT_EQ(linear.decay(2), 0.5);    // s = 1
  EXPECT_EQ(linear.decay(4), 0.75);   // s = 3
  EXPECT_EQ(linear.decay(100), 0.9);  // 0.99 clamped to decay
  o.min_decay = 0.6;
  EXPECT_EQ(ModelEma(m, o).decay(2), 0.6);  // 0.5 raised to min_decay

  o = EmaOptions{};
  o.warmup = true;  // gamma 1, power 2/3: 1 - (1 + s)^(-2/3)
  ModelEma warm(m, o);
  EXPECT_DOUBLE_EQ(warm.decay(2), 0.3700394750525634);  // s = 1: 1 - 2^(-2/3)
  EXPECT_DOUBLE_EQ(warm.decay(9), 0.7688795752164551);  // s = 8: 1 - 9^(-2/3)
  o.warmup_gamma = 2;
  o.warmup_power = 0.75;
  o.update_after_step = 3;
  ModelEma late(m, o);
  EXPECT_EQ(late.decay(4), 0.0);                        // s = max(0, 4 - 3 - 1) = 0
  EXPECT_DOUBLE_EQ(late.decay(8), 0.5613086623491692);  // s = 4: 1 - 3^(-3/4)
}

TEST(ModelEma, UpdateLerpsParametersAndCopiesBuffers) {
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tiny m(dt);
    EmaOptions o;
    o.decay = 0.75;
    ModelEma small_weight(m, o);  // lerp weight 1 - d = 0.25: ema + 0.25 (model - ema)
    o.decay = 0.25;
    ModelEma large_weight(m, o);  // 0.75: model - 0.25 (model - ema)
    ModelEma copy(m, o);
    m.set({5, 2, 4, 8}, {3, -1});
    small_weight.update(m, 2);
    large_weight.update(m, 2);
    copy.update(m, 1);  // decay 0
    // 0.75 {1, 2, -4, 0} + 0.25 {5, 2, 4, 8} and 0.25 {...} + 0.75 {...}, exact in binary.
    auto s = small_weight.state_dict();
    EXPECT_EQ(values(s.at("w")), (std::vector<double>{2, 2, -2, 2}));
    EXPECT_EQ(values(s.at("alias")), values(s.at("w")));            // tied: every name of the model
    EXPECT_EQ(values(s.at("proj")), (std::vector<double>{3, -1}));  // copied, not averaged
    EXPECT_EQ(values(large_weight.state_dict().at("w")), (std::vector<double>{4, 2, 2, 6}));
    EXPECT_EQ(values(copy.state_dict().at("w")), (std::vector<double>{5, 2, 4, 8}));
    EXPECT_EQ(s.at("w").dtype(), dt);
    EXPECT_EQ(s.size(), 3u);
  }
}

// The model's values at training step t.
void train_to(Tiny& m, int64_t t) {
  std::vector<double> w(4), p(2);
  for (size_t i = 0; i < 4; ++i) w[i] = std::sin(static_cast<double>(t) + static_cast<double>(i));
  for (size_t i = 0; i < 2; ++i)
    p[i] = std::cos(static_cast<double>(t * 3) + static_cast<double>(i));
  m.set(w, p);
}

EmaOptions warm_options() {
  EmaOptions o;
  o.warmup = true;
  o.update_after_step = 2;
  return o;
}

void expect_same_state(const ModelEma& a, const ModelEma& b) {
  const auto sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [name, t] : sa) EXPECT_EQ(values(t), values(sb.at(name))) << name;
}

TEST(ModelEma, StateRoundTripsBitExactly) {
  Tiny m;
  ModelEma ema(m, warm_options());
  for (int64_t t = 1; t <= 6; ++t) {
    train_to(m, t);
    ema.update(m, t);
  }
  auto state = ema.state_dict();
  EXPECT_TRUE(state.at("w").device().is_cpu());
  Tiny other;
  ModelEma loaded(other, warm_options());
  loaded.load_state_dict(state);
  expect_same_state(loaded, ema);
  state.at("w").fill(7);  // the state dict holds copies
  EXPECT_NE(values(ema.state_dict().at("w"))[0], 7.0);
}

TEST(ModelEma, ResumingIsBitIdenticalToAnUninterruptedRun) {
  const int64_t N = 12, k = 5;
  Tiny m1;
  ModelEma straight(m1, warm_options());
  for (int64_t t = 1; t <= N; ++t) {
    train_to(m1, t);
    straight.update(m1, t);
  }
  Tiny m2;
  std::map<std::string, Tensor> saved;
  {
    ModelEma first(m2, warm_options());
    for (int64_t t = 1; t <= k; ++t) {
      train_to(m2, t);
      first.update(m2, t);
    }
    saved = first.state_dict();
  }
  Tiny fresh;  // a new process: a new model and EMA, then the saved state
  ModelEma resumed(fresh, warm_options());
  resumed.load_state_dict(saved);
  for (int64_t t = k + 1; t <= N; ++t) {
    train_to(fresh, t);
    resumed.update(fresh, t);
  }
  expect_same_state(resumed, straight);
}

TEST(ModelEma, SwapIntoExchangesValuesAndASecondSwapRestores) {
  Tiny m;
  EmaOptions o;
  o.decay = 0.5;
  ModelEma ema(m, o);
  m.set({5, 2, 4, 8}, {3, -1});
  ema.update(m, 2);  // w: {3, 2, 0, 4}; proj: {3, -1}
  m.set({9, 9, 9, 9}, {1, 1});
  const auto average = ema.state_dict();
  ema.swap_into(m);
  EXPECT_EQ(values(m.w), (std::vector<double>{3, 2, 0, 4}));
  EXPECT_TRUE(m.alias.same(m.w));  // the tied weight is swapped once
  EXPECT_EQ(values(m.proj), (std::vector<double>{3, -1}));
  EXPECT_EQ(values(ema.state_dict().at("w")), (std::vector<double>{9, 9, 9, 9}));
  ema.swap_into(m);
  EXPECT_EQ(values(m.w), (std::vector<double>{9, 9, 9, 9}));
  EXPECT_EQ(values(m.proj), (std::vector<double>{1, 1}));
  for (const auto& [name, t] : ema.state_dict()) EXPECT_EQ(values(t), values(average.at(name)));
}

class Renamed : public nn::Module {
 public:
  Renamed() {
    v = Tensor::zeros({2, 2}, DType::f64);
    register_parameter("v", v);
    proj = Tensor::zeros({3}, DType::f64);
    register_buffer("proj", proj);
  }
  Tensor v, proj;
};

TEST(ModelEma, MismatchesAreNamed) {
  Tiny m;
  ModelEma ema(m);
  Renamed r;
  expect_error([&] { ema.update(r, 3); },
               {"ModelEma::update", "not in the model: w", "not in the model: alias",
                "not in the EMA: v", "proj: the EMA holds [2] f64, the model [3] f64"});
  expect_error([&] { ema.swap_into(r); }, {"ModelEma::swap_into", "not in the EMA: v"});
  auto state = ema.state_dict();
  const auto before = values(state.at("w"));
  state.erase("alias");
  state["extra"] = Tensor::zeros({1});
  state["w"] = Tensor::zeros({4}, DType::f64);
  expect_error([&] { ema.load_state_dict(state); },
               {"missing: alias", "unexpected: extra", "w: expected [2, 2] f64, found [4] f64"});
  EXPECT_EQ(values(ema.state_dict().at("w")), before);  // nothing changed
  EmaOptions bad;
  bad.decay = 1.5;
  expect_error([&] { ModelEma e(m, bad); }, {"ModelEma", "decay"});
}

}  // namespace
}  // namespace forge::optim
