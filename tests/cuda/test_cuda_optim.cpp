// The optimizers, gradient clipping and GradScaler on GPU parameters and grads
// against the same runs on the CPU: SGD (momentum, dampening, Nesterov, L2),
// Adam, AdamW and LAMB over a few steps in f32 and f64; grad_norm and
// clip_grad_norm; state dicts moving between a GPU and a CPU optimizer; an
// overflow skipping the step.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/elementwise/elementwise.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/lamb.h"
#include "optim/sgd.h"
#include "tests/cuda/cuda_test_util.h"

namespace forge::optim {
namespace {

using forge::testing::gpu;

const Device kCpu = Device::cpu();

// The largest |got - want| / max(1, |want|) over all elements must be <= tol.
void expect_close_rel(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto a = got.to_vector<double>(), b = want.to_vector<double>();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i]));
    if (!(err <= worst)) {
      worst = err;
      at = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": worst at flat index " << at << " (got " << a[at] << ", want "
                        << b[at] << ")";
}

double tol_of(DType dtype) {
  return dtype == DType::f32 ? 1e-6 : 1e-13;
}

// The parameters of the runs: w (600, 1000), more elements than one sweep of
// the grid covers, and an empty e (0) in group 0, which decays; b (37) in
// group 1, without decay at half the lr. Values from a fixed seed.
struct Params {
  std::vector<Tensor> list;  // w, e, b

  Params(DType dtype, Device device) {
    Generator gen(11);
    for (const Shape& shape : {Shape{600, 1000}, Shape{0}, Shape{37}}) {
      Tensor p = Tensor::randn(shape, dtype, &gen).to(device);
      p.set_requires_grad(true);
      list.push_back(p);
    }
  }

  std::vector<ParamGroup> groups(double weight_decay) const {
    ParamGroup g0, g1;
    g0.params = {{"w", list[0]}, {"e", list[1]}};
    g0.weight_decay = weight_decay;
    g1.params = {{"b", list[2]}};
    g1.lr_scale = 0.5;
    return {g0, g1};
  }

  // Grads for update t times `scale` (as a scaled loss's backward gives), the
  // same values on any device; b gets none at t = 2, so its state must not
  // advance then.
  void set_grads(int64_t t, double scale = 1) {
    for (size_t k = 0; k < list.size(); ++k) {
      Tensor& p = list[k];
      if (k == 2 && t == 2) {
        p.zero_grad();
        continue;
      }
      Generator gen(1000 + 10 * static_cast<uint64_t>(t) + k);
      Tensor g = Tensor::randn(p.shape(), p.dtype(), &gen);
      if (scale != 1) g = g * scale;  // on the CPU
      p.set_grad(g.to(p.device()));
    }
  }

  void run(Optimizer& opt, int64_t first_t, int64_t steps) {
    for (int64_t t = first_t; t < first_t + steps; ++t) {
      set_grads(t);
      opt.step();
    }
  }
};

void expect_params_close(const Params& got, const Params& want, DType dtype,
                         const std::string& what) {
  const char* names[] = {"w", "e", "b"};
  for (size_t k = 0; k < got.list.size(); ++k)
    expect_close_rel(got.list[k], want.list[k], tol_of(dtype), what + " " + names[k]);
}

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>)>;

struct Case {
  std::string name;
  double weight_decay;
  MakeOptimizer make;
};

std::vector<Case> cases() {
  SGDOptions nesterov;
  nesterov.momentum = 0.9;
  nesterov.nesterov = true;
  SGDOptions dampened;
  dampened.momentum = 0.8;
  dampened.dampening = 0.25;
  return {
      {"sgd", 0.01, [](auto g) { return std::make_unique<SGD>(std::move(g), 0.05); }},
      {"sgd nesterov", 0.01,
       [nesterov](auto g) { return std::make_unique<SGD>(std::move(g), 0.05, nesterov); }},
      {"sgd dampening", 0.0,
       [dampened](auto g) { return std::make_unique<SGD>(std::move(g), 0.05, dampened); }},
      {"adam", 0.01, [](auto g) { return std::make_unique<Adam>(std::move(g), 0.01); }},
      {"adamw", 0.1, [](auto g) { return std::make_unique<AdamW>(std::move(g), 0.01); }},
      {"lamb", 0.01, [](auto g) { return std::make_unique<Lamb>(std::move(g), 0.01); }},
  };
}

