// The training loop (see trainer.h); its steps are the methods of Run (run.h).
#include "train/trainer.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "core/rng.h"
#include "data/loader.h"
#include "train/data.h"
#include "train/init_from.h"
#include "train/model.h"
#include "train/optimization.h"
#include "train/run.h"

namespace forge::train {

namespace fs = std::filesystem;

std::string default_run_dir(const Recipe& r) {
  if (!r.string("output.dir").empty()) return r.string("output.dir");
  return (fs::path("runs") / (r.string("name") + "-N")).string();
}

Recipe resolve_recipe(Recipe r, std::vector<std::string>* notes) {
  placement(r);  // the device is there
  const TaskData data = build_data(r, "", true, [](const std::string&) {});
  const data::DataLoader loader(data.train, loader_options(r, data, true));
  const StepPlan plan = plan_steps(r, data.train->size(), loader.batches_per_epoch());
  Generator gen(static_cast<uint64_t>(r.integer("seed")));
  check_model_fits_memory(r, data.shape, kTrainingBytesPerParameter, kTrainingUse);
  const std::unique_ptr<TaskModel> task = build_model(r, data.shape, DType::f32, &gen);
  if (!r.string("model.init_from").empty())
    notes->push_back(init_from(task->module(), r.string("model.init_from")).summary());
  make_optimizer(r, task->module());
  make_schedule(r, plan.total_steps, std::max<int64_t>(plan.steps_per_epoch, 1), notes);
  resolve_sizes(r, data.shape);
  return r;
}

TrainResult train(Recipe recipe, const TrainOptions& options) {
  Run run(std::move(recipe), options);  // every check; nothing is written yet
  run.start();                          // the run directory is written from here on
  const Cadence& every = run.cadence();
  while (run.steps_done() < run.total_steps()) {
    // Every process stops at the same point: a signal or a request on any one counts.
    if (run.stop_requested()) {
      run.stop();
      break;
    }
    const StepDone done = run.step();
    const bool last = done.step == run.total_steps();
    if (done.step % every.log_every == 0 || last) run.log_progress();
    const bool eval_now =
        last || (every.eval_every > 0 ? done.step % every.eval_every == 0 : done.epoch_ended);
    std::optional<double> metric;  // ranks the checkpoint of an evaluated step
    if (eval_now) {
      const std::optional<EvalResult> e = run.evaluate();
      if (!e) {
        // Stopped inside the evaluation: the checkpoint of this step would miss
        // it, so none is written and a resume redoes the steps since the last one.
        run.stopped_during_evaluation();
        break;
      }
      metric = run.best_metric(*e);
    }
    const bool ckpt_now =
        last || (every.checkpoint_every > 0 ? done.step % every.checkpoint_every == 0 : eval_now);
    if (ckpt_now) run.checkpoint(metric);
  }
  return run.finish();
}

}  // namespace forge::train
