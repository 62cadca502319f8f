// The training loop (see trainer.h).
#include "train/trainer.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/threading.h"
#include "core/upload.h"
#include "core/version.h"
#include "data/image_io.h"
#include "data/lm_text.h"
#include "dist/group.h"
#include "dist/reducer.h"
#include "nn/models.h"
#include "ops/attention/attention.h"
#include "ops/autocast.h"
#include "ops/blas_core.h"
#include "ops/linalg/matmul.h"
#include "ops/ops.h"
#include "optim/clip.h"
#include "optim/ema.h"
#include "optim/grad_scaler.h"
#include "optim/schedule.h"
#include "train/attention_maps.h"
#include "train/card.h"
#include "train/checkpoint.h"
#include "train/outputs.h"
#include "train/data.h"
#include "train/init_from.h"
#include "train/metrics.h"
#include "train/model.h"
#include "train/optimization.h"
#include "train/plot.h"
#include "train/progress.h"
#include "train/run_state.h"

namespace forge::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Said at the start and the end of a run on generated stand-in data.
constexpr const char* kSyntheticWarning =
    "data.synthetic: this run trains and evaluates on generated stand-in data, not the task's "
    "(a smoke test): its accuracy says nothing of the task. Give data.root for the real data";

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The run's log: on the console at once; into train.log only once the run has
// passed every check (commit()), so a refused start or resume leaves no trace
// in the run directory. What was said before the commit goes into the file first.
class RunLog {
 public:
  explicit RunLog(bool console)
      : pending_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096)) {
    std::vector<spdlog::sink_ptr> sinks;
    if (console) sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    sinks.push_back(pending_);
    logger_ = std::make_shared<spdlog::logger>("attnforge", sinks.begin(), sinks.end());
    logger_->set_pattern("[%H:%M:%S] %^%l%$ %v");
    logger_->flush_on(spdlog::level::info);
  }

  void commit(const std::string& run_dir) {
    const std::string path = (fs::path(run_dir) / "train.log").string();
    {
      std::ofstream out(path, std::ios::app | std::ios::binary);
      FORGE_CHECK(out.good(), "{}: cannot open for writing", path);
      for (const std::string& line : pending_->last_formatted()) out << line;
      FORGE_CHECK(out.good(), "{}: write failed", path);
    }
    auto& sinks = logger_->sinks();
    std::erase(sinks, spdlog::sink_ptr(pending_));
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, false);
    file->set_pattern("[%H:%M:%S] %^%l%$ %v");
    sinks.push_back(std::move(file));
  }

  spdlog::logger* operator->() const { return logger_.get(); }
  spdlog::logger& operator*() const { return *logger_; }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> pending_;
  std::shared_ptr<spdlog::logger> logger_;
};

// The entries a run writes at the top of its directory. A directory holding
// only these (and what a killed atomic write of one leaves) and no checkpoint
// is a start that stopped before its first checkpoint: a new start may take it over.
constexpr const char* kRunEntries[] = {"recipe.yaml", "train.log",     "metrics.jsonl",
                                       "metrics.csv", "curves.svg",    "checkpoints",
                                       "data",        "attention_maps"};

// What a killed atomic write of a run entry leaves (recipe.yaml.tmp-PID, ...).
bool is_run_entry_temp(const std::string& name) {
  for (const char* e : kRunEntries)
    if (io::is_atomic_write_temp(name, e)) return true;
  return false;
}

bool is_run_entry(const std::string& name) {
  for (const char* e : kRunEntries)
    if (name == e) return true;
  if (name.rfind("events.out.tfevents.", 0) == 0) return true;  // TensorBoard
  return is_run_entry_temp(name);
}

void remove_leftover_temps(const std::string& run_dir) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (const auto& f : fs::directory_iterator(run_dir, ec))
    if (is_run_entry_temp(f.path().filename().string())) doomed.push_back(f.path());
  for (const fs::path& p : doomed) fs::remove(p, ec);
}

// Training keeps per parameter its f32 weight, gradient and AdamW's two
// moments (f64 runs twice that; activations come on top).
constexpr double kTrainingBytesPerParameter = 16;
constexpr const char* kTrainingUse = "training it (weights, gradients and the optimizer's moments)";

// A new run may go into a directory that does not exist, is empty, or holds
// what a start killed before it wrote its log leaves (recipe.yaml, temporary
// files); never over a run's history (metrics, events, log), checkpoints or not.
void check_new_run_dir(const std::string& run_dir) {
  std::error_code ec;
  if (const auto area = checkpoint_area_of(run_dir))
    FORGE_FAIL("run directory {}: inside the checkpoint directory {}; a run never goes into a "
               "checkpoint (train into another directory: --out DIR)",
               run_dir, *area);
  if (!fs::exists(run_dir, ec)) return;
  FORGE_CHECK(fs::is_directory(run_dir, ec), "run directory {} exists and is not a directory",
              run_dir);
  FORGE_CHECK(!CheckpointManager::holds_checkpoint(run_dir),
              "run directory {} already holds a run; continue it with --resume {} or train into "
              "another directory (--out DIR or --set output.dir=DIR)",
              run_dir, run_dir);
  std::vector<std::string> history;  // what a new start would truncate or delete
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string name = e.path().filename().string();
    FORGE_CHECK(is_run_entry(name),
                "run directory {} is not empty and holds no run (found '{}'); train into another "
                "directory (--out DIR) or empty it",
                run_dir, name);
    const bool events = name.rfind("events.out.tfevents.", 0) == 0;
    if ((name == "metrics.jsonl" || name == "metrics.csv" || name == "train.log" || events) &&
        e.is_regular_file(ec) && e.file_size(ec) > 0)
      history.push_back(fmt::format("{} ({} bytes)", name, e.file_size(ec)));
  }
  std::sort(history.begin(), history.end());
  FORGE_CHECK(history.empty(),
              "run directory {} holds the history of an earlier start but no checkpoint: {}. A new "
              "start would replace it. Continue that run with --resume {} (it starts again from "
              "its recipe.yaml, its metrics kept up to where it resumes), train into another "
              "directory (--out DIR), or move those files away",
              run_dir, fmt::join(history, ", "), run_dir);
}

// Removes the run directory a failed start created, unless the start got far
// enough to disarm it.
class CreatedDirGuard {
 public:
  explicit CreatedDirGuard(std::string dir) : dir_(std::move(dir)) {
    std::error_code ec;
    armed_ = !fs::exists(dir_, ec);
  }
  ~CreatedDirGuard() {
    std::error_code ec;
    if (armed_) fs::remove_all(dir_, ec);
  }
  CreatedDirGuard(const CreatedDirGuard&) = delete;
  CreatedDirGuard& operator=(const CreatedDirGuard&) = delete;
  void disarm() { armed_ = false; }

