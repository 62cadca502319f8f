#include "ops/blas_core.h"

#include <cpuid.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ops/blas.h"

extern "C" char* openblas_get_corename();
extern "C" char* openblas_get_config();

namespace forge::blas {

namespace {

// The environment our re-execution passes to itself: the core OpenBLAS chose
// (so the new process knows it was corrected, and from what), and why a
// correction was undone.
constexpr const char* kChosenVar = "ATTNFORGE_BLAS_OPENBLAS_CHOSE";
constexpr const char* kRevertedVar = "ATTNFORGE_BLAS_REVERTED";
constexpr const char* kTestVar = "ATTNFORGE_BLAS_TEST";

uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(uint32_t word, int b) {
  return (word >> b) & 1u;
}

}  // namespace

CpuFeatures cpu_features() {
  CpuFeatures f;
  uint32_t a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const uint32_t max_leaf = a;
  f.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
  __get_cpuid(1, &a, &b, &c, &d);
  const bool fma = bit(c, 12), osxsave = bit(c, 27), avx = bit(c, 28);
  if (!osxsave || !avx) return f;
  const uint64_t xcr = xcr0();
  if ((xcr & 0x6) != 0x6) return f;  // the OS does not save XMM and YMM state
  f.avx = true;
  if (max_leaf < 7) return f;
  __get_cpuid_count(7, 0, &a, &b, &c, &d);
  f.avx2 = bit(b, 5) && fma;
  const bool zmm_saved = (xcr & 0xe0) == 0xe0;  // opmask, ZMM0-15 upper halves, ZMM16-31
  f.avx512 = zmm_saved && bit(b, 16) && bit(b, 17) && bit(b, 30) && bit(b, 31);
  const bool amx_saved = (xcr & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
  f.amx_bf16 = amx_saved && bit(d, 22) && bit(d, 24);
  const uint32_t max_sub = a;
  if (max_sub >= 1) {
    __get_cpuid_count(7, 1, &a, &b, &c, &d);
    f.avx512_bf16 = f.avx512 && bit(a, 5);
  }
  return f;
}

std::string describe(const CpuFeatures& f) {
  std::string s = f.avx512 ? "AVX-512" : f.avx2 ? "AVX2 + FMA" : f.avx ? "AVX" : "SSE only";
  if (f.avx512_bf16) s += ", AVX512-BF16";
  if (f.amx_bf16) s += ", AMX-BF16";
  return s;
}

std::string best_core(const CpuFeatures& f) {
  if (f.avx512 && f.avx512_bf16) return "Cooperlake";
  if (f.avx512) return "SkylakeX";
  if (f.avx2) return f.amd ? "Zen" : "Haswell";
  if (f.avx) return "Sandybridge";
  return "";
}

int core_level(std::string_view core) {
  struct Level {
    const char* name;
    int level;
  };
  // OpenBLAS's x86-64 cores (its getarch names), by the widest vector
  // arithmetic their GEMM kernels use.
  static constexpr Level kLevels[] = {
      {"Prescott", 0},   {"Core2", 0},        {"Penryn", 0},
      {"Dunnington", 0}, {"Nehalem", 0},      {"Atom", 0},
      {"Opteron", 0},    {"Opteron_SSE3", 0}, {"Barcelona", 0},
      {"Bobcat", 0},     {"Unknown", 0},      {"Sandybridge", 1},
      {"Bulldozer", 1},  {"Piledriver", 1},   {"Steamroller", 1},
      {"Haswell", 2},    {"Zen", 2},          {"Excavator", 2},
      {"SkylakeX", 3},   {"Cooperlake", 4},   {"SapphireRapids", 4},
  };
  for (const auto& l : kLevels)
    if (core == l.name) return l.level;
  return -1;
}

bool is_generic(std::string_view core, const CpuFeatures& f) {
  const std::string best = best_core(f);
  const int level = core_level(core);
  return !best.empty() && level >= 0 && level < core_level(best);
}

namespace {

sigjmp_buf g_sigill_jump;
extern "C" void on_sigill(int) {
  siglongjmp(g_sigill_jump, 1);
}

// Runs fn with a SIGILL turned into `false`. The jump out of the signal
// handler skips the destructors of fn's frames, so fn must own nothing (it
// only calls a GEMM on buffers its caller owns).
template <typename Fn>
bool without_sigill(Fn fn) {
  struct sigaction action {};
  struct sigaction previous {};
  action.sa_handler = on_sigill;
  sigemptyset(&action.sa_mask);
  sigaction(SIGILL, &action, &previous);
  bool ran = true;
  if (sigsetjmp(g_sigill_jump, 1) == 0)
    fn();
  else
    ran = false;
  sigaction(SIGILL, &previous, nullptr);
  return ran;
}

// c = alpha op(a) op(b) + beta c in long double, the oracle of the self-check.
template <typename T>
std::string compare_gemm(const char* name, bool ta, bool tb, int n, int m, int k,
                         const std::vector<T>& a, const std::vector<T>& b, const std::vector<T>& c0,
                         const std::vector<T>& c, T alpha, T beta) {
  const int lda = ta ? n : k, ldb = tb ? k : m;
  // The rounding error of a k-term sum, doubled: a wrong kernel is off by O(1).
  const long double eps = 2 * (k + 2) * static_cast<long double>(std::numeric_limits<T>::epsilon());
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) {
      long double sum = 0, mag = 0;
      for (int p = 0; p < k; ++p) {
        const long double x = ta ? a[p * lda + i] : a[i * lda + p];
        const long double y = tb ? b[j * ldb + p] : b[p * ldb + j];
        sum += x * y;
        mag += std::fabs(x * y);
      }
      const long double want = alpha * sum + beta * static_cast<long double>(c0[i * m + j]);
      const long double tol =
          eps * (std::fabs(alpha) * mag + std::fabs(beta * c0[i * m + j])) + 1e-30L;
      if (!(std::fabs(c[i * m + j] - want) <= tol))
        return fmt::format("{} ({}{}, {}x{}x{}) c[{}][{}] = {} where a plain loop gives {}", name,
                           ta ? "T" : "N", tb ? "T" : "N", n, m, k, i, j,
                           static_cast<double>(c[i * m + j]), static_cast<double>(want));
    }
  return "";
}

// Shapes with full kernel tiles and ragged edges in every dimension, small
// enough for OpenBLAS to run them on this thread (it threads above 262144
// multiply-adds).
template <typename T, typename Fn>
std::string check_gemms(const char* name, Fn gemm) {
  static constexpr int kShapes[][3] = {
      {1, 1, 1}, {7, 5, 3}, {48, 32, 64}, {37, 29, 71}, {65, 33, 97}};
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<T>(static_cast<int>(state >> 9) - (1 << 22)) / static_cast<T>(1 << 22);
  };
  for (const auto& s : kShapes)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const int n = s[0], m = s[1], k = s[2];
      std::vector<T> a(static_cast<size_t>(n) * k), b(static_cast<size_t>(k) * m),
          c0(static_cast<size_t>(n) * m);
      for (auto& x : a) x = next();
      for (auto& x : b) x = next();
      for (auto& x : c0) x = next();
      std::vector<T> c = c0;
      const T alpha = static_cast<T>(0.75), beta = static_cast<T>(t == 3 ? 0 : -0.5);
      const bool ran = without_sigill([&] {
        gemm(ta, tb, n, m, k, alpha, a.data(), ta ? n : k, b.data(), tb ? k : m, beta, c.data(), m);
      });
      if (!ran)
        return fmt::format("{} ({}{}, {}x{}x{}): an illegal instruction (SIGILL)", name,
                           ta ? "T" : "N", tb ? "T" : "N", n, m, k);
      std::string err = compare_gemm(name, ta, tb, n, m, k, a, b, c0, c, alpha, beta);
      if (!err.empty()) return err;
    }
  return "";
}

