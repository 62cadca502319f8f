// Uploader on a GPU: what arrives is the CPU tensor bit for bit, for every
// dtype and for more tensors than the ring has buffers; a source changed or
// freed right after upload() does not change what arrives (the data was staged
// in pinned memory); a buffer grows for a larger tensor; kernels queued after
// an upload see its data.
#include <gtest/gtest.h>

#include "core/upload.h"
#include "ops/ops.h"
#include "tests/cuda/cuda_test_util.h"

namespace forge {
namespace {

using testing::gpu;

Tensor ramp(int64_t n, DType dtype, double start) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + 0.25 * static_cast<double>(i);
  return Tensor::from_vector(v, {n}).to(dtype);
}

TEST(CudaUpload, ArrivesBitForBitThroughTheRing) {
  FORGE_REQUIRE_CUDA();
  Uploader up(gpu(), 2);
  std::vector<Tensor> sources, sent;
  for (int k = 0; k < 7; ++k) {  // 7 uploads through 2 buffers, sizes growing and shrinking
    const DType dt = k % 3 == 0 ? DType::f32 : k % 3 == 1 ? DType::i64 : DType::bf16;
    Tensor src = ramp(1000 + 37 * ((k * 5) % 7), dt, k);
    sources.push_back(src.clone());
    sent.push_back(up.upload(src));
    // Overwrite the source at once: the upload must not see it.
    if (dt == DType::f32) src.data<float>()[0] = -1;
  }
  for (size_t k = 0; k < sent.size(); ++k) {
    EXPECT_TRUE(sent[k].device() == gpu());
    const Tensor back = sent[k].to(Device::cpu());
    ASSERT_EQ(back.shape(), sources[k].shape());
    EXPECT_EQ(std::memcmp(back.raw_data(), sources[k].raw_data(), back.nbytes()), 0) << k;
  }
  EXPECT_GE(up.pinned_bytes(), static_cast<int64_t>(sources[0].nbytes()));
}

TEST(CudaUpload, KernelsQueuedAfterTheUploadSeeItsData) {
  FORGE_REQUIRE_CUDA();
  Uploader up(gpu(), 1);
  Tensor acc = Tensor::zeros({4096}, DType::f32, gpu());
  for (int k = 0; k < 20; ++k) acc = acc + up.upload(Tensor::full({4096}, 1.0 + k, DType::f32));
  const Tensor back = acc.to(Device::cpu());
  for (int64_t i = 0; i < 4096; i += 511) EXPECT_EQ(back.data<float>()[i], 210.0f);
}

TEST(CudaUpload, CpuTargetIsAPlainCopy) {
  Uploader up(Device::cpu());
  const Tensor t = ramp(10, DType::f32, 1);
  EXPECT_EQ(up.upload(t).to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(up.pinned_bytes(), 0);
}

}  // namespace
}  // namespace forge
