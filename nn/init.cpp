// Initialisers: draws are made in f64 on the CPU from the Philox generator and
// then converted to the tensor's dtype and device, so an f32 and an f64 model
// built from the same seed start from the same values (up to rounding).
#include "nn/init.h"

#include <cmath>

namespace forge::nn::init {
namespace {

void check_float(const Tensor& t, const char* what) {
  FORGE_CHECK(t.defined() && (t.dtype() == DType::f32 || t.dtype() == DType::f64),
              "init::{}: expected a defined f32 or f64 tensor, got {}", what,
              t.defined() ? dtype_name(t.dtype()) : "an undefined tensor");
}

// Writes f64 values (a CPU tensor of t's shape) into t.
void assign(Tensor& t, const Tensor& values64) {
  Tensor v = values64.to(t.dtype());
  t.copy_from(t.device() == v.device() ? v : v.to(t.device()));
}

Generator& pick(Generator* gen) {
  return gen ? *gen : default_generator();
}

}  // namespace

std::pair<int64_t, int64_t> fans(const Shape& shape) {
  FORGE_CHECK(!shape.empty(), "init: fans of a 0-d tensor are undefined");
  if (shape.size() == 1) return {shape[0], shape[0]};
  int64_t receptive = 1;
  for (size_t i = 2; i < shape.size(); ++i) receptive *= shape[i];
  return {shape[1] * receptive, shape[0] * receptive};
}

void zeros_(Tensor& t) {
  t.fill(0.0);
}
void ones_(Tensor& t) {
  t.fill(1.0);
}

void normal_(Tensor& t, double mean, double std, Generator* gen) {
  check_float(t, "normal_");
  Tensor z = Tensor::randn(t.shape(), DType::f64, &pick(gen));
  double* p = z.data<double>();
  for (int64_t i = 0; i < z.numel(); ++i) p[i] = mean + std * p[i];
  assign(t, z);
}

void uniform_(Tensor& t, double lo, double hi, Generator* gen) {
  check_float(t, "uniform_");
  Tensor u = Tensor::rand(t.shape(), DType::f64, &pick(gen));
  double* p = u.data<double>();
  for (int64_t i = 0; i < u.numel(); ++i) p[i] = lo + (hi - lo) * p[i];
  assign(t, u);
}

void xavier_normal_(Tensor& t, double gain, Generator* gen) {
  const auto [fan_in, fan_out] = fans(t.shape());
  normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), gen);
}

void xavier_uniform_(Tensor& t, double gain, Generator* gen) {
  const auto [fan_in, fan_out] = fans(t.shape());
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  uniform_(t, -bound, bound, gen);
}

void trunc_normal_(Tensor& t, double mean, double std, double a, double b, Generator* gen) {
  check_float(t, "trunc_normal_");
  FORGE_CHECK(std > 0 && a < b,
              "init::trunc_normal_: expected std > 0 and a < b, got std {}, [{}, {}]", std, a, b);
  const auto phi = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  const double mass = phi((b - mean) / std) - phi((a - mean) / std);
  FORGE_CHECK(mass >= 1e-4,
              "init::trunc_normal_: [{}, {}] holds only {:.2e} of N({}, {}^2); widen the interval "
              "or move the "
              "mean inside it",
              a, b, mass, mean, std);
  Generator& g = pick(gen);
  Tensor out = Tensor::empty(t.shape(), DType::f64);
  double* o = out.data<double>();
  // Indices still to fill; each round redraws exactly those.
  std::vector<int64_t> pending(static_cast<size_t>(out.numel()));
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = static_cast<int64_t>(i);
  while (!pending.empty()) {
    Tensor z = Tensor::randn({static_cast<int64_t>(pending.size())}, DType::f64, &g);
    const double* zp = z.data<double>();
    std::vector<int64_t> rest;
    for (size_t i = 0; i < pending.size(); ++i) {
      const double x = mean + std * zp[i];
      if (x >= a && x <= b)
        o[pending[i]] = x;
      else
        rest.push_back(pending[i]);
    }
    pending = std::move(rest);
  }
  assign(t, out);
}

}  // namespace forge::nn::init
