// The optimizer and the learning-rate schedule of a recipe (the `optimizer`
// and `schedule` sections), built for a model and a run's length.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/recipe.h"

namespace forge::train {

// The recipe's optimizer over `model`'s parameters: weight decay groups
// (optimizer.no_decay_on_norms_biases), timm's layer decay for ViTs, and the
// parameters of optimizer.freeze left out. When `info` is given, what was
// frozen is said there, one line (each prefix with its tensors and values).
std::unique_ptr<optim::Optimizer> make_optimizer(const Recipe& r, nn::Module& model,
                                                 std::vector<std::string>* info = nullptr);

// The schedule of a run of `total_steps` (warmup_epochs counted in
// `steps_per_epoch`). A warmup longer than the run (a short trial:
// --set loop.steps=50) is handled for every kind that has one, with a note:
//   cosine, linear_decay, linear_warmup, step: cut to the run's length (the
//     learning rate rises over the whole run and reaches optimizer.lr at its end);
//   rsqrt: kept (its peak, lr / sqrt(W), depends on W, so a cut would train a
//     short run at a higher rate than the long one ever reaches); the note says
//     what fraction of that peak the run reaches and how to shorten the warmup.
optim::ScheduleConfig make_schedule(const Recipe& r, int64_t total_steps, int64_t steps_per_epoch,
                                    std::vector<std::string>* notes);

}  // namespace forge::train
