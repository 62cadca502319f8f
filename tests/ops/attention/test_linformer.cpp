// linformer: gradcheck of every option, forward and all seven gradients against
// a naive composite of primitive ops (dropout included), f32 against f64, the
// shorter-than-Mmax rule, the dropout stream, errors and the memory rule.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "core/threading.h"
#include "ops/attention/attention.h"
#include "tests/ops/attention/attention_test_util.h"

namespace forge {
namespace {

using ops::attention::linformer;
using ops::attention::LinformerOptions;
using namespace testing;

struct Inputs {
  Tensor q, k, v, E, F, bE, bF;  // bE, bF undefined for "no bias"
};

Inputs make_inputs(DType dtype, int64_t N, int64_t M, int64_t Mmax, int64_t kdim, int64_t d,
                   int64_t dv, bool bias) {
  Inputs in{uniform({2, 2, N, d}, 61, dtype),
            uniform({2, 2, M, d}, 62, dtype),
            uniform({2, 2, M, dv}, 63, dtype),
            uniform({kdim, Mmax}, 64, dtype, -0.3, 0.3),
            uniform({kdim, Mmax}, 65, dtype, -0.3, 0.3),
            Tensor(),
            Tensor()};
  if (bias) {
    in.bE = uniform({kdim}, 66, dtype);
    in.bF = uniform({kdim}, 67, dtype);
  }
  return in;
}

// The contract with primitive ops: project with E[:, :M] and F[:, :M], a full
// softmax over the kdim projected keys, and dropout from the op's Philox draws
// (element ((b H + h) N + i) kdim + j of the stream at (seed, offset)).
Tensor naive_linformer(const Inputs& in, const Tensor& mask, double p, GeneratorState rng) {
  using namespace ops;
  const int64_t B = in.q.size(0), H = in.q.size(1), N = in.q.size(2), M = in.k.size(2),
                kdim = in.E.size(0);
  Tensor k = in.k, v = in.v;
  if (mask.defined()) {
    const Tensor m = mask.to(in.q.dtype()).view({B, 1, M, 1});
    k = k * m;
    v = v * m;
  }
  Tensor K = matmul(narrow(in.E, 1, 0, M), k), V = matmul(narrow(in.F, 1, 0, M), v);
  if (in.bE.defined()) K = K + reshape(in.bE, {kdim, 1});
  if (in.bF.defined()) V = V + reshape(in.bF, {kdim, 1});
  Tensor P = softmax(
      matmul(in.q, K, false, true) * (1.0 / std::sqrt(static_cast<double>(in.q.size(3)))), -1);
  if (p > 0) {
    Generator g;
    g.set_state(rng);
    const uint64_t offset = g.reserve(static_cast<uint64_t>(B * H * N * kdim));
    Tensor keep = Tensor::empty(P.shape(), DType::f64);
    double* kp = keep.data<double>();
    for (int64_t x = 0; x < keep.numel(); ++x)
      kp[x] = static_cast<double>(
                  Generator::uniform_f32(rng.seed, offset, static_cast<uint64_t>(x))) >= p
                  ? 1.0 / (1.0 - p)
                  : 0.0;
    P = P * keep.to(P.dtype());
  }
  return matmul(P, V);
}

Tensor run_op(const Inputs& in, const Tensor& mask, double p, GeneratorState rng) {
  Generator g;
  g.set_state(rng);
  return linformer(in.q, in.k, in.v, in.E, in.F, in.bE, in.bF, mask, LinformerOptions{p, &g});
}

// The output and the gradients of sum(o * w) for every input, in f64.
std::vector<Tensor> outputs_and_grads(const std::function<Tensor(const Inputs&)>& fn, DType dtype,
                                      int64_t N, int64_t M, int64_t Mmax, int64_t kdim, bool bias) {
  const Inputs in = make_inputs(dtype, N, M, Mmax, kdim, 12, 10, bias);
  const Tensor o = fn(in);
  const Tensor w = uniform(o.shape(), 68, dtype, -1, 1, false);
  autograd::backward(ops::sum(o * w));
  std::vector<Tensor> out = {o.detach(),  in.q.grad(), in.k.grad(),
                             in.v.grad(), in.E.grad(), in.F.grad()};
  if (bias) {
    out.push_back(in.bE.grad());
    out.push_back(in.bF.grad());
  }
  for (Tensor& t : out) t = t.to(DType::f64);
  return out;
}

// expect_close on each output/gradient got[i] and want[i], naming i.
void expect_each_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                       double tol) {
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("output/gradient " + std::to_string(i));
    testing::expect_close(got[i], want[i], tol);
  }
}

