// OpenBLAS's kernels: the core this process runs is the best the CPU's
// features call for, the choice from features, and the GEMM self-check that
// guards a corrected core. (The re-execution itself, and its fallback when
// the self-check fails, are tested through `attnforge info` in
// tests/cli/test_cli.sh with ATTNFORGE_BLAS_TEST.)
#include <gtest/gtest.h>

#include "ops/blas_core.h"

namespace forge::blas {
namespace {

// The acceptance test of the whole mechanism: this test binary went through
// the start-up choice like every program that links the ops.
TEST(BlasCore, ThisProcessRunsTheBestCoreForItsCpu) {
  const CpuFeatures f = cpu_features();
  if (!f.avx2 && !f.avx512)
    GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512 (" << describe(f) << ")";
  const KernelChoice& k = kernel_choice();
  EXPECT_FALSE(is_generic(k.core, f))
      << "OpenBLAS runs its " << k.core << " kernels on a CPU with " << describe(f) << ", where "
      << best_core(f) << " is the best; " << kernel_summary();
  EXPECT_GE(core_level(k.core), core_level(best_core(f))) << kernel_summary();
}

TEST(BlasCore, BestCoreFromFeatures) {
  CpuFeatures emerald_rapids{.amd = false,
                             .avx = true,
                             .avx2 = true,
                             .avx512 = true,
                             .avx512_bf16 = true,
                             .amx_bf16 = true};
  EXPECT_EQ(best_core(emerald_rapids), "Cooperlake");
  CpuFeatures skylake_sp{.avx = true, .avx2 = true, .avx512 = true};
  EXPECT_EQ(best_core(skylake_sp), "SkylakeX");
  CpuFeatures haswell{.avx = true, .avx2 = true};
  EXPECT_EQ(best_core(haswell), "Haswell");
  CpuFeatures zen2{.amd = true, .avx = true, .avx2 = true};
  EXPECT_EQ(best_core(zen2), "Zen");
  CpuFeatures sandy{.avx = true};
  EXPECT_EQ(best_core(sandy), "Sandybridge");
  EXPECT_EQ(best_core(CpuFeatures{}), "");

  // Debian's OpenBLAS 0.3.21 on Emerald Rapids: Prescott, the case that
  // made this mechanism.
  EXPECT_TRUE(is_generic("Prescott", emerald_rapids));
  EXPECT_TRUE(is_generic("Haswell", emerald_rapids));
  EXPECT_TRUE(is_generic("SkylakeX", emerald_rapids));
  EXPECT_FALSE(is_generic("Cooperlake", emerald_rapids));
  EXPECT_FALSE(is_generic("SapphireRapids", emerald_rapids));
  EXPECT_TRUE(is_generic("Nehalem", haswell));
  EXPECT_FALSE(is_generic("Zen", haswell));
  EXPECT_FALSE(is_generic("Prescott", CpuFeatures{}));  // nothing better exists
  // A core this table does not know (a newer OpenBLAS's) is never corrected.
  EXPECT_EQ(core_level("Zen5"), -1);
  EXPECT_FALSE(is_generic("Zen5", emerald_rapids));
}

TEST(BlasCore, SelfCheckPassesOnThisProcessKernels) {
  EXPECT_EQ(gemm_self_check(), "");
  EXPECT_EQ(gemm_self_check(kOpsSgemm, kOpsDgemm), "");
}

// Wrong in one element of one transpose case only: the check covers them all.
void sgemm_wrong_when_both_transposed(bool ta, bool tb, int64_t n, int64_t m, int64_t k,
                                      float alpha, const float* a, int64_t lda, const float* b,
                                      int64_t ldb, float beta, float* c, int64_t ldc) {
  kOpsSgemm(ta, tb, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (ta && tb && n > 60) c[(n - 1) * ldc + m - 1] += 0.05f;
}

// Treats beta as 0 (a kernel bug of the kind the check exists for).
void dgemm_ignoring_beta(bool ta, bool tb, int64_t n, int64_t m, int64_t k, double alpha,
                         const double* a, int64_t lda, const double* b, int64_t ldb, double,
                         double* c, int64_t ldc) {
  kOpsDgemm(ta, tb, n, m, k, alpha, a, lda, b, ldb, 0.0, c, ldc);
}

void sgemm_illegal_instruction(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                               const float*, int64_t, float, float*, int64_t) {
  __builtin_trap();  // ud2: what a kernel using instructions the CPU lacks raises
}

TEST(BlasCore, SelfCheckCatchesWrongKernels) {
  const std::string one = gemm_self_check(sgemm_wrong_when_both_transposed, kOpsDgemm);
  EXPECT_NE(one.find("sgemm (TT, 65x33x97) c[64][32]"), std::string::npos) << one;
  const std::string beta = gemm_self_check(kOpsSgemm, dgemm_ignoring_beta);
  EXPECT_NE(beta.find("dgemm (NN, 1x1x1)"), std::string::npos) << beta;
  const std::string sigill = gemm_self_check(sgemm_illegal_instruction, kOpsDgemm);
  EXPECT_NE(sigill.find("sgemm (NN, 1x1x1): an illegal instruction"), std::string::npos) << sigill;
  // The handler is gone afterwards and the check works again.
  EXPECT_EQ(gemm_self_check(), "");
}

TEST(BlasCore, SummaryNamesTheKernels) {
  const std::string s = kernel_summary();
  EXPECT_EQ(s.rfind(kernel_choice().core + " kernels (", 0), 0u) << s;
  EXPECT_NE(openblas_config().find("OpenBLAS"), std::string::npos);
}

}  // namespace
}  // namespace forge::blas
