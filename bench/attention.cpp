// Attention benchmark (a program, not a test): every mechanism and main
// option, forward and forward+backward time and peak memory, B = 1, H = 8,
// d = 64, f32, over N = 256 .. 16384.
//
//   bench_attention [--max-n N] [--csv]   the whole table (Markdown, or CSV)
//   bench_attention --one NAME N           one configuration as a CSV line, for
//                                          bench/torch_attention.py, which runs
//                                          each configuration in its own process
//                                          and compares with PyTorch.
// Peak memory: the allocator's peak bytes above the inputs during one
// forward+backward; with --one also the process's peak-RSS growth (VmHWM
// after a reset through /proc/self/clear_refs), measured the same way as
// the PyTorch side.
#include "bench/attention.h"

#include "ops/attention/attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/threading.h"
#include "ops/ops.h"

namespace {

using forge::DType;
using forge::Tensor;
namespace att = forge::ops::attention;

constexpr int64_t kB = 1, kH = 8, kD = 64;
constexpr int64_t kLinformerK = 256;  // linformer-pytorch's default projected length
const int64_t kFavorM =
    static_cast<int64_t>(kD * std::log(static_cast<double>(kD)));  // int(d ln d)

struct Inputs {
  Tensor q, k, v, E, F, bE, bF, W, tau;
};

struct Mechanism {
  std::string name;
  std::function<Tensor(const Inputs&)> run;
};

const std::vector<Mechanism>& mechanisms() {
  static const std::vector<Mechanism> all = {
      {"softmax", [](const Inputs& x) { return att::softmax(x.q, x.k, x.v); }},
      {"softmax_causal",
       [](const Inputs& x) { return att::softmax(x.q, x.k, x.v, Tensor(), {.causal = true}); }},
      {"local_w64",
       [](const Inputs& x) { return att::local(x.q, x.k, x.v, Tensor(), {.window = 64}); }},
      {"local_w64_causal",
       [](const Inputs& x) {
         return att::local(x.q, x.k, x.v, Tensor(), {.window = 64, .causal = true});
       }},
      {"efficient", [](const Inputs& x) { return att::efficient(x.q, x.k, x.v); }},
      {"efficient_causal",
       [](const Inputs& x) {
         return att::efficient(x.q, x.k, x.v, Tensor(), {.causal = true, .bucket_size = 64});
       }},
      {"linear", [](const Inputs& x) { return att::linear(x.q, x.k, x.v); }},
      {"linear_causal",
       [](const Inputs& x) { return att::linear(x.q, x.k, x.v, Tensor(), {.causal = true}); }},
      {"taylor_linear", [](const Inputs& x) { return att::taylor_linear(x.q, x.k, x.v); }},
      {"linformer_k256",
       [](const Inputs& x) { return att::linformer(x.q, x.k, x.v, x.E, x.F, x.bE, x.bF); }},
      {"favor", [](const Inputs& x) { return att::favor(x.q, x.k, x.v, x.W); }},
      {"favor_causal",
       [](const Inputs& x) { return att::favor(x.q, x.k, x.v, x.W, Tensor(), {.causal = true}); }},
      {"favor_relu",
       [](const Inputs& x) {
         return att::favor(x.q, x.k, x.v, x.W, Tensor(), {.kernel = att::FavorKernel::relu});
       }},
      {"taylorshift_efficient",
       [](const Inputs& x) {
         return att::taylorshift(x.q, x.k, x.v, x.tau, Tensor(), {.n0 = -1});
       }},
      {"taylorshift_direct",
       [](const Inputs& x) {
         return att::taylorshift(x.q, x.k, x.v, x.tau, Tensor(), {.n0 = int64_t{1} << 40});
       }},
  };
  return all;
}

Inputs make_inputs(int64_t N) {
  forge::Generator g(1234);
  auto leaf = [&](const forge::Shape& s, double scale) {
    Tensor t = forge::ops::mul(Tensor::randn(s, DType::f32, &g), scale);
    return t.set_requires_grad(true);
  };
  Inputs x;
  x.q = leaf({kB, kH, N, kD}, 1.0);
  x.k = leaf({kB, kH, N, kD}, 1.0);
  x.v = leaf({kB, kH, N, kD}, 1.0);
  const double xavier = std::sqrt(2.0 / static_cast<double>(kLinformerK + N));
  x.E = leaf({kLinformerK, N}, xavier);
  x.F = leaf({kLinformerK, N}, xavier);
  x.bE = leaf({kLinformerK}, 0.0);
  x.bF = leaf({kLinformerK}, 0.0);
  x.W = att::gaussian_orthogonal_random_matrix(kFavorM, kD, 0, DType::f32, &g);
  x.tau = Tensor::ones({kH}).set_requires_grad(true);
  return x;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median seconds of fn over at least 3 runs and about `budget` seconds.
double median_time(const std::function<void()>& fn, double budget) {
  std::vector<double> t;
  const auto start = std::chrono::steady_clock::now();
  while (t.size() < 3 || (seconds_since(start) < budget && t.size() < 50)) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Peak-RSS bookkeeping from /proc: writing 5 to clear_refs resets the
// high-water mark (VmHWM) to the current RSS, so HWM - RSS(at reset) is the
// peak growth of what runs in between.
long proc_status_kib(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long value = -1;
  const size_t len = std::strlen(field);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, field, len) == 0) value = std::strtol(line + len + 1, nullptr, 10);
  }
  std::fclose(f);
  return value;
}

