// Reductions and layout ops on the GPU against the CPU ops on the same inputs:
// forward and backward, f32 / f64 / bf16 / f16 (16-bit inputs rounded through
// their dtype for the CPU, which computes in f32), several dims and keepdim,
// negative dims, the chunked full reductions, max's tie and NaN rules, layout
// copies of every dtype, the index ops with repeated ids and padding_idx, and
// the errors: out-of-range indices (the CPU's message) and mixed devices.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "ops/layout/layout.h"
#include "ops/reduce/reduce.h"
#include "tests/cuda/cuda_test_util.h"

namespace forge {
namespace {

using namespace testing;
using Ins = std::vector<Tensor>;

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

// The CPU reference of base rounded through dt, in the dtype the CPU computes in.
Tensor on_cpu(const Tensor& base, DType dt) {
  return base.to(dt).to(dt == DType::f64 ? DType::f64 : DType::f32);
}
Tensor on_gpu(const Tensor& base, DType dt) {
  return base.to(dt).to(gpu());
}
Tensor leaf(const Tensor& t) {
  Tensor c = t.clone();
  c.set_requires_grad(true);
  return c;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

// The GPU result within tol of the CPU's everywhere; NaN and infinities must match exactly.
void expect_matches(const Tensor& on_gpu_result, const Tensor& cpu_result, double tol) {
  ASSERT_TRUE(on_gpu_result.defined() && cpu_result.defined());
  ASSERT_EQ(on_gpu_result.device(), gpu());
  ASSERT_EQ(on_gpu_result.shape(), cpu_result.shape());
  const auto a = on_gpu_result.to_vector<double>(), b = cpu_result.to_vector<double>();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double err = std::abs(a[i] - b[i]);
    if (!std::isfinite(b[i]))
      err = (std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i] ? 0 : INFINITY;
    if (std::isnan(err)) err = INFINITY;  // a NaN where the CPU has a number
    if (err > worst) {
      worst = err;
      at = i;
    }
  }
  EXPECT_LE(worst, tol) << "worst at flat index " << at << ": GPU " << a[at] << ", CPU " << b[at];
}

// ---- reductions ----

enum class Reduction { sum, mean, max, logsumexp };

const char* name_of(Reduction k) {
  return k == Reduction::sum    ? "sum"
         : k == Reduction::mean ? "mean"
         : k == Reduction::max  ? "max"
                                : "logsumexp";
}

Tensor reduce(Reduction k, const Tensor& x, const ops::Dims& dims, bool keepdim) {
  switch (k) {
    case Reduction::sum:
      return ops::sum(x, dims, keepdim);
    case Reduction::mean:
      return ops::mean(x, dims, keepdim);
    case Reduction::max:
      return ops::max(x, dims, keepdim);
    case Reduction::logsumexp:
      return ops::logsumexp(x, dims, keepdim);
  }
  return Tensor();
}

Tensor abs_of(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  for (double& e : v) e = std::abs(e);
  return Tensor::from_vector(v, t.shape());
}

TEST(CudaReduce, ForwardAndBackwardMatchTheCpu) {
  FORGE_REQUIRE_CUDA();
  struct Case {
    Shape shape;
    ops::Dims dims;
    bool keepdim;
  };
  const std::vector<Case> cases = {
      {{6, 5, 4}, {}, false},          // everything
      {{6, 5, 4}, {-1}, false},        // the last dim: inner == 1
      {{6, 5, 4}, {0}, true},          // the first: inner > 1
      {{6, 5, 4}, {1}, false},         // the middle
      {{6, 5, 4}, {0, 2}, true},       // split dims: a permuted copy first
      {{3, 1, 7, 2}, {-3, 2}, false},  // a size-1 dim among them
      {{33, 70}, {1}, true},           //
      {{4096, 3}, {0}, false},         // long r, few columns: chunks and a merge pass
      {{50000}, {-1}, true},           // a long full reduction: chunks
  };
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      for (Reduction k : {Reduction::sum, Reduction::mean, Reduction::max, Reduction::logsumexp}) {
        SCOPED_TRACE(std::string(name_of(k)) + " " + dtype_name(dt) + " of " + shape_str(c.shape) +
                     " over " + shape_str(c.dims) + (c.keepdim ? " keepdim" : ""));
        Generator gen(11);
        const Tensor base = Tensor::randn(c.shape, DType::f32, &gen);
        const Tensor xc = leaf(on_cpu(base, dt)), xg = leaf(on_gpu(base, dt));
        const Tensor yc = reduce(k, xc, c.dims, c.keepdim), yg = reduce(k, xg, c.dims, c.keepdim);
        // Sums are compared relative to the sum of magnitudes they add up.
        double scale = std::max(1.0, max_abs(yc));
        if (k == Reduction::sum || k == Reduction::mean)
          scale = std::max(scale, max_abs(reduce(k, abs_of(xc.detach()), c.dims, c.keepdim)));
        expect_matches(yg, yc, tolerance(dt) * scale);

        const Tensor gb = Tensor::randn(yc.shape(), DType::f32, &gen);
        autograd::backward({yc}, {on_cpu(gb, dt)});
        autograd::backward({yg}, {on_gpu(gb, dt)});
        expect_matches(xg.grad(), xc.grad(), tolerance(dt) * std::max(1.0, max_abs(xc.grad())));
      }
    }
  }
}

