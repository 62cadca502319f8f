// Tensor: factories, metadata, free views, conversions and copies, printing,
// autograd flags, and the allocator counters that memory claims rely on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace forge {
namespace {

const DType kCpuDTypes[] = {DType::f32, DType::f64, DType::i32,
                            DType::i64, DType::u8,  DType::boolean};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- factories ----

TEST(TensorFactory, EmptyHasShapeDtypeDevice) {
  const Tensor t = Tensor::empty({2, 3, 4}, DType::f64);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.dtype(), DType::f64);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 24u * 8u);
  EXPECT_FALSE(t.requires_grad());
  EXPECT_TRUE(t.is_leaf());
  EXPECT_THROW(Tensor::empty({2, -1}), Error);
}

TEST(TensorFactory, ZerosOnesFullForEveryCpuDtype) {
  for (DType dt : kCpuDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor z = Tensor::zeros({3, 2}, dt), o = Tensor::ones({5}, dt),
                 f = Tensor::full({2, 2}, 7, dt);
    EXPECT_EQ(z.dtype(), dt);
    EXPECT_EQ(z.to_vector<double>(), std::vector<double>(6, 0.0));
    EXPECT_EQ(o.to_vector<double>(), std::vector<double>(5, 1.0));
    EXPECT_EQ(f.to_vector<double>(), std::vector<double>(4, dt == DType::boolean ? 1.0 : 7.0));
  }
  EXPECT_EQ(Tensor::full({3}, 2.5).to_vector<float>(), std::vector<float>(3, 2.5f));
  EXPECT_EQ(Tensor::full({2}, -3, DType::i32).to_vector<int32_t>(), std::vector<int32_t>(2, -3));
  const Tensor s = Tensor::scalar(4.5, DType::f64);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item(), 4.5);
}

TEST(TensorFactory, Arange) {
  EXPECT_EQ(Tensor::arange(0, 5).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Tensor::arange(0, 5).dtype(), DType::i64);
  EXPECT_EQ(Tensor::arange(2, 9, 3).to_vector<int64_t>(), (std::vector<int64_t>{2, 5, 8}));
  EXPECT_EQ(Tensor::arange(5, 0, -1).to_vector<int64_t>(), (std::vector<int64_t>{5, 4, 3, 2, 1}));
  EXPECT_EQ(Tensor::arange(3, -4, -3).to_vector<int64_t>(), (std::vector<int64_t>{3, 0, -3}));
  EXPECT_EQ(Tensor::arange(0, 1, 0.25, DType::f32).to_vector<float>(),
            (std::vector<float>{0, 0.25f, 0.5f, 0.75f}));
  // (1 - 0) / 0.3 = 3.33: four values, the last below the end.
  const auto x = Tensor::arange(0, 1, 0.3, DType::f64).to_vector<double>();
  ASSERT_EQ(x.size(), 4u);
  EXPECT_DOUBLE_EQ(x[3], 0.9);
  EXPECT_EQ(Tensor::arange(1, -1, -0.5, DType::f64).to_vector<double>(),
            (std::vector<double>{1, 0.5, 0, -0.5}));
  EXPECT_EQ(Tensor::arange(0, 0).numel(), 0);
  EXPECT_EQ(Tensor::arange(0, 5, -1).numel(), 0);  // the wrong direction is empty, as in Python
  EXPECT_EQ(Tensor::arange(5, 0).numel(), 0);
  EXPECT_THROW(Tensor::arange(0, 5, 0), Error);
}

TEST(TensorFactory, RandAndRandn) {
  Generator g(11);
  const Tensor u = Tensor::rand({4, 5}, DType::f64, &g);
  EXPECT_EQ(u.shape(), (Shape{4, 5}));
  EXPECT_EQ(u.dtype(), DType::f64);
  for (double v : u.to_vector<double>()) {
    EXPECT_GE(v, 0.0);
    EXPECT_LT(v, 1.0);
  }
  const Tensor n = Tensor::randn({7}, DType::f32, &g);
  EXPECT_EQ(n.dtype(), DType::f32);
  for (float v : n.to_vector<float>()) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(Tensor::rand({0}, DType::f32, &g).numel(), 0);
}

TEST(TensorFactory, FromVector) {
  const Tensor t = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.dtype(), DType::i32);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.data<int32_t>()[4], 5);
  EXPECT_EQ(Tensor::from_vector<double>({1.5, 2.5}).shape(), (Shape{2}));
  EXPECT_EQ(Tensor::from_vector<uint8_t>({200}).item<int>(), 200);
  EXPECT_THROW(Tensor::from_vector<float>({1, 2, 3}, {2, 2}), Error);
}

