// One training run, as the steps train() (trainer.cpp) calls in its loop:
//
//   Run run(recipe, options);  every check a recipe or a checkpoint can fail;
//                              nothing is written yet
//   run.start();               the run directory is written from here on
//   run.step();                one optimizer step
//   run.log_progress();        a train record and the progress line
//   run.evaluate();            an evaluation (nullopt: a stop request came during it)
//   run.checkpoint(metric);    a checkpoint
//   run.stop();                a stop request before a step: a checkpoint, how to continue
//   run.finish();              the plot, attention maps and the closing line
//
// Data parallelism (under mpirun): every process runs the same steps on its
// slice of each global batch; rank 0 alone writes the run directory, logs
// and checkpoints, the others wait for it where they must.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/rng.h"
#include "core/upload.h"
#include "data/loader.h"
#include "dist/group.h"
#include "dist/reducer.h"
#include "optim/ema.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/evaluation.h"
#include "train/init_from.h"
#include "train/metrics.h"
#include "train/model.h"
#include "train/progress.h"
#include "train/recipe.h"
#include "train/run_dir.h"
#include "train/run_state.h"
#include "train/trainer.h"

namespace forge::train {

// Training keeps per parameter its f32 weight, gradient and AdamW's two
// moments (f64 runs twice that; activations come on top).
inline constexpr double kTrainingBytesPerParameter = 16;
inline constexpr const char* kTrainingUse =
    "training it (weights, gradients and the optimizer's moments)";

// The run's optimizer steps: loop.steps, or loop.epochs of `batches_per_epoch`
// (this process's loader; the same on every one) in steps of loop.accumulation.
struct StepPlan {
  int64_t steps_per_epoch = 0, total_steps = 0;
};
StepPlan plan_steps(const Recipe& r, int64_t examples, int64_t batches_per_epoch);

// When the loop logs, evaluates and checkpoints, in optimizer steps; the last
// step does all three.
struct Cadence {
  int64_t log_every = 0;         // loop.log_every
  int64_t eval_every = 0;        // loop.eval_every; 0: at the end of each epoch
  int64_t checkpoint_every = 0;  // checkpoint.every; 0: with each evaluation
};

// What the loop needs to know of the step just done.
struct StepDone {
  int64_t step = 0;          // optimizer steps done, this one included
  bool epoch_ended = false;  // the step drew the last batch of an epoch
};

// What a step scored, summed over its micro-batches: this process's, then
// (sum_over) the global batch's.
struct StepCounts {
  double loss_sum = 0;     // the loss times the rows it averages over
  double correct = 0;      // rows whose largest logit is the label
  double predictions = 0;  // rows scored: examples (classifiers) or real target tokens
  double examples = 0;
  double tokens = 0;  // the loader's count: real tokens of sequences, pixels of images

  // Sums the counts over the processes of `group` (every process calls it).
  void sum_over(dist::Group& group);
};

// Data parallelism: the gradient all-reduce over the log window.
struct AllReduceWindow {
  int64_t buckets = 0, started_in_backward = 0;
  double comm_s = 0, exposed_s = 0;
};

class Run {
 public:
  // Everything a recipe or a checkpoint can fail is checked here, before the
  // run directory is written to: the directory itself, the device, the data
  // (only generated data is written, into the shared cache), the model, the
  // optimizer, the schedule and, on --resume, the whole checkpoint. A start
  // that fails removes the directory it created; one that fails in a
  // directory that was there leaves it as it was.
  Run(Recipe recipe, const TrainOptions& options);
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // Writes the run directory (recipe.yaml, train.log, metrics; a fork's copy
  // of its checkpoint) once every process has passed every check, and says
  // in the log what the run is.
  void start();
  // Whether a stop was requested before the next step, on any process (every
  // process stops at the same point).
  bool stop_requested();
  // Stops before the next step: a checkpoint of the steps done (unless the
  // last one has them) and how to continue.
  void stop();
  // One optimizer step: the micro-batches' forward and backward, the
  // all-reduce, clipping, the optimizer (through the fp16 loss scaler), the
  // EMA; the step's counts go into the metric window.
  StepDone step();
  // The train record of the window since the last one (metrics.jsonl) and the
  // progress line; starts a new window.
  void log_progress();
  // Evaluates the weights (and the EMA's) on the eval split, appends the eval
  // record and logs it; nullopt when a stop request came during it.
  std::optional<EvalResult> evaluate();
  // After evaluate() returned nullopt: says where the run continues from (no
  // checkpoint is written).
  void stopped_during_evaluation();
  // The value of `e` that ranks checkpoints (checkpoint.keep_best): accuracy,
  // or loss for next-token models; the EMA's with ema.select_best.
  double best_metric(const EvalResult& e) const;
  // Writes a checkpoint of the steps done, ranked by `metric` (rank 0 writes,
  // the others wait).
  void checkpoint(std::optional<double> metric);
  // Ends the run: the plot; on a finished run the attention maps and the
  // closing line; returns what train() returns.
  TrainResult finish();

  int64_t steps_done() const { return step_; }          // optimizer steps done so far
  int64_t total_steps() const { return total_steps_; }  // the run's, resumed ones included
  const Cadence& cadence() const { return every_; }     // when to log, evaluate, checkpoint

 private:
  using Clock = std::chrono::steady_clock;