 private:
  std::string dir_;
  bool armed_;
};

// Class ids of the largest logit per row of (B, C), and how many equal `labels`.
int64_t count_correct(const Tensor& logits_any_device, const Tensor& labels_any_device) {
  const Tensor logits = logits_any_device.to(Device::cpu());
  const Tensor labels = labels_any_device.to(Device::cpu());
  const int64_t B = logits.size(0), C = logits.size(1);
  const int64_t* y = labels.data<int64_t>();
  int64_t correct = 0;
  FORGE_DISPATCH_FLOAT(logits.dtype(), "count_correct", [&] {
    const scalar_t* p = logits.data<scalar_t>();
    for (int64_t b = 0; b < B; ++b) {
      int64_t best = 0;
      for (int64_t c = 1; c < C; ++c)
        if (p[b * C + c] > p[b * C + best]) best = c;
      correct += best == y[b];
    }
  });
  return correct;
}

// What an evaluation of a classifier counts beyond top-1: top-5 hits and the
// confusion matrix (rows the true class, columns the predicted one).
struct ClassCounts {
  int64_t classes = 0;
  int64_t top5 = 0;
  std::vector<int64_t> confusion;  // classes x classes, row-major
};

// Adds a batch to `c`; returns its top-1 hits (count_correct's count, from the same pass).
int64_t count_classes(const Tensor& logits_any_device, const Tensor& labels_any_device,
                      ClassCounts& c) {
  const Tensor logits = logits_any_device.to(Device::cpu());
  const Tensor labels = labels_any_device.to(Device::cpu());
  const int64_t B = logits.size(0), C = logits.size(1);
  if (c.classes == 0) {
    c.classes = C;
    c.confusion.assign(static_cast<size_t>(C * C), 0);
  }
  const int64_t* y = labels.data<int64_t>();
  int64_t correct = 0;
  FORGE_DISPATCH_FLOAT(logits.dtype(), "count_classes", [&] {
    const scalar_t* p = logits.data<scalar_t>();
    for (int64_t b = 0; b < B; ++b) {
      const scalar_t* row = p + b * C;
      int64_t best = 0, above = 0;  // the argmax (first of ties); classes ranked above the label
      for (int64_t k = 0; k < C; ++k) {
        if (row[k] > row[best]) best = k;
        above += row[k] > row[y[b]] || (row[k] == row[y[b]] && k < y[b]);
      }
      c.top5 += above < 5;
      correct += best == y[b];
      ++c.confusion[static_cast<size_t>(y[b] * C + best)];
    }
  });
  return correct;
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != dtype ? t.to(dtype) : t;
}

// The batch in the run's dtype, on the run's device.
data::Batch cast_batch(data::Batch b, DType dtype, Uploader& uploader) {
  b.input = to_dtype(b.input, dtype);
  for (Tensor* t : {&b.input, &b.mask, &b.input2, &b.mask2, &b.target, &b.label, &b.label_mix})
    if (t->defined()) *t = uploader.upload(*t);
  return b;
}

// What a batch is scored on: rows of logits (R, C) and their labels (R). A
// classifier predicts one row per example; a language model or a decoder one
// per real target token (padded positions left out), so losses and accuracies
// are per token.
struct Predictions {
  Tensor logits, labels;
  Tensor labels_mix;  // mixup / cutmix partners (classification only)
  double mix_lambda = 1.0;
  int64_t rows() const { return labels.size(0); }
};

Predictions predictions(const Tensor& out, const data::Batch& b) {
  if (!b.target.defined()) return {out, b.label, b.label_mix, b.mix_lambda};
  Tensor logits = ops::reshape(out, {-1, out.size(-1)});  // (B N, V)
  Tensor labels = ops::reshape(b.target, {-1});           // (B N)
  if (!(b.input2.defined() ? b.padded2 : b.padded)) return {logits, labels, Tensor(), 1.0};
  const Tensor mask = (b.input2.defined() ? b.mask2 : b.mask).to(Device::cpu());
  const bool* m = mask.data<bool>();
  std::vector<int64_t> real;
  for (int64_t i = 0; i < mask.numel(); ++i)
    if (m[i]) real.push_back(i);
  const Tensor index =
      Tensor::from_vector(real, {static_cast<int64_t>(real.size())}).to(out.device());
  return {ops::index_select(logits, 0, index), ops::index_select(labels, 0, index), Tensor(), 1.0};
}

Tensor batch_loss(const Predictions& p, double smoothing) {
  ops::CrossEntropyOptions o;
  o.label_smoothing = smoothing;
  Tensor loss = ops::cross_entropy(p.logits, p.labels, o);
  if (p.labels_mix.defined())
    loss = ops::add(ops::mul(loss, p.mix_lambda),
                    ops::mul(ops::cross_entropy(p.logits, p.labels_mix, o), 1.0 - p.mix_lambda));
  return loss;
}

// Bits per byte and perplexity of a mean loss in nats per token, into a
// metrics record: for next-token tasks (bits per byte when the tokens are bytes).
void add_token_metrics(json::Value& rec, double loss, const DataShape& shape) {
  if (shape.task == Task::classification) return;
  if (shape.byte_tokens) rec["bits_per_byte"] = data::bits_per_byte(loss);
  rec["perplexity"] = std::exp(loss);
}

// "  bpb 1.234" (bits per byte) or "  ppl 3.21" for a record with those fields.
std::string token_metrics_text(const json::Value& rec) {
  if (const json::Value* v = rec.find("bits_per_byte"))
    return fmt::format("  bpb {:.4f}", v->as_double());
  if (const json::Value* v = rec.find("perplexity"))
    return fmt::format("  ppl {:.3f}", v->as_double());
  return "";
}

