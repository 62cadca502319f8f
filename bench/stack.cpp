// Stack benchmark (a program, not a test): one training step of an nn::Stack
// (forward, a loss, backward; no optimizer) under each way of keeping or
// dropping activations, with its time and the allocator's peak memory.
//
//   bench_stack [--n 4096] [--depth 12] [--dim 256] [--heads 4] [--ff-mult 4]
//               [--kind favor,linformer,linear] [--modes C0,C1,C2,rev,rev-plain]
//               [--k 256] [--sharing headwise] [--loss mse|sum] [--runs 3]
//               [--threads 2] [--frozen-input] [--csv]
//
// --runs 0 measures memory and checks the results only (one step per mode).
// Modes: C0 plain; C1 each residual branch checkpointed; C2 also one head at
// a time; rev the reversible stack (one autograd node for all blocks);
// rev-plain the same reversible network run as ordinary recorded ops, which
// is what rev must reproduce. C1 and C2 are checked against C0 and rev
// against rev-plain: the loss and every parameter's (and x's) gradient.
//
// Memory, from the allocator's counters around the warm-up step: "act" is
// the peak during the step minus the bytes held before it (parameters, x and
// the target), so it counts activations, recomputation buffers and the
// gradients the step creates ("grads": those still held after it, the
// parameters' and x's); "peak" is the whole peak. Time: the median of
// --runs steps after the warm-up. Shapes: x (B = 1, N, D), heads of d = D / H.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "bench/bench_args.h"
#include "core/allocator.h"
#include "core/threading.h"
#include "nn/transformer.h"
#include "ops/ops.h"