long reset_peak_rss_kib() {
  if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
  return proc_status_kib("VmRSS");
}

struct Result {
  double fwd_ms = 0, fwdbwd_ms = 0;
  int64_t peak_bytes = 0;  // allocator peak above the inputs, forward + backward
  long rss_growth_kib = 0;
};

Result measure(const Mechanism& m, int64_t N, double budget) {
  Inputs x = make_inputs(N);
  std::vector<Tensor> leaves = {x.q, x.k, x.v, x.E, x.F, x.bE, x.bF, x.tau};
  auto fwdbwd = [&] {
    for (Tensor& t : leaves) t.zero_grad();
    Tensor o = m.run(x);
    forge::autograd::backward(forge::ops::sum(o));
  };
  // Give cached blocks back first: the temporaries of make_inputs would
  // otherwise serve the run and hide its memory from the RSS figure.
  forge::empty_cache();
  const long rss0 = reset_peak_rss_kib();
  // The first run is the warm-up and the memory measurement.
  const int64_t base = forge::memory_stats().current;
  forge::reset_peak_memory();
  fwdbwd();
  for (Tensor& t : leaves) t.zero_grad();
  Result r;
  r.peak_bytes = forge::memory_stats().peak - base;
  r.rss_growth_kib = proc_status_kib("VmHWM") - rss0;
  r.fwdbwd_ms = 1e3 * median_time(fwdbwd, budget);
  for (Tensor& t : leaves) t.zero_grad();
  r.fwd_ms = 1e3 * median_time(
                       [&] {
                         forge::NoGradGuard no_grad;
                         Tensor o = m.run(x);
                       },
                       budget);
  return r;
}

const Mechanism* find(const std::string& name) {
  for (const Mechanism& m : mechanisms())
    if (m.name == name) return &m;
  return nullptr;
}

}  // namespace

int bench_attention_main(int argc, char** argv) {
  int64_t max_n = 16384;
  bool csv = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--one" && i + 2 < argc) {
      const Mechanism* m = find(argv[i + 1]);
      FORGE_CHECK(m != nullptr, "unknown mechanism {}", argv[i + 1]);
      const int64_t N = std::stoll(argv[i + 2]);
      const Result r = measure(*m, N, 1.0);
      std::printf("%s,%lld,%.3f,%.3f,%lld,%ld\n", m->name.c_str(), static_cast<long long>(N),
                  r.fwd_ms, r.fwdbwd_ms, static_cast<long long>(r.peak_bytes), r.rss_growth_kib);
      return 0;
    } else if (a == "--list") {
      for (const Mechanism& m : mechanisms()) std::printf("%s\n", m.name.c_str());
      return 0;
    } else if (a == "--max-n" && i + 1 < argc) {
      max_n = std::stoll(argv[++i]);
    } else if (a == "--csv") {
      csv = true;
    } else {
      FORGE_FAIL("unknown argument {} (use --max-n N, --csv, --list or --one NAME N)", a);
    }
  }
  std::printf(csv ? "mechanism,N,fwd_ms,fwdbwd_ms,peak_MiB\n"
                  : "B = %lld, H = %lld, d = %lld, f32, %d threads\n\n| mechanism | N | fwd ms | "
                    "fwd+bwd ms | peak MiB "
                    "|\n|---|---|---|---|---|\n",
              static_cast<long long>(kB), static_cast<long long>(kH), static_cast<long long>(kD),
              forge::num_threads());
  for (const Mechanism& m : mechanisms()) {
    for (int64_t N = 256; N <= max_n; N *= 2) {
      const Result r = measure(m, N, 0.5);
      std::printf(csv ? "%s,%lld,%.3f,%.3f,%.1f\n" : "| %s | %lld | %.2f | %.2f | %.1f |\n",
                  m.name.c_str(), static_cast<long long>(N), r.fwd_ms, r.fwdbwd_ms,
                  static_cast<double>(r.peak_bytes) / (1 << 20));
      std::fflush(stdout);
      if (r.fwdbwd_ms > 30000) break;  // the next N would take minutes
    }
  }
  return 0;
}