struct Config {
  const char* name;
  int64_t N, M, Mmax, kdim;
  bool mask, bias;
  double dropout;
};

TEST(AttentionLinformer, MatchesNaiveReference) {
  const GeneratorState rng{1234, 17};
  for (const Config& c : {Config{"full", 48, 48, 48, 16, false, true, 0},
                          Config{"mask", 41, 41, 41, 16, true, true, 0},
                          Config{"short", 45, 37, 50, 12, false, true, 0},
                          Config{"no_bias", 40, 40, 40, 16, false, false, 0},
                          Config{"dropout", 44, 44, 44, 16, false, true, 0.2},
                          Config{"short+mask+dropout", 300, 290, 320, 24, true, true, 0.3}}) {
    SCOPED_TRACE(c.name);
    const Tensor mask = c.mask ? testing::padding_mask(2, c.M, {2, 9}) : Tensor();
    const auto got =
        outputs_and_grads([&](const Inputs& in) { return run_op(in, mask, c.dropout, rng); },
                          DType::f64, c.N, c.M, c.Mmax, c.kdim, c.bias);
    const auto want = outputs_and_grads(
        [&](const Inputs& in) { return naive_linformer(in, mask, c.dropout, rng); }, DType::f64,
        c.N, c.M, c.Mmax, c.kdim, c.bias);
    ASSERT_EQ(got.size(), want.size());
    expect_each_close(got, want, 1e-10);
  }
}

// With fewer batch-heads than threads, the backward splits each batch-head's
// row tiles into runs with their own dK/dV partials and sums them: the result
// must not change.
TEST(AttentionLinformer, TileRunsAcrossThreadsMatchNaiveReference) {
  const GeneratorState rng{99, 3};
  const int saved = num_threads();
  set_num_threads(8);  // 4 batch-heads, 8 threads: 2 runs of tiles per batch-head
  const Tensor mask = testing::padding_mask(2, 290, {2, 9});
  const auto got = outputs_and_grads([&](const Inputs& in) { return run_op(in, mask, 0.3, rng); },
                                     DType::f64, 300, 290, 320, 24, true);
  set_num_threads(saved);
  const auto want =
      outputs_and_grads([&](const Inputs& in) { return naive_linformer(in, mask, 0.3, rng); },
                        DType::f64, 300, 290, 320, 24, true);
  ASSERT_EQ(got.size(), want.size());
  expect_each_close(got, want, 1e-10);
}

TEST(AttentionLinformer, Float32MatchesFloat64) {
  const GeneratorState rng{99, 0};
  const Tensor mask = testing::padding_mask(2, 150, {0, 13});
  auto fn = [&](const Inputs& in) { return run_op(in, mask, 0.1, rng); };
  const auto f32 = outputs_and_grads(fn, DType::f32, 200, 150, 160, 32, true);
  const auto f64 = outputs_and_grads(fn, DType::f64, 200, 150, 160, 32, true);
  expect_each_close(f32, f64, 5e-5);
}

TEST(AttentionLinformer, ShortInputUsesTheFirstColumns) {
  // M < Mmax equals the op with E, F cut to their first M columns; the unused
  // columns get a zero gradient.
  const Inputs in = make_inputs(DType::f64, 9, 6, 11, 5, 4, 3, true);
  const Tensor o = linformer(in.q, in.k, in.v, in.E, in.F, in.bE, in.bF);
  autograd::backward(ops::sum(o));
  const Tensor Ec = ops::narrow(in.E.detach(), 1, 0, 6), Fc = ops::narrow(in.F.detach(), 1, 0, 6);
  testing::expect_close(o,
                        linformer(in.q.detach(), in.k.detach(), in.v.detach(), Ec, Fc,
                                  in.bE.detach(), in.bF.detach()),
                        1e-14);
  for (const Tensor& g : {in.E.grad(), in.F.grad()}) {
    const auto x = g.to_vector<double>();
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t j = 6; j < 11; ++j) EXPECT_EQ(x[static_cast<size_t>(r * 11 + j)], 0.0);
  }
}

