// Which OpenBLAS kernels this process runs, chosen from the CPU's features.
//
// OpenBLAS (Debian's DYNAMIC_ARCH build) picks its kernels ("core") from the
// CPU's model number when it loads. A model it does not know gets Prescott's
// SSE3 kernels: Debian's 0.3.21 on Sapphire, Emerald and Granite Rapids runs
// sgemm at a sixth of the speed its Cooperlake or SkylakeX kernels reach on
// the same CPU. The library cannot change its choice once loaded, so before
// main() every program that links the ops (attnforge, the tests, the benches)
// compares OpenBLAS's choice with the best core the CPU's features (cpuid,
// with the OS's consent from XCR0) call for and, when OpenBLAS chose worse,
// re-executes itself with OPENBLAS_CORETYPE naming the better core. The
// re-executed process checks that core's GEMMs against a plain loop (a SIGILL
// counts as a failure) and goes back to OpenBLAS's own choice if they
// disagree. A user's own OPENBLAS_CORETYPE is always kept.
//
// ATTNFORGE_BLAS_TEST (tests only) pretends OpenBLAS chose the core it names
// ("Prescott"), and with ",broken" also makes the self-check fail, so that the
// correction and its fallback can be tested on any CPU.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace forge::blas {

// What this CPU offers the GEMM kernels (each only when the OS saves the
// registers it needs).
struct CpuFeatures {
  bool amd = false;  // AuthenticAMD (OpenBLAS's AVX2 core there is "Zen")
  bool avx = false;
  bool avx2 = false;    // with FMA
  bool avx512 = false;  // F, BW, DQ and VL: what OpenBLAS's SkylakeX kernels use
  bool avx512_bf16 = false;
  bool amx_bf16 = false;
  // Multiplies bf16 itself: what precision: bf16 on the CPU needs (oneDNN).
  bool bf16() const { return avx512_bf16 || amx_bf16; }
};

CpuFeatures cpu_features();
// "AVX-512 BF16, AMX" ...: the features above in words, for logs.
std::string describe(const CpuFeatures& f);

// The best core Debian's OpenBLAS has for these features ("Cooperlake",
// "SkylakeX", "Haswell", "Zen", "Sandybridge"), or "" for a CPU without AVX.
std::string best_core(const CpuFeatures& f);
// 0 for OpenBLAS's SSE-era cores (Prescott, Nehalem, ...), 1 AVX, 2 AVX2,
// 3 AVX-512, 4 AVX-512 with BF16; -1 for a name not listed here (a core of a
// newer OpenBLAS, never taken for generic).
int core_level(std::string_view core);
// True when `core` is a worse choice on a CPU with features f than best_core.
bool is_generic(std::string_view core, const CpuFeatures& f);

// GEMMs in ops/blas.h's row-major form, so the self-check can be given wrong
// ones in tests.
using SgemmFn = void (*)(bool ta, bool tb, int64_t n, int64_t m, int64_t k, float alpha,
                         const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                         float* c, int64_t ldc);
using DgemmFn = void (*)(bool ta, bool tb, int64_t n, int64_t m, int64_t k, double alpha,
                         const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                         double* c, int64_t ldc);
// The f32 and f64 ops::gemm (ops/blas.h) as those: what every op calls.
extern const SgemmFn kOpsSgemm;
extern const DgemmFn kOpsDgemm;
// sgemm and dgemm in every transpose case, with edge tiles, against a plain
// loop in long double: "" when they agree, else what differed first. A
// SIGILL inside them is reported, not raised.
std::string gemm_self_check(SgemmFn sgemm, DgemmFn dgemm);
// The same on kOpsSgemm / kOpsDgemm.
std::string gemm_self_check();

// This process's kernels and how they were chosen.
struct KernelChoice {
  std::string core;        // openblas_get_corename()
  std::string openblas;    // the core OpenBLAS chose itself ("" when it was not asked)
  std::string best;        // best_core(cpu_features())
  bool corrected = false;  // attnforge asked for `core` instead of `openblas`
  bool by_user = false;    // OPENBLAS_CORETYPE came from the user
  std::string reverted;    // why a correction was undone ("" when it was not)
};
const KernelChoice& kernel_choice();
// One line for `attnforge info` and run logs: "Cooperlake kernels (corrected
// by attnforge: OpenBLAS chose Prescott on this CPU with AVX-512, BF16)".
std::string kernel_summary();
// openblas_get_config(): version and build options.
std::string openblas_config();

}  // namespace forge::blas
