// The CUDA device layer: copies both ways, fill and dtype conversion on the
// GPU equal to the CPU's, the caching allocator's reuse and byte counters.
// Philox on the GPU is checked through dropout's mask (test_cuda_functional.cpp).
#include <gtest/gtest.h>

#include <cstring>

#include "core/allocator.h"
#include "tests/cuda/cuda_test_util.h"

namespace forge {
namespace {

using testing::gpu;

TEST(CudaCore, CopiesBothWaysAndBetweenTensors) {
  FORGE_REQUIRE_CUDA();
  const Tensor h = Tensor::randn({37, 5});
  const Tensor d = h.to(gpu());
  EXPECT_EQ(d.device(), gpu());
  EXPECT_EQ(d.to(Device::cpu()).to_vector<float>(), h.to_vector<float>());
  Tensor d2 = Tensor::empty({37, 5}, DType::f32, gpu());
  d2.copy_from(d);  // device to device
  EXPECT_EQ(d2.to(Device::cpu()).to_vector<float>(), h.to_vector<float>());
  Tensor h2 = Tensor::zeros({37, 5});
  h2.copy_from(d2);  // device to host
  EXPECT_EQ(h2.to_vector<float>(), h.to_vector<float>());
  d2.copy_from(Tensor::ones({37, 5}));  // host to device
  EXPECT_EQ(d2.to(Device::cpu()).to_vector<float>(), std::vector<float>(37 * 5, 1.0f));
  // A slice of dim 0 copies from its offset.
  EXPECT_EQ(d.slice0(3, 4).to(Device::cpu()).to_vector<float>(), h.slice0(3, 4).to_vector<float>());
  EXPECT_EQ(d.clone().to(Device::cpu()).to_vector<float>(), h.to_vector<float>());
}

TEST(CudaCore, FillAndFactoriesOnTheGpu) {
  FORGE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64,
                   DType::u8, DType::boolean}) {
    const Tensor d = Tensor::full({1000}, 3.0, dt, gpu());
    const Tensor h = Tensor::full({1000}, 3.0, dt);
    const Tensor back = d.to(Device::cpu());
    ASSERT_EQ(back.nbytes(), h.nbytes());
    EXPECT_EQ(std::memcmp(back.raw_data(), h.raw_data(), h.nbytes()), 0) << dtype_name(dt);
  }
  EXPECT_EQ(Tensor::zeros({3}, DType::f32, gpu()).to(Device::cpu()).to_vector<float>(),
            std::vector<float>(3, 0.0f));
}

TEST(CudaCore, DtypeConversionsMatchTheCpuBitForBit) {
  FORGE_REQUIRE_CUDA();
  // Values that exercise rounding to nearest even, subnormals of f16 and overflow
  // (NaN is left out: its bit pattern is not specified, only its NaN-ness).
  std::vector<float> v = {0.0f,     -0.0f, 1.0f,  1.00390625f, 1.01171875f, -2.5f,  65504.0f,
                          70000.0f, 6e-8f, 3e-5f, 1e-40f,      3.14159265f, -1e30f, 1e-3f};
  for (int i = 0; i < 500; ++i) v.push_back(static_cast<float>(i) * 0.3719f - 91.0f);
  const Tensor h = Tensor::from_vector(v);
  for (DType dt : {DType::bf16, DType::f16, DType::f64, DType::i32, DType::boolean}) {
    const Tensor on_cpu = h.to(dt);
    const Tensor on_gpu = h.to(gpu()).to(dt).to(Device::cpu());
    if (dt == DType::i32 || dt == DType::boolean) {
      EXPECT_EQ(on_gpu.to(DType::f64).to_vector<double>(),
                on_cpu.to(DType::f64).to_vector<double>())
          << dtype_name(dt);
      continue;
    }
    ASSERT_EQ(on_gpu.nbytes(), on_cpu.nbytes());
    EXPECT_EQ(std::memcmp(on_gpu.raw_data(), on_cpu.raw_data(), on_cpu.nbytes()), 0)
        << dtype_name(dt);
    // And back to f32 on the GPU, equal to the CPU's widening.
    EXPECT_EQ(on_cpu.to(gpu()).to(DType::f32).to(Device::cpu()).to_vector<float>(),
              on_cpu.to(DType::f32).to_vector<float>())
        << dtype_name(dt);
  }
}

TEST(CudaAllocator, ReusesFreedBlocksAndCountsRequestedBytes) {
  FORGE_REQUIRE_CUDA();
  cuda_synchronize(gpu());
  empty_cache(gpu());
  const int64_t before = memory_stats(gpu()).current;
  reset_peak_memory(gpu());
  const void* first = nullptr;
  {
    Tensor a = Tensor::empty({1000}, DType::f32, gpu());  // 4000 bytes, a 4096-byte class
    first = a.raw_device_data();
    EXPECT_EQ(memory_stats(gpu()).current - before, 4000);
  }
  EXPECT_EQ(memory_stats(gpu()).current, before);
  EXPECT_GE(allocator_for(gpu()).cached_bytes(), 4000u);
  {
    // Same size class: the freed block comes back without a cudaMalloc.
    Tensor b = Tensor::empty({1010}, DType::f32, gpu());
    EXPECT_EQ(b.raw_device_data(), first);
    Tensor c = Tensor::empty({1 << 20}, DType::f32, gpu());  // 4 MiB, another class
    EXPECT_NE(c.raw_device_data(), first);
    EXPECT_EQ(memory_stats(gpu()).current - before, 4040 + (4 << 20));
  }
  EXPECT_EQ(memory_stats(gpu()).peak - before, 4040 + (4 << 20));
  empty_cache(gpu());
  EXPECT_EQ(allocator_for(gpu()).cached_bytes(), 0u);
  EXPECT_EQ(memory_stats(gpu()).current, before);
}

TEST(CudaAllocator, OutOfMemoryIsAClearError) {
  FORGE_REQUIRE_CUDA();
  const int64_t huge = int64_t{1} << 50;  // 4 PiB of f32
  testing::expect_error([&] { Tensor::empty({huge}, DType::f32, gpu()); },
                        {"cuda:0", "cudaMalloc", "bytes"});
  // The device is still usable afterwards.
  EXPECT_EQ(Tensor::ones({4}, DType::f32, gpu()).to(Device::cpu()).to_vector<float>(),
            std::vector<float>(4, 1.0f));
}

}  // namespace
}  // namespace forge