TEST(AttentionLinformer, DropoutReservesItsDrawsAndNoneWithout) {
  const Inputs in = make_inputs(DType::f32, 10, 10, 10, 6, 4, 4, true);
  Generator g(5);
  linformer(in.q, in.k, in.v, in.E, in.F, in.bE, in.bF, Tensor(), LinformerOptions{0.0, &g});
  EXPECT_EQ(g.offset(), 0u);
  linformer(in.q, in.k, in.v, in.E, in.F, in.bE, in.bF, Tensor(), LinformerOptions{0.5, &g});
  EXPECT_EQ(g.offset(), static_cast<uint64_t>((2 * 2 * 10 * 6 + 3) / 4));
  // Two calls draw different masks; the same state draws the same one.
  Generator g2(5);
  const Tensor a =
      linformer(in.q, in.k, in.v, in.E, in.F, in.bE, in.bF, Tensor(), LinformerOptions{0.5, &g2});
  const Tensor b =
      linformer(in.q, in.k, in.v, in.E, in.F, in.bE, in.bF, Tensor(), LinformerOptions{0.5, &g2});
  g2.set_state({5, 0});
  const Tensor c =
      linformer(in.q, in.k, in.v, in.E, in.F, in.bE, in.bF, Tensor(), LinformerOptions{0.5, &g2});
  EXPECT_GT(testing::max_abs_diff(a, b), 1e-3);
  EXPECT_EQ(testing::max_abs_diff(a, c), 0.0);
}

TEST(AttentionLinformer, ErrorsNameTheOpAndArgument) {
  const Inputs in = make_inputs(DType::f64, 5, 7, 6, 4, 3, 3, true);
  EXPECT_NE(error_of([&] {
              linformer(in.q, in.k, in.v, in.E, in.F, in.bE, in.bF);
            }).find("linformer: k has M = 7 positions but E, F [kdim, Mmax] cover Mmax = 6"),
            std::string::npos);
  const Tensor k = ops::narrow(in.k.detach(), 2, 0, 6), v = ops::narrow(in.v.detach(), 2, 0, 6);
  EXPECT_NE(error_of([&] {
              linformer(in.q, k, v, in.E, Tensor::zeros({4, 5}, DType::f64), in.bE, in.bF);
            }).find("linformer: F must be [4, 6], got [4, 5]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              linformer(in.q, k, v, in.E, in.F, Tensor::zeros({3}, DType::f64), in.bF);
            }).find("linformer: bias_E must be [4], got [3]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              linformer(in.q, k, v, in.E.to(DType::f32), in.F, in.bE, in.bF);
            }).find("linformer: E is f32 but q is f64"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              linformer(in.q, k, v, in.E, in.F, in.bE, in.bF, Tensor(), LinformerOptions{1.0});
            }).find("linformer: dropout must be in [0, 1)"),
            std::string::npos);
}

TEST(AttentionLinformer, MemoryGrowsLinearly) {
  // N x kdim is what Linformer is allowed to hold; with kdim fixed the peak must
  // grow linearly in N and stay far below one N x N buffer. E, F [kdim, N] are
  // inputs, made before the measurement (their gradients count).
  const int64_t kdim = 64;
  auto peak = [&](int64_t N) {
    const Tensor E = uniform({kdim, N}, 71, DType::f32, -0.1, 0.1),
                 F = uniform({kdim, N}, 72, DType::f32, -0.1, 0.1),
                 bE = uniform({kdim}, 73, DType::f32), bF = uniform({kdim}, 74, DType::f32);
    return testing::attention_peak_bytes(
        [&](const Tensor& q, const Tensor& k, const Tensor& v) {
          return linformer(q, k, v, E, F, bE, bF);
        },
        N, 16);
  };
  const testing::PeakBytes p = testing::expect_peaks_linear_in_n(peak, "linformer");
  RecordProperty("peak_bytes_2048", std::to_string(p.n2048));
  RecordProperty("peak_bytes_8192", std::to_string(p.n8192));
}

}  // namespace
}  // namespace forge