TEST(CudaReduce, MaxTiesNansInfinitiesAndEmptyGroupsAsOnTheCpu) {
  FORGE_REQUIRE_CUDA();
  const double inf = INFINITY, nan = NAN;
  // Rows: a tie (the first wins), NaNs (the first NaN wins), all -inf, +inf twice.
  const Tensor special = Tensor::from_vector<double>(
      {1, 3, 3, 0, nan, 5, nan, 2, -inf, -inf, -inf, -inf, inf, 1, inf, 0}, {4, 4});
  // A tie across the chunks of a long reduction: every column's maximum is
  // reached first at r = 0 in column 0, at r = 15000 in column 1.
  Tensor ties = Tensor::zeros({20000, 2});
  ties.data<float>()[2 * 15000 + 1] = ties.data<float>()[2 * 19000 + 1] = 1;
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Tensor& base : {special.to(DType::f32), ties}) {
      for (int64_t dim : {0, 1}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(base.shape()) + " dim " +
                     std::to_string(dim));
        const Tensor xc = leaf(on_cpu(base, dt)), xg = leaf(on_gpu(base, dt));
        const Tensor yc = ops::max(xc, {dim}), yg = ops::max(xg, {dim});
        expect_matches(yg, yc, 0);
        expect_matches(ops::logsumexp(xg.detach(), {dim}), ops::logsumexp(xc.detach(), {dim}),
                       tolerance(dt) * 16);
        const Tensor g = Tensor::ones(yc.shape());
        autograd::backward({yc}, {on_cpu(g, dt)});
        autograd::backward({yg}, {on_gpu(g, dt)});
        expect_matches(xg.grad(), xc.grad(), 0);
      }
    }
  }
  // Empty groups: a sum of nothing is 0, a mean NaN, a maximum an error.
  const Tensor empty = Tensor::zeros({0, 3}, DType::f32, gpu());
  expect_matches(ops::sum(empty, {0}), Tensor::zeros({3}), 0);
  expect_matches(ops::mean(empty, {0}), Tensor::full({3}, NAN), 0);
  expect_matches(ops::logsumexp(empty, {0}), Tensor::full({3}, -INFINITY), 0);
  expect_error([&] { ops::max(empty, {0}); }, {"max: cannot reduce over an empty group"});
  expect_error([&] { ops::sum(Tensor::zeros({3}, DType::i32, gpu())); }, {"sum", "i32"});
}

