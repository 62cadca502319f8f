// cuDNN's fused attention behind cuda::FlashEngine::cudnn (flash_cuda.h;
// issue 29, not yet run on a GPU): the native SDPA forward and backward
// operations of cuDNN's graph API, through its C backend API
// (cudnn_graph.h; no frontend headers are installed). One operation per
// graph: q, k, v [B, H, N|M, d] dense, o [B, H, N, d], the softmax
// statistics (the log-sum-exp of each scaled score row, [B, H, N, 1] in f32:
// the same numbers as the flash kernels' lse) and the scale, passed by value.
// The engine is the first of cuDNN's heuristics (mode A) whose execution
// plan finalises; the plan is built once per shape, dtype and device and
// kept. A case the installed cuDNN does not take (no engine, or an older
// cuDNN than 9.13.1, whose graphs lack these operations) returns false and
// the caller runs its own kernels.
#include <cudnn.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/attention/flash_cuda.h"
#include "ops/linalg/handles_cuda.h"

namespace forge::cuda {

namespace {

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    FORGE_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Descriptor() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const void* values) {
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
  }
  void set(cudnnBackendAttributeName_t name, const Descriptor& value) {
    cudnnBackendDescriptor_t v = value.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  // cuDNN's status of finalising (a graph or plan it does not support is not an error here).
  cudnnStatus_t finalize() { return cudnnBackendFinalize(d_); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

cudnnDataType_t cudnn_type(DType t) {
  return t == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

// A finalised tensor descriptor of `uid`: dims [4] with dense strides
// (innermost last), or a scalar passed by value (a host pointer in the
// variant pack).
std::unique_ptr<Descriptor> tensor(int64_t uid, cudnnDataType_t type, std::array<int64_t, 4> dims,
                                   bool by_value = false) {
  auto t = std::make_unique<Descriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  std::array<int64_t, 4> strides{};
  int64_t s = 1;
  for (int i = 3; i >= 0; --i) {
    strides[i] = s;
    s *= dims[i];
  }
  const int64_t alignment = by_value ? 4 : 16;
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  t->set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  t->set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  t->set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  t->set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  if (by_value) {
    const bool yes = true;
    t->set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
  }
  FORGE_CUDNN_CHECK(t->finalize());
  return t;
}

// The tensors' unique ids in the graphs and variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kDout, kDq, kDk, kDv };

// A finalised execution plan and its workspace, or none (the case is not
// taken); `parts` keeps every descriptor the plan was built from alive with it.
struct Plan {
  std::vector<std::unique_ptr<Descriptor>> parts;
  Descriptor* plan = nullptr;
  int64_t workspace = 0;
};

Descriptor& add(Plan& p, cudnnBackendDescriptorType_t type) {
  p.parts.push_back(std::make_unique<Descriptor>(type));
  return *p.parts.back();
}

// The handle attributes of the graph and the plan are marked deprecated in
// cuDNN 9, yet its graphs still need them (as its own frontend sets them).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void set_handle(Descriptor& d, cudnnBackendAttributeName_t name, cudnnHandle_t handle) {
  d.set(name, CUDNN_TYPE_HANDLE, 1, &handle);
}
constexpr cudnnBackendAttributeName_t kGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

// Completes p, whose last part is a finalised operation, with the plan of
// its one-operation graph: the first heuristic engine whose plan finalises.
// p.plan stays null when none does.
void plan_for(Plan& p, cudnnHandle_t handle) {
  const Descriptor& op = *p.parts.back();
  Descriptor& graph = add(p, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set_handle(graph, kGraphHandle, handle);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
  if (graph.finalize() != CUDNN_STATUS_SUCCESS) return;
  Descriptor& heuristics = add(p, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (heuristics.finalize() != CUDNN_STATUS_SUCCESS) return;
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return;
  std::vector<cudnnBackendDescriptor_t> configs;
  for (int64_t i = 0; i < count; ++i)
    configs.push_back(add(p, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
  int64_t returned = 0;
  if (cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                               configs.data()) != CUDNN_STATUS_SUCCESS)
    return;
  for (int64_t i = 0; i < returned; ++i) {
    Descriptor& plan = add(p, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set_handle(plan, kPlanHandle, handle);
    cudnnBackendDescriptor_t config = configs[static_cast<size_t>(i)];
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
    if (plan.finalize() != CUDNN_STATUS_SUCCESS) continue;
    int64_t n = 0;
    FORGE_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                               CUDNN_TYPE_INT64, 1, &n, &p.workspace));
    p.plan = &plan;
    return;
  }
}

// A finalised tensor descriptor of `uid` in p (tensor() above).
const Descriptor& add_tensor(Plan& p, int64_t uid, cudnnDataType_t type,
                             std::array<int64_t, 4> dims, bool by_value = false) {
  p.parts.push_back(tensor(uid, type, dims, by_value));
  return *p.parts.back();
}

// The tensor descriptors of a graph, by uid: q, k, v, o, do, dq, dk, dv in
// the data type, the statistics [B, H, N, 1] in f32, the scale by value.
const Descriptor& add_tensor(Plan& p, const FlashArgs& a, int64_t uid) {
  const cudnnDataType_t t = cudnn_type(a.dtype);
  const int64_t rows = uid == kK || uid == kV || uid == kDk || uid == kDv ? a.M : a.N;
  const int64_t cols = uid == kQ || uid == kK || uid == kDq || uid == kDk ? a.d : a.dv;
  if (uid == kStats) return add_tensor(p, uid, CUDNN_DATA_FLOAT, {a.B, a.H, a.N, 1});
  if (uid == kScale) return add_tensor(p, uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, true);
  return add_tensor(p, uid, t, {a.B, a.H, rows, cols});
}

// The plan of one SDPA operation of type `op_type` whose attributes `attrs`
// take the tensors of the same index in `uids`.
Plan sdpa_plan(const FlashArgs& a, cudnnHandle_t handle, cudnnBackendDescriptorType_t op_type,
               const std::vector<std::pair<cudnnBackendAttributeName_t, int64_t>>& attrs) {
  Plan p;
  std::vector<const Descriptor*> tensors;
  for (const auto& [name, uid] : attrs) tensors.push_back(&add_tensor(p, a, uid));
  Descriptor& op = add(p, op_type);
  for (size_t i = 0; i < attrs.size(); ++i) op.set(attrs[i].first, *tensors[i]);
  if (op.finalize() == CUDNN_STATUS_SUCCESS) plan_for(p, handle);
  return p;
}

// The forward graph: (q, k, v, scale) -> (o, stats).
Plan forward_plan(const FlashArgs& a, cudnnHandle_t handle) {
  return sdpa_plan(a, handle, CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR,
                   {{CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, kQ},
                    {CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, kK},
                    {CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, kV},
                    {CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, kO},
                    {CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, kStats},
                    {CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, kScale}});
}

// The backward graph: (q, k, v, o, stats, do, scale) -> (dq, dk, dv).
Plan backward_plan(const FlashArgs& a, cudnnHandle_t handle) {
  return sdpa_plan(a, handle, CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR,
                   {{CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC, kQ},
                    {CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC, kK},
                    {CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC, kV},
                    {CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC, kO},
                    {CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC, kStats},
                    {CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC, kScale},
                    {CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC, kDout},
                    {CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC, kDq},
                    {CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC, kDk},
                    {CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC, kDv}});
}

// Plans per (device, pass, dtype, B, H, N, M, d, dv); a case without an
// engine is remembered as such, so it is asked once.
using PlanKey = std::tuple<int, bool, DType, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

const Plan& cached_plan(const FlashArgs& a, bool backward, int device) {
  static std::mutex mu;
  static std::map<PlanKey, Plan> plans;
  const PlanKey key{device, backward, a.dtype, a.B, a.H, a.N, a.M, a.d, a.dv};
  const std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(key);
  if (it == plans.end()) {
    cudnnHandle_t handle = cudnn_handle(device);
    it = plans.emplace(key, backward ? backward_plan(a, handle) : forward_plan(a, handle)).first;
  }
  return it->second;
}

// Runs `plan` on the tensors of `uids` / `pointers` with a workspace from the
// caching allocator.
void execute(const Plan& plan, const std::vector<int64_t>& uids, std::vector<void*> pointers,
             int device) {
  Tensor workspace;
  void* ws = nullptr;
  if (plan.workspace > 0) {
    workspace = Tensor::empty({plan.workspace}, DType::u8, Device::cuda(device));
    ws = workspace.raw_device_data();
  }
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
           uids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(pointers.size()), pointers.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  FORGE_CUDNN_CHECK(pack.finalize());
  FORGE_CUDNN_CHECK(cudnnBackendExecute(cudnn_handle(device), plan.plan->get(), pack.get()));
}

}  // namespace

bool cudnn_sdpa_takes(const FlashArgs& a) {
  return a.engine == FlashEngine::cudnn && cudnnGetVersion() >= 91301 &&
         (a.dtype == DType::bf16 || a.dtype == DType::f16) && a.d == a.dv && a.d % 8 == 0 &&
         a.d <= 128 && !a.causal && a.kpm == nullptr && a.window == 0 && a.dropout == 0 &&
         a.N > 0 && a.M > 0;
}

bool cudnn_sdpa_forward(const FlashArgs& a, const void* q, const void* k, const void* v, void* o,
                        void* lse, int device) {
  if (!cudnn_sdpa_takes(a)) return false;
  DeviceGuard guard(device);
  const Plan& plan = cached_plan(a, false, device);
  if (plan.plan == nullptr) return false;
  float scale = static_cast<float>(a.scale);
  execute(plan, {kQ, kK, kV, kO, kStats, kScale},
          {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), o, lse, &scale},
          device);
  return true;
}

bool cudnn_sdpa_backward(const FlashArgs& a, const void* q, const void* k, const void* v,
                         const void* o, const void* lse, const void* dout, void* dq, void* dk,
                         void* dv, int device) {
  if (!cudnn_sdpa_takes(a)) return false;
  DeviceGuard guard(device);
  const Plan& plan = cached_plan(a, true, device);
  if (plan.plan == nullptr) return false;
  float scale = static_cast<float>(a.scale);
  execute(plan, {kQ, kK, kV, kO, kStats, kScale, kDout, kDq, kDk, kDv},
          {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), const_cast<void*>(o),
           const_cast<void*>(lse), &scale, const_cast<void*>(dout), dq, dk, dv},
          device);
  return true;
}

}  // namespace forge::cuda
