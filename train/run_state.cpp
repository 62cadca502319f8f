// state.json written and read strictly (see run_state.h).
#include "train/run_state.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace forge::train {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

json::Value generator_json(const GeneratorState& s) {
  json::Value v;
  v["seed"] = s.seed;
  v["offset"] = s.offset;
  return v;
}

// Reads one object of the state; every error names the file and the key's
// full path ("loader.batch").
class Reader {
 public:
  Reader(const json::Value& object, std::string file, std::string prefix)
      : object_(object), file_(std::move(file)), prefix_(std::move(prefix)) {
    if (!object_.is_object())
      fail_at(prefix_.empty() ? "the state" : prefix_, "a JSON object", object_);
  }

  // The keys this object may hold; any other is an error.
  void only(std::initializer_list<const char*> keys) const {
    for (const auto& [key, unused] : object_.as_object()) {
      bool known = false;
      for (const char* k : keys) known = known || key == k;
      if (!known) {
        std::string list;
        for (const char* k : keys) list += std::string(list.empty() ? "" : ", ") + k;
        FORGE_FAIL(
            "{}: unknown key \"{}\" (expected {}): not a state this version of attnforge "
            "wrote",
            file_, path(key), list);
      }
    }
  }

  const json::Value& get(const char* key) const {
    const json::Value* v = object_.find(key);
    if (v == nullptr) FORGE_FAIL("{}: \"{}\" is missing", file_, path(key));
    return *v;
  }
  bool has(const char* key) const { return object_.find(key) != nullptr; }

  int64_t integer(const char* key, int64_t min, int64_t max) const {
    const json::Value& v = get(key);
    if (!v.is_int() || v.as_double() < static_cast<double>(min) ||
        v.as_double() > static_cast<double>(max) || v.as_int() < min || v.as_int() > max)
      fail(key, fmt::format("an integer in [{}, {}]", min, max), v);
    return v.as_int();
  }
  uint64_t unsigned_integer(const char* key) const {
    const json::Value& v = get(key);
    if (!v.is_int() || v.as_double() < 0) fail(key, "an integer in [0, 2^64)", v);
    return v.as_uint();
  }
  double number(const char* key, double min, double max) const {
    const json::Value& v = get(key);
    if (!v.is_number() || !(v.as_double() >= min && v.as_double() <= max))
      fail(key, fmt::format("a number in [{}, {}]", min, max), v);
    return v.as_double();
  }
  // A count >= 0 that older versions wrote as a double (12.0).
  double whole_number(const char* key) const {
    const json::Value& v = get(key);
    if (!v.is_number() || !(v.as_double() >= 0) || v.as_double() > 9.0e15 ||
        v.as_double() != std::floor(v.as_double()))
      fail(key, "a whole number >= 0", v);
    return v.as_double();
  }
  std::string string(const char* key) const {
    const json::Value& v = get(key);
    if (!v.is_string()) fail(key, "a string", v);
    return v.as_string();
  }
  Reader object(const char* key) const { return Reader(get(key), file_, path(key)); }

  [[noreturn]] void fail(const char* key, const std::string& expected,
                         const json::Value& found) const {
    fail_at(path(key), expected, found);
  }
  [[noreturn]] void fail_at(const std::string& key, const std::string& expected,
                            const json::Value& found) const {
    std::string text = json::dump(found);
    if (text.size() > 80) text = text.substr(0, 77) + "...";
    FORGE_FAIL("{}: \"{}\": expected {}, found {} {}", file_, key, expected,
               json::type_name(found.type()), text);
  }

 private:
  std::string path(const std::string& key) const {
    return prefix_.empty() ? key : prefix_ + "." + key;
  }

  const json::Value& object_;
  std::string file_, prefix_;
};

GeneratorState read_generator(const Reader& r) {
  r.only({"seed", "offset"});
  return {r.unsigned_integer("seed"), r.unsigned_integer("offset")};
}

}  // namespace

json::Value RunState::to_json() const {
  json::Value s;
  s["step"] = step;
  s["epoch"] = loader.epoch;
  s["loader"]["epoch"] = loader.epoch;
  s["loader"]["batch"] = loader.batch;
  s["generator"] = generator_json(generator);
  s["default_generator"] = generator_json(default_generator);
  json::Value& w = s["window"];
  w["loss_sum"] = window.loss_sum;
  w["grad_norm_sum"] = window.grad_norm_sum;
  w["seconds"] = window.seconds;
  w["correct"] = window.correct;
  w["examples"] = window.examples;
  w["predictions"] = window.predictions;
  w["tokens"] = window.tokens;
  w["steps"] = window.steps;
  s["schedule"]["kind"] = schedule_kind;
  s["schedule"]["step"] = step;
  s["schedule"]["lr"] = lr;
  s["elapsed_s"] = elapsed_s;
  s["world_size"] = world_size;
  s["last_eval"]["loss"] = last_eval_loss;
  s["last_eval"]["accuracy"] = last_eval_accuracy;
  if (grad_scaler) {
    s["grad_scaler"]["scale"] = grad_scaler->at("scale");
    s["grad_scaler"]["growth_tracker"] = static_cast<int64_t>(grad_scaler->at("growth_tracker"));
  }
  return s;
}