// Evaluates on every batch of `loader`; nullopt when `stop` asks to stop first
// (an evaluation can take minutes: a stop signal does not wait for it).
// Data parallelism: each process evaluates its slice of every batch (a slice
// may be empty) and the sums and counts are added over the processes, so the
// accuracy is the one process's exactly and the loss up to summation order.
std::optional<EvalResult> run_eval(TaskModel& model, data::DataLoader& loader,
                                   const Placement& place, double smoothing, dist::Group& group,
                                   const std::function<bool()>& stop = {},
                                   bool class_counts = false) {
  nn::Module& m = model.module();
  const bool was_training = m.is_training();
  m.eval();
  NoGradGuard no_grad;
  ops::AutocastGuard autocast(place.autocast);
  EvalResult r;
  double loss_sum = 0;
  int64_t correct = 0, rows = 0;
  ClassCounts counts;
  Uploader uploader(place.device);
  // Epoch 0 of the loader, built ahead by its workers.
  loader.seek({0, 0});
  for (data::Batch next; loader.next(next);) {
    if (stop && stop()) {
      m.train(was_training);
      return std::nullopt;
    }
    const data::Batch b = cast_batch(std::move(next), place.dtype, uploader);
    if (b.size == 0) continue;  // this process's slice of a short last batch
    const Predictions p = predictions(model.forward(b), b);
    if (p.rows() == 0) continue;
    loss_sum += batch_loss(p, smoothing).item() * static_cast<double>(p.rows());
    correct += class_counts ? count_classes(p.logits, p.labels, counts)
                            : count_correct(p.logits, p.labels);
    rows += p.rows();
    r.examples += b.size;
  }
  m.train(was_training);
  if (class_counts) {
    // Every process must add arrays of one size, also one whose slices were all empty.
    double classes = static_cast<double>(counts.classes);
    group.max(std::span<double>(&classes, 1), "the evaluation's classes");
    const auto C = static_cast<int64_t>(classes);
    if (counts.classes == 0) counts.confusion.assign(static_cast<size_t>(C * C), 0);
    std::vector<double> sums(counts.confusion.begin(), counts.confusion.end());
    sums.push_back(static_cast<double>(counts.top5));
    group.sum(std::span<double>(sums), "the evaluation's class counts");
    r.top5_accuracy = sums.back();  // a count until divided by every process's rows below
    r.confusion.assign(static_cast<size_t>(C), std::vector<int64_t>(static_cast<size_t>(C)));
    for (int64_t i = 0; i < C * C; ++i)
      r.confusion[static_cast<size_t>(i / C)][static_cast<size_t>(i % C)] =
          static_cast<int64_t>(sums[static_cast<size_t>(i)]);
  }
  double totals[] = {loss_sum, static_cast<double>(correct), static_cast<double>(rows),
                     static_cast<double>(r.examples)};
  group.sum(totals, "the evaluation's sums");
  loss_sum = totals[0];
  correct = static_cast<int64_t>(totals[1]);
  rows = static_cast<int64_t>(totals[2]);
  r.examples = static_cast<int64_t>(totals[3]);
  r.predictions = rows;
  r.loss = loss_sum / static_cast<double>(std::max<int64_t>(rows, 1));
  r.accuracy = static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(rows, 1));
  if (r.top5_accuracy) *r.top5_accuracy /= static_cast<double>(std::max<int64_t>(rows, 1));
  return r;
}

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

// The recipe's choices of GPU kernels: TF32 for f32 GEMMs, and the attention
// kernels (model.attention.backend: the flash engine of softmax / local /
// linformer, and the tensor-core core of the linear family with mma or cudnn).
void apply_gpu_kernels(const Recipe& r) {
  ops::set_allow_tf32(r.boolean("allow_tf32"));
  const std::string backend = r.string("model.attention.backend");
  ops::attention::set_flash_engine(backend == "mma"     ? cuda::FlashEngine::mma
                                   : backend == "cudnn" ? cuda::FlashEngine::cudnn
                                                        : cuda::FlashEngine::tiled);
  ops::attention::set_linear_engine(backend == "tiled" ? cuda::LinearEngine::fma
                                                       : cuda::LinearEngine::mma);
}

// The recipe's threads, or every core of the host shared evenly by the
// processes of a data-parallel job on it.
void apply_threads(const Recipe& r, const dist::Group& group) {
  if (r.integer("threads") > 0)
    set_num_threads(static_cast<int>(r.integer("threads")));
  else if (group.local_size() > 1)
    set_num_threads(std::max(1, num_threads() / group.local_size()));
}

// Epochs whose every batch has been drawn (the loader moves to the next epoch
// only when asked for a batch past the end).
int64_t completed_epochs(const data::DataLoader& loader) {
  const data::LoaderPosition p = loader.position();
  return p.epoch + (p.batch >= loader.batches_per_epoch() ? 1 : 0);
}

// The run's optimizer steps: loop.steps, or loop.epochs of `batches_per_epoch`
// (this process's loader; the same on every one) in steps of loop.accumulation.
struct StepPlan {
  int64_t steps_per_epoch = 0, total_steps = 0;
};
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

// runs/<name>-<N>, N one past the highest number of the runs of that name
// there (1 for the first). Rank 0 looks; every process gets its answer.
std::string next_run_dir(const Recipe& r, dist::Group& group) {
  const std::string prefix = r.string("name") + "-";
  int64_t n = 1;
  if (group.root()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("runs", ec)) {
      const std::string f = e.path().filename().string();
      if (f.size() <= prefix.size() || f.size() > prefix.size() + 9 ||
          f.compare(0, prefix.size(), prefix) != 0)
        continue;
      const std::string digits = f.substr(prefix.size());
      if (digits.find_first_not_of("0123456789") == std::string::npos)
        n = std::max<int64_t>(n, std::stoll(digits) + 1);
    }
  }
  group.broadcast(&n, sizeof n, 0, "the number of the new run directory");
  return (fs::path("runs") / fmt::format("{}{}", prefix, n)).string();
}

// The metric a checkpoint's state records for ranking ("checkpoint_metric").
std::optional<double> checkpoint_metric(const json::Value& state) {
  const json::Value* m = state.is_object() ? state.find("checkpoint_metric") : nullptr;
  const json::Value* v = m && m->is_object() ? m->find("value") : nullptr;
  if (v && v->is_number()) return v->as_double();
  return std::nullopt;
}

}  // namespace

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

json::Value EvalResult::to_json() const {
  json::Value v;
  v["split"] = split;
  v["step"] = step;
  if (ema_weights) v["weights"] = "ema";
  v["examples"] = examples;
  v["loss"] = loss;
  v["accuracy"] = accuracy;
  if (predictions != examples) v["tokens"] = predictions;
  if (bits_per_byte) v["bits_per_byte"] = *bits_per_byte;
  if (perplexity) v["perplexity"] = *perplexity;
  if (top5_accuracy) v["top5_accuracy"] = *top5_accuracy;
  if (!confusion.empty()) {
    json::Array per_class, matrix;
    for (size_t c = 0; c < confusion.size(); ++c) {
      int64_t total = 0;
      json::Array row;
      for (int64_t n : confusion[c]) {
        total += n;
        row.emplace_back(n);
      }
      json::Value e;
      e["class"] = static_cast<int64_t>(c);
      if (c < class_names.size()) e["name"] = class_names[c];
      e["examples"] = total;
      e["accuracy"] =
          total > 0 ? static_cast<double>(confusion[c][c]) / static_cast<double>(total) : 0.0;
      per_class.push_back(std::move(e));
      matrix.emplace_back(std::move(row));
    }
    v["per_class"] = json::Value(std::move(per_class));
    v["confusion"] = json::Value(std::move(matrix));  // rows: true class; columns: predicted
  }
  return v;
}

