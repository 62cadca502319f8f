// Evaluation (see evaluation.h).
#include "train/evaluation.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/upload.h"
#include "data/lm_text.h"
#include "dist/group.h"
#include "ops/autocast.h"
#include "train/batch_math.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/process_settings.h"

namespace forge::train {

namespace {

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

}  // namespace

void add_token_metrics(json::Value& rec, double loss, const DataShape& shape) {
  if (shape.task == Task::classification) return;
  if (shape.byte_tokens) rec["bits_per_byte"] = data::bits_per_byte(loss);
  rec["perplexity"] = std::exp(loss);
}

std::string token_metrics_text(const json::Value& rec) {
  if (const json::Value* v = rec.find("bits_per_byte"))
    return fmt::format("  bpb {:.4f}", v->as_double());
  if (const json::Value* v = rec.find("perplexity"))
    return fmt::format("  ppl {:.3f}", v->as_double());
  return "";
}

std::optional<EvalResult> run_eval(TaskModel& model, data::DataLoader& loader,
                                   const Placement& place, double smoothing, dist::Group& group,
                                   const std::function<bool()>& stop, bool class_counts) {
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
