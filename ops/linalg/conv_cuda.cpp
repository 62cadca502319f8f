// The patch convolution on cuDNN's convolution API (see conv_cuda.h): forward,
// backward data and backward filter. Each pass asks cuDNN's heuristics (the
// _v7 queries, no benchmarking) for algorithms, best first, and the first one
// that runs is remembered per shape, dtype and device, so the query happens
// once. Workspaces come from the caching allocator.
#include "ops/linalg/conv_cuda.h"

#include <cudnn.h>

#include <climits>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/names.h"
#include "core/tensor.h"
#include "ops/linalg/handles_cuda.h"

namespace forge::cuda {

namespace {

enum class Pass { forward, backward_data, backward_filter };

constexpr NameTable<Pass, 3> kPassNames{"pass", {"forward", "backward data", "backward filter"}};
const char* pass_name(Pass pass) {
  return name_of(kPassNames, pass);
}

// cuDNN's type of each DType the patch convolution takes.
constexpr std::pair<DType, cudnnDataType_t> kCudnnTypes[] = {{DType::f32, CUDNN_DATA_FLOAT},
                                                             {DType::f64, CUDNN_DATA_DOUBLE},
                                                             {DType::bf16, CUDNN_DATA_BFLOAT16},
                                                             {DType::f16, CUDNN_DATA_HALF}};

cudnnDataType_t cudnn_type(DType t) {
  for (const auto& [d, c] : kCudnnTypes)
    if (d == t) return c;
  fail_dtype("patch_embed", t);
}

// The math the descriptor asks for: tensor cores for bf16 / f16; for f32 plain
// FMA unless TF32 is allowed (CUDNN_DEFAULT_MATH lets Ampere and later use it).
cudnnMathType_t requested_math(const PatchConv& s) {
  if (s.dtype == DType::bf16 || s.dtype == DType::f16) return CUDNN_TENSOR_OP_MATH;
  if (s.dtype == DType::f32 && !s.tf32) return CUDNN_FMA_MATH;
  return CUDNN_DEFAULT_MATH;
}

// alpha = 1 and beta = 0: double for f64 data, float for the others.
const void* scalar(DType t, int value) {
  static const float f[2] = {0.0f, 1.0f};
  static const double d[2] = {0.0, 1.0};
  return t == DType::f64 ? static_cast<const void*>(&d[value]) : &f[value];
}

// Owners of one cuDNN descriptor each.
class TensorDesc {
 public:
  TensorDesc() { FORGE_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d_)); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d_); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

class FilterDesc {
 public:
  FilterDesc() { FORGE_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d_)); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d_); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  cudnnFilterDescriptor_t get() const { return d_; }

 private:
  cudnnFilterDescriptor_t d_ = nullptr;
};

class ConvDesc {
 public:
  ConvDesc() { FORGE_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d_)); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d_); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return d_; }

 private:
  cudnnConvolutionDescriptor_t d_ = nullptr;
};

// cuDNN indexes tensors with 32-bit ints.
int as_int(int64_t v, const char* what, const PatchConv& s) {
  FORGE_CHECK(v <= INT_MAX,
              "patch_embed (cuDNN): {} = {} is beyond cuDNN's 32-bit indexing (images [{}, {}, "
              "{}, {}]); split the batch",
              what, v, s.B, s.C, s.H, s.W);
  return static_cast<int>(v);
}

// x (B, C, H, W), w (D, C, p, p), y (B, D, H / p, W / p) and the convolution.
struct Descriptors {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;

  explicit Descriptors(const PatchConv& s) {
    const int64_t h = s.H / s.p, w_out = s.W / s.p;
    as_int(s.B * s.C * s.H * s.W, "the images' element count", s);
    as_int(s.B * s.D * h * w_out, "the output's element count", s);
    const cudnnDataType_t t = cudnn_type(s.dtype);
    const int B = as_int(s.B, "B", s), C = as_int(s.C, "C", s), D = as_int(s.D, "D", s),
              p = as_int(s.p, "p", s);
    FORGE_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.get(), CUDNN_TENSOR_NCHW, t, B, C,
                                                 as_int(s.H, "H", s), as_int(s.W, "W", s)));
    FORGE_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y.get(), CUDNN_TENSOR_NCHW, t, B, D,
                                                 static_cast<int>(h), static_cast<int>(w_out)));
    FORGE_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.get(), t, CUDNN_TENSOR_NCHW, D, C, p, p));
    // torch's Conv2d is a cross-correlation (the kernel is not flipped).
    FORGE_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv.get(), 0, 0, p, p, 1, 1, CUDNN_CROSS_CORRELATION,
        s.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
    FORGE_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), requested_math(s)));
  }
};