TrainResult train(Recipe r, const TrainOptions& opt) {
  // Everything a recipe or a checkpoint can fail is checked before the run
  // directory is written to: the directory itself, the device, the data (only
  // generated data is written, into run_dir/data), the model, the optimizer,
  // the schedule and, on --resume, the whole checkpoint. A start that fails
  // removes the directory it created; one that fails in a directory that was
  // there leaves it as it was.
  //
  // Data parallelism (under mpirun): every process runs this function on its
  // slice of each global batch; rank 0 alone writes the run directory, logs
  // and checkpoints, the others wait for it where they must.
  dist::Group& group = dist::Group::world();
  group.set_timeout(r.number("distributed.timeout_s"));
  const bool root = group.root();
  const int world = group.size();
  const Placement place = placement(r, group.local_rank());
  FORGE_CHECK(!(opt.resume && !opt.resume_from.empty()),
              "TrainOptions: resume and resume_from exclude each other");
  // The run directory: as given (--out, --resume, output.dir), or the next
  // free runs/<name>-<N>.
  std::string run_dir = opt.run_dir.empty() ? r.string("output.dir") : opt.run_dir;
  if (run_dir.empty() && !opt.resume) run_dir = next_run_dir(r, group);
  // A new run that continues from a chosen checkpoint of another (or the same) run.
  std::optional<CheckpointRef> fork;
  if (!opt.resume_from.empty()) {
    fork = resolve_checkpoint(opt.resume_from, "--resume");
    FORGE_CHECK(fork->step && !fork->run_dir.empty(),
                "--resume {}: {} is not a checkpoint of a run (RUN/checkpoints/step-N)",
                opt.resume_from, fork->dir);
  }
  bool from_checkpoint = fork.has_value();
  if (opt.resume) {
    FORGE_CHECK(fs::is_directory(run_dir), "--resume {}: no such run directory", run_dir);
    from_checkpoint = CheckpointManager::holds_checkpoint(run_dir);
  } else {
    check_new_run_dir(run_dir);
  }
  CreatedDirGuard created(root ? run_dir : std::string());
  RunLog log(opt.console && root);
  // The best checkpoint: by accuracy for classifiers, by loss for next-token
  // models (whose per-token accuracy says less).
  const bool by_loss =
      r.string("model.type") == "language_model" || r.string("model.type") == "encoder_decoder";
  CheckpointManager ckpts(
      run_dir, static_cast<int>(r.integer("checkpoint.keep_last")),
      r.boolean("checkpoint.keep_best") ? 1 : 0,
      std::string("eval_") +
          (r.number("ema.decay") > 0 && r.boolean("ema.select_best") ? "ema_" : "") +
          (by_loss ? "loss" : "accuracy"),
      by_loss ? "min" : "max", [&log](const std::string& w) { log->warn("{}", w); });
  // A resume refuses a damaged latest checkpoint rather than going back to an
  // older one (whose next save would delete the damaged one): the user decides.
  if (from_checkpoint && !fork && ckpts.damaged_latest())
    FORGE_FAIL(
        "--resume {}: the latest checkpoint is damaged: {}. Nothing was changed. To resume "
        "from the newest whole checkpoint before it, move it out of {}",
        run_dir, *ckpts.damaged_latest(), ckpts.dir());
  FORGE_CHECK(!from_checkpoint || fork || ckpts.latest(),
              "--resume {}: {} holds checkpoints but none can be read ({}). Nothing was changed",
              run_dir, ckpts.dir(), fmt::join(ckpts.warnings(), "; "));
  const DType dtype = place.dtype;
  apply_gpu_kernels(r);
  apply_threads(r, group);
  autograd::set_check_nan(opt.check_nan || r.boolean("loop.check_nan"));

  // ---- data, model, optimizer ----
  // Generated data is written into the shared cache by rank 0 first; the
  // others then read it.
  auto make_data = [&] {
    return build_data(r, "", true, [&](const std::string& s) { log->info("{}", s); });
  };
  TaskData data = root ? make_data() : TaskData{};
  group.barrier("rank 0's data preparation");
  if (!root) data = make_data();
  auto sharded = [&](data::LoaderOptions o) {
    o.shard_index = group.rank();
    o.shard_count = world;
    return o;
  };
  data::DataLoader train_loader(data.train, sharded(loader_options(r, data, true)));
  data::DataLoader eval_loader(data.eval, sharded(loader_options(r, data, false)));
  const int64_t accum = r.integer("loop.accumulation");
  const StepPlan plan = plan_steps(r, data.train->size(), train_loader.batches_per_epoch());
  const int64_t steps_per_epoch = plan.steps_per_epoch, total_steps = plan.total_steps;

  Generator gen(static_cast<uint64_t>(r.integer("seed")));
  check_model_fits_memory(r, data.shape, kTrainingBytesPerParameter, kTrainingUse);
  std::unique_ptr<TaskModel> task = build_model(r, data.shape, dtype, &gen);
  resolve_sizes(r, data.shape);  // what the run keeps says what was built
  const json::Value card = model_card(r, data);
  nn::Module& model = task->module();
  model.to(place.device);  // before the optimizer, whose state lives beside the parameters
  model.set_generator(&gen);
  model.train();
  // Dropout draws keyed by the global batch position: this process's masks
  // are its rows of the masks one process would draw for the whole batch.
  gen.set_batch_shard({static_cast<uint64_t>(group.rank()), static_cast<uint64_t>(world)});
  default_generator().set_batch_shard(gen.batch_shard());
  // Fine-tuning: the weights from model.init_from (a resume has its own).
  std::optional<InitReport> init;
  if (!r.string("model.init_from").empty() && !from_checkpoint)
    init = init_from(model, r.string("model.init_from"));
  std::vector<std::string> setup_info;  // said in the log once the run has started
  auto optimizer = make_optimizer(r, model, &setup_info);
  optim::GradScaler scaler(optim::GradScalerOptions{.enabled = place.loss_scaling});
  std::vector<std::string> notes;  // said in the log once the run has started
  const optim::ScheduleConfig schedule =
      make_schedule(r, total_steps, std::max<int64_t>(steps_per_epoch, 1), &notes);
  const std::vector<Tensor> params = optimizer->parameters();  // for the gradient norm
  const double base_lr = r.number("optimizer.lr");
  const double clip = r.number("optimizer.clip_grad_norm");
  const double smoothing = r.number("loop.label_smoothing");
  const int64_t log_every = r.integer("loop.log_every");
  const int64_t eval_every = r.integer("loop.eval_every");
  const int64_t ckpt_every = r.integer("checkpoint.every");

  // ---- resume: the whole checkpoint is read and checked first ----
  int64_t step = 0;
  MetricWindow window;
  double elapsed_before = 0;
  EvalResult last_eval;
  int64_t resumed_world = world;
  std::optional<Checkpoint> forked;         // copied into the new run directory once it starts
  std::map<std::string, Tensor> ema_state;  // the checkpoint's EMA weights, if any
  if (from_checkpoint) {
    const std::string latest = fork ? fork->dir : *ckpts.latest();
    const Checkpoint c = read_checkpoint(latest);
    for (const std::string& w : c.warnings) notes.push_back(w);
    try {
      model.load_state_dict(c.model);
      auto [optimizer_state, ema_tensors] = split_ema(c.optimizer);
      optimizer->load_state_dict(optimizer_state);
      ema_state = std::move(ema_tensors);
    } catch (const Error& e) {
      FORGE_FAIL(
          "--resume {}: checkpoint {} does not fit the run's recipe (a --set given with --resume "
          "changed the model or the optimizer?): {}. Resume without it, or start a new run",
          fork ? opt.resume_from : run_dir, latest, message_of(e));
    }
    RunStateExpect expect;
    expect.step = fork ? *fork->step : *ckpts.latest_step();
    expect.total_steps = total_steps;
    expect.batches_per_epoch = train_loader.batches_per_epoch();
    expect.accumulation = accum;
    const std::string state_file = (fs::path(latest) / "state.json").string();
    const RunState s = parse_run_state(c.state, state_file, expect);
    if (s.grad_scaler && place.loss_scaling) {
      try {
        scaler.set_state(*s.grad_scaler);
      } catch (const Error& e) {
        FORGE_FAIL("{}: \"grad_scaler\": {}", state_file, message_of(e));
      }
    }
    step = s.step;
    train_loader.seek(s.loader);
    gen.set_state(s.generator);
    default_generator().set_state(s.default_generator);
    window = s.window;
    elapsed_before = s.elapsed_s;
    last_eval.loss = s.last_eval_loss;
    last_eval.accuracy = s.last_eval_accuracy;
    resumed_world = s.world_size;
    if (fork) forked = c;
  }
  const int64_t first_step = step;
  // The exponential moving average of the weights (ema.decay > 0): from the
  // checkpoint's, or starting as the weights.
  std::unique_ptr<optim::ModelEma> ema;
  if (r.number("ema.decay") > 0) {
    optim::EmaOptions eo;
    eo.decay = r.number("ema.decay");
    eo.warmup = r.boolean("ema.warmup");
    ema = std::make_unique<optim::ModelEma>(model, eo);
    if (!ema_state.empty()) {
      try {
        ema->load_state_dict(ema_state);
      } catch (const Error& e) {
        FORGE_FAIL("--resume {}: the checkpoint's EMA weights do not fit the model: {}",
                   fork ? opt.resume_from : run_dir, message_of(e));
      }
    } else if (from_checkpoint) {
      notes.push_back(fmt::format(
          "the checkpoint has no EMA of the weights (ema.decay was 0); the average starts from "
          "its weights at step {}",
          step));
    }
  } else if (!ema_state.empty()) {
    notes.push_back("the checkpoint's EMA of the weights is dropped: ema.decay is 0");
  }
  ema_state.clear();

  // The files the run will write or append to, checked without writing: a
  // resume that would fail on them (a torn metrics line, a file that cannot be
  // written) fails here, with every file of the run as it was.
  if (root) {
    const fs::path dir(run_dir);
    for (const char* f : {"recipe.yaml", "train.log"}) io::check_writable((dir / f).string());
    MetricsLog::check_can_open(run_dir, from_checkpoint ? std::optional<int64_t>(step)
                                                        : std::nullopt);
  }

  // ---- every check passed (on every process): the run directory is written from here on ----
  group.barrier("every process's checks of the recipe, the data and the checkpoint");
  std::optional<MetricsLog> metrics;
  if (root) {
    fs::create_directories(run_dir);
    created.disarm();
    remove_leftover_temps(run_dir);
    ckpts.tidy();
    // The recipe the run continues with: --set overrides given with --resume become the run's.
    io::write_file_atomic((fs::path(run_dir) / "recipe.yaml").string(), r.to_yaml());
    log.commit(run_dir);
    if (forked) {
      // The new run starts as a copy of the chosen checkpoint and the metrics
      // up to it; the run it came from is left as it was.
      ckpts.save(step, *forked, checkpoint_metric(forked->state));
      const fs::path source_metrics = fs::path(fork->run_dir) / "metrics.jsonl";
      std::error_code ec;
      if (fs::exists(source_metrics, ec))
        fs::copy_file(source_metrics, fs::path(run_dir) / "metrics.jsonl",
                      fs::copy_options::overwrite_existing);
    }
    metrics.emplace(run_dir, from_checkpoint ? std::optional<int64_t>(step) : std::nullopt);
  }
  forked.reset();
  for (const std::string& n : notes) log->warn("{}", n);
  if (init) log->info("{}", init->summary());
  for (const std::string& line : setup_info) log->info("{}", line);
  if (r.boolean("data.synthetic")) log->warn("{}", kSyntheticWarning);
  if (fork) {
    log->info("new run {} continuing {} (step {} of {}); {} is left as it was", run_dir, fork->dir,
              step, total_steps, fork->run_dir);
  } else if (from_checkpoint) {
    log->info("resuming {} from {} (step {} of {}){}", run_dir, *ckpts.latest(), step, total_steps,
              resumed_world != world
                  ? fmt::format("; it was trained by {} processes, it continues with {}",
                                resumed_world, world)
                  : std::string());
  } else if (opt.resume) {
    log->info("resuming {}: it has no checkpoint yet; starting it from the beginning", run_dir);
  } else {
    log->info("run directory: {}", run_dir);
  }
  // Gradients averaged over the processes during the backward (dist/reducer.h).
  std::unique_ptr<dist::GradReducer> reducer;
  if (world > 1) {
    const std::string& backend = r.string("distributed.backend");
    const bool nccl = backend == "nccl" || (backend == "auto" && place.device.is_cuda());
    FORGE_CHECK(!nccl || place.device.is_cuda(),
                "recipe: distributed.backend: nccl averages GPU gradients, but this run trains "
                "on the CPU; use mpi or auto");
    dist::ReducerOptions ro;
    ro.bucket_bytes = static_cast<int64_t>(r.number("distributed.bucket_mb") * (1 << 20));
    reducer = std::make_unique<dist::GradReducer>(
        group,
        nccl ? dist::make_nccl_transport(group, place.device.index)
             : dist::make_mpi_transport(group),
        optimizer->parameters(), ro);
    log->info(
        "data parallel: {} processes ({} on this host), {} all-reduce in {} buckets of up "
        "to {} MiB; batch {} = {} per process",
        world, group.local_size(), dist::backend_name(reducer->backend()), reducer->num_buckets(),
        r.number("distributed.bucket_mb"), r.integer("loop.batch_size"),
        r.integer("loop.batch_size") / world);
  }

  if (!place.note.empty()) log->warn("{}", place.note);
  if (place.device.is_cpu()) log->info("CPU: OpenBLAS's {}", blas::kernel_summary());
  if (place.device.is_cuda())
    log->info("GPU: softmax / local / linformer attention on the {} kernels "
              "(model.attention.backend)",
              r.string("model.attention.backend"));
  if (place.device.is_cpu() && place.autocast == DType::bf16)
    log->info("CPU: matmuls, linear layers, the patch embedding and softmax / local attention "
              "from 128 keys in bf16 with f32 accumulation (oneDNN); every other op in f32");
  // The precision the run has, which may differ from the recipe's (fp16 on a CPU is fp32).
  const std::string precision = place.autocast == DType::bf16   ? "bf16"
                                : place.autocast == DType::f16  ? "fp16"
                                : place.dtype == DType::f64     ? "fp64"
                                                                : "fp32";
  log->info(
      "model: {} {} on {} ({} parameters), attention {}, {} steps ({} per epoch, batch {} x {} "
      "accumulation), {} thread{}",
      r.string("model.type"),
      precision == r.string("precision")
          ? precision
          : fmt::format("{} (the recipe's precision {} does not apply here)", precision,
                        r.string("precision")),
      place.device.str(), model.num_parameters(),
      r.string("model.attention.kind"), total_steps, steps_per_epoch, r.integer("loop.batch_size"),
      accum, num_threads(), num_threads() == 1 ? "" : "s");

  const auto run_start = Clock::now();
  // Rank 0 writes (atomically, as ever) while the others wait; the weights and
  // every state are the same on all processes.
  auto save = [&](std::optional<double> metric) {
    if (!root) {
      group.barrier("rank 0's checkpoint write");
      return std::string();
    }
    Checkpoint c;
    c.model = model.state_dict();
    c.optimizer = optimizer->state_dict();
    if (ema)
      for (auto& [name, t] : ema->state_dict())
        c.optimizer.emplace(std::string(kEmaPrefix) + name, t);
    c.recipe_yaml = r.to_yaml();
    c.card = card;
    RunState s;
    s.step = step;
    s.loader = train_loader.position();
    s.generator = gen.state();
    s.default_generator = default_generator().state();
    s.window = window;
    s.schedule_kind = r.string("schedule.kind");
    s.lr = optimizer->lr();
    s.elapsed_s = elapsed_before + seconds_since(run_start);
    s.world_size = world;
    s.last_eval_loss = last_eval.loss;
    s.last_eval_accuracy = last_eval.accuracy;
    if (place.loss_scaling) s.grad_scaler = scaler.state();
    c.state = s.to_json();
    c.state["card"] = card;
    c.state["attnforge"]["version"] = forge::version();
    c.state["attnforge"]["commit"] = forge::git_commit();
    const std::string path = ckpts.save(step, c, metric);
    log->info("checkpoint {}", path);
    group.barrier("rank 0's checkpoint write");
    return path;
  };

  // Every process stops at the same point: a signal or a request on any one counts.
  const auto stop_now = [&] {
    return group.any(opt.stop_requested && opt.stop_requested(step), "the stop decision");
  };
  double last_eval_seconds = 0;  // how long the last evaluation took, for the ETA
  auto evaluate = [&]() -> std::optional<EvalResult> {
    const auto t0 = Clock::now();
    std::optional<EvalResult> e = run_eval(*task, eval_loader, place, smoothing, group, stop_now);
    if (!e) return e;
    e->step = step;
    // The EMA weights on the same data, swapped into the model and back.
    std::optional<EvalResult> e_ema;
    if (ema) {
      ema->swap_into(model);
      try {
        e_ema = run_eval(*task, eval_loader, place, smoothing, group, stop_now);
      } catch (...) {
        ema->swap_into(model);
        throw;
      }
      ema->swap_into(model);
      if (!e_ema) return e_ema;
      e->ema_loss = e_ema->loss;
      e->ema_accuracy = e_ema->accuracy;
    }
    last_eval = *e;
    json::Value rec;
    rec["step"] = step;
    rec["split"] = "eval";
    rec["loss"] = e->loss;
    rec["accuracy"] = e->accuracy;
    rec["examples"] = e->examples;
    if (e->predictions != e->examples) rec["tokens"] = e->predictions;
    add_token_metrics(rec, e->loss, data.shape);
    if (e_ema) {
      rec["ema_loss"] = e_ema->loss;
      rec["ema_accuracy"] = e_ema->accuracy;
    }
    rec["seconds"] = seconds_since(t0);
    last_eval_seconds = rec.at("seconds").as_double();
    if (metrics) metrics->append(rec);
    log->info("eval  step {:>6}  loss {:.4f}{}  accuracy {:.2f}%{}  ({} examples{}, {})", step,
              e->loss, token_metrics_text(rec), 100 * e->accuracy,
              e_ema ? fmt::format("  EMA: loss {:.4f} accuracy {:.2f}%", e_ema->loss,
                                  100 * e_ema->accuracy)
                    : std::string(),
              e->examples,
              e->predictions != e->examples ? fmt::format(", {} tokens", e->predictions) : "",
              format_duration(seconds_since(t0)));
    return e;
  };

  // Evaluations still to come after `at` steps (every eval_every steps, or at
  // each epoch's end, and at the last step), for the ETA.
  const auto evaluations_left = [&](int64_t at) -> double {
    const int64_t every = eval_every > 0 ? eval_every : std::max<int64_t>(steps_per_epoch, 1);
    return static_cast<double>(total_steps / every - at / every +
                               (total_steps % every != 0 ? 1 : 0));
  };
  // A ViT's tokens per picture: its patches, and the class token.
  const int64_t vit_tokens =
      data.shape.images && r.string("model.type") == "vit"
          ? (r.integer("model.image_size") / r.integer("model.patch_size")) *
                    (r.integer("model.image_size") / r.integer("model.patch_size")) +
                (r.string("model.pool") == "cls" ? 1 : 0)
          : 0;

  // ---- the loop ----
  Uploader uploader(place.device);  // batches go to a GPU through pinned buffers
  TrainResult result;
  result.run_dir = run_dir;
  EtaEstimator eta;
  std::string last_ckpt;
  int64_t last_ckpt_step = from_checkpoint ? step : -1;
  reset_peak_memory(place.device);
  int64_t skipped_steps = 0;  // fp16: steps the loss scaler skipped for inf / NaN gradients
  // Data parallelism: the gradient all-reduce over the log window.
  struct {
    int64_t buckets = 0, started_in_backward = 0;
    double comm_s = 0, exposed_s = 0;
  } comm;
  // A non-finite loss or gradient norm stops the run: nothing is written, so
  // the last checkpoint (if any) stays the run's latest.
  const auto stop_non_finite = [&](const char* what, double value, const char* pass) {
    const data::LoaderPosition at = train_loader.position();
    const auto good = ckpts.latest();
    FORGE_FAIL(
        "step {} (epoch {}, batch {}): {} is {}; stopping. {}. Rerun with --check-nan to name the "
        "first op whose {} produced it, or lower optimizer.lr",
        step + 1, at.epoch, at.batch, what, value,
        good ? fmt::format("The last good checkpoint is {} (attnforge train --resume {})", *good,
                           run_dir)
             : std::string("No checkpoint was written yet"),
        pass);
  };
  while (step < total_steps) {
    if (stop_now()) {
      if (last_ckpt_step != step) last_ckpt = save(std::nullopt);
      log->warn("stopped at step {} of {}; continue with: attnforge train --resume {}", step,
                total_steps, run_dir);
      result.status = TrainResult::Status::interrupted;
      break;
    }
    const auto t0 = Clock::now();
    const int64_t epochs_before = completed_epochs(train_loader);
    optimizer->set_lr(base_lr * optim::lr_factor(schedule, step));
    // This process's loss sum, correct, rows, examples and tokens of the step.
    double step_counts[5] = {0, 0, 0, 0, 0};
    for (int64_t a = 0; a < accum; ++a) {
      data::Batch b;
      // At the end of an epoch next() moves to the next one and returns false
      // once; the loader refuses a dataset that makes no batch at all.
      if (!train_loader.next(b))
        FORGE_CHECK(train_loader.next(b), "DataLoader: epoch {} has no batch",
                    train_loader.position().epoch);
      b = cast_batch(std::move(b), dtype, uploader);
      Predictions p;
      Tensor loss;
      {
        ops::AutocastGuard autocast(place.autocast);
        p = predictions(task->forward(b), b);
        loss = batch_loss(p, smoothing);
      }
      const double l = loss.item();
      if (!std::isfinite(l)) stop_non_finite("the loss", l, "forward");
      // The loss is this process's mean; the reducer averages the gradients
      // over the processes, so each mean is weighted by its share of what the
      // global batch's mean averages over (1 for classifiers' equal slices;
      // next-token slices may hold different numbers of real tokens).
      double weight = 1.0 / static_cast<double>(accum);
      if (world > 1)
        weight *= static_cast<double>(p.rows()) * world / static_cast<double>(b.global_scored);
      const Tensor scaled = weight == 1.0 ? loss : ops::mul(loss, weight);
      const bool reduce_now =
          reducer && a == accum - 1;  // the last micro-batch's gradients are final
      if (reduce_now) reducer->begin();
      autograd::backward(place.loss_scaling ? scaler.scale(scaled) : scaled);
      if (reduce_now) {
        reducer->finish();
        const dist::ReduceEvents& ev = reducer->events();
        comm.started_in_backward += ev.started_in_backward;
        comm.buckets += ev.buckets;
        comm.comm_s += ev.comm;
        comm.exposed_s += ev.exposed();
      }
      step_counts[0] += l * static_cast<double>(p.rows());
      step_counts[1] += static_cast<double>(count_correct(p.logits, p.labels));
      step_counts[2] += static_cast<double>(p.rows());
      step_counts[3] += static_cast<double>(b.size);
      step_counts[4] += static_cast<double>(b.tokens);
    }
    // The metrics are the global batch's: sums over the processes.
    group.sum(step_counts, "the step's metric sums");
    window.loss_sum += step_counts[0];
    window.correct += static_cast<int64_t>(step_counts[1]);
    window.predictions += static_cast<int64_t>(step_counts[2]);
    window.examples += static_cast<int64_t>(step_counts[3]);
    window.tokens += static_cast<int64_t>(step_counts[4]);
    // fp16: gradients are unscaled first; an overflow skips the step and lowers
    // the scale (dynamic loss scaling), it does not stop the run.
    const bool grads_finite = place.loss_scaling ? scaler.unscale(*optimizer) : true;
    double norm = 0;
    if (grads_finite) {
      norm = clip > 0 ? optim::clip_grad_norm(params, clip) : optim::grad_norm(params);
      if (!std::isfinite(norm)) stop_non_finite("the gradient norm", norm, "backward");
    }
    if (place.loss_scaling) {
      if (!scaler.step(*optimizer)) {
        ++skipped_steps;
        log->warn("step {}: inf / NaN gradients at loss scale {}; step skipped, scale lowered",
                  step + 1, scaler.get_scale());
      }
      scaler.update();
    } else {
      optimizer->step();
    }
    model.zero_grad();
    ++step;
    if (ema) ema->update(model, step);
    const double dt = seconds_since(t0);
    eta.add(dt);
    if (step == first_step + 1 && log_every > 1 && step < total_steps)
      log->info("step {} done in {}; progress every {} steps (loop.log_every), ETA {}", step,
                format_duration(dt), log_every,
                format_duration(eta.eta(total_steps - step) +
                                evaluations_left(step) * last_eval_seconds));
    window.grad_norm_sum += norm;
    window.seconds += dt;
    window.steps += 1;

    const bool last = step == total_steps;
    if (step % log_every == 0 || last) {
      const MemoryStats mem = memory_stats(place.device);
      const double epoch_f =
          static_cast<double>(train_loader.position().epoch) +
          static_cast<double>(train_loader.position().batch) /
              static_cast<double>(std::max<int64_t>(train_loader.batches_per_epoch(), 1));
      json::Value rec;
      rec["step"] = step;
      rec["split"] = "train";
      rec["epoch"] = epoch_f;
      rec["loss"] = window.loss_sum / static_cast<double>(window.predictions);
      rec["accuracy"] =
          static_cast<double>(window.correct) / static_cast<double>(window.predictions);
      add_token_metrics(rec, rec.at("loss").as_double(), data.shape);
      rec["lr"] = optimizer->lr();
      rec["grad_norm"] = window.grad_norm_sum / static_cast<double>(window.steps);
      rec["samples_per_s"] = static_cast<double>(window.examples) / window.seconds;
      // A ViT's tokens are its patches and class token, not the pixels the loader counts.
      rec["tokens_per_s"] =
          (data.shape.images ? static_cast<double>(window.examples * vit_tokens)
                             : static_cast<double>(window.tokens)) /
          window.seconds;
      rec["step_time_ms"] = 1000 * window.seconds / static_cast<double>(window.steps);
      rec["peak_memory_mb"] = static_cast<double>(mem.peak) / (1 << 20);
      if (reducer) {
        // How much of the all-reduce the backward hid: buckets started during
        // it, and the time added after it (rank 0's view).
        rec["allreduce_ms"] = 1000 * comm.comm_s / static_cast<double>(window.steps);
        rec["allreduce_exposed_ms"] = 1000 * comm.exposed_s / static_cast<double>(window.steps);
        rec["buckets_started_in_backward"] =
            static_cast<double>(comm.started_in_backward) / static_cast<double>(comm.buckets);
        comm = {};
      }
      if (metrics) metrics->append(rec);
      const double frac = static_cast<double>(step) / static_cast<double>(total_steps);
      // What a step is measured in: pictures, sequences, or a language model's tokens.
      const std::string rate =
          data.shape.images ? format_count(rec.at("samples_per_s").as_double()) + " img/s"
          : data.shape.task == Task::classification
              ? format_count(rec.at("samples_per_s").as_double()) + " seq/s"
              : format_count(rec.at("tokens_per_s").as_double()) + " tok/s";
      log->info(
          "step {:>6}/{} {} {:3.0f}% ep {:.2f}  loss {:.4f}{}  acc {:5.2f}%  lr {:.2e}  |g| {:.3f} "
          " "
          "{}  {:.0f} ms/step  mem {:.0f} MB  ETA {}",
          step, total_steps, progress_bar(frac, 20), 100 * frac, epoch_f,
          rec.at("loss").as_double(), token_metrics_text(rec), 100 * rec.at("accuracy").as_double(),
          optimizer->lr(), rec.at("grad_norm").as_double(),
          rate, rec.at("step_time_ms").as_double(), rec.at("peak_memory_mb").as_double(),
          format_duration(eta.eta(total_steps - step) +
                          evaluations_left(step) * last_eval_seconds));
      window = MetricWindow{};
    }
    const bool epoch_ended = completed_epochs(train_loader) != epochs_before;
    const bool eval_now = last || (eval_every > 0 ? step % eval_every == 0 : epoch_ended);
    std::optional<double> metric;
    if (eval_now) {
      const std::optional<EvalResult> e = evaluate();
      if (!e) {
        // Stopped inside the evaluation: the checkpoint of this step would miss
        // it, so none is written and a resume redoes the steps since the last one.
        const auto good = ckpts.latest();
        log->warn(
            "stopped during the evaluation at step {}; continue from {} with: attnforge "
            "train --resume {}",
            step, good ? *good : std::string("the beginning (no checkpoint yet)"), run_dir);
        result.status = TrainResult::Status::interrupted;
        break;
      }
      const bool by_ema = e->ema_loss && r.boolean("ema.select_best");
      metric =
          by_loss ? (by_ema ? *e->ema_loss : e->loss) : (by_ema ? *e->ema_accuracy : e->accuracy);
    }
    const bool ckpt_now = last || (ckpt_every > 0 ? step % ckpt_every == 0 : eval_now);
    if (ckpt_now) {
      last_ckpt = save(metric);
      last_ckpt_step = step;
    }
  }

  result.steps = step;
  result.eval_loss = last_eval.loss;
  result.eval_accuracy = last_eval.accuracy;
  result.ema_eval_accuracy = last_eval.ema_accuracy;
  result.last_checkpoint = last_ckpt;
  if (root) write_plot(run_dir);
  if (root && result.status == TrainResult::Status::finished) {
    if (r.boolean("output.attention_maps"))
      write_attention_maps(*task, eval_loader, place, r,
                           (fs::path(run_dir) / "attention_maps").string(), *log);
    log->info("done: {} in {}; eval accuracy {:.2f}%, loss {:.4f}; curves in {}{}",
              first_step == 0 ? fmt::format("{} steps", step)
              : first_step == step
                  ? fmt::format("nothing to train, the run had finished (step {} of {})", step,
                                total_steps)
                  : fmt::format("steps {} to {} of {}", first_step + 1, step, total_steps),
              format_duration(seconds_since(run_start)), 100 * last_eval.accuracy, last_eval.loss,
              (fs::path(run_dir) / "curves.svg").string(),
              skipped_steps ? fmt::format(" ({} steps skipped by the loss scaler)", skipped_steps)
                            : std::string());
  }
  if (r.boolean("data.synthetic")) log->warn("{}", kSyntheticWarning);
  autograd::set_check_nan(false);
  log->flush();
  return result;
}