// ---- metadata ----

TEST(TensorShape, SizeWithNegativeDims) {
  const Tensor t = Tensor::empty({2, 3, 4});
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(2), 4);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(-3), 2);
  EXPECT_THROW(t.size(3), Error);
  EXPECT_THROW(t.size(-4), Error);
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({3, 0, 2}), 0);
  EXPECT_EQ(shape_str({2, 3}), "[2, 3]");
  EXPECT_EQ(wrap_dim(-1, 3, "test"), 2);
  EXPECT_THROW(wrap_dim(-4, 3, "test"), Error);
}

// A 0-d tensor has no dimension to ask the size of (PyTorch raises too).
TEST(TensorShape, ScalarHasNoSizes) {
  EXPECT_THROW(Tensor::scalar(1).size(0), Error);
  EXPECT_THROW(Tensor::scalar(1).size(-1), Error);
}

TEST(TensorShape, UndefinedTensor) {
  const Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_THROW(t.shape(), Error);
  EXPECT_EQ(t.str(), "tensor(undefined)");
}

TEST(TensorData, TypedAccessChecksTheDtype) {
  const Tensor t = Tensor::zeros({2});
  EXPECT_NO_THROW(t.data<float>());
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_THROW(t.data<int32_t>(), Error);
}

// ---- views ----

TEST(TensorView, InfersMinusOneAndSharesStorage) {
  const Tensor t = Tensor::arange(0, 24).view({2, 3, 4});
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.view({-1, 4}).shape(), (Shape{6, 4}));
  EXPECT_EQ(t.view({4, -1}).shape(), (Shape{4, 6}));
  EXPECT_EQ(t.view({-1}).shape(), (Shape{24}));
  EXPECT_EQ(t.view({2, -1, 3}).shape(), (Shape{2, 4, 3}));
  const Tensor v = t.view({24});
  EXPECT_EQ(v.raw_data(), t.raw_data());
  v.data<int64_t>()[5] = -7;
  EXPECT_EQ(t.data<int64_t>()[5], -7);
  EXPECT_EQ(Tensor::empty({0, 3}).view({-1}).shape(), (Shape{0}));
  EXPECT_EQ(Tensor::scalar(3).view({1, 1}).shape(), (Shape{1, 1}));
}

TEST(TensorView, Errors) {
  const Tensor t = Tensor::empty({2, 3, 4});
  EXPECT_THROW(t.view({-1, -1}), Error);                     // two unknowns
  EXPECT_THROW(t.view({5, -1}), Error);                      // 24 is not a multiple of 5
  EXPECT_THROW(t.view({5, 5}), Error);                       // wrong element count
  EXPECT_THROW(t.view({-2, 12}), Error);                     // negative size
  EXPECT_THROW(Tensor::empty({0, 3}).view({-1, 0}), Error);  // -1 undetermined with zero elements
  try {
    t.view({5, 5});
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "[5, 5]")) << e.what();
    EXPECT_TRUE(contains(e.what(), "24")) << e.what();
  }
}