TEST(CudaOptim, EveryOptimizerMatchesTheCpu) {
  FORGE_REQUIRE_CUDA();
  for (DType dtype : {DType::f32, DType::f64}) {
    for (const Case& c : cases()) {
      const std::string what = c.name + " " + dtype_name(dtype);
      Params on_gpu(dtype, gpu()), on_cpu(dtype, kCpu);
      auto opt_gpu = c.make(on_gpu.groups(c.weight_decay));
      auto opt_cpu = c.make(on_cpu.groups(c.weight_decay));
      on_gpu.run(*opt_gpu, 1, 4);
      on_cpu.run(*opt_cpu, 1, 4);
      EXPECT_EQ(on_gpu.list[0].device(), gpu());
      expect_params_close(on_gpu, on_cpu, dtype, what);
      // The slots live on the GPU; the state dict holds CPU copies equal to the CPU run's.
      const auto sd_gpu = opt_gpu->state_dict(), sd_cpu = opt_cpu->state_dict();
      ASSERT_EQ(sd_gpu.size(), sd_cpu.size()) << what;
      for (const auto& [key, t] : sd_gpu) {
        EXPECT_TRUE(t.device().is_cpu()) << what << " " << key;
        expect_close_rel(t, sd_cpu.at(key), tol_of(dtype), what + " state " + key);
      }
      EXPECT_EQ(sd_gpu.at("step.b").item(), 3.0) << what;
    }
  }
}

// optim::set_multi_tensor (issue 31): Adam and AdamW take every GPU
// parameter of a step in launches of up to 32 tensors, and give the same bits
// as one launch per tensor: 70 tensors (three launches) of 0 to 3 chunks of
// 2048 elements, two groups (decay at the full lr, none at half), in f32 and
// f64, one tensor without a grad on the second step, and a CPU parameter in
// the same optimizer.
TEST(CudaOptim, MultiTensorAdamGivesTheSameBits) {
  FORGE_REQUIRE_CUDA();
  const auto run = [](DType dtype, bool decoupled, bool many) {
    set_multi_tensor(many);
    Generator gen(5);
    std::vector<Tensor> ps;
    ParamGroup g0, g1;
    g0.weight_decay = 0.05;
    g1.lr_scale = 0.5;
    for (int k = 0; k < 70; ++k) {
      const int64_t n = k % 7 == 0 ? 0 : (k * 977) % 6200 + 1;
      Tensor p = Tensor::randn({n}, dtype, &gen).to(k == 69 ? kCpu : gpu());
      p.set_requires_grad(true);
      ps.push_back(p);
      (k % 3 == 0 ? g1 : g0).params.push_back({"p" + std::to_string(k), p});
    }
    std::unique_ptr<Optimizer> opt;
    if (decoupled)
      opt = std::make_unique<AdamW>(std::vector<ParamGroup>{g0, g1}, 0.01);
    else
      opt = std::make_unique<Adam>(std::vector<ParamGroup>{g0, g1}, 0.01);
    for (int64_t t = 1; t <= 3; ++t) {
      for (size_t k = 0; k < ps.size(); ++k) {
        if (t == 2 && k == 5) {
          ps[k].zero_grad();
          continue;
        }
        Generator g(100 * static_cast<uint64_t>(t) + k);
        ps[k].set_grad(Tensor::randn(ps[k].shape(), dtype, &g).to(ps[k].device()));
      }
      opt->step();
    }
    set_multi_tensor(false);
    std::map<std::string, std::vector<double>> out;
    for (const auto& [key, t] : opt->state_dict()) out[key] = t.to_vector<double>();
    for (size_t k = 0; k < ps.size(); ++k)
      out["param " + std::to_string(k)] = ps[k].to(kCpu).to_vector<double>();
    return out;
  };
  for (DType dtype : {DType::f32, DType::f64})
    for (bool decoupled : {false, true}) {
      const auto one = run(dtype, decoupled, false), many = run(dtype, decoupled, true);
      ASSERT_EQ(one.size(), many.size());
      for (const auto& [key, values] : one)
        EXPECT_EQ(many.at(key), values) << key << " " << dtype_name(dtype)
                                        << (decoupled ? " adamw" : " adam");
    }
}