RunState parse_run_state(const json::Value& state, const std::string& file,
                         const RunStateExpect& expect) {
  const Reader r(state, file, "");
  r.only({"step", "epoch", "loader", "generator", "default_generator", "window", "schedule",
          "elapsed_s", "world_size", "last_eval", "grad_scaler", "checkpoint_metric", "card",
          "attnforge"});
  RunState s;
  s.step = r.integer("step", 0, kMaxInt);
  FORGE_CHECK(s.step == expect.step,
              "{}: \"step\" is {}, but the checkpoint's directory is named for step {}: the state "
              "belongs to another checkpoint",
              file, s.step, expect.step);
  FORGE_CHECK(s.step <= expect.total_steps,
              "{}: \"step\" is {}, past the {} steps the recipe trains (loop.steps, or loop.epochs "
              "x the steps per epoch); raise them to continue this run",
              file, s.step, expect.total_steps);

  const Reader loader = r.object("loader");
  loader.only({"epoch", "batch"});
  s.loader.epoch = loader.integer("epoch", 0, kMaxInt);
  s.loader.batch = loader.integer("batch", 0, expect.batches_per_epoch);
  FORGE_CHECK(r.integer("epoch", 0, kMaxInt) == s.loader.epoch,
              "{}: \"epoch\" is {} but \"loader.epoch\" is {}; they are written equal", file,
              r.get("epoch").as_int(), s.loader.epoch);
  // Each step draws `accumulation` batches from the stream of epochs laid end
  // to end; a position that step count does not reach is from another recipe
  // (batch size, data limit, accumulation) or damaged.
  const double drawn =
      static_cast<double>(s.loader.epoch) * static_cast<double>(expect.batches_per_epoch) +
      static_cast<double>(s.loader.batch);
  FORGE_CHECK(
      drawn == static_cast<double>(s.step) * static_cast<double>(expect.accumulation),
      "{}: \"loader\" is at epoch {} batch {} ({} batches of {} per epoch), but {} steps of "
      "{} batch(es) draw {}: the checkpoint was written with another loop.batch_size, "
      "data.limit_train or loop.accumulation than the recipe's, or is damaged",
      file, s.loader.epoch, s.loader.batch, expect.batches_per_epoch, expect.batches_per_epoch,
      s.step, expect.accumulation, s.step * expect.accumulation);

  s.generator = read_generator(r.object("generator"));
  s.default_generator = read_generator(r.object("default_generator"));

  const Reader w = r.object("window");
  w.only({"loss_sum", "grad_norm_sum", "seconds", "correct", "examples", "predictions", "tokens",
          "steps"});
  s.window.loss_sum = w.number("loss_sum", -kInf, kInf);
  s.window.grad_norm_sum = w.number("grad_norm_sum", 0, kInf);
  s.window.seconds = w.number("seconds", 0, kInf);
  s.window.examples = w.integer("examples", 0, kMaxInt);
  // Checkpoints written before next-token models counted one per example.
  s.window.predictions =
      w.has("predictions") ? w.integer("predictions", 0, kMaxInt) : s.window.examples;
  s.window.correct = w.integer("correct", 0, s.window.predictions);
  s.window.tokens = w.integer("tokens", 0, kMaxInt);
  s.window.steps = w.integer("steps", 0, s.step);

  const Reader schedule = r.object("schedule");
  schedule.only({"kind", "step", "lr"});
  s.schedule_kind = schedule.string("kind");
  schedule.integer("step", s.step, s.step);
  s.lr = schedule.number("lr", 0, kInf);

  s.elapsed_s = r.number("elapsed_s", 0, kInf);
  // Written since data-parallel training; any process count may continue a
  // run (the loader's position counts global batches).
  s.world_size = r.has("world_size") ? r.integer("world_size", 1, kMaxInt) : 1;
  const Reader eval = r.object("last_eval");
  eval.only({"loss", "accuracy"});
  s.last_eval_loss = eval.number("loss", -kInf, kInf);
  s.last_eval_accuracy = eval.number("accuracy", 0, 1);

  if (r.has("grad_scaler")) {
    const Reader g = r.object("grad_scaler");
    g.only({"scale", "growth_tracker"});
    s.grad_scaler = std::map<std::string, double>{
        {"scale", g.number("scale", std::numeric_limits<double>::min(), kInf)},
        {"growth_tracker", g.whole_number("growth_tracker")}};
  }
  if (r.has("checkpoint_metric")) {
    const Reader m = r.object("checkpoint_metric");
    m.only({"name", "value"});
    m.string("name");
    const json::Value& v = m.get("value");
    if (!v.is_null() && !v.is_number()) m.fail("value", "a number or null", v);
  }
  return s;
}

}  // namespace forge::train