TEST(TensorView, Slice0SharesStorage) {
  const Tensor t = Tensor::arange(0, 12).view({4, 3});
  const Tensor s = t.slice0(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.to_vector<int64_t>(), (std::vector<int64_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(s.raw_data(), static_cast<char*>(t.raw_data()) + 3 * sizeof(int64_t));
  s.data<int64_t>()[0] = 100;
  EXPECT_EQ(t.data<int64_t>()[3], 100);
  // A slice of a slice, and views of a slice, keep the offset.
  EXPECT_EQ(s.slice0(1, 2).to_vector<int64_t>(), (std::vector<int64_t>{6, 7, 8}));
  EXPECT_EQ(s.view({-1}).to_vector<int64_t>()[0], 100);
  EXPECT_EQ(t.slice0(2, 2).shape(), (Shape{0, 3}));
  EXPECT_EQ(t.slice0(0, 4).to_vector<int64_t>(), t.to_vector<int64_t>());
  EXPECT_THROW(t.slice0(2, 1), Error);
  EXPECT_THROW(t.slice0(0, 5), Error);
  EXPECT_THROW(t.slice0(-1, 2), Error);
  EXPECT_THROW(Tensor::scalar(1).slice0(0, 1), Error);
}

// ---- conversions and copies ----

// The value a double becomes in `dt`: truncated for integers, 0/1 for bool.
double in_dtype(double v, DType dt) {
  if (dt == DType::boolean) return v != 0 ? 1 : 0;
  if (dt == DType::f32 || dt == DType::f64) return v;
  return std::trunc(v);
}

TEST(TensorConvert, BetweenAllCpuDtypes) {
  // Values every dtype holds (no negatives for u8, nothing past 255).
  const std::vector<double> values = {0, 1, 2.5, 3, 100, 255};
  for (DType src : kCpuDTypes) {
    const Tensor a = Tensor::from_vector<double>(values, {2, 3}).to(src);
    ASSERT_EQ(a.dtype(), src);
    for (DType dst : kCpuDTypes) {
      SCOPED_TRACE(fmt::format("{} -> {}", dtype_name(src), dtype_name(dst)));
      const Tensor b = a.to(dst);
      EXPECT_EQ(b.dtype(), dst);
      EXPECT_EQ(b.shape(), (Shape{2, 3}));
      const auto got = b.to_vector<double>();
      for (size_t i = 0; i < values.size(); ++i)
        EXPECT_EQ(got[i], in_dtype(in_dtype(values[i], src), dst)) << i;
    }
  }
  const Tensor t = Tensor::ones({2});
  EXPECT_TRUE(t.to(DType::f32).same(t));  // no copy when nothing changes
  EXPECT_TRUE(t.to(Device::cpu()).same(t));
  EXPECT_EQ(Tensor::from_vector<float>({-2.7f, 2.7f}).to(DType::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{-2, 2}));  // toward zero
}

// bf16 / f16 on the host: round to nearest even from f32, exact widening.
TEST(TensorConvert, HalfFloatsRoundToNearestEven) {
  const auto bf16 = [](float v) { return float_to_bf16_bits(v); };
  const auto f16 = [](float v) { return float_to_f16_bits(v); };
  EXPECT_EQ(bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16(1.00390625f), 0x3F80);  // 1 + 2^-8: a tie, to the even 1
  EXPECT_EQ(bf16(1.01171875f), 0x3F82);  // 1 + 3 * 2^-8: a tie, to the even 1 + 2^-6
  EXPECT_EQ(bf16(-2.0f), 0xC000);
  EXPECT_EQ(bf16(3.0e38f), 0x7F62);  // rounding in the top binade
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(bf16(NAN))));
  EXPECT_EQ(f16(1.0f), 0x3C00);
  EXPECT_EQ(f16(-2.0f), 0xC000);
  EXPECT_EQ(f16(65504.0f), 0x7BFF);                      // the largest f16
  EXPECT_EQ(f16(65519.0f), 0x7BFF);                      // below the halfway point to 65536
  EXPECT_EQ(f16(65520.0f), 0x7C00);                      // the tie rounds to even: infinity
  EXPECT_EQ(f16(std::ldexp(1.0f, -24)), 0x0001);         // the smallest subnormal
  EXPECT_EQ(f16(std::ldexp(1.0f, -25)), 0x0000);         // a tie, to the even 0
  EXPECT_EQ(f16(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 units: to the even 2
  EXPECT_EQ(f16(std::ldexp(1.0f, -14)), 0x0400);         // the smallest normal
  EXPECT_EQ(f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // a tie, to the even 1
  EXPECT_TRUE(std::isnan(f16_bits_to_float(f16(NAN))));
  // Widening is exact, subnormals included.
  EXPECT_EQ(f16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_bits_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(f16_bits_to_float(0xFC00), -INFINITY);
  EXPECT_EQ(bf16_bits_to_float(0x3F82), 1.015625f);
  // Every f16 and every bf16 pattern that is not NaN survives a round trip.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = static_cast<uint16_t>(b);
    if (!std::isnan(f16_bits_to_float(h))) {
      EXPECT_EQ(f16(f16_bits_to_float(h)), h) << b;
    }
    if (!std::isnan(bf16_bits_to_float(h))) {
      EXPECT_EQ(bf16(bf16_bits_to_float(h)), h) << b;
    }
  }
}

TEST(TensorConvert, HalfFloatTensorsOnTheCpu) {
  const Tensor x = Tensor::from_vector<float>({1.0f, 1.00390625f, -3.5f, 70000.0f});
  const Tensor b = x.to(DType::bf16), h = x.to(DType::f16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.nbytes(), 8u);
  EXPECT_EQ(b.to(DType::f32).to_vector<float>(), (std::vector<float>{1.0f, 1.0f, -3.5f, 70144.0f}));
  EXPECT_EQ(h.to(DType::f32).to_vector<float>(),
            (std::vector<float>{1.0f, 1.00390625f, -3.5f, INFINITY}));  // f16 keeps 10 bits
  // Through f64 and back, and fill / item / printing.
  EXPECT_EQ(x.to(DType::f64).to(DType::bf16).to(DType::f64).to_vector<double>(),
            (std::vector<double>{1.0, 1.0, -3.5, 70144.0}));
  Tensor f = Tensor::full({3}, 0.1, DType::f16);
  EXPECT_EQ(f.to_vector<float>(),
            std::vector<float>(3, f16_bits_to_float(float_to_f16_bits(0.1f))));
  EXPECT_FLOAT_EQ(static_cast<float>(Tensor::full({}, 2.5, DType::bf16).item()), 2.5f);
  EXPECT_NE(b.str().find("bf16"), std::string::npos);
}

TEST(TensorConvert, CudaWithoutABackendIsAnError) {
  if (cuda_built()) GTEST_SKIP() << "this build has the CUDA backend";
  EXPECT_THROW(Tensor::ones({2}).to(Device::cuda(0)), Error);
}

TEST(TensorConvert, Item) {
  EXPECT_EQ(Tensor::scalar(2.5).item(), 2.5);
  EXPECT_EQ(Tensor::full({1, 1}, 7, DType::i64).item<int64_t>(), 7);
  EXPECT_EQ(Tensor::full({1}, 1, DType::boolean).item(), 1.0);
  EXPECT_THROW(Tensor::zeros({2}).item(), Error);
  EXPECT_THROW(Tensor::zeros({0}).item(), Error);
}

TEST(TensorCopy, CloneIsIndependent) {
  const Tensor t = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  const Tensor c = t.clone();
  EXPECT_EQ(c.shape(), t.shape());
  EXPECT_EQ(c.dtype(), t.dtype());
  EXPECT_NE(c.raw_data(), t.raw_data());
  EXPECT_EQ(c.to_vector<float>(), t.to_vector<float>());
  c.data<float>()[0] = 42;
  EXPECT_EQ(t.data<float>()[0], 1);
  t.data<float>()[3] = -1;
  EXPECT_EQ(c.data<float>()[3], 4);
  // A clone of a slice holds only the slice.
  const Tensor s = Tensor::arange(0, 6).view({3, 2}).slice0(1, 2).clone();
  EXPECT_EQ(s.to_vector<int64_t>(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(s.impl().storage->nbytes(), 2 * sizeof(int64_t));
}

TEST(TensorCopy, CopyFromAndFill) {
  Tensor dst = Tensor::zeros({2, 3});
  dst.copy_from(Tensor::arange(0, 6, 1, DType::f32));  // same numel and dtype, any shape
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_THROW(dst.copy_from(Tensor::zeros({5})), Error);
  EXPECT_THROW(dst.copy_from(Tensor::zeros({6}, DType::f64)), Error);
  // Into a slice: only those rows change.
  Tensor rows = dst.slice0(1, 2);
  rows.copy_from(Tensor::full({3}, 9));
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{0, 1, 2, 9, 9, 9}));
  rows.fill(-1);
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{0, 1, 2, -1, -1, -1}));
}

// ---- printing ----

TEST(TensorPrint, ShowsDtypeShapeAndValues) {
  const Tensor t = Tensor::from_vector<float>({1.5f, -2, 3.25f, 4, 5, 6}, {2, 3});
  const std::string s = t.str();
  EXPECT_TRUE(contains(s, "f32")) << s;
  EXPECT_TRUE(contains(s, "[2, 3]")) << s;
  EXPECT_TRUE(contains(s, "[[1.5, -2, 3.25],")) << s;
  EXPECT_TRUE(contains(s, "[4, 5, 6]]")) << s;
  std::ostringstream os;
  os << t;
  EXPECT_EQ(os.str(), s);
  EXPECT_TRUE(contains(Tensor::from_vector<int32_t>({7, -8}).str(), "i32"))
      << Tensor::from_vector<int32_t>({7, -8});
  EXPECT_TRUE(contains(Tensor::from_vector<int32_t>({7, -8}).str(), "[7, -8]"));
  EXPECT_TRUE(contains(Tensor::scalar(4.5, DType::f64).str(), "f64, []"));
  EXPECT_TRUE(contains(Tensor::scalar(4.5, DType::f64).str(), "4.5"));
  EXPECT_TRUE(contains(Tensor::ones({1}).set_requires_grad(true).str(), "requires_grad"));
}

TEST(TensorPrint, LargeTensorsAreTruncated) {
  const std::string s = Tensor::arange(0, 100).str();
  EXPECT_TRUE(contains(s, "i64, [100]")) << s;
  EXPECT_TRUE(contains(s, "[0, 1, 2, ..., 97, 98, 99]")) << s;
  EXPECT_FALSE(contains(s, "50")) << s;
  const std::string m = Tensor::zeros({50, 50}).str();
  EXPECT_TRUE(contains(m, "...")) << m;
  EXPECT_LT(m.size(), 400u) << m;  // 7 rows of 7 entries, not 2500 values
  EXPECT_TRUE(contains(Tensor::arange(0, 10).str(4), "[0, 1, ..., 8, 9]"))
      << Tensor::arange(0, 10).str(4);
}

// ---- autograd flags ----

TEST(TensorGrad, RequiresGradOnlyOnFloatingDtypes) {
  Tensor f = Tensor::zeros({2});
  f.set_requires_grad(true);
  EXPECT_TRUE(f.requires_grad());
  f.set_requires_grad(false);
  EXPECT_FALSE(f.requires_grad());
  EXPECT_TRUE(Tensor::zeros({2}, DType::f64).set_requires_grad(true).requires_grad());
  for (DType dt : {DType::i32, DType::i64, DType::u8, DType::boolean}) {
    Tensor t = Tensor::zeros({2}, dt);
    try {
      t.set_requires_grad(true);
      ADD_FAILURE() << dtype_name(dt) << " accepted requires_grad";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), dtype_name(dt))) << e.what();
      EXPECT_TRUE(contains(e.what(), "floating")) << e.what();
    }
    EXPECT_FALSE(t.requires_grad());
    EXPECT_NO_THROW(t.set_requires_grad(false));
  }
}