// A GPU optimizer's state continues in a CPU one, and a CPU one's on the GPU,
// exactly as the run that never moved.
TEST(CudaOptim, StateDictsMoveBetweenDevices) {
  FORGE_REQUIRE_CUDA();
  const DType dtype = DType::f32;
  for (const Case& c : cases()) {
    for (bool from_gpu : {true, false}) {
      const std::string what = c.name + (from_gpu ? " gpu -> cpu" : " cpu -> gpu");
      const Device first = from_gpu ? gpu() : kCpu, second = from_gpu ? kCpu : gpu();
      // Reference: 5 steps on the CPU.
      Params ref(dtype, kCpu);
      auto opt_ref = c.make(ref.groups(c.weight_decay));
      ref.run(*opt_ref, 1, 5);
      // 3 steps on `first`, then parameters and state moved to `second` for 2 more.
      Params a(dtype, first);
      auto opt_a = c.make(a.groups(c.weight_decay));
      a.run(*opt_a, 1, 3);
      Params b(dtype, second);
      for (size_t k = 0; k < b.list.size(); ++k) b.list[k].copy_from(a.list[k]);
      auto opt_b = c.make(b.groups(c.weight_decay));
      opt_b->load_state_dict(opt_a->state_dict());
      EXPECT_EQ(opt_b->steps(), 3) << what;
      b.run(*opt_b, 4, 2);
      expect_params_close(b, ref, dtype, what);
    }
  }
  // State tensors that are themselves on the GPU load too.
  Params p(dtype, gpu());
  Adam adam(p.groups(0.0), 0.01);
  p.run(adam, 1, 2);
  std::map<std::string, Tensor> on_device;
  for (const auto& [key, t] : adam.state_dict()) on_device[key] = t.to(gpu());
  Params q(dtype, gpu());
  Adam other(q.groups(0.0), 0.01);
  other.load_state_dict(on_device);
  const auto back = other.state_dict();
  for (const auto& [key, t] : adam.state_dict())
    expect_close_rel(back.at(key), t, 0, "reloaded " + key);
}

TEST(CudaOptim, GradNormAndClipMatchTheCpu) {
  FORGE_REQUIRE_CUDA();
  for (DType dtype : {DType::f32, DType::f64}) {
    Params on_gpu(dtype, gpu()), on_cpu(dtype, kCpu);
    on_gpu.set_grads(1);
    on_cpu.set_grads(1);
    const double norm_cpu = grad_norm(on_cpu.list);
    EXPECT_NEAR(grad_norm(on_gpu.list), norm_cpu, 1e-13 * norm_cpu) << dtype_name(dtype);

    // Above the threshold: new, scaled grads on the GPU; the old ones untouched.
    std::vector<Tensor> old;
    for (const Tensor& p : on_gpu.list) old.push_back(p.grad());
    const Tensor old_w = old[0].to(kCpu);
    const double max_norm = norm_cpu / 3;
    const double got = clip_grad_norm(on_gpu.list, max_norm);
    EXPECT_NEAR(got, clip_grad_norm(on_cpu.list, max_norm), 1e-13 * norm_cpu);
    for (size_t k = 0; k < on_gpu.list.size(); ++k) {
      const Tensor g = on_gpu.list[k].grad();
      EXPECT_FALSE(g.same(old[k]));
      EXPECT_EQ(g.device(), gpu());
      expect_close_rel(g, on_cpu.list[k].grad(), tol_of(dtype), "clipped grad");
    }
    expect_close_rel(old[0], old_w, 0, "the old grad");
    EXPECT_NEAR(grad_norm(on_gpu.list), max_norm, 1e-6 * max_norm);

    // Below the threshold nothing is replaced.
    const Tensor kept = on_gpu.list[0].grad();
    clip_grad_norm(on_gpu.list, 10 * norm_cpu);
    EXPECT_TRUE(on_gpu.list[0].grad().same(kept));
  }
}