TEST(CudaReduce, CumsumMatchesTheCpu) {
  FORGE_REQUIRE_CUDA();
  struct Case {
    Shape shape;
    int64_t dim;
  };
  const std::vector<Case> cases = {
      {{6, 5, 4}, 1}, {{6, 5, 4}, -1}, {{6, 5, 4}, 0}, {{300}, 0}, {{2, 300, 3}, -2}};
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(c.shape) + " dim " +
                   std::to_string(c.dim));
      Generator gen(5);
      const Tensor base = Tensor::randn(c.shape, DType::f32, &gen);
      const Tensor xc = leaf(on_cpu(base, dt)), xg = leaf(on_gpu(base, dt));
      const Tensor yc = ops::cumsum(xc, c.dim), yg = ops::cumsum(xg, c.dim);
      const double n = static_cast<double>(xc.size(c.dim));  // |terms| summed, at most
      expect_matches(yg, yc, tolerance(dt) * std::max(1.0, max_abs(xc) * n));
      const Tensor gb = Tensor::randn(c.shape, DType::f32, &gen);
      autograd::backward({yc}, {on_cpu(gb, dt)});
      autograd::backward({yg}, {on_gpu(gb, dt)});
      expect_matches(xg.grad(), xc.grad(), tolerance(dt) * std::max(1.0, max_abs(gb) * n));
    }
  }
}

// ---- layout copies: every value and gradient is a copy, so GPU == CPU exactly ----

struct LayoutCase {
  const char* name;
  std::vector<Shape> inputs;
  std::function<Ins(const Ins&)> op;
};

const std::vector<LayoutCase>& layout_cases() {
  static const std::vector<LayoutCase> cases = {
      {"reshape",
       {{4, 6}},
       [](const Ins& x) {
         return Ins{ops::reshape(x[0], {3, -1, 2})};
       }},
      {"flatten", {{2, 3, 4}}, [](const Ins& x) { return Ins{ops::flatten(x[0], 1)}; }},
      {"unsqueeze+squeeze",
       {{3, 4}},
       [](const Ins& x) {
         return Ins{ops::unsqueeze(ops::squeeze(ops::unsqueeze(x[0], -1), 2), 0)};
       }},
      {"transpose", {{3, 4, 5}}, [](const Ins& x) { return Ins{ops::transpose(x[0], 0, 2)}; }},
      {"transpose last",
       {{2, 3, 4, 5}},
       [](const Ins& x) { return Ins{ops::transpose(x[0], -1, -2)}; }},
      {"permute",
       {{3, 4, 5, 2}},
       [](const Ins& x) {
         return Ins{ops::permute(x[0], {2, 0, 3, 1})};
       }},
      {"narrow dim 0 (a view)",
       {{5, 4}},
       [](const Ins& x) { return Ins{ops::narrow(x[0], 0, 1, 3)}; }},
      {"transpose of a view",
       {{5, 4}},
       [](const Ins& x) { return Ins{ops::transpose(ops::narrow(x[0], 0, 1, 3), 0, 1)}; }},
      {"narrow", {{3, 7, 4}}, [](const Ins& x) { return Ins{ops::narrow(x[0], 1, 2, 4)}; }},
      {"narrow last", {{3, 8}}, [](const Ins& x) { return Ins{ops::narrow(x[0], -1, -5, 4)}; }},
      {"slice step", {{3, 4, 9}}, [](const Ins& x) { return Ins{ops::slice(x[0], 2, 1, 8, 3)}; }},
      {"slice negative",
       {{6, 5}},
       [](const Ins& x) { return Ins{ops::slice(x[0], 0, -5, 100, 2)}; }},
      {"cat last",
       {{2, 3, 4}, {2, 3, 8}},
       [](const Ins& x) {
         return Ins{ops::cat({x[0], x[1]}, -1)};
       }},
      {"cat middle",
       {{2, 1, 4}, {2, 5, 4}, {2, 2, 4}},
       [](const Ins& x) {
         return Ins{ops::cat({x[0], x[1], x[2]}, 1)};
       }},
      {"split", {{4, 9, 2}}, [](const Ins& x) { return ops::split(x[0], 4, 1); }},
      {"split sizes",
       {{6, 8}},
       [](const Ins& x) {
         return ops::split(x[0], {1, 5, 2}, -1);
       }},
      {"stack",
       {{3, 4}, {3, 4}},
       [](const Ins& x) {
         return Ins{ops::stack({x[0], x[1]}, 1)};
       }},
      {"stack last",
       {{3, 4}, {3, 4}},
       [](const Ins& x) {
         return Ins{ops::stack({x[0], x[1]}, -1)};
       }},
      {"pad",
       {{3, 4, 5}},
       [](const Ins& x) {
         return Ins{ops::pad(x[0], {1, 2, 0, 3}, 0.5)};
       }},
      {"pad negative",
       {{3, 6, 5}},
       [](const Ins& x) {
         return Ins{ops::pad(x[0], {-1, 2, 2, -3})};
       }},
      {"crop only",
       {{4, 6}},
       [](const Ins& x) {
         return Ins{ops::pad(x[0], {-2, -1})};
       }},
      {"token shift",
       {{3, 17, 20}},
       [](const Ins& x) {
         return Ins{ops::token_shift(x[0], {0, 1, -1, 4, -4, 3, -3, 5, -5})};
       }},
      {"token shift, moving segments from a second tensor",
       {{2, 6, 7}, {2, 6, 7}},
       [](const Ins& x) {
         return Ins{ops::token_shift(x[0], {2, -9, 0}, x[1])};
       }},
  };
  return cases;
}

