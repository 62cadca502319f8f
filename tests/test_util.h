// Shared helpers for the GoogleTest suites.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "autograd/gradcheck.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/blas_core.h"

// Skips a test of the CPU's bf16 path (oneDNN's bf16 GEMMs, autocast on the
// CPU) on a CPU that does not multiply bf16 itself, where precision: bf16 is
// refused (train/model.cpp) and oneDNN may have no bf16 matmul.
#define FORGE_REQUIRE_CPU_BF16()                                                      \
  do {                                                                                \
    if (!::forge::blas::cpu_features().bf16())                                        \
      GTEST_SKIP() << "this CPU has neither AVX512-BF16 nor AMX: no bf16 on the CPU"; \
  } while (0)

namespace forge::testing {

// A f64 leaf of `shape` with values uniform in [lo, hi), drawn from its own
// seeded generator (tests do not disturb each other's streams), requiring grad.
inline Tensor leaf64(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Generator g(seed);
  Tensor u = Tensor::rand(shape, DType::f64, &g);
  double* p = u.data<double>();
  for (int64_t i = 0; i < u.numel(); ++i) p[i] = lo + (hi - lo) * p[i];
  u.set_requires_grad(true);
  return u;
}

// Uniform [lo, hi) tensor of `shape` and dtype from its own seeded generator
// (leaf64's values, cast), optionally requiring grad.
inline Tensor uniform(const Shape& shape, uint64_t seed, DType dtype = DType::f64, double lo = -1,
                      double hi = 1, bool requires_grad = true) {
  Tensor t = leaf64(shape, seed, lo, hi).detach();
  if (dtype != DType::f64) t = t.to(dtype);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

// [B, N] i64 token ids uniform in [0, vocab), from a seeded generator.
inline Tensor random_ids(int64_t B, int64_t N, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  const auto u = Tensor::rand({B, N}, DType::f64, &g).to_vector<double>();
  std::vector<int64_t> ids(u.size());
  for (size_t i = 0; i < u.size(); ++i)
    ids[i] = static_cast<int64_t>(u[i] * static_cast<double>(vocab)) % vocab;
  return Tensor::from_vector(ids, {B, N});
}

// t's values rounded to bf16 (through f32), in f64: what the CPU's bf16
// GEMMs multiply under autocast.
inline Tensor bf16_rounded(const Tensor& t) {
  return t.detach().to(DType::f32).to(DType::bf16).to(DType::f64);
}

// Token shift from its definition (linear-attention-transformer's
// PreShiftTokens): feature f of segment s reads position i - shifts[s], zero
// outside [0, N), from `moving` when the segment moves (shift != 0) and from
// x when it does not (the remainder features never move).
inline std::vector<double> naive_token_shift(const Tensor& x, const Tensor& moving,
                                             const std::vector<int64_t>& shifts) {
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2);
  const auto segments = static_cast<int64_t>(shifts.size()), per = D / segments;
  const auto xv = x.to_vector<double>(), mv = moving.to_vector<double>();
  std::vector<double> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t f = 0; f < D; ++f) {
        const int64_t shift = f < segments * per ? shifts[static_cast<size_t>(f / per)] : 0;
        const int64_t src = i - shift;
        const auto at = static_cast<size_t>((b * N + src) * D + f);
        out.push_back(src < 0 || src >= N ? 0.0 : shift == 0 ? xv[at] : mv[at]);
      }
  return out;
}

// Max |a - b| over all elements (same shape required), computed in f64.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// Both defined, the same shape, and max |a - b| <= tol (printing both when not).
inline void expect_close(const Tensor& a, const Tensor& b, double tol) {
  ASSERT_TRUE(a.defined() && b.defined());
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_LE(max_abs_diff(a, b), tol) << "got\n" << a << "\nexpected\n" << b;
}

// expect_close on each pair of two lists with the same entries defined.
inline void expect_all_close(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                             double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].defined(), b[i].defined()) << "entry " << i;
    if (a[i].defined()) expect_close(a[i], b[i], tol);
  }
}

// a's values, flattened, equal `expected` within tol.
inline void expect_values(const Tensor& a, const std::vector<double>& expected, double tol = 1e-6) {
  const auto x = a.to_vector<double>();
  ASSERT_EQ(x.size(), expected.size());
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(x[i], expected[i], tol) << "at flat index " << i;
}

// The bytes of t's elements (t moved to the CPU first), to compare bit for bit.
inline std::string bytes_of(const Tensor& t) {
  const Tensor c = t.to(Device::cpu());
  return std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
}

// Both undefined, or the same dtype, shape and bytes (CPU tensors).
inline bool same_tensor(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// f throws a forge::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const auto& p : parts)
      EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
    return;
  }
  ADD_FAILURE() << "expected a forge::Error";
}

// What error_of does when fn throws nothing: fail the test, or allow it.
enum class IfNoError { fail, allow };

// The message of the forge::Error fn throws; "" when it throws none (a test
// failure unless if_none is IfNoError::allow).
template <typename F>
std::string error_of(F&& fn, IfNoError if_none = IfNoError::fail) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  if (if_none == IfNoError::fail) ADD_FAILURE() << "expected a forge::Error";
  return "";
}

// ---- files ----

// A fresh empty directory for one test (named after the test, the process and
// a counter), removed with everything in it at the end of the scope.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(::testing::TempDir()) /
            ("forge_" + std::string(info ? info->name() : "test") + "_" +
             std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
  static inline int counter_ = 0;
};

// The bytes of the file at `path` ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Writes `bytes` to `path`, creating the folders above it.
inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// write_file for bytes held as uint8_t.
inline void write_file(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  write_file(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

// Every file under `dir` (relative path -> bytes), to check that an operation
// changed nothing on disk; empty when `dir` does not exist.
inline std::map<std::string, std::string> snapshot(const std::filesystem::path& dir) {
  std::map<std::string, std::string> out;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file())
      out[std::filesystem::relative(e.path(), dir).string()] = read_file(e.path());
  return out;
}

}  // namespace forge::testing

// Runs gradcheck and fails the test with its report when it does not pass.
#define EXPECT_GRADCHECK(fn, ...)                                      \
  do {                                                                 \
    auto gc_result_ = ::forge::autograd::gradcheck((fn), __VA_ARGS__); \
    EXPECT_TRUE(gc_result_.ok) << gc_result_.message;                  \
  } while (0)
