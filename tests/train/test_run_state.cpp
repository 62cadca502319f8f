// state.json read strictly: a state round-trips; every kind of bad value
// (wrong type, out of range, disagreeing with its directory or the recipe,
// unknown or missing key) is refused with the file and the key named.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/test_util.h"
#include "train/run_state.h"

namespace forge::train {
namespace {

using forge::testing::expect_error;

// A run of 100 steps, 10 batches per epoch, one batch per step, at step 23.
RunStateExpect expect_at_23() {
  return RunStateExpect{.step = 23, .total_steps = 100, .batches_per_epoch = 10, .accumulation = 1};
}

RunState state_at_23() {
  RunState s;
  s.step = 23;
  s.loader = {2, 3};
  s.generator = {3, 4096};
  s.default_generator = {0, (uint64_t{1} << 63) + 5};  // exact beyond 2^53
  s.window = {1.5, 0.75, 0.25, 7, 9, 0, 3, 9};
  s.schedule_kind = "cosine";
  s.lr = 1e-3;
  s.elapsed_s = 12.5;
  s.last_eval_loss = 0.5;
  s.last_eval_accuracy = 0.8;
  s.grad_scaler = std::map<std::string, double>{{"scale", 65536.0}, {"growth_tracker", 12.0}};
  return s;
}

// The state of state_at_23 with `key` (a dotted path) set to `value`, or removed when null.
json::Value with(const std::string& path, const json::Value& value, bool remove = false) {
  json::Value v = state_at_23().to_json();
  json::Value* node = &v;
  std::string rest = path;
  for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1))
    node = &(*node)[rest.substr(0, dot)];
  if (remove) {
    std::erase_if(node->as_object(), [&](const auto& kv) { return kv.first == rest; });
  } else {
    (*node)[rest] = value;
  }
  return v;
}

// A state written before next-token models counted predictions apart from
// examples: its window's predictions are its examples.
TEST(RunState, AWindowWithoutPredictionsCountsItsExamples) {
  const RunState back = parse_run_state(with("window.predictions", json::Value(), true),
                                        "state.json", expect_at_23());
  EXPECT_EQ(back.window.predictions, 9);
  EXPECT_EQ(back.window.correct, 7);
}

TEST(RunState, RoundTripsExactly) {
  const RunState s = state_at_23();
  const RunState back = parse_run_state(s.to_json(), "state.json", expect_at_23());
  EXPECT_EQ(back.step, 23);
  EXPECT_EQ(back.loader, s.loader);
  EXPECT_EQ(back.generator, s.generator);
  EXPECT_EQ(back.default_generator, s.default_generator);
  EXPECT_EQ(back.window.loss_sum, 1.5);
  EXPECT_EQ(back.window.correct, 7);
  EXPECT_EQ(back.window.predictions, 9);
  EXPECT_EQ(back.window.steps, 3);
  EXPECT_EQ(back.elapsed_s, 12.5);
  EXPECT_EQ(back.last_eval_accuracy, 0.8);
  ASSERT_TRUE(back.grad_scaler.has_value());
  EXPECT_EQ(back.grad_scaler->at("scale"), 65536.0);
  // The CheckpointManager's key is allowed.
  json::Value v = s.to_json();
  v["checkpoint_metric"]["name"] = "eval_accuracy";
  v["checkpoint_metric"]["value"] = json::Value();
  EXPECT_NO_THROW(parse_run_state(v, "state.json", expect_at_23()));
}

// The end of an epoch (batch == batches per epoch) is the start of the next.
TEST(RunState, AcceptsThePositionAtTheEndOfAnEpoch) {
  RunStateExpect e = expect_at_23();
  e.step = 20;
  json::Value v = with("step", 20);
  v["schedule"]["step"] = 20;
  v["loader"]["epoch"] = 1;
  v["epoch"] = 1;
  v["loader"]["batch"] = 10;
  EXPECT_EQ(parse_run_state(v, "state.json", e).loader, (data::LoaderPosition{1, 10}));
}

TEST(RunStateErrors, EachNamesTheFileAndTheKey) {
  const std::string f = "runs/x/checkpoints/step-00000023/state.json";
  const auto refused = [&](const json::Value& v, std::vector<std::string> parts) {
    parts.push_back(f);
    expect_error([&] { parse_run_state(v, f, expect_at_23()); }, parts);
  };
  refused(with("step", -5), {"\"step\"", "-5"});
  refused(with("step", "abc"), {"\"step\"", "string \"abc\""});
  refused(with("step", 2.5), {"\"step\"", "an integer"});
  refused(with("step", json::Value(), true), {"\"step\" is missing"});
  refused(with("loader.batch", 9999), {"\"loader.batch\"", "[0, 10]", "9999"});
  refused(with("loader.epoch", "0"), {"\"loader.epoch\""});
  refused(with("generator.offset", -1), {"\"generator.offset\""});
  refused(with("default_generator", json::Array{}), {"\"default_generator\"", "object"});
  refused(with("window.correct", 10), {"\"window.correct\"", "[0, 9]"});
  refused(with("window.seconds", -1.0), {"\"window.seconds\""});
  refused(with("elapsed_s", true), {"\"elapsed_s\"", "boolean"});
  refused(with("last_eval.accuracy", 1.5), {"\"last_eval.accuracy\""});
  refused(with("grad_scaler.scale", 0.0), {"\"grad_scaler.scale\""});
  refused(with("schedule.step", 7), {"\"schedule.step\""});
  refused(with("surprise", 1), {"unknown key \"surprise\""});
  refused(with("window.extra", 1), {"unknown key \"window.extra\""});
  refused(with("checkpoint_metric", json::Value(json::Object{{"name", json::Value("a")},
                                                             {"value", json::Value("high")}})),
          {"\"checkpoint_metric.value\""});
  refused(json::Value(json::Array{}), {"the state", "object"});
}

// A state copied into another checkpoint's directory would overwrite that
// checkpoint on the next save.
TEST(RunStateErrors, StepMustMatchTheDirectory) {
  RunStateExpect e = expect_at_23();
  e.step = 200;
  e.total_steps = 300;
  expect_error([&] { parse_run_state(state_at_23().to_json(), "s/state.json", e); },
               {"s/state.json", "\"step\" is 23", "step 200"});
}

TEST(RunStateErrors, StepBeyondTheRecipesStepsIsRefused) {
  RunStateExpect e = expect_at_23();
  e.total_steps = 20;
  expect_error([&] { parse_run_state(state_at_23().to_json(), "state.json", e); },
               {"state.json", "past the 20 steps", "loop.steps"});
}

// A position the step count cannot reach: another batch size or data limit.
TEST(RunStateErrors, LoaderPositionMustFitTheStepsDone) {
  RunStateExpect e = expect_at_23();
  e.batches_per_epoch = 8;  // 23 steps reach epoch 2 batch 7, not batch 3
  expect_error([&] { parse_run_state(state_at_23().to_json(), "state.json", e); },
               {"state.json", "\"loader\"", "loop.batch_size"});
  e = expect_at_23();
  e.accumulation = 2;
  expect_error([&] { parse_run_state(state_at_23().to_json(), "state.json", e); },
               {"loop.accumulation"});
}

}  // namespace
}  // namespace forge::train