TEST(CudaLayout, EveryOpForwardAndBackwardEqualTheCpu) {
  FORGE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    for (const LayoutCase& c : layout_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      Generator gen(3);
      Ins xc, xg;
      for (const Shape& s : c.inputs) {
        const Tensor base = Tensor::randn(s, DType::f32, &gen);
        xc.push_back(leaf(on_cpu(base, dt)));
        xg.push_back(leaf(on_gpu(base, dt)));
      }
      const Ins yc = c.op(xc), yg = c.op(xg);
      ASSERT_EQ(yc.size(), yg.size());
      Ins gc, gg;
      for (size_t k = 0; k < yc.size(); ++k) {
        expect_matches(yg[k], yc[k], 0);
        const Tensor gb = Tensor::randn(yc[k].shape(), DType::f32, &gen);
        gc.push_back(on_cpu(gb, dt));
        gg.push_back(on_gpu(gb, dt));
      }
      autograd::backward(yc, gc);
      autograd::backward(yg, gg);
      for (size_t i = 0; i < xc.size(); ++i) expect_matches(xg[i].grad(), xc[i].grad(), 0);
    }
  }
}

TEST(CudaLayout, CopiesAndGathersMoveEveryDtype) {
  FORGE_REQUIRE_CUDA();
  const Tensor idx = Tensor::from_vector<int64_t>({3, 0, 3, 5});
  const Tensor gidx = Tensor::from_vector<int32_t>({0, 4, 4, 1, 2, 3, 0, 0, 1, 1, 2, 4}, {3, 2, 2});
  const std::vector<std::function<Tensor(const Tensor&, bool)>> ops_of = {
      [](const Tensor& x, bool) { return ops::transpose(x, 0, 2); },
      [](const Tensor& x, bool) {
        return ops::permute(x, {1, 2, 0});
      },
      [](const Tensor& x, bool) { return ops::narrow(x, 2, 1, 3); },
      [](const Tensor& x, bool) { return ops::slice(x, 1, 0, 6, 4); },
      [](const Tensor& x, bool) {
        return ops::pad(x, {1, -2, 0, 1}, 1.0);
      },
      [](const Tensor& x, bool) {
        return ops::cat({x, x}, 1);
      },
      [](const Tensor& x, bool) {
        return ops::stack({x, x}, 3);
      },
      [](const Tensor& x, bool) { return ops::split(x, 2, 2)[1]; },
      [&](const Tensor& x, bool g) { return ops::index_select(x, 1, g ? idx.to(gpu()) : idx); },
      [&](const Tensor& x, bool g) { return ops::gather(x, 2, g ? gidx.to(gpu()) : gidx); },
      [&](const Tensor& x, bool g) {
        return ops::embedding(ops::reshape(x, {24, 5}), g ? idx.to(gpu()) : idx);
      },
  };
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64,
                   DType::u8, DType::boolean}) {
    const Tensor h = Tensor::arange(0, 120, 1, DType::i64).view({4, 6, 5}).to(dt);
    for (size_t k = 0; k < ops_of.size(); ++k) {
      const Tensor on_host = ops_of[k](h, false), on_device = ops_of[k](h.to(gpu()), true);
      EXPECT_EQ(on_device.device(), gpu());
      EXPECT_EQ(on_device.shape(), on_host.shape());
      EXPECT_EQ(bytes_of(on_device), bytes_of(on_host)) << "op " << k << " " << dtype_name(dt);
    }
  }
}