// A GEMM that is wrong in one element: ATTNFORGE_BLAS_TEST's ",broken".
void broken_sgemm(bool ta, bool tb, int64_t n, int64_t m, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  ops::gemm(ta, tb, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc);
  c[0] += 1.0f;
}

}  // namespace

std::string gemm_self_check(SgemmFn sgemm, DgemmFn dgemm) {
  std::string err = check_gemms<float>("sgemm", sgemm);
  return err.empty() ? check_gemms<double>("dgemm", dgemm) : err;
}

const SgemmFn kOpsSgemm = &ops::gemm;
const DgemmFn kOpsDgemm = &ops::gemm;

std::string gemm_self_check() {
  return gemm_self_check(kOpsSgemm, kOpsDgemm);
}

namespace {

// A function-local static: the constructor below may run before this file's
// dynamic initialisation.
KernelChoice& choice() {
  static KernelChoice c;
  return c;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

[[noreturn]] void reexec(char** argv) {
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "attnforge: could not re-execute itself to change OpenBLAS's kernels: %s\n",
               std::strerror(errno));
  std::_Exit(127);
}

// Runs before main (glibc passes a constructor argc, argv and the
// environment), after OpenBLAS has chosen its core.
__attribute__((constructor)) void choose_kernels(int argc, char** argv, char**) {
  KernelChoice& k = choice();
  const std::string core = openblas_get_corename();
  const CpuFeatures features = cpu_features();
  k.core = core;
  k.best = best_core(features);
  const std::string test = env(kTestVar);
  const bool broken = test.find(",broken") != std::string::npos;
  const std::string chose_before = env(kChosenVar);
  if (!chose_before.empty()) {  // we asked for this core in a re-execution
    k.openblas = chose_before;
    k.reverted = env(kRevertedVar);
    if (!k.reverted.empty()) return;  // and went back to OpenBLAS's choice
    k.corrected = true;
    const std::string asked = env("OPENBLAS_CORETYPE");
    std::string why;
    if (core != asked) {
      why = fmt::format("this OpenBLAS has no {} core", asked);
    } else if (std::string err = gemm_self_check(broken ? broken_sgemm : kOpsSgemm, kOpsDgemm);
               !err.empty()) {
      why = fmt::format("{} failed its self-check: {}", asked, err);
    }
    if (why.empty() || argc < 1 || argv == nullptr) return;
    setenv(kRevertedVar, why.c_str(), 1);
    setenv("OPENBLAS_CORETYPE", chose_before.c_str(), 1);
    reexec(argv);
  }
  if (!env("OPENBLAS_CORETYPE").empty()) {
    k.by_user = true;
    return;
  }
  const std::string chosen = test.empty() ? core : test.substr(0, test.find(','));
  k.openblas = chosen;
  if (!is_generic(chosen, features) || argc < 1 || argv == nullptr) return;
  setenv(kChosenVar, chosen.c_str(), 1);
  setenv("OPENBLAS_CORETYPE", k.best.c_str(), 1);
  reexec(argv);
}

}  // namespace

const KernelChoice& kernel_choice() {
  return choice();
}

std::string kernel_summary() {
  const KernelChoice& k = choice();
  const CpuFeatures f = cpu_features();
  const std::string cpu = describe(f);
  if (!k.reverted.empty())
    return fmt::format(
        "{} kernels (OpenBLAS's choice, slow on this CPU with {}: {}; {} was "
        "not kept)",
        k.core, cpu, k.reverted, k.best);
  if (k.corrected)
    return fmt::format(
        "{} kernels (corrected by attnforge: OpenBLAS chose {} on this CPU with {}; "
        "self-checked)",
        k.core, k.openblas, cpu);
  if (k.by_user)
    return fmt::format("{} kernels (OPENBLAS_CORETYPE){}", k.core,
                       is_generic(k.core, f)
                           ? fmt::format(": slow on this CPU with {}; unset it for {}", cpu, k.best)
                           : std::string());
  return fmt::format("{} kernels (OpenBLAS's choice on this CPU with {})", k.core, cpu);
}

std::string openblas_config() {
  return openblas_get_config();
}

}  // namespace forge::blas
