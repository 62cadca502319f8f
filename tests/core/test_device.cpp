// The device slot: the CUDA allocator and copies when this build has CUDA and
// a GPU is visible; a clear error otherwise.
#include <gtest/gtest.h>

#include "core/tensor.h"

namespace forge {
namespace {

TEST(Device, Names) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_NE(Device::cpu(), Device::cuda(0));
}

TEST(Device, CudaWithoutAGpuIsAClearError) {
  if (cuda_device_count() > 0)
    GTEST_SKIP() << "a GPU is visible; this test covers machines without one";
  try {
    Tensor::zeros({4}, DType::f32, Device::cuda(0));
    FAIL() << "allocating on cuda:0 without a GPU must throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda:0"), std::string::npos) << m;
  }
}

TEST(Device, CudaRoundTripAndCounters) {
  if (cuda_device_count() == 0) {
    GTEST_SKIP() << "no CUDA device visible (build has CUDA: " << (cuda_built() ? "yes" : "no")
                 << ")";
  }
  const Device gpu = Device::cuda(0);
  reset_peak_memory(gpu);
  const int64_t before = memory_stats(gpu).current;
  {
    Tensor h = Tensor::arange(0, 1000, 1, DType::f32);
    Tensor d = h.to(gpu);
    EXPECT_EQ(d.device(), gpu);
    EXPECT_EQ(memory_stats(gpu).current - before, 4000);
    EXPECT_THROW(d.raw_data(), Error);  // device memory is not host-addressable
    Tensor back = d.to(Device::cpu());
    EXPECT_EQ(back.to_vector<float>(), h.to_vector<float>());
    EXPECT_EQ(d.view({10, 100}).to(Device::cpu()).shape(), Shape({10, 100}));
    EXPECT_EQ(d.slice0(10, 20).to(Device::cpu()).to_vector<float>()[0], 10.0f);
  }
  EXPECT_EQ(memory_stats(gpu).current, before);
  EXPECT_GE(memory_stats(gpu).peak - before, 4000);
}

TEST(CpuAllocatorCache, ReusesFreedBlocksAndCountsRequestedBytes) {
  empty_cache();
  const int64_t before = memory_stats().current;
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1 << 18});  // 1 MiB: large enough to be cached
    first = t.raw_data();
    EXPECT_EQ(memory_stats().current - before, 1 << 20);
  }
  EXPECT_EQ(memory_stats().current, before);
#if defined(__SANITIZE_ADDRESS__)
  (void)first;  // nothing is cached under ASan, so use-after-free stays detectable
#else
  EXPECT_GE(allocator_for(Device::cpu()).cached_bytes(), size_t{1} << 20);
  Tensor again = Tensor::empty({(1 << 18) - 100});  // same size class
  EXPECT_EQ(again.raw_data(), first);
  EXPECT_EQ(memory_stats().current - before, 4 * ((1 << 18) - 100));
#endif
  empty_cache();
  EXPECT_EQ(allocator_for(Device::cpu()).cached_bytes(), 0u);
}

}  // namespace
}  // namespace forge