// ---- index ops: gathers forward, scatter-adds (atomics on the GPU) backward ----

struct IndexCase {
  const char* name;
  Shape x;
  std::function<Tensor(const Tensor&, Device)> op;  // the index is built on the device
};

TEST(CudaIndexOps, ForwardAndScatterAddBackwardMatchTheCpu) {
  FORGE_REQUIRE_CUDA();
  const auto i64 = [](std::vector<int64_t> v, Shape s, Device d) {
    return Tensor::from_vector(v, s).to(d);
  };
  const auto i32 = [](std::vector<int32_t> v, Shape s, Device d) {
    return Tensor::from_vector(v, s).to(d);
  };
  const std::vector<IndexCase> cases = {
      {"index_select dim 0",
       {5, 4},
       [&](const Tensor& x, Device d) {
         return ops::index_select(x, 0, i64({4, 0, 4, 2, 4}, {5}, d));
       }},
      {"index_select middle",
       {3, 6, 4},
       [&](const Tensor& x, Device d) {
         return ops::index_select(x, 1, i32({5, 1, 1, 0}, {4}, d));
       }},
      {"index_select last",
       {3, 2, 7},
       [&](const Tensor& x, Device d) {
         return ops::index_select(x, -1, i64({6, 6, 6, 2, 0, 3}, {6}, d));
       }},
      {"gather dim 1, smaller index",
       {4, 5, 3},
       [&](const Tensor& x, Device d) {
         return ops::gather(x, 1,
                            i64({0, 4, 4, 4, 1, 2, 3, 3, 0, 0, 2, 1, 4, 4, 4, 4,
                                 1, 2, 0, 3, 3, 2, 1, 0, 2, 2, 2, 2, 0, 1, 1, 1},
                                {4, 4, 2}, d));
       }},
      {"gather last",
       {3, 4},
       [&](const Tensor& x, Device d) {
         return ops::gather(x, -1, i32({3, 3, 0, 1, 1, 1, 2, 0, 3, 2, 2, 2, 2, 1, 0}, {3, 5}, d));
       }},
      {"embedding",
       {10, 8},
       [&](const Tensor& w, Device d) {
         return ops::embedding(w, i64({1, 7, 1, 9, 0, 7, 7, 3}, {2, 4}, d));
       }},
      {"embedding padding_idx",
       {10, 8},
       [&](const Tensor& w, Device d) {
         return ops::embedding(w, i32({2, 5, 2, 2, 9, 5, 0, 2, 1}, {3, 3}, d), 2);
       }},
      {"embedding wide rows",
       {6, 256},
       [&](const Tensor& w, Device d) {
         return ops::embedding(w, i64({5, 5, 0, 3, 5}, {5}, d), 0);
       }},
  };
  for (DType dt : kFloatTypes) {
    for (const IndexCase& c : cases) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      Generator gen(9);
      const Tensor base = Tensor::randn(c.x, DType::f32, &gen);
      const Tensor xc = leaf(on_cpu(base, dt)), xg = leaf(on_gpu(base, dt));
      const Tensor yc = c.op(xc, Device::cpu()), yg = c.op(xg, gpu());
      expect_matches(yg, yc, 0);
      const Tensor gb = Tensor::randn(yc.shape(), DType::f32, &gen);
      autograd::backward({yc}, {on_cpu(gb, dt)});
      autograd::backward({yg}, {on_gpu(gb, dt)});
      // Repeated ids add up to 4 gradients, in an order the atomics choose.
      expect_matches(xg.grad(), xc.grad(), tolerance(dt) * std::max(1.0, max_abs(xc.grad())));
    }
  }
}

