// Attention benchmark (a program, not a test): every mechanism and main
// option, forward and forward+backward time and peak memory, by default
// B = 1, H = 8, d = 64, f32 on the CPU, over N = 256 .. 16384.
//
//   bench_attention [--max-n N] [--csv] [SHAPE]   the whole table (Markdown, or CSV)
//   bench_attention --one NAME N [SHAPE]           one configuration as a CSV line, for
//                                                  bench/torch_attention.py, which runs
//                                                  each configuration in its own process
//                                                  and compares with PyTorch.
//   SHAPE: [--batch B] [--heads H] [--dim d] [--device cpu|cuda] [--dtype f32|bf16|f16]
//          [--autocast bf16|f16] (f32 inputs under autocast, as precision: bf16 | fp16 runs)
//          [--flash-engine tiled|mma|cudnn] (the GPU softmax / local / Linformer forward kernels:
//          ops::attention::set_flash_engine)
//          [--linear-engine fma|mma] (the GPU core of linear / efficient / taylor_linear:
//          ops::attention::set_linear_engine)
//          [--tokens T] (B = max(1, T / N) for each N) [--ns N1,N2,..] [--mechanisms a,b,..]
// Peak memory: the allocator's peak bytes above the inputs during one
// forward+backward (on the GPU: the CUDA allocator's); with --one on the CPU
// also the process's peak-RSS growth (VmHWM after a reset through
// /proc/self/clear_refs), measured the same way as the PyTorch side (0 on
// the GPU). GPU times wait for the device before the clock is read.
#include "bench/attention.h"

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
#include "core/allocator.h"
#include "core/device.h"
#include "core/threading.h"
#include "ops/attention/attention.h"
#include "ops/autocast.h"
#include "ops/ops.h"

