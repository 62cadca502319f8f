// Data-parallel training end to end: the attnforge program under OpenMPI's
// mpirun (as root: --allow-run-as-root; more ranks than cores: --oversubscribe).
//   (a) 2 and 4 processes train the same run as one (f64 weights to 1e-10),
//       with dropout, mixup / cutmix and a Performer redraw inside the steps;
//   (b) repeating a 2-process run is bit-identical;
//   (c) a checkpoint of a 2-process run resumes with 1 and with 4 processes;
//   (d) one failing (or hanging) rank ends the job within seconds, its message
//       printed once;
//   (e) evaluation over 3 processes (uneven slices, one empty) equals one process's;
//   (f) the bucketed all-reduce starts during the backward.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "core/file_io.h"
#include "core/json.h"
#include "train/checkpoint.h"
#include "train/metrics.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;

struct Job {
  int code = -1;
  std::string output;  // stdout and stderr
  double seconds = 0;
};

Job sh(const std::string& command) {
  const auto t0 = std::chrono::steady_clock::now();
  Job r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  EXPECT_NE(p, nullptr) << command;
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

const std::string kBin = FORGE_ATTNFORGE_BIN;

// `np` processes (0: attnforge alone, without mpirun).
std::string attnforge(int np, const std::string& args, const std::string& env = "") {
  const std::string launch =
      np == 0 ? "" : "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(np) + " ";
  return env + (env.empty() ? "" : " ") + launch + kBin + " " + args;
}

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("attnforge_dp_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// A small f64 ViT on Fashion-MNIST with every stochastic part on: dropout and
// attention dropout, mixup and cutmix, a FAVOR+ layer redrawing its
// projection every 7 steps, shuffling.
std::string write_recipe(const std::string& dir, const std::string& extra = "") {
  const std::string path = (fs::path(dir) / "dp.yaml").string();
  std::ofstream(path) << R"(name: dp
seed: 5
precision: fp64
threads: 1
model:
  type: vit
  image_size: 28
  patch_size: 7
  dim: 16
  depth: 2
  heads: 2
  mlp_ratio: 2
  dropout: 0.1
  attention:
    per_layer: [favor, softmax]
    dropout: 0.1
    nb_features: 8
    feature_redraw_interval: 7
data:
  dataset: fashion_mnist
  limit_train: 640
  limit_eval: 50
  workers: 1
  mixup_alpha: 0.8
  cutmix_alpha: 1.0
optimizer:
  name: adamw
  lr: 3.0e-3
schedule:
  kind: cosine
  warmup_steps: 3
loop:
  steps: 20
  batch_size: 16
  eval_batch_size: 12
  log_every: 5
  eval_every: 10
checkpoint:
  every: 10
)" << extra;
  return path;
}

std::map<std::string, Tensor> weights(const std::string& run_dir, int step) {
  return read_checkpoint(
             (fs::path(run_dir) / "checkpoints" / fmt::format("step-{:08}", step)).string())
      .model;
}

// max |a - b| / max(max |b|, 1e-3) over every tensor. The floor: a tensor
// whose gradient is only rounding noise (a softmax layer's key bias: adding
// a constant to every key changes no attention weight) stays near 0 with
// values of the noise's size, which Adam's normalisation makes differ between
// summation orders; it is compared absolutely (to 1e-13).
double max_rel_diff(const std::map<std::string, Tensor>& a,
                    const std::map<std::string, Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [name, t] : a) {
    const std::vector<double> x = t.to(DType::f64).to_vector<double>();
    const std::vector<double> y = b.at(name).to(DType::f64).to_vector<double>();
    EXPECT_EQ(x.size(), y.size()) << name;
    double scale = 1e-3, diff = 0;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      scale = std::max(scale, std::abs(y[i]));
      diff = std::max(diff, std::abs(x[i] - y[i]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

bool bit_equal(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    if (t.nbytes() != u.nbytes() || std::memcmp(t.raw_data(), u.raw_data(), t.nbytes()) != 0)
      return false;
  }
  return true;
}

std::vector<json::Value> records(const std::string& run_dir, const std::string& split) {
  std::vector<json::Value> out;
  for (json::Value& r : read_metrics((fs::path(run_dir) / "metrics.jsonl").string()))
    if (r.at("split").as_string() == split) out.push_back(std::move(r));
  return out;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

class DataParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = temp_dir("suite");
    recipe_ = write_recipe(dir_);
    for (int np : {0, 2, 4}) {
      const std::string out = (fs::path(dir_) / fmt::format("np{}", np)).string();
      const Job r = sh(attnforge(np, "train " + recipe_ + " --out " + out));
      ASSERT_EQ(r.code, 0) << r.output;
      runs_[np] = out;
    }
  }
  static inline std::string dir_, recipe_;
  static inline std::map<int, std::string> runs_;
};

TEST_F(DataParallel, TwoAndFourProcessesTrainTheSameRunAsOne) {
  const auto one = weights(runs_[0], 20);
  for (int np : {2, 4}) {
    EXPECT_LT(max_rel_diff(weights(runs_[np], 20), one), 1e-10) << np << " processes";
    EXPECT_LT(max_rel_diff(weights(runs_[np], 10), weights(runs_[0], 10)), 1e-10);
    // The metrics are the global batch's: the same losses and accuracies.
    const auto a = records(runs_[0], "train"), b = records(runs_[np], "train");
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(a[i].at("loss").as_double(), b[i].at("loss").as_double(), 1e-10);
      EXPECT_EQ(a[i].at("accuracy").as_double(), b[i].at("accuracy").as_double());
    }
    const auto ea = records(runs_[0], "eval"), eb = records(runs_[np], "eval");
    ASSERT_EQ(ea.size(), eb.size());
    for (size_t i = 0; i < ea.size(); ++i) {
      EXPECT_EQ(ea[i].at("accuracy").as_double(), eb[i].at("accuracy").as_double());
      EXPECT_EQ(ea[i].at("examples").as_int(), eb[i].at("examples").as_int());
      EXPECT_NEAR(ea[i].at("loss").as_double(), eb[i].at("loss").as_double(), 1e-10);
    }
  }
  // The runs are not trivially equal: training moved the weights.
  EXPECT_GT(max_rel_diff(weights(runs_[0], 20), weights(runs_[0], 10)), 1e-3);
}

TEST_F(DataParallel, GradientAccumulationReducesOnlyTheLastMicroBatch) {
  // Two micro-batches of 8 per step: each process accumulates its slices and
  // the reducer averages once, after the second backward.
  std::map<int, std::string> runs;
  for (int np : {0, 2}) {
    runs[np] = (fs::path(dir_) / fmt::format("accum-np{}", np)).string();
    const Job r = sh(attnforge(np, "train " + recipe_ + " --out " + runs[np] +
                                       " --set loop.batch_size=8 --set loop.accumulation=2"));
    ASSERT_EQ(r.code, 0) << r.output;
  }
  EXPECT_LT(max_rel_diff(weights(runs[2], 20), weights(runs[0], 20)), 1e-10);
  EXPECT_GT(max_rel_diff(weights(runs[0], 20), weights(runs_[0], 20)), 1e-6);  // another run
}

TEST_F(DataParallel, ARepeatWithTheSameProcessCountIsBitIdentical) {
  const std::string again = (fs::path(dir_) / "np2-again").string();
  const Job r = sh(attnforge(2, "train " + recipe_ + " --out " + again));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(bit_equal(weights(again, 20), weights(runs_[2], 20)));
}

TEST_F(DataParallel, ACheckpointResumesWithAnotherProcessCount) {
  // A 2-process run that stops after its checkpoint at step 10 (rank 0 fails
  // before step 12; before step 11 would be inside step 10's evaluation,
  // which polls for a stop too), resumed with 1 and with 4 processes.
  const std::string stopped = (fs::path(dir_) / "stopped").string();
  const Job r = sh(attnforge(2, "train " + recipe_ + " --out " + stopped, "ATTNFORGE_FAULT=step:11:raise:0"));
  ASSERT_NE(r.code, 0) << r.output;
  ASSERT_TRUE(fs::exists(fs::path(stopped) / "checkpoints" / "step-00000010")) << r.output;
  ASSERT_FALSE(fs::exists(fs::path(stopped) / "checkpoints" / "step-00000020"));
  for (int np : {0, 4}) {
    const std::string run = (fs::path(dir_) / fmt::format("resumed-np{}", np)).string();
    fs::remove_all(run);
    fs::copy(stopped, run, fs::copy_options::recursive);
    const Job res = sh(attnforge(np, "train --resume " + run));
    ASSERT_EQ(res.code, 0) << res.output;
    EXPECT_LT(max_rel_diff(weights(run, 20), weights(runs_[0], 20)), 1e-10) << np;
    const std::string state_file =
        (fs::path(run) / "checkpoints" / "step-00000020" / "state.json").string();
    const json::Value state = json::parse(io::read_file(state_file), state_file);
    EXPECT_EQ(state.at("world_size").as_int(), np == 0 ? 1 : np);
  }
}

TEST_F(DataParallel, ShardedEvaluationEqualsOneProcess) {
  const std::string ckpt = (fs::path(runs_[2]) / "checkpoints" / "step-00000020").string();
  const std::string one = (fs::path(dir_) / "eval1.json").string();
  const std::string three = (fs::path(dir_) / "eval3.json").string();
  // 50 examples in batches of 12 split over 3 processes: slices of 4, and of
  // the last batch's 2 rows one process gets none.
  const Job a = sh(attnforge(0, "eval " + ckpt + " --set data.limit_eval=50 --out " + one));
  ASSERT_EQ(a.code, 0) << a.output;
  const Job b = sh(attnforge(3, "eval " + ckpt + " --set data.limit_eval=50 --out " + three));
  ASSERT_EQ(b.code, 0) << b.output;
  const json::Value x = json::parse(io::read_file(one), one);
  const json::Value y = json::parse(io::read_file(three), three);
  EXPECT_EQ(x.at("examples").as_int(), 50);
  EXPECT_EQ(y.at("examples").as_int(), 50);
  EXPECT_EQ(x.at("accuracy").as_double(), y.at("accuracy").as_double());
  // The class counts are summed over the processes too (one gets no rows of the last batch).
  EXPECT_EQ(x.at("top5_accuracy").as_double(), y.at("top5_accuracy").as_double());
  EXPECT_EQ(json::dump(x.at("confusion")), json::dump(y.at("confusion")));
  EXPECT_NEAR(x.at("loss").as_double(), y.at("loss").as_double(), 1e-12);
  EXPECT_EQ(count(b.output, "\"top5_accuracy\""), 1u) << "rank 0 alone reports";
}

TEST_F(DataParallel, TheAllReduceStartsDuringTheBackward) {
  // Small buckets (about 10 KiB): the model's 20-odd parameters make several,
  // and every one but the last layer's must start from the leaf hook.
  const std::string run = (fs::path(dir_) / "overlap").string();
  const Job r = sh(attnforge(2, "train " + recipe_ + " --out " + run +
                                    " --set distributed.bucket_mb=0.01 --set loop.steps=10"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("buckets"), std::string::npos);
  for (const json::Value& rec : records(run, "train")) {
    // The share of buckets started before the backward returned.
    EXPECT_GT(rec.at("buckets_started_in_backward").as_double(), 0.5);
    EXPECT_GT(rec.at("allreduce_ms").as_double(), 0);
  }
}

// An encoder-decoder on source/target pairs of different lengths: the
// processes' slices hold different numbers of real target tokens, so each
// process's mean loss must be weighted by its share of the global batch's
// tokens (Batch::global_scored), and the sequences padded to the global
// batch's longest.
TEST(DataParallelTokens, AnEncoderDecoderOnUnevenSequencesTrainsTheSameRun) {
  const std::string dir = temp_dir("tokens");
  fs::create_directories(fs::path(dir) / "pairs");
  for (const std::string split : {"train", "test"}) {
    std::ofstream tsv(fs::path(dir) / "pairs" / (split + ".tsv"));
    uint64_t x = split == "train" ? 7 : 11;
    for (int line = 0; line < 64; ++line) {
      std::string src, dst;
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const int n = 2 + static_cast<int>((x >> 33) % 14);  // 2 .. 15 letters
      for (int i = 0; i < n; ++i) src.push_back(static_cast<char>('a' + (x >> (i % 40)) % 26));
      dst.assign(src.rbegin(), src.rend());
      tsv << src << "\t" << dst << "\n";
    }
  }
  const std::string recipe = (fs::path(dir) / "s2s.yaml").string();
  std::ofstream(recipe)
      << "name: s2s\nseed: 2\nprecision: fp64\nthreads: 1\n"
      << "model:\n  type: encoder_decoder\n  dim: 16\n  encoder_depth: 1\n"
      << "  decoder_depth: 1\n  heads: 2\n  mlp_ratio: 2\n  dropout: 0.1\n"
      << "data:\n  dataset: seq2seq_tsv\n  root: " << dir << "/pairs\n  workers: 0\n"
      << "optimizer:\n  name: adamw\n  lr: 3.0e-3\n"
      << "schedule:\n  kind: constant\n"
      << "loop:\n  steps: 12\n  batch_size: 8\n  log_every: 4\n  eval_every: 12\n";
  std::map<int, std::string> runs;
  for (int np : {0, 2, 4}) {
    runs[np] = (fs::path(dir) / fmt::format("np{}", np)).string();
    const Job r = sh(attnforge(np, "train " + recipe + " --out " + runs[np]));
    ASSERT_EQ(r.code, 0) << r.output;
  }
  for (int np : {2, 4}) {
    EXPECT_LT(max_rel_diff(weights(runs[np], 12), weights(runs[0], 12)), 1e-10) << np;
    const auto a = records(runs[0], "train"), b = records(runs[np], "train");
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(a[i].at("loss").as_double(), b[i].at("loss").as_double(), 1e-10);
      EXPECT_EQ(a[i].at("tokens_per_s").is_number(), true);
    }
  }
}

TEST(DataParallelFaults, AFailingRankEndsTheJobWithItsMessageOnce) {
  const std::string dir = temp_dir("fault");
  const std::string recipe = write_recipe(dir);
  const Job r =
      sh(attnforge(2, "train " + recipe + " --out " + dir + "/run", "ATTNFORGE_FAULT=step:3:raise:1"));
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count(r.output, "rank 1 of 2: error: fault injected by ATTNFORGE_FAULT"), 1u)
      << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
}