// An algorithm of one pass (the cuDNN enum of that pass, as an int), the math
// type it runs with and its workspace.
struct Algo {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

// The heuristics' results that can run, best first; only deterministic ones
// (cuDNN's non-deterministic backward algorithms add with atomics in a varying
// order: a run, or a resumed run, would then not reproduce bit for bit); for
// f32 without TF32 only those on plain FMA math.
template <typename Perf>
std::vector<Algo> usable(const Perf* perfs, int count, const PatchConv& s) {
  std::vector<Algo> out;
  for (int i = 0; i < count; ++i) {
    if (perfs[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (perfs[i].determinism != CUDNN_DETERMINISTIC) continue;
    if (s.dtype == DType::f32 && !s.tf32 && perfs[i].mathType != CUDNN_FMA_MATH) continue;
    out.push_back({static_cast<int>(perfs[i].algo), perfs[i].mathType, perfs[i].memory});
  }
  return out;
}

std::vector<Algo> candidates(Pass pass, cudnnHandle_t h, const Descriptors& d, const PatchConv& s) {
  int count = 0;
  switch (pass) {
    case Pass::forward: {
      cudnnConvolutionFwdAlgoPerf_t perfs[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      FORGE_CUDNN_CHECK(
          cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                 CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perfs));
      return usable(perfs, count, s);
    }
    case Pass::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t perfs[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      FORGE_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
          &count, perfs));
      return usable(perfs, count, s);
    }
    case Pass::backward_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perfs[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      FORGE_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
          &count, perfs));
      return usable(perfs, count, s);
    }
  }
  return {};
}

// Runs one pass: `call(handle, descriptors, algo, workspace)` issues the cuDNN
// call and returns its status. The algorithm remembered for this problem is
// used when there is one; otherwise the candidates are tried in order, skipping
// one whose workspace cannot be allocated or that cuDNN refuses to run.
template <typename Call>
void run_pass(Pass pass, const PatchConv& s, int device, Call call) {
  using Key =
      std::tuple<int, int, DType, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
  static std::mutex mu;
  static std::map<Key, Algo> chosen;
  const Key key{device, static_cast<int>(pass), s.dtype, s.tf32, s.B, s.C, s.H, s.W, s.D, s.p};

  DeviceGuard guard(device);
  const cudnnHandle_t h = cudnn_handle(device);
  const Descriptors d(s);
  const auto workspace_for = [&](const Algo& a) {
    return Tensor::empty({static_cast<int64_t>(a.workspace)}, DType::u8, Device::cuda(device));
  };
  const auto run = [&](const Algo& a, const Tensor& workspace) {
    FORGE_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), a.math));
    return call(h, d, a, a.workspace > 0 ? workspace.raw_device_data() : nullptr);
  };
  const auto failure = [&](const char* what, cudnnStatus_t status) {
    FORGE_FAIL(
        "patch_embed (cuDNN {}): {} for images [{}, {}, {}, {}], {}x{} patches, {} channels out, "
        "{}{}: {}",
        pass_name(pass), what, s.B, s.C, s.H, s.W, s.p, s.p, s.D, dtype_name(s.dtype),
        s.dtype == DType::f32 && !s.tf32 ? " without TF32" : "", cudnnGetErrorString(status));
  };

  Algo known;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = chosen.find(key);
    if (it != chosen.end()) {
      known = it->second;
      found = true;
    }
  }
  if (found) {
    const cudnnStatus_t status = run(known, workspace_for(known));
    if (status != CUDNN_STATUS_SUCCESS) failure("the algorithm that ran before failed", status);
    return;
  }
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
  for (const Algo& a : candidates(pass, h, d, s)) {
    Tensor workspace;
    try {
      workspace = workspace_for(a);
    } catch (const Error&) {
      continue;  // more workspace than the device has left: the next candidate may need less
    }
    last = run(a, workspace);
    if (last == CUDNN_STATUS_SUCCESS) {
      std::lock_guard<std::mutex> lock(mu);
      chosen[key] = a;
      return;
    }
  }
  failure("no algorithm ran", last);
}

}  // namespace

void patch_conv_forward(const PatchConv& s, const void* x, const void* w, void* y, int device) {
  run_pass(Pass::forward, s, device,
           [&](cudnnHandle_t h, const Descriptors& d, const Algo& a, void* workspace) {
             return cudnnConvolutionForward(
                 h, scalar(s.dtype, 1), d.x.get(), x, d.w.get(), w, d.conv.get(),
                 static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), workspace, a.workspace,
                 scalar(s.dtype, 0), d.y.get(), y);
           });
}

void patch_conv_backward_data(const PatchConv& s, const void* w, const void* dy, void* dx,
                              int device) {
  run_pass(Pass::backward_data, s, device,
           [&](cudnnHandle_t h, const Descriptors& d, const Algo& a, void* workspace) {
             return cudnnConvolutionBackwardData(
                 h, scalar(s.dtype, 1), d.w.get(), w, d.y.get(), dy, d.conv.get(),
                 static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo), workspace, a.workspace,
                 scalar(s.dtype, 0), d.x.get(), dx);
           });
}

void patch_conv_backward_filter(const PatchConv& s, const void* x, const void* dy, void* dw,
                                int device) {
  run_pass(Pass::backward_filter, s, device,
           [&](cudnnHandle_t h, const Descriptors& d, const Algo& a, void* workspace) {
             return cudnnConvolutionBackwardFilter(
                 h, scalar(s.dtype, 1), d.x.get(), x, d.y.get(), dy, d.conv.get(),
                 static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo), workspace, a.workspace,
                 scalar(s.dtype, 0), d.w.get(), dw);
           });
}

}  // namespace forge::cuda
