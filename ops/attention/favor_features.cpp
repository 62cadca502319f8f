// The random projection of FAVOR+'s feature maps: W [m, d], the Gaussian
// orthogonal random matrix of performer-pytorch (blocks of d orthogonal rows
// from the Householder QR of Gaussian matrices, rows scaled by Gaussian norms
// or sqrt(d)). The maps themselves are favor_features.h's; the op, favor.cpp.
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/attention/attention.h"

namespace forge::ops::attention {

namespace {

// Householder QR of a [n, n] (row-major, double): returns Q [n, n] with a = Q R.
std::vector<double> householder_q(std::vector<double> a, int64_t n) {
  std::vector<std::vector<double>> vs;
  for (int64_t col = 0; col < n; ++col) {
    std::vector<double> u(static_cast<size_t>(n - col));
    double norm = 0;
    for (int64_t i = col; i < n; ++i) norm += a[i * n + col] * a[i * n + col];
    norm = std::sqrt(norm);
    for (int64_t i = col; i < n; ++i) u[static_cast<size_t>(i - col)] = a[i * n + col];
    u[0] += a[col * n + col] >= 0 ? norm : -norm;  // u = x + sign(x0) ||x|| e1
    double un = 0;
    for (double x : u) un += x * x;
    un = std::sqrt(un);
    if (un > 0)
      for (double& x : u) x /= un;
    for (int64_t c = col; c < n; ++c) {  // a[col:, col:] -= 2 u (u^T a[col:, col:])
      double dot = 0;
      for (int64_t i = col; i < n; ++i) dot += u[static_cast<size_t>(i - col)] * a[i * n + c];
      for (int64_t i = col; i < n; ++i) a[i * n + c] -= 2 * u[static_cast<size_t>(i - col)] * dot;
    }
    vs.push_back(std::move(u));
  }
  std::vector<double> qm(static_cast<size_t>(n * n), 0.0);  // Q = H_0 H_1 ... H_{n-1} I
  for (int64_t i = 0; i < n; ++i) qm[static_cast<size_t>(i * n + i)] = 1;
  for (int64_t col = n; col-- > 0;) {
    const std::vector<double>& u = vs[static_cast<size_t>(col)];
    for (int64_t c = 0; c < n; ++c) {
      double dot = 0;
      for (int64_t i = col; i < n; ++i) dot += u[static_cast<size_t>(i - col)] * qm[i * n + c];
      for (int64_t i = col; i < n; ++i) qm[i * n + c] -= 2 * u[static_cast<size_t>(i - col)] * dot;
    }
  }
  return qm;
}

}  // namespace

Tensor gaussian_orthogonal_random_matrix(int64_t m, int64_t d, int scaling, DType dtype,
                                         Generator* gen) {
  FORGE_CHECK(m > 0 && d > 0,
              "gaussian_orthogonal_random_matrix: m and d must be positive, got m = {}, d = {}", m,
              d);
  FORGE_CHECK(scaling == 0 || scaling == 1,
              "gaussian_orthogonal_random_matrix: scaling must be 0 (Gaussian row norms) or 1 "
              "(sqrt(d)), got {}",
              scaling);
  FORGE_CHECK(dtype == DType::f32 || dtype == DType::f64,
              "gaussian_orthogonal_random_matrix: dtype must be f32 or f64, got {}",
              dtype_name(dtype));
  Generator& g = gen ? *gen : default_generator();
  std::vector<double> rows;  // [ceil(m / d) d, d]: the blocks Q^T, stacked
  for (int64_t b = 0; b < (m + d - 1) / d; ++b) {
    const std::vector<double> qm =
        householder_q(Tensor::randn({d, d}, DType::f64, &g).to_vector<double>(), d);
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j) rows.push_back(qm[j * d + i]);
  }
  std::vector<double> scale(static_cast<size_t>(m), std::sqrt(static_cast<double>(d)));
  if (scaling == 0) {
    const std::vector<double> gauss = Tensor::randn({m, d}, DType::f64, &g).to_vector<double>();
    for (int64_t i = 0; i < m; ++i) {
      double sq = 0;
      for (int64_t j = 0; j < d; ++j) sq += gauss[i * d + j] * gauss[i * d + j];
      scale[static_cast<size_t>(i)] = std::sqrt(sq);
    }
  }
  std::vector<double> out(static_cast<size_t>(m * d));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < d; ++j)
      out[i * d + j] = rows[i * d + j] * scale[static_cast<size_t>(i)];
  return Tensor::from_vector(out, {m, d}).to(dtype);
}

}  // namespace forge::ops::attention