TEST(DataParallelFaults, AHangingRankEndsTheJobAfterTheTimeout) {
  const std::string dir = temp_dir("hang");
  const std::string recipe = write_recipe(dir);
  const Job r =
      sh(attnforge(2, "train " + recipe + " --out " + dir + "/run --set distributed.timeout_s=4",
                   "ATTNFORGE_FAULT=step:3:hang:1"));
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count(r.output, "rank 0 of 2: error: the stop decision did not complete within 4 s"),
            1u)
      << r.output;
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(DataParallelFaults, SigintToMpirunCheckpointsAndStopsEveryRank) {
  const std::string dir = temp_dir("sigint");
  const std::string recipe = write_recipe(dir);
  const std::string run = dir + "/run";
  // mpirun passes the signal to both processes; they agree on the step to stop
  // before, rank 0 writes the checkpoint, and the run resumes in one process.
  const Job r = sh("sh -c '" +
                   attnforge(2, "train " + recipe + " --out " + run +
                                    " --set loop.steps=100000 --set loop.eval_every=100000") +
                   " & pid=$!; sleep 5; kill -INT $pid; wait $pid'");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count(r.output, "stopped at step"), 1u) << r.output;
  // The resume reads the checkpoint (and is stopped the same way after 4 s).
  const Job res = sh("timeout -s INT 4 " + attnforge(0, "train --resume " + run));
  EXPECT_NE(res.output.find("resuming " + run + " from"), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("trained by 2 processes, it continues with 1"), std::string::npos)
      << res.output;
}

TEST(DataParallelFaults, ABatchNotDivisibleByTheProcessesIsRefusedOnce) {
  const std::string dir = temp_dir("divisible");
  const std::string recipe = write_recipe(dir);
  const Job r = sh(attnforge(3, "train " + recipe + " --out " + dir + "/run"));
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count(r.output, "batch_size 16 is not divisible by 3 processes"), 1u) << r.output;
  EXPECT_FALSE(fs::exists(fs::path(dir) / "run" / "checkpoints"));
}

}  // namespace
}  // namespace forge::train