EvalResult evaluate_checkpoint(const std::string& path, const std::string& split,
                               const std::vector<std::string>& overrides, bool ema) {
  // Under mpirun each process evaluates its slice of every batch (run_eval).
  dist::Group& group = dist::Group::world();
  const CheckpointRef ref = resolve_checkpoint(path, "eval");
  const std::string& dir = ref.dir;
  const Checkpoint c = read_checkpoint(dir);
  Recipe r = Recipe::from_yaml(c.recipe_yaml, dir + "/model.safetensors (recipe)");
  // The whole split, whatever subset the training run evaluated on, unless
  // the command line asks for one.
  r.set("data.limit_eval=0");
  for (const std::string& s : overrides) r.set(s);
  group.set_timeout(r.number("distributed.timeout_s"));
  const Placement place = placement(r, group.local_rank());
  apply_gpu_kernels(r);
  apply_threads(r, group);
  TaskData data = build_data(r, split, false, [](const std::string&) {});
  data::LoaderOptions lo = loader_options(r, data, false);
  lo.shard_index = group.rank();
  lo.shard_count = group.size();
  data::DataLoader loader(data.eval, lo);
  std::unique_ptr<TaskModel> task = build_trained_model(
      r, data.shape, place, checkpoint_weights(c, ema, "eval --ema " + dir), dir);
  EvalResult e = *run_eval(*task, loader, place, r.number("loop.label_smoothing"), group, {},
                           data.shape.task == Task::classification);
  e.class_names = data.eval->class_names();
  e.split = split.empty() ? r.string("data.eval_split") : split;
  if (data.shape.task != Task::classification) {
    json::Value rec;
    add_token_metrics(rec, e.loss, data.shape);
    if (const json::Value* v = rec.find("bits_per_byte")) e.bits_per_byte = v->as_double();
    e.perplexity = rec.at("perplexity").as_double();
  }
  e.step = c.state.at("step").as_int();
  e.limit = r.integer("data.limit_eval");
  e.ema_weights = ema;
  e.checkpoint = dir;
  e.run_dir = ref.run_dir;
  e.warnings = c.warnings;
  return e;
}

}  // namespace forge::train
