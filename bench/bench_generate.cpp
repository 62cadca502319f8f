// Generation benchmark (a program, not a test): tokens/s of
// LanguageModel::generate with incremental decoding against the context length.
//
//   bench_generate [--max-len 32768] [--mechanisms softmax,local,linear,favor,efficient]
//                  [--new-tokens 32] [--threads 2] [--depth 4] [--dim 512] [--heads 8]
//                  [--device cpu|cuda] [--state-on-gpu]
// On a GPU the model decodes by recomputing its window for every token unless
// --state-on-gpu keeps the linear, efficient and favor heads' state on the
// device (GenerateOptions::state_on_gpu).
//
// For each mechanism and context length L = 1k, 2k, 4k, .. up to --max-len,
// a causal model (B = 1, D = 512 and H = 8 unless set, f32, CPU, learned positions,
// vocabulary 256) is primed with L random tokens and draws --new-tokens + 2.
//   prime s     the prime up to the first draw: one Stack::step over L tokens
//               (the forward's ops, filling the state).
//   ms / token  the mean time per draw over the last --new-tokens draws, each
//               one token decoded at context ~L, sampling included (the first
//               decode is left out: it may double softmax's KV cache).
//   peak MiB    the allocator's peak during the call above what was held
//               before it (weights excluded): the prime's activations, the state.
// softmax keeps a KV cache (per-token cost linear in L); local a band of 2
// windows of 256; linear, favor (softmax kernel, prefix stabiliser,
// m = int(d ln d)) and efficient (bucket 64) running sums (flat in L). The
// default run takes about 3 minutes on 2 idle cores, most of it softmax's
// O(L^2) primes; --depth 2 halves it.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "core/allocator.h"
#include "core/threading.h"
#include "nn/models.h"

namespace {

using forge::Tensor;
namespace nn = forge::nn;

struct Options {
  int64_t max_len = 32768, new_tokens = 32, depth = 4, dim = 512, heads = 8;
  std::vector<std::string> mechanisms = {"softmax", "local", "linear", "favor", "efficient"};
  int threads = 2;
  forge::Device device = forge::Device::cpu();
  bool state_on_gpu = false;
};

nn::LanguageModelConfig make_config(const Options& o, const std::string& mechanism) {
  nn::LanguageModelConfig c;
  c.vocab_size = 256;
  c.max_len = o.max_len + o.new_tokens + 2;
  c.dim = o.dim;
  c.stack.depth = o.depth;
  nn::AttentionConfig& a = c.stack.block.attention;
  a.kind = nn::mechanism_from_name(mechanism);
  a.heads = o.heads;
  a.local_window = 256;
  return c;
}

struct Result {
  double prime_s = 0, ms_per_token = 0, peak_mib = 0;
};

Result measure(nn::LanguageModel& lm, const Options& o, int64_t L) {
  using clock = std::chrono::steady_clock;
  forge::Generator g(static_cast<uint64_t>(L));
  std::vector<int64_t> ids(static_cast<size_t>(L));
  const auto u = Tensor::rand({L}, forge::DType::f64, &g).to_vector<double>();
  for (int64_t i = 0; i < L; ++i) ids[i] = static_cast<int64_t>(u[i] * 256) % 256;
  const Tensor prime = Tensor::from_vector(ids, {1, L});
  std::vector<clock::time_point> draws;
  nn::GenerateOptions go;
  go.gen = &g;
  go.state_on_gpu = o.state_on_gpu;
  go.on_token = [&](const std::vector<int64_t>&) { draws.push_back(clock::now()); };
  const int64_t before = forge::memory_stats(o.device).current;
  forge::reset_peak_memory(o.device);
  const auto t0 = clock::now();
  lm.generate(prime, o.new_tokens + 2, go);
  Result r;
  r.peak_mib = double(forge::memory_stats(o.device).peak - before) / (1 << 20);
  r.prime_s = std::chrono::duration<double>(draws.front() - t0).count();
  r.ms_per_token = std::chrono::duration<double, std::milli>(draws.back() - draws[1]).count() /
                   double(o.new_tokens);
  return r;
}

int run(int argc, char** argv) {
  Options o;
  forge::bench::parse_bench_args(
      argc, argv,
      {{"--max-len", &o.max_len},
       {"--mechanisms", &o.mechanisms},
       {"--new-tokens", &o.new_tokens},
       {"--threads", &o.threads},
       {"--depth", &o.depth},
       {"--dim", &o.dim},
       {"--heads", &o.heads},
       {"--device",
        [&](const std::string& d) {
          FORGE_CHECK(d == "cpu" || d == "cuda", "--device must be cpu or cuda, got {}", d);
          FORGE_CHECK(d == "cpu" || forge::cuda_device_count() > 0,
                      "--device cuda, but no CUDA device is visible");
          o.device = d == "cpu" ? forge::Device::cpu() : forge::Device::cuda(0);
        }},
       {"--state-on-gpu", &o.state_on_gpu}});
  FORGE_CHECK(o.max_len >= 1024, "--max-len must be >= 1024 (the first context), got {}",
              o.max_len);
  FORGE_CHECK(o.new_tokens >= 1, "--new-tokens must be >= 1, got {}", o.new_tokens);
  forge::set_num_threads(o.threads);
  std::printf(
      "B = 1, D = %lld, H = %lld (d = %lld), depth %lld, ff mult 4, f32, %s%s, %d thread%s; "
      "%lld new tokens after a prime of L\n\n",
      static_cast<long long>(o.dim), static_cast<long long>(o.heads),
      static_cast<long long>(o.dim / o.heads), static_cast<long long>(o.depth),
      o.device.str().c_str(),
      o.device.is_cuda() ? (o.state_on_gpu ? " (state on the GPU)" : " (recomputing)") : "",
      forge::num_threads(), forge::num_threads() == 1 ? "" : "s",
      static_cast<long long>(o.new_tokens));
  std::printf(
      "| mechanism | L | prime s | ms / token | tokens/s | peak MiB |\n"
      "|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (const std::string& mechanism : o.mechanisms) {
    forge::Generator init(1);
    nn::LanguageModel lm(make_config(o, mechanism), &init);
    lm.fix_projections();
    lm.to(o.device);
    FORGE_CHECK(lm.stack().supports_recurrent(), "{} does not decode incrementally", mechanism);
    for (int64_t L = 1024; L <= o.max_len; L *= 2) {
      const Result r = measure(lm, o, L);
      std::printf("| %s | %lld | %.2f | %.2f | %.1f | %.0f |\n", mechanism.c_str(),
                  static_cast<long long>(L), r.prime_s, r.ms_per_token, 1e3 / r.ms_per_token,
                  r.peak_mib);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return forge::bench::bench_main("bench_generate", argc, argv, run);
}