// Grads that are not finite give a non-finite norm and are left alone.
TEST(CudaOptim, ClipLeavesNonFiniteGradsAlone) {
  FORGE_REQUIRE_CUDA();
  for (double bad :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    Params p(DType::f32, gpu());
    p.set_grads(1);
    std::vector<float> b = p.list[2].grad().to_vector<float>();
    b[5] = static_cast<float>(bad);
    p.list[2].set_grad(Tensor::from_vector(b).to(gpu()));
    const Tensor w = p.list[0].grad();
    const double norm = clip_grad_norm(p.list, 1.0);
    EXPECT_FALSE(std::isfinite(norm));
    EXPECT_EQ(std::isnan(norm), std::isnan(bad));
    EXPECT_TRUE(p.list[0].grad().same(w));
  }
}

// bf16 and f16 grads: the norm of exactly the values they hold.
TEST(CudaOptim, GradNormOfHalfGrads) {
  FORGE_REQUIRE_CUDA();
  for (DType dtype : {DType::bf16, DType::f16}) {
    Generator gen(5);
    const Tensor values = Tensor::randn({1000, 77}, DType::f32, &gen).to(dtype);
    Tensor p_gpu = Tensor::zeros({1000, 77}, dtype, gpu());
    Tensor p_cpu = Tensor::zeros({1000, 77}, DType::f32);
    p_gpu.set_grad(values.to(gpu()));
    p_cpu.set_grad(values.to(DType::f32));
    const double want = grad_norm({p_cpu});
    EXPECT_NEAR(grad_norm({p_gpu}), want, 1e-13 * want) << dtype_name(dtype);
    clip_grad_norm({p_gpu}, want / 2);
    clip_grad_norm({p_cpu}, want / 2);
    expect_close_rel(p_gpu.grad(), forge::testing::round_through(p_cpu.grad(), dtype), 0,
                     std::string("clipped ") + dtype_name(dtype));
  }
}

// GradScaler on GPU grads: an inf skips the step and halves the scale; finite
// grads are unscaled exactly and step as the CPU run does.
TEST(CudaOptim, GradScalerOnGpuGrads) {
  FORGE_REQUIRE_CUDA();
  Params on_gpu(DType::f32, gpu()), on_cpu(DType::f32, kCpu);
  AdamW opt_gpu(on_gpu.groups(0.1), 0.01), opt_cpu(on_cpu.groups(0.1), 0.01);
  GradScaler scaler;

  const Tensor w_before = on_gpu.list[0].to(kCpu);
  on_gpu.set_grads(1, scaler.get_scale());
  std::vector<float> w_grad = on_gpu.list[0].grad().to_vector<float>();
  w_grad[123456] = std::numeric_limits<float>::infinity();
  on_gpu.list[0].set_grad(Tensor::from_vector(w_grad, {600, 1000}).to(gpu()));
  EXPECT_FALSE(scaler.step(opt_gpu));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(opt_gpu.steps(), 0);
  expect_close_rel(on_gpu.list[0], w_before, 0, "skipped w");

  for (int64_t t = 1; t <= 3; ++t) {
    on_gpu.set_grads(t, scaler.get_scale());
    on_cpu.set_grads(t);
    const Tensor scaled_w = on_gpu.list[0].grad();
    EXPECT_TRUE(scaler.unscale(opt_gpu));
    EXPECT_FALSE(on_gpu.list[0].grad().same(scaled_w));
    expect_close_rel(on_gpu.list[0].grad(), on_cpu.list[0].grad(), 0, "unscaled w");
    EXPECT_TRUE(scaler.step(opt_gpu));
    scaler.update();
    opt_cpu.step();
  }
  EXPECT_EQ(scaler.growth_tracker(), 3);
  expect_params_close(on_gpu, on_cpu, DType::f32, "scaled adamw");
}

}  // namespace
}  // namespace forge::optim