  // ---- setup: the constructor's steps, in order ----
  // The group's timeout, and this process's device and precision.
  void choose_device();
  // The run directory (as given, or the next free runs/<name>-<N>) and whether
  // the run continues from a checkpoint; a new run's directory is checked.
  void choose_run_dir();
  // The run's checkpoints; a resume refuses a damaged or unreadable latest one.
  void open_checkpoints();
  // The recipe's process-wide settings: GPU kernels, threads, NaN checks.
  void apply_settings();
  // The datasets (generated ones by rank 0 first), this process's loaders and
  // the run's number of steps.
  void load_data();
  // The model, on the device, with its generator; model.init_from's weights
  // for a run that does not continue a checkpoint.
  void build_model();
  // The optimizer, the fp16 loss scaler, the schedule and the loop's settings.
  void build_optimizer();
  // On resume: the checkpoint's weights, optimizer, loader position,
  // generators and metric window, read and checked whole.
  void resume_from_checkpoint();
  // The moving average of the weights (ema.decay > 0): the checkpoint's, or
  // starting as the weights.
  void build_ema();
  // The files the run will write or append to, checked without writing.
  void check_run_files();

  // ---- start()'s steps ----
  // Rank 0 creates the run directory and writes recipe.yaml, train.log, the
  // metrics (and a fork's copy of its checkpoint).
  void write_run_dir();
  // The notes of the setup and the line saying what the run starts or continues.
  void log_start();
  // Data parallelism: the gradient all-reduce during the backward.
  void build_reducer();
  // The device, precision and model lines of the log.
  void log_setup();

  // ---- step()'s steps ----
  // The step's micro-batches: forward, loss, backward (gradients accumulate);
  // this process's counts.
  StepCounts forward_backward();
  // Unscales (fp16) and clips the gradients, steps the optimizer, zeroes the
  // gradients; returns the gradient norm (0 for a step the scaler skipped).
  double update_weights();
  // A non-finite loss or gradient norm stops the run: nothing is written, so
  // the last checkpoint (if any) stays the run's latest.
  [[noreturn]] void stop_non_finite(const char* what, double value, const char* pass);

  // checkpoint()'s write: the checkpoint's path on rank 0, empty on the others.
  std::string write_checkpoint(std::optional<double> metric);

  nn::Module& model() { return task_->module(); }  // the task model's module
  // Evaluations still to come after `at` steps (every eval_every steps, or at
  // each epoch's end, and at the last step), for the ETA.
  double evaluations_left(int64_t at) const;
  // Seconds to the end of the run: the steps left and the evaluations left.
  double eta_seconds() const;

  // ---- the run's state, in the order it is set up ----
  Recipe r_;
  const TrainOptions& opt_;
  dist::Group& group_;
  bool root_ = false;
  int world_ = 1;
  Placement place_;
  std::string run_dir_;
  std::optional<CheckpointRef> fork_;  // resume_from: the checkpoint a new run continues
  bool from_checkpoint_ = false;       // the run continues a checkpoint (a resume or a fork)
  std::optional<CreatedDirGuard> created_;
  RunLog log_;
  bool by_loss_ = false;  // the best checkpoint has the lowest loss (next-token models)
  std::optional<CheckpointManager> ckpts_;
  TaskData data_;
  std::optional<data::DataLoader> train_loader_, eval_loader_;
  int64_t accum_ = 1;  // loop.accumulation: micro-batches per step
  int64_t steps_per_epoch_ = 0, total_steps_ = 0;
  Generator gen_;  // the model's (dropout, redraws)
  std::unique_ptr<TaskModel> task_;
  json::Value card_;
  std::optional<InitReport> init_;
  std::vector<std::string> setup_info_;  // said in the log once the run has started
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::optional<optim::GradScaler> scaler_;
  std::vector<std::string> notes_;  // warnings said in the log once the run has started
  optim::ScheduleConfig schedule_;
  std::vector<Tensor> params_;  // for the gradient norm
  double base_lr_ = 0, clip_ = 0, smoothing_ = 0;
  Cadence every_;
  int64_t step_ = 0;  // optimizer steps done
  MetricWindow window_;
  double elapsed_before_ = 0;  // training seconds of the checkpoint resumed from
  EvalResult last_eval_;
  int64_t resumed_world_ = 1;                // the processes that trained the checkpoint
  std::optional<Checkpoint> forked_;         // copied into the new run directory once it starts
  std::map<std::string, Tensor> ema_state_;  // the checkpoint's EMA weights, if any
  int64_t first_step_ = 0;                   // the step this invocation starts from
  std::unique_ptr<optim::ModelEma> ema_;
  std::optional<MetricsLog> metrics_;  // rank 0
  std::unique_ptr<dist::GradReducer> reducer_;
  Clock::time_point run_start_;
  double last_eval_seconds_ = 0;  // how long the last evaluation took, for the ETA
  int64_t vit_tokens_ = 0;        // a ViT's tokens per picture: its patches, and the class token
  std::optional<Uploader> uploader_;  // batches go to a GPU through pinned buffers
  TrainResult::Status status_ = TrainResult::Status::finished;
  EtaEstimator eta_;
  std::string last_ckpt_;
  int64_t last_ckpt_step_ = -1;
  int64_t skipped_steps_ = 0;  // fp16: steps the loss scaler skipped for inf / NaN gradients
  AllReduceWindow comm_;
};

}  // namespace forge::train
