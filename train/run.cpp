// One training run, step by step (see run.h).
#include "train/run.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <span>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/file_io.h"
#include "core/threading.h"
#include "core/version.h"
#include "ops/autocast.h"
#include "ops/blas_core.h"
#include "ops/ops.h"
#include "optim/clip.h"
#include "train/attention_maps.h"
#include "train/batch_math.h"
#include "train/card.h"
#include "train/optimization.h"
#include "train/plot.h"
#include "train/process_settings.h"

namespace forge::train {

namespace fs = std::filesystem;

namespace {

// Said at the start and the end of a run on generated stand-in data.
constexpr const char* kSyntheticWarning =
    "data.synthetic: this run trains and evaluates on generated stand-in data, not the task's "
    "(a smoke test): its accuracy says nothing of the task. Give data.root for the real data";

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Epochs whose every batch has been drawn (the loader moves to the next epoch
// only when asked for a batch past the end).
int64_t completed_epochs(const data::DataLoader& loader) {
  const data::LoaderPosition p = loader.position();
  return p.epoch + (p.batch >= loader.batches_per_epoch() ? 1 : 0);
}

// The metric a checkpoint's state records for ranking ("checkpoint_metric").
std::optional<double> checkpoint_metric(const json::Value& state) {
  const json::Value* m = state.is_object() ? state.find("checkpoint_metric") : nullptr;
  const json::Value* v = m && m->is_object() ? m->find("value") : nullptr;
  if (v && v->is_number()) return v->as_double();
  return std::nullopt;
}

// Draws the attention maps of the first evaluation example into `dir`
// (output.attention_maps) and says so in the log.
void write_attention_maps(TaskModel& model, data::DataLoader& loader, const Placement& place,
                          const Recipe& r, const std::string& dir, spdlog::logger& log) {
  nn::Module& m = model.module();
  m.eval();
  Uploader uploader(place.device);
  const data::Batch b = cast_batch(loader.build(0, 0), place.dtype, uploader);
  const AttentionMapsResult maps = draw_attention_maps(model, b, vit_layout(r), dir);
  m.train();
  log.info("attention maps of the first evaluation example: {} images in {}{}", maps.files.size(),
           dir,
           maps.layers_with_maps == 0 ? " (no layer has a mechanism with explicit maps)"
           : maps.rollout             ? ", attention rollout included"
                                      : "");
}

}  // namespace

StepPlan plan_steps(const Recipe& r, int64_t examples, int64_t batches_per_epoch) {
  StepPlan p;
  const int64_t accum = r.integer("loop.accumulation");
  p.steps_per_epoch = batches_per_epoch / accum;
  FORGE_CHECK(p.steps_per_epoch > 0 || r.integer("loop.steps") > 0,
              "recipe: one epoch of {} examples makes {} batches of loop.batch_size {}, fewer than "
              "loop.accumulation {}; lower them or set loop.steps",
              examples, batches_per_epoch, r.integer("loop.batch_size"), accum);
  p.total_steps = r.integer("loop.steps") > 0 ? r.integer("loop.steps")
                                              : r.integer("loop.epochs") * p.steps_per_epoch;
  FORGE_CHECK(p.total_steps > 0, "recipe: nothing to train: loop.steps and loop.epochs are 0");
  return p;
}

void StepCounts::sum_over(dist::Group& group) {
  double sums[] = {loss_sum, correct, predictions, examples, tokens};
  group.sum(sums, "the step's metric sums");
  loss_sum = sums[0];
  correct = sums[1];
  predictions = sums[2];
  examples = sums[3];
  tokens = sums[4];
}

// ---- setup ----

Run::Run(Recipe recipe, const TrainOptions& options)
    : r_(std::move(recipe)),
      opt_(options),
      group_(dist::Group::world()),
      root_(group_.root()),
      world_(group_.size()),
      log_(options.console && group_.root()) {
  // In this order: a recipe with several faults is refused for the first one
  // met, and the model's weights are drawn before a checkpoint or
  // model.init_from replaces them.
  choose_device();
  choose_run_dir();
  open_checkpoints();
  apply_settings();
  load_data();
  build_model();
  build_optimizer();
  resume_from_checkpoint();
  first_step_ = step_;  // where this invocation starts (0, or the checkpoint's step)
  build_ema();
  check_run_files();
}

void Run::choose_device() {
  group_.set_timeout(r_.number("distributed.timeout_s"));
  place_ = placement(r_, group_.local_rank());
}

void Run::choose_run_dir() {
  FORGE_CHECK(!(opt_.resume && !opt_.resume_from.empty()),
              "TrainOptions: resume and resume_from exclude each other");
  // The run directory: as given (--out, --resume, output.dir), or the next
  // free runs/<name>-<N>.
  run_dir_ = opt_.run_dir.empty() ? r_.string("output.dir") : opt_.run_dir;
  if (run_dir_.empty() && !opt_.resume) run_dir_ = next_run_dir(r_, group_);
  // A new run that continues from a chosen checkpoint of another (or the same) run.
  if (!opt_.resume_from.empty()) {
    fork_ = resolve_checkpoint(opt_.resume_from, "--resume");
    FORGE_CHECK(fork_->step && !fork_->run_dir.empty(),
                "--resume {}: {} is not a checkpoint of a run (RUN/checkpoints/step-N)",
                opt_.resume_from, fork_->dir);
  }
  from_checkpoint_ = fork_.has_value();
  if (opt_.resume) {
    FORGE_CHECK(fs::is_directory(run_dir_), "--resume {}: no such run directory", run_dir_);
    from_checkpoint_ = CheckpointManager::holds_checkpoint(run_dir_);
  } else {
    check_new_run_dir(run_dir_);
  }
  created_.emplace(root_ ? run_dir_ : std::string());
}

void Run::open_checkpoints() {
  // The best checkpoint: by accuracy for classifiers, by loss for next-token
  // models (whose per-token accuracy says less).
  by_loss_ =
      r_.string("model.type") == "language_model" || r_.string("model.type") == "encoder_decoder";
  ckpts_.emplace(
      run_dir_, static_cast<int>(r_.integer("checkpoint.keep_last")),
      r_.boolean("checkpoint.keep_best") ? 1 : 0,
      std::string("eval_") +
          (r_.number("ema.decay") > 0 && r_.boolean("ema.select_best") ? "ema_" : "") +
          (by_loss_ ? "loss" : "accuracy"),
      by_loss_ ? "min" : "max", [this](const std::string& w) { log_->warn("{}", w); });
  // A resume refuses a damaged latest checkpoint rather than going back to an
  // older one (whose next save would delete the damaged one): the user decides.
  if (from_checkpoint_ && !fork_ && ckpts_->damaged_latest())
    FORGE_FAIL(
        "--resume {}: the latest checkpoint is damaged: {}. Nothing was changed. To resume "
        "from the newest whole checkpoint before it, move it out of {}",
        run_dir_, *ckpts_->damaged_latest(), ckpts_->dir());
  FORGE_CHECK(!from_checkpoint_ || fork_ || ckpts_->latest(),
              "--resume {}: {} holds checkpoints but none can be read ({}). Nothing was changed",
              run_dir_, ckpts_->dir(), fmt::join(ckpts_->warnings(), "; "));
}

void Run::apply_settings() {
  apply_gpu_kernels(r_);
  apply_threads(r_, group_);
  autograd::set_check_nan(opt_.check_nan || r_.boolean("loop.check_nan"));
}

void Run::load_data() {
  // Generated data is written into the shared cache by rank 0 first; the
  // others then read it.
  auto make_data = [&] {
    return build_data(r_, "", true, [&](const std::string& s) { log_->info("{}", s); });
  };
  data_ = root_ ? make_data() : TaskData{};
  group_.barrier("rank 0's data preparation");
  if (!root_) data_ = make_data();
  auto sharded = [&](data::LoaderOptions o) {
    o.shard_index = group_.rank();
    o.shard_count = world_;
    return o;
  };
  train_loader_.emplace(data_.train, sharded(loader_options(r_, data_, true)));
  eval_loader_.emplace(data_.eval, sharded(loader_options(r_, data_, false)));
  accum_ = r_.integer("loop.accumulation");
  const StepPlan plan = plan_steps(r_, data_.train->size(), train_loader_->batches_per_epoch());
  steps_per_epoch_ = plan.steps_per_epoch;
  total_steps_ = plan.total_steps;
}

void Run::build_model() {
  gen_ = Generator(static_cast<uint64_t>(r_.integer("seed")));
  check_model_fits_memory(r_, data_.shape, kTrainingBytesPerParameter, kTrainingUse);
  task_ = train::build_model(r_, data_.shape, place_.dtype, &gen_);
  resolve_sizes(r_, data_.shape);  // what the run keeps says what was built
  card_ = model_card(r_, data_);
  model().to(place_.device);  // before the optimizer, whose state lives beside the parameters
  model().set_generator(&gen_);
  model().train();
  // Dropout draws keyed by the global batch position: this process's masks
  // are its rows of the masks one process would draw for the whole batch.
  gen_.set_batch_shard({static_cast<uint64_t>(group_.rank()), static_cast<uint64_t>(world_)});
  default_generator().set_batch_shard(gen_.batch_shard());
  // Fine-tuning: the weights from model.init_from (a resume has its own).
  if (!r_.string("model.init_from").empty() && !from_checkpoint_)
    init_ = init_from(model(), r_.string("model.init_from"));
}

void Run::build_optimizer() {
  optimizer_ = make_optimizer(r_, model(), &setup_info_);
  scaler_.emplace(optim::GradScalerOptions{.enabled = place_.loss_scaling});
  schedule_ = make_schedule(r_, total_steps_, std::max<int64_t>(steps_per_epoch_, 1), &notes_);
  params_ = optimizer_->parameters();
  base_lr_ = r_.number("optimizer.lr");
  clip_ = r_.number("optimizer.clip_grad_norm");
  smoothing_ = r_.number("loop.label_smoothing");
  every_.log_every = r_.integer("loop.log_every");
  every_.eval_every = r_.integer("loop.eval_every");
  every_.checkpoint_every = r_.integer("checkpoint.every");
}

void Run::resume_from_checkpoint() {
  if (!from_checkpoint_) return;
  const std::string latest = fork_ ? fork_->dir : *ckpts_->latest();
  const Checkpoint c = read_checkpoint(latest);
  for (const std::string& w : c.warnings) notes_.push_back(w);
  try {
    model().load_state_dict(c.model);
    auto [optimizer_state, ema_tensors] = split_ema(c.optimizer);
    optimizer_->load_state_dict(optimizer_state);
    ema_state_ = std::move(ema_tensors);
  } catch (const Error& e) {
    FORGE_FAIL(
        "--resume {}: checkpoint {} does not fit the run's recipe (a --set given with --resume "
        "changed the model or the optimizer?): {}. Resume without it, or start a new run",
        fork_ ? opt_.resume_from : run_dir_, latest, message_of(e));
  }
  RunStateExpect expect;
  expect.step = fork_ ? *fork_->step : *ckpts_->latest_step();
  expect.total_steps = total_steps_;
  expect.batches_per_epoch = train_loader_->batches_per_epoch();
  expect.accumulation = accum_;
  const std::string state_file = (fs::path(latest) / "state.json").string();
  const RunState s = parse_run_state(c.state, state_file, expect);
  if (s.grad_scaler && place_.loss_scaling) {
    try {
      scaler_->set_state(*s.grad_scaler);
    } catch (const Error& e) {
      FORGE_FAIL("{}: \"grad_scaler\": {}", state_file, message_of(e));
    }
  }
  step_ = s.step;
  train_loader_->seek(s.loader);
  gen_.set_state(s.generator);
  default_generator().set_state(s.default_generator);
  window_ = s.window;
  elapsed_before_ = s.elapsed_s;
  last_eval_.loss = s.last_eval_loss;
  last_eval_.accuracy = s.last_eval_accuracy;
  resumed_world_ = s.world_size;
  if (fork_) forked_ = c;
}

void Run::build_ema() {
  if (r_.number("ema.decay") > 0) {
    optim::EmaOptions eo;
    eo.decay = r_.number("ema.decay");
    eo.warmup = r_.boolean("ema.warmup");
    ema_ = std::make_unique<optim::ModelEma>(model(), eo);
    if (!ema_state_.empty()) {
      try {
        ema_->load_state_dict(ema_state_);
      } catch (const Error& e) {
        FORGE_FAIL("--resume {}: the checkpoint's EMA weights do not fit the model: {}",
                   fork_ ? opt_.resume_from : run_dir_, message_of(e));
      }
    } else if (from_checkpoint_) {
      notes_.push_back(fmt::format(
          "the checkpoint has no EMA of the weights (ema.decay was 0); the average starts from "
          "its weights at step {}",
          step_));
    }
  } else if (!ema_state_.empty()) {
    notes_.push_back("the checkpoint's EMA of the weights is dropped: ema.decay is 0");
  }
  ema_state_.clear();
}

void Run::check_run_files() {
  // A resume that would fail on them (a torn metrics line, a file that cannot
  // be written) fails here, with every file of the run as it was.
  if (root_) {
    const fs::path dir(run_dir_);
    for (const char* f : {"recipe.yaml", "train.log"}) io::check_writable((dir / f).string());
    MetricsLog::check_can_open(run_dir_, from_checkpoint_ ? std::optional<int64_t>(step_)
                                                          : std::nullopt);
  }
}

// ---- start ----

void Run::start() {
  // Every check passed (on every process): the run directory is written from here on.
  group_.barrier("every process's checks of the recipe, the data and the checkpoint");
  write_run_dir();
  log_start();
  build_reducer();
  log_setup();
  run_start_ = Clock::now();
  vit_tokens_ = data_.shape.images && r_.string("model.type") == "vit"
                    ? (r_.integer("model.image_size") / r_.integer("model.patch_size")) *
                              (r_.integer("model.image_size") / r_.integer("model.patch_size")) +
                          (r_.string("model.pool") == "cls" ? 1 : 0)
                    : 0;
  uploader_.emplace(place_.device);
  last_ckpt_step_ = from_checkpoint_ ? step_ : -1;
  reset_peak_memory(place_.device);
}

void Run::write_run_dir() {
  if (root_) {
    fs::create_directories(run_dir_);
    created_->disarm();
    remove_leftover_temps(run_dir_);
    ckpts_->tidy();
    // The recipe the run continues with: --set overrides given with --resume become the run's.
    io::write_file_atomic((fs::path(run_dir_) / "recipe.yaml").string(), r_.to_yaml());
    log_.commit(run_dir_);
    if (forked_) {
      // The new run starts as a copy of the chosen checkpoint and the metrics
      // up to it; the run it came from is left as it was.
      ckpts_->save(step_, *forked_, checkpoint_metric(forked_->state));
      const fs::path source_metrics = fs::path(fork_->run_dir) / "metrics.jsonl";
      std::error_code ec;
      if (fs::exists(source_metrics, ec))
        fs::copy_file(source_metrics, fs::path(run_dir_) / "metrics.jsonl",
                      fs::copy_options::overwrite_existing);
    }
    metrics_.emplace(run_dir_, from_checkpoint_ ? std::optional<int64_t>(step_) : std::nullopt);
  }
  forked_.reset();
}

void Run::log_start() {
  for (const std::string& n : notes_) log_->warn("{}", n);
  if (init_) log_->info("{}", init_->summary());
  for (const std::string& line : setup_info_) log_->info("{}", line);
  if (r_.boolean("data.synthetic")) log_->warn("{}", kSyntheticWarning);
  if (fork_) {
    log_->info("new run {} continuing {} (step {} of {}); {} is left as it was", run_dir_,
               fork_->dir, step_, total_steps_, fork_->run_dir);
  } else if (from_checkpoint_) {
    log_->info("resuming {} from {} (step {} of {}){}", run_dir_, *ckpts_->latest(), step_,
               total_steps_,
               resumed_world_ != world_
                   ? fmt::format("; it was trained by {} processes, it continues with {}",
                                 resumed_world_, world_)
                   : std::string());
  } else if (opt_.resume) {
    log_->info("resuming {}: it has no checkpoint yet; starting it from the beginning", run_dir_);
  } else {
    log_->info("run directory: {}", run_dir_);
  }
}

void Run::build_reducer() {
  // Gradients averaged over the processes during the backward (dist/reducer.h).
  if (world_ <= 1) return;
  const std::string& backend = r_.string("distributed.backend");
  const bool nccl = backend == "nccl" || (backend == "auto" && place_.device.is_cuda());
  FORGE_CHECK(!nccl || place_.device.is_cuda(),
              "recipe: distributed.backend: nccl averages GPU gradients, but this run trains "
              "on the CPU; use mpi or auto");
  dist::ReducerOptions ro;
  ro.bucket_bytes = static_cast<int64_t>(r_.number("distributed.bucket_mb") * (1 << 20));
  reducer_ = std::make_unique<dist::GradReducer>(
      group_,
      nccl ? dist::make_nccl_transport(group_, place_.device.index)
           : dist::make_mpi_transport(group_),
      optimizer_->parameters(), ro);
  log_->info(
      "data parallel: {} processes ({} on this host), {} all-reduce in {} buckets of up "
      "to {} MiB; batch {} = {} per process",
      world_, group_.local_size(), dist::backend_name(reducer_->backend()),
      reducer_->num_buckets(), r_.number("distributed.bucket_mb"), r_.integer("loop.batch_size"),
      r_.integer("loop.batch_size") / world_);
}

void Run::log_setup() {
  if (!place_.note.empty()) log_->warn("{}", place_.note);
  if (place_.device.is_cpu()) log_->info("CPU: OpenBLAS's {}", blas::kernel_summary());
  if (place_.device.is_cuda())
    log_->info("GPU: softmax / local / linformer attention on the {} kernels "
               "(model.attention.backend)",
               r_.string("model.attention.backend"));
  if (place_.device.is_cpu() && place_.autocast == DType::bf16)
    log_->info("CPU: matmuls, linear layers, the patch embedding and softmax / local attention "
               "from 128 keys in bf16 with f32 accumulation (oneDNN); every other op in f32");
  // The precision the run has, which may differ from the recipe's (fp16 on a CPU is fp32).
  const std::string precision = place_.autocast == DType::bf16   ? "bf16"
                                : place_.autocast == DType::f16  ? "fp16"
                                : place_.dtype == DType::f64     ? "fp64"
                                                                 : "fp32";
  log_->info(
      "model: {} {} on {} ({} parameters), attention {}, {} steps ({} per epoch, batch {} x {} "
      "accumulation), {} thread{}",
      r_.string("model.type"),
      precision == r_.string("precision")
          ? precision
          : fmt::format("{} (the recipe's precision {} does not apply here)", precision,
                        r_.string("precision")),
      place_.device.str(), model().num_parameters(),
      r_.string("model.attention.kind"), total_steps_, steps_per_epoch_,
      r_.integer("loop.batch_size"), accum_, num_threads(), num_threads() == 1 ? "" : "s");
}

// ---- the loop's steps ----

bool Run::stop_requested() {
  // core/fault.h's "step" point: an armed fault fails (or hangs) this process
  // once step_ steps are done, before the others hear of it.
  if (fault::due_at("step", step_)) fault::fire(fmt::format("before step {}", step_ + 1));
  return group_.any(opt_.stop_requested && opt_.stop_requested(step_), "the stop decision");
}

void Run::stop() {
  if (last_ckpt_step_ != step_) last_ckpt_ = write_checkpoint(std::nullopt);
  log_->warn("stopped at step {} of {}; continue with: attnforge train --resume {}", step_,
             total_steps_, run_dir_);
  status_ = TrainResult::Status::interrupted;
}

StepDone Run::step() {
  const auto t0 = Clock::now();
  const int64_t epochs_before = completed_epochs(*train_loader_);
  optimizer_->set_lr(base_lr_ * optim::lr_factor(schedule_, step_));
  StepCounts counts = forward_backward();
  // The metrics are the global batch's: sums over the processes.
  counts.sum_over(group_);
  window_.loss_sum += counts.loss_sum;
  window_.correct += static_cast<int64_t>(counts.correct);
  window_.predictions += static_cast<int64_t>(counts.predictions);
  window_.examples += static_cast<int64_t>(counts.examples);
  window_.tokens += static_cast<int64_t>(counts.tokens);
  const double norm = update_weights();
  ++step_;
  if (ema_) ema_->update(model(), step_);
  const double dt = seconds_since(t0);
  eta_.add(dt);
  if (step_ == first_step_ + 1 && every_.log_every > 1 && step_ < total_steps_)
    log_->info("step {} done in {}; progress every {} steps (loop.log_every), ETA {}", step_,
               format_duration(dt), every_.log_every, format_duration(eta_seconds()));
  window_.grad_norm_sum += norm;
  window_.seconds += dt;
  window_.steps += 1;
  return {step_, completed_epochs(*train_loader_) != epochs_before};
}

StepCounts Run::forward_backward() {
  StepCounts counts;  // this process's
  for (int64_t a = 0; a < accum_; ++a) {
    data::Batch b;
    // At the end of an epoch next() moves to the next one and returns false
    // once; the loader refuses a dataset that makes no batch at all.
    if (!train_loader_->next(b))
      FORGE_CHECK(train_loader_->next(b), "DataLoader: epoch {} has no batch",
                  train_loader_->position().epoch);
    b = cast_batch(std::move(b), place_.dtype, *uploader_);
    Predictions p;
    Tensor loss;
    {
      ops::AutocastGuard autocast(place_.autocast);
      p = predictions(task_->forward(b), b);
      loss = batch_loss(p, smoothing_);
    }
    const double l = loss.item();
    if (!std::isfinite(l)) stop_non_finite("the loss", l, "forward");
    // The loss is this process's mean; the reducer averages the gradients
    // over the processes, so each mean is weighted by its share of what the
    // global batch's mean averages over (1 for classifiers' equal slices;
    // next-token slices may hold different numbers of real tokens).
    double weight = 1.0 / static_cast<double>(accum_);
    if (world_ > 1)
      weight *= static_cast<double>(p.rows()) * world_ / static_cast<double>(b.global_scored);
    const Tensor scaled = weight == 1.0 ? loss : ops::mul(loss, weight);
    const bool reduce_now =
        reducer_ && a == accum_ - 1;  // the last micro-batch's gradients are final
    if (reduce_now) reducer_->begin();
    autograd::backward(place_.loss_scaling ? scaler_->scale(scaled) : scaled);
    if (reduce_now) {
      reducer_->finish();
      const dist::ReduceEvents& ev = reducer_->events();
      comm_.started_in_backward += ev.started_in_backward;
      comm_.buckets += ev.buckets;
      comm_.comm_s += ev.comm;
      comm_.exposed_s += ev.exposed();
    }
    counts.loss_sum += l * static_cast<double>(p.rows());
    counts.correct += static_cast<double>(count_correct(p.logits, p.labels));
    counts.predictions += static_cast<double>(p.rows());
    counts.examples += static_cast<double>(b.size);
    counts.tokens += static_cast<double>(b.tokens);
  }
  return counts;
}

double Run::update_weights() {
  // fp16: gradients are unscaled first; an overflow skips the step and lowers
  // the scale (dynamic loss scaling), it does not stop the run.
  const bool grads_finite = place_.loss_scaling ? scaler_->unscale(*optimizer_) : true;
  double norm = 0;
  if (grads_finite) {
    norm = clip_ > 0 ? optim::clip_grad_norm(params_, clip_) : optim::grad_norm(params_);
    if (!std::isfinite(norm)) stop_non_finite("the gradient norm", norm, "backward");
  }
  if (place_.loss_scaling) {
    if (!scaler_->step(*optimizer_)) {
      ++skipped_steps_;
      log_->warn("step {}: inf / NaN gradients at loss scale {}; step skipped, scale lowered",
                 step_ + 1, scaler_->get_scale());
    }
    scaler_->update();
  } else {
    optimizer_->step();
  }
  model().zero_grad();
  return norm;
}

void Run::stop_non_finite(const char* what, double value, const char* pass) {
  const data::LoaderPosition at = train_loader_->position();
  const auto good = ckpts_->latest();
  FORGE_FAIL(
      "step {} (epoch {}, batch {}): {} is {}; stopping. {}. Rerun with --check-nan to name the "
      "first op whose {} produced it, or lower optimizer.lr",
      step_ + 1, at.epoch, at.batch, what, value,
      good ? fmt::format("The last good checkpoint is {} (attnforge train --resume {})", *good,
                         run_dir_)
           : std::string("No checkpoint was written yet"),
      pass);
}

void Run::log_progress() {
  const MemoryStats mem = memory_stats(place_.device);
  const double epoch_f =
      static_cast<double>(train_loader_->position().epoch) +
      static_cast<double>(train_loader_->position().batch) /
          static_cast<double>(std::max<int64_t>(train_loader_->batches_per_epoch(), 1));
  json::Value rec;
  rec["step"] = step_;
  rec["split"] = "train";
  rec["epoch"] = epoch_f;
  rec["loss"] = window_.loss_sum / static_cast<double>(window_.predictions);
  rec["accuracy"] =
      static_cast<double>(window_.correct) / static_cast<double>(window_.predictions);
  add_token_metrics(rec, rec.at("loss").as_double(), data_.shape);
  rec["lr"] = optimizer_->lr();
  rec["grad_norm"] = window_.grad_norm_sum / static_cast<double>(window_.steps);
  rec["samples_per_s"] = static_cast<double>(window_.examples) / window_.seconds;
  // A ViT's tokens are its patches and class token, not the pixels the loader counts.
  rec["tokens_per_s"] =
      (data_.shape.images ? static_cast<double>(window_.examples * vit_tokens_)
                          : static_cast<double>(window_.tokens)) /
      window_.seconds;
  rec["step_time_ms"] = 1000 * window_.seconds / static_cast<double>(window_.steps);
  rec["peak_memory_mb"] = static_cast<double>(mem.peak) / (1 << 20);
  if (reducer_) {
    // How much of the all-reduce the backward hid: buckets started during
    // it, and the time added after it (rank 0's view).
    rec["allreduce_ms"] = 1000 * comm_.comm_s / static_cast<double>(window_.steps);
    rec["allreduce_exposed_ms"] = 1000 * comm_.exposed_s / static_cast<double>(window_.steps);
    rec["buckets_started_in_backward"] =
        static_cast<double>(comm_.started_in_backward) / static_cast<double>(comm_.buckets);
    comm_ = {};
  }
  if (metrics_) metrics_->append(rec);
  const double frac = static_cast<double>(step_) / static_cast<double>(total_steps_);
  // What a step is measured in: pictures, sequences, or a language model's tokens.
  const std::string rate =
      data_.shape.images ? format_count(rec.at("samples_per_s").as_double()) + " img/s"
      : data_.shape.task == Task::classification
          ? format_count(rec.at("samples_per_s").as_double()) + " seq/s"
          : format_count(rec.at("tokens_per_s").as_double()) + " tok/s";
  log_->info(
      "step {:>6}/{} {} {:3.0f}% ep {:.2f}  loss {:.4f}{}  acc {:5.2f}%  lr {:.2e}  |g| {:.3f} "
      " "
      "{}  {:.0f} ms/step  mem {:.0f} MB  ETA {}",
      step_, total_steps_, progress_bar(frac, 20), 100 * frac, epoch_f,
      rec.at("loss").as_double(), token_metrics_text(rec), 100 * rec.at("accuracy").as_double(),
      optimizer_->lr(), rec.at("grad_norm").as_double(),
      rate, rec.at("step_time_ms").as_double(), rec.at("peak_memory_mb").as_double(),
      format_duration(eta_seconds()));
  window_ = MetricWindow{};
}

std::optional<EvalResult> Run::evaluate() {
  const auto t0 = Clock::now();
  const auto stop = [this] { return stop_requested(); };
  std::optional<EvalResult> e = run_eval(*task_, *eval_loader_, place_, smoothing_, group_, stop);
  if (!e) return e;
  e->step = step_;
  // The EMA weights on the same data, swapped into the model and back.
  std::optional<EvalResult> e_ema;
  if (ema_) {
    ema_->swap_into(model());
    try {
      e_ema = run_eval(*task_, *eval_loader_, place_, smoothing_, group_, stop);
    } catch (...) {
      ema_->swap_into(model());
      throw;
    }
    ema_->swap_into(model());
    if (!e_ema) return e_ema;
    e->ema_loss = e_ema->loss;
    e->ema_accuracy = e_ema->accuracy;
  }
  last_eval_ = *e;
  json::Value rec;
  rec["step"] = step_;
  rec["split"] = "eval";
  rec["loss"] = e->loss;
  rec["accuracy"] = e->accuracy;
  rec["examples"] = e->examples;
  if (e->predictions != e->examples) rec["tokens"] = e->predictions;
  add_token_metrics(rec, e->loss, data_.shape);
  if (e_ema) {
    rec["ema_loss"] = e_ema->loss;
    rec["ema_accuracy"] = e_ema->accuracy;
  }
  rec["seconds"] = seconds_since(t0);
  last_eval_seconds_ = rec.at("seconds").as_double();
  if (metrics_) metrics_->append(rec);
  log_->info("eval  step {:>6}  loss {:.4f}{}  accuracy {:.2f}%{}  ({} examples{}, {})", step_,
             e->loss, token_metrics_text(rec), 100 * e->accuracy,
             e_ema ? fmt::format("  EMA: loss {:.4f} accuracy {:.2f}%", e_ema->loss,
                                 100 * e_ema->accuracy)
                   : std::string(),
             e->examples,
             e->predictions != e->examples ? fmt::format(", {} tokens", e->predictions) : "",
             format_duration(seconds_since(t0)));
  return e;
}

void Run::stopped_during_evaluation() {
  const auto good = ckpts_->latest();
  log_->warn(
      "stopped during the evaluation at step {}; continue from {} with: attnforge "
      "train --resume {}",
      step_, good ? *good : std::string("the beginning (no checkpoint yet)"), run_dir_);
  status_ = TrainResult::Status::interrupted;
}

double Run::best_metric(const EvalResult& e) const {
  const bool by_ema = e.ema_loss && r_.boolean("ema.select_best");
  return by_loss_ ? (by_ema ? *e.ema_loss : e.loss) : (by_ema ? *e.ema_accuracy : e.accuracy);
}

void Run::checkpoint(std::optional<double> metric) {
  last_ckpt_ = write_checkpoint(metric);
  last_ckpt_step_ = step_;
}

std::string Run::write_checkpoint(std::optional<double> metric) {
  // Rank 0 writes (atomically, as ever) while the others wait; the weights and
  // every state are the same on all processes.
  if (!root_) {
    group_.barrier("rank 0's checkpoint write");
    return std::string();
  }
  Checkpoint c;
  c.model = model().state_dict();
  c.optimizer = optimizer_->state_dict();
  if (ema_)
    for (auto& [name, t] : ema_->state_dict())
      c.optimizer.emplace(std::string(kEmaPrefix) + name, t);
  c.recipe_yaml = r_.to_yaml();
  c.card = card_;
  RunState s;
  s.step = step_;
  s.loader = train_loader_->position();
  s.generator = gen_.state();
  s.default_generator = default_generator().state();
  s.window = window_;
  s.schedule_kind = r_.string("schedule.kind");
  s.lr = optimizer_->lr();
  s.elapsed_s = elapsed_before_ + seconds_since(run_start_);
  s.world_size = world_;
  s.last_eval_loss = last_eval_.loss;
  s.last_eval_accuracy = last_eval_.accuracy;
  if (place_.loss_scaling) s.grad_scaler = scaler_->state();
  c.state = s.to_json();
  c.state["card"] = card_;
  c.state["attnforge"]["version"] = forge::version();
  c.state["attnforge"]["commit"] = forge::git_commit();
  const std::string path = ckpts_->save(step_, c, metric);
  log_->info("checkpoint {}", path);
  group_.barrier("rank 0's checkpoint write");
  return path;
}

TrainResult Run::finish() {
  TrainResult result;
  result.status = status_;
  result.run_dir = run_dir_;
  result.steps = step_;
  result.eval_loss = last_eval_.loss;
  result.eval_accuracy = last_eval_.accuracy;
  result.ema_eval_accuracy = last_eval_.ema_accuracy;
  result.last_checkpoint = last_ckpt_;
  if (root_) write_plot(run_dir_);
  if (root_ && status_ == TrainResult::Status::finished) {
    if (r_.boolean("output.attention_maps"))
      write_attention_maps(*task_, *eval_loader_, place_, r_,
                           (fs::path(run_dir_) / "attention_maps").string(), *log_);
    log_->info("done: {} in {}; eval accuracy {:.2f}%, loss {:.4f}; curves in {}{}",
               first_step_ == 0 ? fmt::format("{} steps", step_)
               : first_step_ == step_
                   ? fmt::format("nothing to train, the run had finished (step {} of {})", step_,
                                 total_steps_)
                   : fmt::format("steps {} to {} of {}", first_step_ + 1, step_, total_steps_),
               format_duration(seconds_since(run_start_)), 100 * last_eval_.accuracy,
               last_eval_.loss, (fs::path(run_dir_) / "curves.svg").string(),
               skipped_steps_
                   ? fmt::format(" ({} steps skipped by the loss scaler)", skipped_steps_)
                   : std::string());
  }
  if (r_.boolean("data.synthetic")) log_->warn("{}", kSyntheticWarning);
  autograd::set_check_nan(false);
  log_->flush();
  return result;
}

// ---- helpers ----

double Run::evaluations_left(int64_t at) const {
  const int64_t every =
      every_.eval_every > 0 ? every_.eval_every : std::max<int64_t>(steps_per_epoch_, 1);
  return static_cast<double>(total_steps_ / every - at / every +
                             (total_steps_ % every != 0 ? 1 : 0));
}

double Run::eta_seconds() const {
  return eta_.eta(total_steps_ - step_) + evaluations_left(step_) * last_eval_seconds_;
}

}  // namespace forge::train