TEST(TensorGrad, DetachSharesDataWithoutHistory) {
  Tensor t = Tensor::ones({3});
  t.set_requires_grad(true);
  const Tensor d = t.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.raw_data(), t.raw_data());
  t.set_grad(Tensor::full({3}, 2));
  EXPECT_EQ(t.grad().to_vector<float>(), std::vector<float>(3, 2.0f));
  t.zero_grad();
  EXPECT_FALSE(t.grad().defined());
}

// ---- allocator counters ----

TEST(TensorMemory, CountersFollowTensorLifetimes) {
  const MemoryStats base = memory_stats();
  {
    Tensor a = Tensor::empty({10, 7});  // 280 bytes
    EXPECT_EQ(memory_stats().current, base.current + 280);
    EXPECT_EQ(memory_stats().allocations, base.allocations + 1);
    Tensor b = Tensor::zeros({3}, DType::f64);  // 24 bytes
    EXPECT_EQ(memory_stats().current, base.current + 304);
    Tensor v = a.view({70});  // views and slices allocate nothing
    Tensor s = a.slice0(2, 5);
    EXPECT_EQ(memory_stats().current, base.current + 304);
    a = Tensor();  // the views keep the storage alive
    EXPECT_EQ(memory_stats().current, base.current + 304);
    v = Tensor();
    s = Tensor();
    EXPECT_EQ(memory_stats().current, base.current + 24);
    Tensor e = Tensor::empty({0, 5});  // nothing to allocate
    EXPECT_EQ(memory_stats().current, base.current + 24);
    EXPECT_EQ(memory_stats().allocations, base.allocations + 2);
    Tensor c = b.clone();
    EXPECT_EQ(memory_stats().current, base.current + 48);
  }
  EXPECT_EQ(memory_stats().current, base.current);
}

