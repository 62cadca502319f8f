// The optimizer and schedule of a recipe (see optimization.h).
#include "train/optimization.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "nn/models.h"
#include "optim/adam.h"
#include "optim/lamb.h"
#include "optim/sgd.h"

namespace forge::train {

std::unique_ptr<optim::Optimizer> make_optimizer(const Recipe& r, nn::Module& model,
                                                 std::vector<std::string>* info) {
  const double wd = r.number("optimizer.weight_decay"),
               layer_decay = r.number("optimizer.layer_decay");
  const bool exclude = r.boolean("optimizer.no_decay_on_norms_biases");
  std::vector<optim::ParamGroup> groups;
  if (layer_decay < 1) {
    FORGE_CHECK(r.string("model.type") == "vit",
                "recipe: optimizer.layer_decay numbers a ViT's layers (timm's); model.type {} has "
                "no such numbering: leave it at 1",
                r.string("model.type"));
    const int64_t depth = r.integer("model.depth");
    groups = optim::param_groups_layer_decay(
        model, wd, exclude, layer_decay,
        [depth](const std::string& name) { return nn::vit_layer_id(name, depth); },
        nn::vit_num_layers(depth));
  } else {
    groups = optim::param_groups(model, wd, exclude);
  }
  std::vector<std::string> frozen_text;
  for (const std::string& prefix : r.string_list("optimizer.freeze")) {
    std::vector<std::string> names;
    int64_t values = 0;
    for (optim::ParamGroup& g : groups)
      std::erase_if(g.params, [&](const auto& p) {
        if (p.first.rfind(prefix, 0) != 0) return false;
        names.push_back(p.first);
        values += p.second.numel();
        return true;
      });
    FORGE_CHECK(!names.empty(),
                "recipe: optimizer.freeze: no parameter name starts with '{}' (names look like "
                "'transformer.layers.0.attn.to_q.weight')",
                prefix);
    std::sort(names.begin(), names.end());
    frozen_text.push_back(fmt::format("'{}': {} tensor{} of {} values ({})", prefix, names.size(),
                                      names.size() == 1 ? "" : "s", values,
                                      fmt::join(names, ", ")));
  }
  if (info && !frozen_text.empty())
    info->push_back(fmt::format("optimizer.freeze: not trained: {}", fmt::join(frozen_text, "; ")));
  const double lr = r.number("optimizer.lr");
  const std::string& name = r.string("optimizer.name");
  if (name == "sgd") {
    optim::SGDOptions o;
    o.momentum = r.number("optimizer.momentum");
    o.nesterov = r.boolean("optimizer.nesterov");
    return std::make_unique<optim::SGD>(std::move(groups), lr, o);
  }
  if (name == "lamb") {
    optim::LambOptions o;
    o.beta1 = r.number("optimizer.beta1");
    o.beta2 = r.number("optimizer.beta2");
    o.eps = r.number("optimizer.eps");
    return std::make_unique<optim::Lamb>(std::move(groups), lr, o);
  }
  optim::AdamOptions o;
  o.beta1 = r.number("optimizer.beta1");
  o.beta2 = r.number("optimizer.beta2");
  o.eps = r.number("optimizer.eps");
  if (name == "adam") return std::make_unique<optim::Adam>(std::move(groups), lr, o);
  return std::make_unique<optim::AdamW>(std::move(groups), lr, o);
}

optim::ScheduleConfig make_schedule(const Recipe& r, int64_t total_steps, int64_t steps_per_epoch,
                                    std::vector<std::string>* notes) {
  optim::ScheduleConfig s;
  s.kind = enum_from_name(optim::kScheduleNames, r.string("schedule.kind"));
  s.warmup_steps = r.integer("schedule.warmup_steps");
  const char* warmup_key = "schedule.warmup_steps";
  if (s.warmup_steps == 0 && r.number("schedule.warmup_epochs") > 0) {
    s.warmup_steps =
        static_cast<int64_t>(std::llround(r.number("schedule.warmup_epochs") * steps_per_epoch));
    warmup_key = "schedule.warmup_epochs";
  }
  const int64_t W = s.warmup_steps, T = total_steps;
  if (W > T) {
    switch (s.kind) {
      case optim::ScheduleKind::cosine:
      case optim::ScheduleKind::linear_decay:
      case optim::ScheduleKind::linear_warmup:
      case optim::ScheduleKind::step:
        notes->push_back(fmt::format(
            "{} makes a warmup of {} steps, longer than this run's {} steps: the warmup is cut to "
            "{} (the learning rate rises over the whole run and reaches optimizer.lr at its end)",
            warmup_key, W, T, T));
        s.warmup_steps = T;
        break;
      case optim::ScheduleKind::rsqrt:
        // The factor at the last update (s = T - 1) is (T - 1) / W of the peak 1 / sqrt(W).
        notes->push_back(fmt::format(
            "{} makes a warmup of {} steps, longer than this run's {} steps: the rsqrt schedule "
            "peaks at optimizer.lr / sqrt({}) after its warmup, and this run ends at {:.2g}% of "
            "that peak. The warmup is kept (a shorter one raises the peak); for a short trial set "
            "it, e.g. --set schedule.warmup_steps={}",
            warmup_key, W, T, W, 100.0 * static_cast<double>(T - 1) / static_cast<double>(W),
            std::max<int64_t>(1, T / 10)));
        break;
      case optim::ScheduleKind::constant:  // no warmup: validate() refuses one
        break;
    }
  }
  s.total_steps = total_steps;
  s.min_lr_ratio = r.number("schedule.min_lr_ratio");
  s.step_size = r.integer("schedule.step_size");
  s.gamma = r.number("schedule.gamma");
  try {
    s.validate();
  } catch (const Error& e) {
    FORGE_FAIL("recipe: the schedule section does not fit this run ({} steps, warmup {}): {}",
               total_steps, s.warmup_steps, message_of(e));
  }
  return s;
}

}  // namespace forge::train