namespace {

using forge::DType;
using forge::Tensor;
namespace nn = forge::nn;

enum class Mode { C0, C1, C2, rev, rev_plain };
constexpr const char* kModeNames[] = {"C0", "C1", "C2", "rev", "rev-plain"};

Mode mode_from_name(const std::string& s) {
  for (int i = 0; i < 5; ++i)
    if (s == kModeNames[i]) return static_cast<Mode>(i);
  FORGE_FAIL("unknown mode '{}'; expected C0, C1, C2, rev or rev-plain", s);
}
const char* name_of(Mode m) {
  return kModeNames[static_cast<int>(m)];
}
// The mode whose results a mode must equal: the plain run of the same network.
Mode reference_of(Mode m) {
  return m == Mode::rev || m == Mode::rev_plain ? Mode::rev_plain : Mode::C0;
}

struct Options {
  int64_t n = 4096, depth = 12, dim = 256, heads = 4, ff_mult = 4, k = 256;
  std::vector<std::string> kinds = {"favor", "linformer", "linear"};
  std::vector<Mode> modes = {Mode::C0, Mode::C1, Mode::C2, Mode::rev, Mode::rev_plain};
  std::string sharing = "headwise";
  std::string loss = "mse";
  int runs = 3;
  int threads = 2;
  bool frozen_input = false;  // x without requires_grad (pixels into a frozen stem)
  bool csv = false;
};

nn::StackConfig make_config(const Options& o, const std::string& kind, Mode mode) {
  nn::StackConfig c;
  c.depth = o.depth;
  nn::AttentionConfig& a = c.block.attention;
  a.kind = nn::mechanism_from_name(kind);
  a.dim = o.dim;
  a.heads = o.heads;
  a.seq_len = o.n;  // linformer: E/F project from N positions
  a.k = o.k;
  c.block.ff.mult = o.ff_mult;
  c.sharing = enum_from_name(nn::kSharingNames, o.sharing);
  c.checkpoint = mode == Mode::C1   ? nn::CheckpointLevel::C1
                 : mode == Mode::C2 ? nn::CheckpointLevel::C2
                                    : nn::CheckpointLevel::C0;
  c.reversible = mode == Mode::rev;
  return c;
}

// The reversible network of Stack::forward (x1 = x2 = x; y1 = x1 + f(x2),
// y2 = x2 + g(y1) per block; out = norm(y1 + y2)) as ordinary recorded ops.
Tensor reversible_plain(nn::Stack& stack, const Tensor& x) {
  Tensor x1 = x, x2 = x;
  for (const auto& b : stack.blocks) {
    Tensor y1 = x1 + b->attention_branch(x2, Tensor(), Tensor(), Tensor());
    x2 = x2 + b->ff_branch(y1);
    x1 = y1;
  }
  Tensor h = x1 + x2;
  return stack.norm ? stack.norm->forward(h) : h;
}

struct Grads {
  std::vector<std::vector<float>> values;  // per parameter, then x; empty: no gradient
};

Grads copy_grads(const std::vector<Tensor>& tensors) {
  Grads g;
  for (const Tensor& t : tensors) {
    const Tensor gr = t.grad();
    g.values.push_back(gr.defined() ? gr.to_vector<float>() : std::vector<float>{});
  }
  return g;
}

// Against the reference: the largest |g - g_ref| / max|g_ref| over all
// tensors, and how many tensors have a gradient in one run and not the other.
struct GradDiff {
  double max_rel = 0;
  int missing = 0;
};

GradDiff compare(const Grads& a, const Grads& ref) {
  GradDiff d;
  for (size_t i = 0; i < ref.values.size(); ++i) {
    const auto& x = a.values[i];
    const auto& r = ref.values[i];
    if (x.size() != r.size()) {
      ++d.missing;
      continue;
    }
    double scale = 0, err = 0;
    for (size_t j = 0; j < r.size(); ++j) {
      scale = std::max(scale, std::fabs(double(r[j])));
      err = std::max(err, std::fabs(double(x[j]) - double(r[j])));
    }
    if (scale > 0) d.max_rel = std::max(d.max_rel, err / scale);
  }
  return d;
}

struct Result {
  double loss = 0, step_ms = 0;
  int64_t param_bytes = 0, act_bytes = 0, peak_bytes = 0, grad_bytes = 0;
  int no_grad_params = 0;
  Grads grads;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Result measure(const Options& o, const std::string& kind, Mode mode) {
  const int64_t B = 1;
  forge::Generator init_gen(1234);  // the same parameters in every mode
  nn::Stack stack(make_config(o, kind, mode), &init_gen);
  forge::Generator data_gen(99);
  Tensor x = Tensor::randn({B, o.n, o.dim}, DType::f32, &data_gen);
  if (!o.frozen_input) x.set_requires_grad(true);  // as an embedding's output
  const Tensor target = Tensor::randn({B, o.n, o.dim}, DType::f32, &data_gen);
  std::vector<Tensor> tensors = stack.parameters();
  tensors.push_back(x);

  auto step = [&] {
    stack.zero_grad();
    x.zero_grad();
    Tensor y = mode == Mode::rev_plain ? reversible_plain(stack, x) : stack.forward(x);
    Tensor loss = o.loss == "sum" ? forge::ops::sum(y) : forge::ops::mse_loss(y, target);
    forge::autograd::backward(loss);
    return loss.item();
  };

  Result r;
  for (const Tensor& p : stack.parameters()) r.param_bytes += static_cast<int64_t>(p.nbytes());
  // The warm-up step is the memory measurement and the correctness sample.
  stack.zero_grad();
  x.zero_grad();
  const int64_t before = forge::memory_stats().current;
  forge::reset_peak_memory();
  r.loss = step();
  r.peak_bytes = forge::memory_stats().peak;
  r.act_bytes = r.peak_bytes - before;
  r.grad_bytes = forge::memory_stats().current - before;
  r.grads = copy_grads(tensors);
  for (size_t i = 0; i + 1 < tensors.size(); ++i) r.no_grad_params += r.grads.values[i].empty();

  std::vector<double> t;
  for (int i = 0; i < o.runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  r.step_ms = t.empty() ? 0 : 1e3 * t[t.size() / 2];
  return r;
}

double mib(int64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

int run(int argc, char** argv) {
  Options o;
  forge::bench::parse_bench_args(argc, argv,
                                 {{"--n", &o.n},
                                  {"--depth", &o.depth},
                                  {"--dim", &o.dim},
                                  {"--heads", &o.heads},
                                  {"--ff-mult", &o.ff_mult},
                                  {"--k", &o.k},
                                  {"--kind", &o.kinds},
                                  {"--modes",
                                   [&](const std::string& v) {
                                     o.modes.clear();
                                     for (const std::string& m : forge::bench::split_list(v))
                                       o.modes.push_back(mode_from_name(m));
                                   }},
                                  {"--sharing", &o.sharing},
                                  {"--loss", &o.loss},
                                  {"--runs", &o.runs},
                                  {"--threads", &o.threads},
                                  {"--frozen-input", &o.frozen_input},
                                  {"--csv", &o.csv}});
  FORGE_CHECK(o.loss == "mse" || o.loss == "sum", "--loss must be mse or sum, got {}", o.loss);
  // Each reference (C0, rev-plain) runs before the modes checked against it.
  std::vector<Mode> order;
  for (Mode m : o.modes) {
    const Mode ref = reference_of(m);
    if (std::find(o.modes.begin(), o.modes.end(), ref) != o.modes.end() &&
        std::find(order.begin(), order.end(), ref) == order.end())
      order.push_back(ref);
    if (std::find(order.begin(), order.end(), m) == order.end()) order.push_back(m);
  }
  o.modes = order;
  FORGE_CHECK(o.runs >= 0, "--runs must be >= 0, got {}", o.runs);
  forge::set_num_threads(o.threads);

  if (o.csv) {
    std::printf(
        "mechanism,mode,loss,ref_mode,loss_diff,grad_max_rel_diff,grads_missing,"
        "no_grad_params,step_ms,act_MiB,grads_MiB,peak_MiB,param_MiB\n");
  } else {
    std::printf(
        "depth %lld, N = %lld, B = 1, D = %lld, H = %lld (d = %lld), ff mult %lld, f32, "
        "%d thread%s; loss %s; linformer k = %lld, sharing %s; step = median of %d after a "
        "warm-up%s\n\n",
        static_cast<long long>(o.depth), static_cast<long long>(o.n), static_cast<long long>(o.dim),
        static_cast<long long>(o.heads), static_cast<long long>(o.dim / o.heads),
        static_cast<long long>(o.ff_mult), forge::num_threads(),
        forge::num_threads() == 1 ? "" : "s",
        o.loss == "mse" ? "mse against a random target" : "sum(y)", static_cast<long long>(o.k),
        o.sharing.c_str(), o.runs, o.frozen_input ? "; x does not require grad" : "");
    std::printf(
        "| mechanism | mode | loss | vs | loss diff | grad rel diff | step ms | act MiB | "
        "of which grads MiB | peak MiB | time / C0 | act / C0 | peak / C0 |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  std::fflush(stdout);

  std::string params_note;
  for (const std::string& kind : o.kinds) {
    std::vector<std::pair<Mode, Result>> done;
    auto find = [&](Mode m) -> const Result* {
      for (const auto& [mm, r] : done)
        if (mm == m) return &r;
      return nullptr;
    };
    for (Mode mode : o.modes) {
      Result r = measure(o, kind, mode);
      // The reference is the plain run of the same network; when that has
      // not run, the first run of the same network.
      Mode ref_mode = reference_of(mode);
      const Result* ref = find(ref_mode);
      for (const auto& [mm, rr] : done) {
        if (ref) break;
        if (reference_of(mm) == reference_of(mode)) {
          ref = &rr;
          ref_mode = mm;
        }
      }
      const GradDiff d = ref ? compare(r.grads, ref->grads) : GradDiff{};
      const Result* c0 = find(Mode::C0);
      if (mode == Mode::C0) c0 = &r;
      char loss_diff[32] = "-", grad_rel[32] = "-", grad_diff[64] = "-";
      char ratios[3][16] = {"-", "-", "-"};
      if (ref) {
        std::snprintf(loss_diff, sizeof loss_diff, "%.3g", std::fabs(r.loss - ref->loss));
        std::snprintf(grad_rel, sizeof grad_rel, "%.3g", d.max_rel);
        std::snprintf(grad_diff, sizeof grad_diff, d.missing ? "%.3g (%d missing)" : "%.3g",
                      d.max_rel, d.missing);
      }
      if (c0) {
        if (c0->step_ms > 0)
          std::snprintf(ratios[0], sizeof ratios[0], "%.2f", r.step_ms / c0->step_ms);
        std::snprintf(ratios[1], sizeof ratios[1], "%.2f",
                      double(r.act_bytes) / double(c0->act_bytes));
        std::snprintf(ratios[2], sizeof ratios[2], "%.2f",
                      double(r.peak_bytes) / double(c0->peak_bytes));
      }
      const char* vs = ref ? name_of(ref_mode) : "-";
      if (o.csv) {
        std::printf("%s,%s,%.9g,%s,%s,%s,%d,%d,%.2f,%.1f,%.1f,%.1f,%.1f\n", kind.c_str(),
                    name_of(mode), r.loss, vs, loss_diff, grad_rel, d.missing, r.no_grad_params,
                    r.step_ms, mib(r.act_bytes), mib(r.grad_bytes), mib(r.peak_bytes),
                    mib(r.param_bytes));
      } else {
        std::printf(
            "| %s | %s | %.7g | %s | %s | %s | %.0f | %.1f | %.1f | %.1f | %s | %s | %s |\n",
            kind.c_str(), name_of(mode), r.loss, vs, loss_diff, grad_diff, r.step_ms,
            mib(r.act_bytes), mib(r.grad_bytes), mib(r.peak_bytes), ratios[0], ratios[1],
            ratios[2]);
      }
      if (r.no_grad_params > 0)
        std::fprintf(stderr, "bench_stack: %s %s: %d of %zu parameters got no gradient\n",
                     kind.c_str(), name_of(mode), r.no_grad_params, r.grads.values.size() - 1);
      std::fflush(stdout);
      done.emplace_back(mode, std::move(r));
    }
    if (!done.empty()) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s%s %.1f MiB", params_note.empty() ? "" : ", ", kind.c_str(),
                    mib(done.front().second.param_bytes));
      params_note += buf;
    }
  }
  if (!o.csv) std::printf("\nparameters: %s\n", params_note.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return forge::bench::bench_main("bench_stack", argc, argv, run);
}