TEST(TensorMemory, PeakAndReset) {
  reset_peak_memory();
  const int64_t base = memory_stats().current;
  EXPECT_EQ(memory_stats().peak, base);
  {
    Tensor big = Tensor::empty({1000}, DType::f64);  // 8000 bytes
    Tensor small = Tensor::empty({10}, DType::u8);   // 10 bytes
    EXPECT_EQ(memory_stats().peak, base + 8010);
  }
  EXPECT_EQ(memory_stats().current, base);
  EXPECT_EQ(memory_stats().peak, base + 8010);  // the peak outlives the tensors
  {
    Tensor t = Tensor::empty({100});
    EXPECT_EQ(memory_stats().peak, base + 8010);  // below the old peak: unchanged
  }
  reset_peak_memory();
  EXPECT_EQ(memory_stats().peak, memory_stats().current);
  EXPECT_EQ(memory_stats().peak, base);
}

TEST(TensorMemory, CpuDataIs64ByteAligned) {
  for (int64_t n : {1, 3, 63, 64, 65, 1000, 4097}) {
    for (DType dt : {DType::u8, DType::f32, DType::f64}) {
      const Tensor t = Tensor::empty({n}, dt);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % kCpuAlignment, 0u)
          << n << " " << dtype_name(dt);
    }
  }
  EXPECT_EQ(kCpuAlignment, 64u);
}

}  // namespace
}  // namespace forge
