// The bf16 GEMM of ops/blas.h on oneDNN's matmul primitive. A primitive is
// built once per shape (its kernels are generated for it) and kept in a
// per-thread cache, so that tiles of the attention kernels, which call from
// inside OpenMP regions, never share one: the primitive and its stream run
// on the calling thread.
#include <fmt/format.h>

#include <dnnl.hpp>
#include <map>
#include <tuple>
#include <unordered_map>

#include "core/error.h"
#include "ops/blas.h"
#include "ops/blas_core.h"

namespace forge::ops {

namespace {

using Dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

// Everything a primitive is built for.
using Key =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float>;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A primitive with its argument map: memory objects made once without a
// buffer, pointed at each call's operands (no allocation per call).
struct Gemm {
  dnnl::matmul primitive;
  std::unordered_map<int, dnnl::memory> args;
};

// Shapes seen by one thread; cleared when it grows past a few hundred (a
// run's shapes are few: its layers, the attention tiles and their edges).
constexpr size_t kMaxCached = 512;

Gemm build(const Key& key) {
  const auto [ta, tb, n, m, k, lda, ldb, ldc, alpha, beta] = key;
  // op(a) [n, k] and op(b) [k, m] as strided views: a transpose is a stride swap.
  const dnnl::memory::desc a({n, k}, dt::bf16, ta ? Dims{1, lda} : Dims{lda, 1});
  const dnnl::memory::desc b({k, m}, dt::bf16, tb ? Dims{1, ldb} : Dims{ldb, 1});
  const dnnl::memory::desc c({n, m}, dt::f32, Dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops post;
    post.append_sum(beta);  // c = alpha a b + beta c
    attr.set_post_ops(post);
  }
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
    const auto unbound = [](const dnnl::memory::desc& md) {
      return dnnl::memory(md, cpu_engine(), DNNL_MEMORY_NONE);
    };
    return {
        dnnl::matmul(pd),
        {{DNNL_ARG_SRC, unbound(a)}, {DNNL_ARG_WEIGHTS, unbound(b)}, {DNNL_ARG_DST, unbound(c)}}};
  } catch (const dnnl::error& e) {
    FORGE_FAIL(
        "gemm (bf16): oneDNN has no bf16 matmul for [{}, {}] x [{}, {}] on this CPU ({}): {}", n, k,
        k, m, blas::describe(blas::cpu_features()), e.what());
  }
}

}  // namespace

void gemm(bool ta, bool tb, int64_t n, int64_t m, int64_t k, float alpha, const BF16* a,
          int64_t lda, const BF16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (n == 0 || m == 0) return;
  if (k == 0) {  // no products: c = beta c, as BLAS
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  thread_local std::map<Key, Gemm> cache;
  thread_local dnnl::stream stream(cpu_engine());
  const Key key{ta, tb, n, m, k, lda, ldb, ldc, alpha, beta};
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= kMaxCached) cache.clear();
    it = cache.emplace(key, build(key)).first;
  }
  Gemm& g = it->second;
  // oneDNN takes non-const handles; the operands are only read.
  g.args.at(DNNL_ARG_SRC).set_data_handle(const_cast<BF16*>(a));
  g.args.at(DNNL_ARG_WEIGHTS).set_data_handle(const_cast<BF16*>(b));
  g.args.at(DNNL_ARG_DST).set_data_handle(c);
  g.primitive.execute(stream, g.args);
  stream.wait();
}

std::string bf16_gemm_summary() {
  const dnnl_version_t* v = dnnl_version();
  const blas::CpuFeatures f = blas::cpu_features();
  const char* native = f.amx_bf16 ? "AMX" : "AVX512-BF16";
  return f.bf16() ? fmt::format("oneDNN {}.{}.{}, {} on this CPU: precision: bf16 runs here",
                                v->major, v->minor, v->patch, native)
                  : fmt::format(
                        "oneDNN {}.{}.{}; this CPU has neither AVX512-BF16 nor AMX: "
                        "precision: bf16 is refused here",
                        v->major, v->minor, v->patch);
}

}  // namespace forge::ops
