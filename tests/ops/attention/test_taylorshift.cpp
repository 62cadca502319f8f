// Tests of attention::taylorshift (ATTENTION.md, "taylorshift"): gradcheck of
// every registered case, both forms against a naive O(N^2) composite of
// primitive ops and against each other, f32 against f64, padding invariance,
// argument errors and the memory rule (no N x M buffer in either form).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "autograd/engine.h"
#include "ops/attention/attention.h"
#include "tests/ops/attention/attention_test_util.h"

namespace forge {
namespace {

using ops::attention::TaylorShiftOptions;
using testing::error_of;

constexpr int64_t kForceDirect = int64_t{1} << 40;

TaylorShiftOptions direct_form(TaylorShiftOptions o = {}) {
  o.n0 = kForceDirect;
  return o;
}
TaylorShiftOptions efficient_form(TaylorShiftOptions o = {}) {
  o.n0 = -1;
  return o;
}

// The naive composite, straight from ATTENTION.md's direct form: q [B, H, N, d],
// k [B, H, M, d], v [B, H, M, dv], tau [H], mask [B, M] or undefined.
Tensor naive_taylorshift(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& tau,
                         const Tensor& mask, const TaylorShiftOptions& o) {
  using namespace ops;
  const int64_t B = q.size(0), H = q.size(1), M = k.size(2), d = q.size(3);
  const Tensor qh = q / sqrt(sum(square(q), {-1}, true)) * reshape(tau, {1, H, 1, 1});
  const Tensor kh = k / sqrt(sum(square(k), {-1}, true));
  const Tensor A = matmul(qh, kh, false, true);  // [B, H, N, M]
  Tensor T = A * A * o.a + A * o.b + o.c;
  // Real-key count per batch: the n of sqrt(n / d).
  Tensor real = Tensor::ones({B, 1, 1, M}, q.dtype());
  if (mask.defined()) {
    real = mask.to(q.dtype()).view({B, 1, 1, M});
    T = T * real;
  }
  Tensor out = matmul(T / sum(T, {-1}, true), v);
  if (o.output_normalized) out = out * sqrt(sum(real, {-1}, true) / static_cast<double>(d));
  return out;
}

struct Grads {
  Tensor out, dq, dk, dv, dtau;
};

// The output and the gradients of sum(out * g) for a fixed random g.
Grads run(
    const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&)>& fn,
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& tau) {
  Tensor q2 = q.detach().clone().set_requires_grad(true),
         k2 = k.detach().clone().set_requires_grad(true),
         v2 = v.detach().clone().set_requires_grad(true),
         t2 = tau.detach().clone().set_requires_grad(true);
  Tensor out = fn(q2, k2, v2, t2);
  const Tensor g = testing::uniform(out.shape(), 99, out.dtype(), -1, 1, false);
  autograd::backward(ops::sum(ops::mul(out, g)));
  return {out.detach(), q2.grad(), k2.grad(), v2.grad(), t2.grad()};
}

// max |a - b| <= tol * max(1, max |b|)
void expect_rel_close(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  double mag = 1;
  for (double x : b.to_vector<double>()) mag = std::max(mag, std::abs(x));
  EXPECT_LE(testing::max_abs_diff(a, b), tol * mag) << what;
}

void expect_same(const Grads& a, const Grads& b, double tol, const std::string& what) {
  expect_rel_close(a.out, b.out, tol, what + ": output");
  expect_rel_close(a.dq, b.dq, tol, what + ": dq");
  expect_rel_close(a.dk, b.dk, tol, what + ": dk");
  expect_rel_close(a.dv, b.dv, tol, what + ": dv");
  expect_rel_close(a.dtau, b.dtau, tol, what + ": dtau");
}

struct MediumCase {
  const char* name;
  int64_t N, M;
  bool mask;
  TaylorShiftOptions options;
};

std::vector<MediumCase> medium_cases() {
  TaylorShiftOptions coeffs;
  coeffs.a = 0.3;
  coeffs.b = -0.4;
  coeffs.c = 0.5;
  TaylorShiftOptions normalized;
  normalized.output_normalized = true;
  return {{"plain", 40, 40, false, {}},
          {"mask", 40, 40, true, {}},
          {"cross+mask", 33, 47, true, {}},
          {"coefficients", 40, 40, false, coeffs},
          {"output_normalized+mask", 37, 44, true, normalized}};
}

struct Inputs {
  Tensor q, k, v, tau, mask;
};

Inputs medium_inputs(const MediumCase& c, DType dtype = DType::f64) {
  const int64_t B = 2, H = 2, d = 8, dv = 12;
  return {testing::uniform({B, H, c.N, d}, 1, dtype), testing::uniform({B, H, c.M, d}, 2, dtype),
          testing::uniform({B, H, c.M, dv}, 3, dtype), testing::uniform({H}, 4, dtype, 0.5, 2.0),
          c.mask ? testing::padding_mask(B, c.M, {3, 11}) : Tensor()};
}

TEST(AttentionTaylorShift, BothFormsMatchNaiveComposite) {
  for (const MediumCase& c : medium_cases()) {
    const Inputs in = medium_inputs(c);
    const Grads ref =
        run([&](const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& t) { return naive_taylorshift(q, k, v, t, in.mask, c.options); },
            in.q, in.k, in.v, in.tau);
    for (bool direct : {true, false}) {
      const TaylorShiftOptions o = direct ? direct_form(c.options) : efficient_form(c.options);
      const Grads got =
          run([&](const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& t) { return ops::attention::taylorshift(q, k, v, t, in.mask, o); },
              in.q, in.k, in.v, in.tau);
      expect_same(got, ref, 1e-10, std::string(c.name) + (direct ? " direct" : " efficient"));
    }
  }
}

TEST(AttentionTaylorShift, DirectEqualsEfficient) {
  // Longer than one tile (64 query rows, 128 key rows) so that tiling is exercised.
  MediumCase c{"long cross+mask", 150, 270, true, {}};
  const Inputs in = medium_inputs(c);
  auto with = [&](const TaylorShiftOptions& o) {
    return run([&](const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& t) { return ops::attention::taylorshift(q, k, v, t, in.mask, o); },
               in.q, in.k, in.v, in.tau);
  };
  expect_same(with(efficient_form()), with(direct_form()), 1e-10, "efficient vs direct");
}

TEST(AttentionTaylorShift, Float32MatchesFloat64) {
  for (const MediumCase& c : medium_cases()) {
    const Inputs in64 = medium_inputs(c);
    const Inputs in32{in64.q.to(DType::f32), in64.k.to(DType::f32), in64.v.to(DType::f32),
                      in64.tau.to(DType::f32), in64.mask};
    for (bool direct : {true, false}) {
      const TaylorShiftOptions o = direct ? direct_form(c.options) : efficient_form(c.options);
      auto fn = [&](const Inputs& in) {
        return run(
            [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& t) {
              return ops::attention::taylorshift(q, k, v, t, in.mask, o);
            },
            in.q, in.k, in.v, in.tau);
      };
      const Grads g32 = fn(in32), g64 = fn(in64);
      EXPECT_EQ(g32.out.dtype(), DType::f32);
      EXPECT_EQ(g32.dtau.dtype(), DType::f32);
      expect_same({g32.out.to(DType::f64), g32.dq.to(DType::f64), g32.dk.to(DType::f64),
                   g32.dv.to(DType::f64), g32.dtau.to(DType::f64)},
                  g64, 2e-4, std::string(c.name) + (direct ? " direct f32" : " efficient f32"));
    }
  }
}

// n = the real-key count: padded keys change nothing, so a padded batch gives
// exactly the output of its unpadded prefix (output_normalized included).
TEST(AttentionTaylorShift, PaddedKeysMatchTruncatedInput) {
  const int64_t H = 2, N = 9, M = 12, real = 8, d = 4, dv = 5;
  const auto [q, k, v] = testing::qkv_inputs(1, H, N, M, d, dv, 5);
  const Tensor tau = testing::uniform({H}, 8, DType::f64, 0.5, 1.5, false);
  const Tensor mask = testing::padding_mask(1, M, {M - real});
  const Tensor kt = ops::narrow(k, 2, 0, real), vt = ops::narrow(v, 2, 0, real);
  for (bool normalized : {false, true})
    for (bool direct : {true, false}) {
      TaylorShiftOptions o;
      o.output_normalized = normalized;
      o = direct ? direct_form(o) : efficient_form(o);
      testing::expect_close(ops::attention::taylorshift(q, k, v, tau, mask, o),
                            ops::attention::taylorshift(q, kt, vt, tau, Tensor(), o), 1e-12);
    }
}

TEST(AttentionTaylorShift, FullyMaskedBatchGivesZeros) {
  const Tensor q = testing::uniform({2, 1, 5, 3}, 1), k = testing::uniform({2, 1, 6, 3}, 2),
               v = testing::uniform({2, 1, 6, 4}, 3),
               tau = testing::uniform({1}, 4, DType::f64, 0.5, 1.5);
  const Tensor mask = testing::padding_mask(2, 6, {0, 6});
  for (bool direct : {true, false}) {
    const Grads g = run(
        [&](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& t) {
          return ops::attention::taylorshift(a, b, c, t, mask,
                                             direct ? direct_form() : efficient_form());
        },
        q, k, v, tau);
    const auto out = g.out.to_vector<double>(), dq = g.dq.to_vector<double>(),
               dv = g.dv.to_vector<double>();
    for (size_t i = out.size() / 2; i < out.size(); ++i) EXPECT_EQ(out[i], 0.0);
    for (size_t i = dq.size() / 2; i < dq.size(); ++i) EXPECT_EQ(dq[i], 0.0);
    for (size_t i = dv.size() / 2; i < dv.size(); ++i) EXPECT_EQ(dv[i], 0.0);
    for (double x : g.dtau.to_vector<double>()) EXPECT_TRUE(std::isfinite(x));
  }
}

TEST(AttentionTaylorShift, ErrorsNameTheProblem) {
  const Tensor q = Tensor::ones({1, 2, 4, 3}), k = Tensor::ones({1, 2, 5, 3}),
               v = Tensor::ones({1, 2, 5, 2});
  const Tensor tau = Tensor::ones({2});
  auto err = [&](const TaylorShiftOptions& o, const Tensor& t) {
    return error_of([&] { ops::attention::taylorshift(q, k, v, t, Tensor(), o); });
  };
  TaylorShiftOptions a0;
  a0.a = 0;
  EXPECT_NE(err(a0, tau).find("coefficient a must be > 0, got a = 0"), std::string::npos);
  TaylorShiftOptions cs;
  cs.c = 0.4;  // b^2 / (4 a) = 0.5
  EXPECT_NE(err(cs, tau).find("c >= b^2 / (4 a) = 0.5"), std::string::npos);
  TaylorShiftOptions n0;
  n0.n0 = -2;
  EXPECT_NE(err(n0, tau).find("n0 must be -1"), std::string::npos);
  EXPECT_NE(err({}, Tensor::ones({3})).find("tau must be [H] = [2], got [3]"), std::string::npos);
  EXPECT_NE(err({}, Tensor::ones({2}, DType::f64)).find("tau must be a CPU f32 tensor"),
            std::string::npos);
  EXPECT_NE(err({}, Tensor()).find("tau is undefined"), std::string::npos);
  EXPECT_NE(error_of([&] {
              ops::attention::taylorshift(q, k, Tensor::ones({1, 2, 4, 2}), tau);
            }).find("taylorshift"),
            std::string::npos);
}

// Forward + backward peak bytes at N = 2048 and 8192 (d = 16): no N x N
// buffer in either form, and the efficient form grows linearly.
TEST(AttentionTaylorShift, MemoryEfficientFormGrowsLinearly) {
  auto fn = [](const Tensor& q, const Tensor& k, const Tensor& v) {
    return ops::attention::taylorshift(q, k, v, Tensor::ones({1}), Tensor(), efficient_form());
  };
  const int64_t p2k = testing::attention_peak_bytes(fn, 2048, 16),
                p8k = testing::attention_peak_bytes(fn, 8192, 16);
  RecordProperty("peak_2048", std::to_string(p2k));
  RecordProperty("peak_8192", std::to_string(p8k));
  std::printf("taylorshift efficient peak bytes: N=2048 %lld, N=8192 %lld\n",
              static_cast<long long>(p2k), static_cast<long long>(p8k));
  EXPECT_LE(static_cast<double>(p8k) / static_cast<double>(p2k), 4.6);
  EXPECT_LT(p8k, int64_t{8192} * 8192 * 4 / 16);
}

TEST(AttentionTaylorShift, MemoryDirectFormHasNoNxNBuffer) {
  auto fn = [](const Tensor& q, const Tensor& k, const Tensor& v) {
    return ops::attention::taylorshift(q, k, v, Tensor::ones({1}), Tensor(), direct_form());
  };
  const int64_t p2k = testing::attention_peak_bytes(fn, 2048, 16),
                p8k = testing::attention_peak_bytes(fn, 8192, 16);
  std::printf("taylorshift direct peak bytes: N=2048 %lld, N=8192 %lld\n",
              static_cast<long long>(p2k), static_cast<long long>(p8k));
  EXPECT_LE(static_cast<double>(p8k) / static_cast<double>(p2k), 4.6);
  EXPECT_LT(p8k, int64_t{8192} * 8192 * 4 / 16);
}

}  // namespace
}  // namespace forge

namespace forge::ops::attention {
namespace {

TEST(AttentionTaylorShift, FormDifferenceCheckReportsRounding) {
  // The reference's self-check: the two forms agree to rounding (f64 ~1e-15,
  // f32 ~1e-7 relative), and the check is sensitive (different seeds differ).
  const FormDifference f64 = taylorshift_form_difference(2, 2, 40, 8, DType::f64, 1);
  EXPECT_LT(f64.mean_abs, 1e-13);
  EXPECT_LT(f64.mean_rel, 1e-11);
  EXPECT_GT(f64.mean_abs, 0.0);
  const FormDifference f32 = taylorshift_form_difference(2, 2, 40, 8, DType::f32, 1);
  EXPECT_LT(f32.mean_abs, 1e-5);
  EXPECT_GT(f32.mean_abs, f64.mean_abs);
}

}  // namespace
}  // namespace forge::ops::attention