namespace {

using forge::DType;
using forge::Tensor;
namespace att = forge::ops::attention;

constexpr int64_t kLinformerK = 256;  // linformer-pytorch's default projected length

// The benchmarked shape, device and dtype (the same for every mechanism).
struct Config {
  int64_t B = 1, H = 8, D = 64;
  int64_t tokens = 0;  // > 0: B = max(1, tokens / N) for each N
  forge::Device device = forge::Device::cpu();
  DType dtype = DType::f32;
  DType autocast = DType::f32;  // bf16 / f16: every run under an AutocastGuard
  int64_t favor_m() const {     // int(d ln d)
    return static_cast<int64_t>(static_cast<double>(D) * std::log(static_cast<double>(D)));
  }
};
Config cfg;

void sync() {
  if (cfg.device.is_cuda()) forge::cuda_synchronize(cfg.device);
}

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
      // The local-attention package's usual window (window_size 256, look_backward 1).
      {"local_w256",
       [](const Inputs& x) { return att::local(x.q, x.k, x.v, Tensor(), {.window = 256}); }},
      {"local_w256_causal",
       [](const Inputs& x) {
         return att::local(x.q, x.k, x.v, Tensor(), {.window = 256, .causal = true});
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

// Drawn in f32 on the CPU, then moved to the benchmarked device and dtype.
Inputs make_inputs(int64_t N) {
  forge::Generator g(1234);
  auto place = [](Tensor t) { return t.to(cfg.device).to(cfg.dtype); };
  auto leaf = [&](const forge::Shape& s, double scale) {
    Tensor t = place(forge::ops::mul(Tensor::randn(s, DType::f32, &g), scale));
    return t.set_requires_grad(true);
  };
  Inputs x;
  x.q = leaf({cfg.B, cfg.H, N, cfg.D}, 1.0);
  x.k = leaf({cfg.B, cfg.H, N, cfg.D}, 1.0);
  x.v = leaf({cfg.B, cfg.H, N, cfg.D}, 1.0);
  const double xavier = std::sqrt(2.0 / static_cast<double>(kLinformerK + N));
  x.E = leaf({kLinformerK, N}, xavier);
  x.F = leaf({kLinformerK, N}, xavier);
  x.bE = leaf({kLinformerK}, 0.0);
  x.bF = leaf({kLinformerK}, 0.0);
  x.W = place(att::gaussian_orthogonal_random_matrix(cfg.favor_m(), cfg.D, 0, DType::f32, &g));
  x.tau = place(Tensor::ones({cfg.H})).set_requires_grad(true);
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
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    sync();
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
    forge::ops::AutocastGuard autocast(cfg.autocast);
    Tensor o = m.run(x);
    forge::autograd::backward(forge::ops::sum(o));
  };
  // Give cached blocks back first: the temporaries of make_inputs would
  // otherwise serve the run and hide its memory from the RSS figure.
  forge::empty_cache();
  sync();
  const long rss0 = reset_peak_rss_kib();
  // The first run is the warm-up and the memory measurement.
  const int64_t base = forge::memory_stats(cfg.device).current;
  forge::reset_peak_memory(cfg.device);
  fwdbwd();
  sync();
  for (Tensor& t : leaves) t.zero_grad();
  Result r;
  r.peak_bytes = forge::memory_stats(cfg.device).peak - base;
  r.rss_growth_kib = cfg.device.is_cpu() ? proc_status_kib("VmHWM") - rss0 : 0;
  r.fwdbwd_ms = 1e3 * median_time(fwdbwd, budget);
  for (Tensor& t : leaves) t.zero_grad();
  r.fwd_ms = 1e3 * median_time(
                       [&] {
                         forge::NoGradGuard no_grad;
                         forge::ops::AutocastGuard autocast(cfg.autocast);
                         Tensor o = m.run(x);
                       },
                       budget);
  return r;
}

// The device's copy bandwidth in bytes/s (bytes read plus written), from the
// median of copying 256 MiB between two buffers: the ceiling of a
// memory-bound kernel.
double copy_bandwidth() {
  static double measured = 0;
  if (measured == 0) {
    const int64_t n = int64_t{1} << 26;  // f32 values
    Tensor src = Tensor::full({n}, 1.0, DType::f32, cfg.device);
    Tensor dst = Tensor::empty({n}, DType::f32, cfg.device);
    const double t = median_time([&] { dst.copy_from(src); }, 0.5);
    measured = 2.0 * static_cast<double>(n) * 4 / t;
  }
  return measured;
}

// The fewest bytes one forward + backward of m must move through memory: q, k,
// v read and o written by the forward; q, k, v and do read and dq, dk, dv
// written by the backward (d = dv here, N = M); Linformer's E and F (shared
// by every head) read twice and their gradients written. Over the copy
// bandwidth, the time no kernel can beat.
double floor_ms(const Mechanism& m, int64_t N) {
  const double elem = static_cast<double>(forge::dtype_size(cfg.dtype));
  const double per_head = 11.0 * static_cast<double>(N * cfg.D);  // 4 N d + 7 N d
  double bytes = elem * per_head * static_cast<double>(cfg.B * cfg.H);
  if (m.name.rfind("linformer", 0) == 0) bytes += elem * 6.0 * 256 * static_cast<double>(N);
  return 1e3 * bytes / copy_bandwidth();
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    if (comma > at) out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

const Mechanism* find(const std::string& name) {
  for (const Mechanism& m : mechanisms())
    if (m.name == name) return &m;
  return nullptr;
}

}  // namespace

int bench_attention_main(int argc, char** argv) {
  int64_t max_n = 16384;
  std::vector<int64_t> ns;         // empty: 256, 512, .. max_n
  std::vector<std::string> names;  // empty: every mechanism
  bool csv = false;
  const Mechanism* one = nullptr;
  int64_t one_n = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--one" && i + 2 < argc) {
      one = find(argv[i + 1]);
      FORGE_CHECK(one != nullptr, "unknown mechanism {} (see --list)", argv[i + 1]);
      one_n = std::stoll(argv[i + 2]);
      i += 2;
    } else if (a == "--batch" && has_value) {
      cfg.B = std::stoll(argv[++i]);
    } else if (a == "--tokens" && has_value) {
      cfg.tokens = std::stoll(argv[++i]);
    } else if (a == "--ns" && has_value) {
      ns.clear();
      for (const std::string& n : split_commas(argv[++i])) ns.push_back(std::stoll(n));
    } else if (a == "--mechanisms" && has_value) {
      names = split_commas(argv[++i]);
    } else if (a == "--heads" && has_value) {
      cfg.H = std::stoll(argv[++i]);
    } else if (a == "--dim" && has_value) {
      cfg.D = std::stoll(argv[++i]);
    } else if (a == "--device" && has_value) {
      const std::string v = argv[++i];
      FORGE_CHECK(v == "cpu" || v == "cuda", "--device must be cpu or cuda, got {}", v);
      cfg.device = v == "cpu" ? forge::Device::cpu() : forge::Device::cuda(0);
      FORGE_CHECK(cfg.device.is_cpu() || forge::cuda_device_count() > 0,
                  "--device cuda, but no CUDA device is visible");
    } else if (a == "--dtype" && has_value) {
      const std::string v = argv[++i];
      FORGE_CHECK(v == "f32" || v == "bf16" || v == "f16",
                  "--dtype must be f32, bf16 or f16, got {}", v);
      cfg.dtype = v == "f32" ? DType::f32 : v == "bf16" ? DType::bf16 : DType::f16;
    } else if (a == "--autocast" && has_value) {
      const std::string v = argv[++i];
      FORGE_CHECK(v == "bf16" || v == "f16", "--autocast must be bf16 or f16, got {}", v);
      cfg.autocast = v == "bf16" ? DType::bf16 : DType::f16;
    } else if (a == "--flash-engine" && has_value) {
      const std::string v = argv[++i];
      FORGE_CHECK(v == "tiled" || v == "mma" || v == "cudnn",
                  "--flash-engine must be tiled, mma or cudnn, got {}", v);
      att::set_flash_engine(v == "tiled" ? forge::cuda::FlashEngine::tiled
                            : v == "mma" ? forge::cuda::FlashEngine::mma
                                         : forge::cuda::FlashEngine::cudnn);
    } else if (a == "--linear-engine" && has_value) {
      const std::string v = argv[++i];
      FORGE_CHECK(v == "fma" || v == "mma", "--linear-engine must be fma or mma, got {}", v);
      att::set_linear_engine(v == "fma" ? forge::cuda::LinearEngine::fma
                                        : forge::cuda::LinearEngine::mma);
    } else if (a == "--list") {
      for (const Mechanism& m : mechanisms()) std::printf("%s\n", m.name.c_str());
      return 0;
    } else if (a == "--max-n" && i + 1 < argc) {
      max_n = std::stoll(argv[++i]);
    } else if (a == "--csv") {
      csv = true;
    } else {
      FORGE_FAIL(
          "unknown argument {} (use --max-n N, --csv, --list, --one NAME N, --batch B, --heads H, "
          "--dim d, --device cpu|cuda, --dtype f32|bf16|f16, --autocast bf16|f16, "
          "--flash-engine tiled|mma|cudnn, --linear-engine fma|mma)",
          a);
    }
  }
  if (ns.empty())
    for (int64_t N = 256; N <= max_n; N *= 2) ns.push_back(N);
  auto batch_for = [](int64_t N) {
    return cfg.tokens > 0 ? std::max<int64_t>(1, cfg.tokens / N) : cfg.B;
  };
  if (one != nullptr) {
    cfg.B = batch_for(one_n);
    const Result r = measure(*one, one_n, 1.0);
    std::printf("%s,%lld,%.3f,%.3f,%lld,%ld\n", one->name.c_str(), static_cast<long long>(one_n),
                r.fwd_ms, r.fwdbwd_ms, static_cast<long long>(r.peak_bytes), r.rss_growth_kib);
    return 0;
  }
  std::printf(csv ? "mechanism,B,N,fwd_ms,fwdbwd_ms,peak_MiB,floor_ms\n"
                  : "H = %lld, d = %lld, %s%s on %s, %d thread%s; copy bandwidth %.1f GB/s\n\n"
                    "| mechanism | B | N | fwd ms | fwd+bwd ms | peak MiB | floor ms | "
                    "fwd+bwd / floor |\n|---|---|---|---|---|---|---|---|\n",
              static_cast<long long>(cfg.H), static_cast<long long>(cfg.D),
              forge::dtype_name(cfg.dtype),
              cfg.autocast == DType::bf16  ? " under bf16 autocast"
              : cfg.autocast == DType::f16 ? " under f16 autocast"
                                           : "",
              cfg.device.str().c_str(), forge::num_threads(), forge::num_threads() == 1 ? "" : "s",
              copy_bandwidth() / 1e9);
  if (names.empty())
    for (const Mechanism& m : mechanisms()) names.push_back(m.name);
  for (const std::string& name : names) {
    const Mechanism* m = find(name);
    FORGE_CHECK(m != nullptr, "unknown mechanism {} (see --list)", name);
    for (int64_t N : ns) {
      cfg.B = batch_for(N);
      Result r;
      try {
        r = measure(*m, N, 0.5);
      } catch (const std::exception& e) {  // out of memory, most likely: say so, go on
        std::printf(csv ? "%s,%lld,%lld,failed,failed,failed,failed\n"
                        : "| %s | %lld | %lld | failed: %s |\n",
                    m->name.c_str(), static_cast<long long>(cfg.B), static_cast<long long>(N),
                    e.what());
        std::fflush(stdout);
        break;
      }
      const double floor = floor_ms(*m, N),
                   peak_mib = static_cast<double>(r.peak_bytes) / (1 << 20);
      if (csv)
        std::printf("%s,%lld,%lld,%.3f,%.3f,%.1f,%.3f\n", m->name.c_str(),
                    static_cast<long long>(cfg.B), static_cast<long long>(N), r.fwd_ms, r.fwdbwd_ms,
                    peak_mib, floor);
      else
        std::printf("| %s | %lld | %lld | %.2f | %.2f | %.1f | %.3f | %.1f |\n", m->name.c_str(),
                    static_cast<long long>(cfg.B), static_cast<long long>(N), r.fwd_ms, r.fwdbwd_ms,
                    peak_mib, floor, r.fwdbwd_ms / floor);
      std::fflush(stdout);
      if (r.fwdbwd_ms > 30000) break;  // the next N would take minutes
    }
  }
  return 0;
}
