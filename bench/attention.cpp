// Attention benchmark (a program, not a test): the cases of
// ops/attention/cases.h (each mechanism's one list, the one gradcheck and the
// GPU tests run), forward and forward+backward time and peak memory, by
// default B = 1, H = 8, d = 64, f32 on the CPU, over N = 256 .. 16384. A case
// runs at q, k, v [B, H, N, d] (M = N, dv = d; its mechanism's own size, FAVOR+'s
// features or Linformer's k, the reference's default).
//
//   bench_attention [--max-n N] [--csv] [SHAPE]   the table of the cases marked `bench`
//                                                  (Markdown, or CSV)
//   bench_attention --one NAME N [SHAPE]           one configuration as a CSV line, for
//                                                  bench/torch_attention.py, which runs
//                                                  each configuration in its own process
//                                                  and compares with PyTorch.
//   bench_attention --list                         every case (* marks the table's rows)
//   SHAPE: [--batch B] [--heads H] [--dim d] [--device cpu|cuda] [--dtype f32|bf16|f16]
//          [--autocast bf16|f16] (f32 inputs under autocast, as precision: bf16 | fp16 runs)
//          [--flash-engine tiled|mma|cudnn] (the GPU softmax / local / Linformer forward kernels:
//          ops::attention::set_flash_engine)
//          [--linear-engine fma|mma] (the GPU core of linear / efficient / taylor_linear:
//          ops::attention::set_linear_engine)
//          [--tokens T] (B = max(1, T / N) for each N) [--ns N1,N2,..]
//          [--mechanisms a,b,..] (case names, or "all": every case)
//          [--budget S] (seconds of repeats per timing; at least 3 runs each)
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
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/threading.h"
#include "ops/attention/attention.h"
#include "ops/attention/cases.h"
#include "ops/autocast.h"
#include "ops/ops.h"

namespace {

using forge::DType;
using forge::Tensor;
namespace att = forge::ops::attention;

using att::AttentionCase;
using att::CaseDims;

constexpr int64_t kLinformerK = 256;  // linformer-pytorch's default projected length

// The benchmarked shape, device and dtype (the same for every case).
struct Config {
  int64_t B = 1, H = 8, D = 64;
  int64_t tokens = 0;  // > 0: B = max(1, tokens / N) for each N
  forge::Device device = forge::Device::cpu();
  DType dtype = DType::f32;
  DType autocast = DType::f32;  // bf16 / f16: every run under an AutocastGuard
};
Config cfg;

void sync() {
  if (cfg.device.is_cuda()) forge::cuda_synchronize(cfg.device);
}

// The case's inputs at N (made in f64 on the CPU), moved to the benchmarked
// device and dtype: floating ones keep whether they require grad.
std::vector<Tensor> make_inputs(const AttentionCase& c, int64_t N) {
  const CaseDims dims{.B = cfg.B, .H = cfg.H, .N = N, .M = N, .d = cfg.D, .dv = cfg.D, .k = 0};
  std::vector<Tensor> in = c.make_inputs(dims);
  for (Tensor& t : in) {
    if (!t.defined()) continue;
    const bool grad = t.requires_grad();
    Tensor placed = t.detach().to(cfg.device);
    if (forge::is_floating(placed.dtype())) placed = placed.to(cfg.dtype);
    t = grad ? placed.set_requires_grad(true) : placed;
  }
  return in;
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

Result measure(const AttentionCase& c, int64_t N, double budget) {
  const std::vector<Tensor> x = make_inputs(c, N);
  std::vector<Tensor> leaves;
  for (const Tensor& t : x)
    if (t.defined() && t.requires_grad()) leaves.push_back(t);
  auto fwdbwd = [&] {
    for (Tensor& t : leaves) t.zero_grad();
    forge::ops::AutocastGuard autocast(cfg.autocast);
    Tensor o = c.fn(x);
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
                         Tensor o = c.fn(x);
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
double floor_ms(const AttentionCase& c, int64_t N) {
  const double elem = static_cast<double>(forge::dtype_size(cfg.dtype));
  const double per_head = 11.0 * static_cast<double>(N * cfg.D);  // 4 N d + 7 N d
  double bytes = elem * per_head * static_cast<double>(cfg.B * cfg.H);
  if (c.name.rfind("linformer/", 0) == 0)
    bytes += elem * 6.0 * kLinformerK * static_cast<double>(N);
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

const AttentionCase* find(const std::string& name) {
  const AttentionCase* c = att::find_attention_case(name);
  FORGE_CHECK(c != nullptr, "unknown case {} (see --list)", name);
  return c;
}

}  // namespace

int bench_attention_main(int argc, char** argv) {
  int64_t max_n = 16384;
  std::vector<int64_t> ns;         // empty: 256, 512, .. max_n
  std::vector<std::string> names;  // empty: the cases marked `bench`
  bool csv = false;
  double budget = -1;  // < 0: 1 s for --one, 0.5 s a row for the table
  const AttentionCase* one = nullptr;
  int64_t one_n = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--one" && i + 2 < argc) {
      one = find(argv[i + 1]);
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
      if (names == std::vector<std::string>{"all"}) {
        names.clear();
        for (const AttentionCase& c : att::attention_cases()) names.push_back(c.name);
      }
    } else if (a == "--budget" && has_value) {
      budget = std::stod(argv[++i]);
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
      for (const AttentionCase& c : att::attention_cases())
        std::printf("%s%s\n", c.name.c_str(), c.bench ? " *" : "");
      return 0;
    } else if (a == "--max-n" && i + 1 < argc) {
      max_n = std::stoll(argv[++i]);
    } else if (a == "--csv") {
      csv = true;
    } else {
      FORGE_FAIL(
          "unknown argument {} (use --max-n N, --csv, --list, --one NAME N, --mechanisms "
          "a,b,..|all, "
          "--ns N1,N2,.., --budget S, --batch B, --tokens T, --heads H, "
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
    one_n = one->length_for(one_n);
    cfg.B = batch_for(one_n);
    const Result r = measure(*one, one_n, budget < 0 ? 1.0 : budget);
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
    for (const AttentionCase& c : att::attention_cases())
      if (c.bench) names.push_back(c.name);
  for (const std::string& name : names) {
    const AttentionCase* m = find(name);
    for (int64_t asked : ns) {
      const int64_t N = m->length_for(asked);
      cfg.B = batch_for(N);
      Result r;
      try {
        r = measure(*m, N, budget < 0 ? 0.5 : budget);
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