TEST(CudaIndexOps, OutOfRangeIndicesRaiseTheCpuErrorAndTheGpuGoesOn) {
  FORGE_REQUIRE_CUDA();
  const Tensor x = Tensor::randn({5, 4});
  const Tensor bad_rows = Tensor::from_vector<int64_t>({1, 4, 5, 0, -1});
  const Tensor bad_ids = Tensor::from_vector<int32_t>({0, 3, -1, 2, 9, 1}, {2, 3});
  const Tensor bad_cols = Tensor::from_vector<int64_t>({0, 3, 4, 1}, {2, 2});
  const std::vector<std::function<void(Device)>> calls = {
      [&](Device d) { ops::index_select(x.to(d), 0, bad_rows.to(d)); },
      [&](Device d) { ops::embedding(x.to(d), bad_ids.to(d), 1); },
      [&](Device d) { ops::gather(x.to(d), -1, bad_cols.to(d)); },
  };
  for (const auto& call : calls) {
    const std::string on_cpu_error = error_of([&] { call(Device::cpu()); });
    EXPECT_NE(on_cpu_error.find("out of range"), std::string::npos) << on_cpu_error;
    EXPECT_EQ(error_of([&] { call(gpu()); }), on_cpu_error);
  }
  // The GPU is fine afterwards.
  const Tensor rows = Tensor::from_vector<int64_t>({4, 0});
  EXPECT_EQ(ops::index_select(x.to(gpu()), 0, rows.to(gpu())).to_vector<float>(),
            ops::index_select(x, 0, rows).to_vector<float>());
}

TEST(CudaIndexOps, MixedDevicesAreErrors) {
  FORGE_REQUIRE_CUDA();
  const Tensor x = Tensor::randn({5, 4}).to(gpu());
  const Tensor rows = Tensor::from_vector<int64_t>({1, 2});
  expect_error([&] { ops::index_select(x, 0, rows); },
               {"index_select", "index is on cpu", "x is on cuda:0"});
  expect_error(
      [&] {
        ops::gather(x, 1, Tensor::zeros({5, 2}, DType::i64));
      },
      {"gather", "index is on cpu", "x is on cuda:0"});
  expect_error([&] { ops::embedding(x.to(Device::cpu()), rows.to(gpu())); },
               {"embedding", "ids is on cuda:0", "weight is on cpu"});
  expect_error(
      [&] {
        ops::cat({x, Tensor::randn({5, 4})}, 0);
      },
      {"cat", "tensor 1 is on cpu", "tensor 0 is on cuda:0"});
  expect_error(
      [&] {
        ops::stack({x, Tensor::randn({5, 4})}, 0);
      },
      {"stack", "tensor 1 is on cpu", "tensor 0 is on cuda:0"});
}

}  // namespace
}  // namespace forge
