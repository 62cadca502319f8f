// The GPU path that linear, efficient and taylor_linear share (internal):
// each computes feature maps of q and k with its kernels of
// linear_features_cuda.h, and attention on them runs through the shared core
// of linear_core_cuda.h, as one autograd node whose backward recomputes the
// feature maps; with LinearEngine::mma on a case it takes, the tensor-core
// core (linear_core_mma_cuda.cu) runs instead, on q and k themselves when both
// maps are one it fuses. Called only under FORGE_IF_CUDA; the launcher calls here sit
// inside `if constexpr (kCudaBuilt)`, so a build without CUDA compiles them
// away.
#pragma once

#include <functional>
#include <vector>

#include "autograd/node.h"
#include "core/device.h"
#include "core/tensor.h"
#include "ops/attention/attention.h"
#include "ops/attention/common.h"
#include "ops/attention/linear_core_cuda.h"
#include "ops/attention/linear_features_cuda.h"

namespace forge::ops::attention {

// The accumulation type of feature maps, states and normalisers.
inline DType feature_dtype(DType dtype) {
  return dtype == DType::f64 ? DType::f64 : DType::f32;
}

// The core's sizes for q [B, H, N, d], k [B, H, M, d] mapped to F features
// a row and v [B, H, M, dv] of `dtype`; the mechanism sets the rest.
inline cuda::LinearCoreArgs core_sizes(const Dims4& s, int64_t F, DType dtype) {
  cuda::LinearCoreArgs a;
  a.BH = s.B * s.H;
  a.N = s.N;
  a.M = s.M;
  a.F = F;
  a.dv = s.dv;
  a.dtype = dtype;
  return a;
}

// The rows of x [B, H, len, d] for the feature kernels; mask [B, len] or undefined.
inline cuda::FeatureRows feature_rows(const Tensor& x, const Tensor& mask) {
  cuda::FeatureRows r;
  r.BH = x.size(0) * x.size(1);
  r.L = x.size(2);
  r.d = x.size(3);
  r.H = x.size(1);
  r.keep = mask.defined() ? static_cast<const uint8_t*>(mask.raw_device_data()) : nullptr;
  return r;
}

// One feature map on the GPU. forward(x, mask, stats) -> f [B*H, len, F] in
// feature_dtype, 0 on the rows the mask pads (mask is undefined for q);
// `stats` keeps what its backward needs besides x and f (may stay undefined).
// backward(x, mask, f, stats, df, dx) writes dx [B, H, len, d] from df.
// `fused`: the same map as one the tensor-core core applies itself (none: it
// cannot).
struct FeatureMap {
  std::function<Tensor(const Tensor& x, const Tensor& mask, Tensor& stats)> forward;
  std::function<void(const Tensor& x, const Tensor& mask, const Tensor& f, const Tensor& stats,
                     const Tensor& df, const Tensor& dx)>
      backward;
  cuda::FusedMap fused = cuda::FusedMap::none;
};

// A feature map computed row by row from x alone, by a forward and a backward
// launcher of linear_features_cuda.h (elu + 1, softmax over d, exp, [1, x / ||x||]);
// F = d + extra.
using RowFeatures = void (*)(DType, const cuda::FeatureRows&, const void* x, void* f, int device);
using RowFeaturesBackward = void (*)(DType, const cuda::FeatureRows&, const void* x, const void* df,
                                     void* dx, int device);
inline FeatureMap row_feature_map(RowFeatures forward, RowFeaturesBackward backward,
                                  int64_t extra = 0) {
  return {[forward, extra](const Tensor& x, const Tensor& mask, Tensor&) {
            Tensor f = Tensor::empty({x.size(0) * x.size(1), x.size(2), x.size(3) + extra},
                                     feature_dtype(x.dtype()), x.device());
            forward(x.dtype(), feature_rows(x, mask), x.raw_device_data(), f.raw_device_data(),
                    x.device().index);
            return f;
          },
          [backward](const Tensor& x, const Tensor& mask, const Tensor&, const Tensor&,
                     const Tensor& df, const Tensor& dx) {
            backward(x.dtype(), feature_rows(x, mask), x.raw_device_data(), df.raw_device_data(),
                     dx.raw_device_data(), x.device().index);
          }};
}

// The core of one call: the tensor-core one (LinearEngine::mma) where it
// takes the case and `tensors` (device pointers) are aligned for it, with the
// maps fused when q's and k's are the same one it fuses; else fma.
struct CoreChoice {
  bool mma = false;
  cuda::LinearMmaArgs m;
};
inline CoreChoice choose_core(const cuda::LinearCoreArgs& args, const FeatureMap& qmap,
                              const FeatureMap& kmap, const Tensor& q, const Tensor& mask,
                              std::initializer_list<const void*> tensors) {
  CoreChoice c;
  c.mma = linear_engine() == cuda::LinearEngine::mma && cuda::linear_mma_takes(args, tensors);
  c.m.core = args;
  if (c.mma && qmap.fused != cuda::FusedMap::none && qmap.fused == kmap.fused) {
    c.m.map = qmap.fused;
    c.m.keep = mask.defined() ? static_cast<const uint8_t*>(mask.raw_device_data()) : nullptr;
    c.m.H = q.size(1);
  }
  return c;
}

// The core's forward (o from q, k, v) and backward (dq, dk, dv from the
// gradient g of o) on the chosen core, the feature maps around it unless fused.
inline void feature_core_forward(const CoreChoice& c, const FeatureMap& qmap,
                                 const FeatureMap& kmap, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& mask, const Tensor& o) {
  const int device = q.device().index;
  if (c.mma && c.m.map != cuda::FusedMap::none) {
    cuda::linear_mma_forward(c.m, q.raw_device_data(), k.raw_device_data(), v.raw_device_data(),
                             o.raw_device_data(), device);
    return;
  }
  Tensor qstats, kstats;
  const Tensor qf = qmap.forward(q, Tensor(), qstats), kf = kmap.forward(k, mask, kstats);
  if (c.mma)
    cuda::linear_mma_forward(c.m, qf.raw_device_data(), kf.raw_device_data(), v.raw_device_data(),
                             o.raw_device_data(), device);
  else
    cuda::linear_core_forward(c.m.core, qf.raw_device_data(), kf.raw_device_data(),
                              v.raw_device_data(), o.raw_device_data(), device);
}

inline void feature_core_backward(const CoreChoice& c, const FeatureMap& qmap,
                                  const FeatureMap& kmap, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& mask, const Tensor& g,
                                  const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const int device = g.device().index;
  if (c.mma && c.m.map != cuda::FusedMap::none) {
    cuda::linear_mma_backward(c.m, q.raw_device_data(), k.raw_device_data(), v.raw_device_data(),
                              g.raw_device_data(), dq.raw_device_data(), dk.raw_device_data(),
                              dv.raw_device_data(), device);
    return;
  }
  Tensor qstats, kstats;
  const Tensor qf = qmap.forward(q, Tensor(), qstats), kf = kmap.forward(k, mask, kstats);
  const Tensor dqf = Tensor::empty(qf.shape(), qf.dtype(), g.device()),
               dkf = Tensor::empty(kf.shape(), kf.dtype(), g.device());
  if (c.mma)
    cuda::linear_mma_backward(c.m, qf.raw_device_data(), kf.raw_device_data(), v.raw_device_data(),
                              g.raw_device_data(), dqf.raw_device_data(), dkf.raw_device_data(),
                              dv.raw_device_data(), device);
  else
    cuda::linear_core_backward(c.m.core, qf.raw_device_data(), kf.raw_device_data(),
                               v.raw_device_data(), g.raw_device_data(), dqf.raw_device_data(),
                               dkf.raw_device_data(), dv.raw_device_data(), device);
  qmap.backward(q, Tensor(), qf, qstats, dqf, dq);
  kmap.backward(k, mask, kf, kstats, dkf, dk);
}

// o [B, H, N, dv] = the core (args) on qmap(q) and kmap(k, key_padding_mask),
// recorded as the op `name`. `z0` holds the device buffer args.z0 points to
// (or is undefined); the backward closure keeps it alive.
inline Tensor feature_attention_cuda(const char* name, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& key_padding_mask,
                                     const cuda::LinearCoreArgs& args, const FeatureMap& qmap,
                                     const FeatureMap& kmap, const Tensor& z0 = Tensor()) {
  Tensor o = Tensor::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.dtype(), q.device());
  if constexpr (kCudaBuilt)
    feature_core_forward(choose_core(args, qmap, kmap, q, key_padding_mask,
                                     {q.raw_device_data(), k.raw_device_data(), v.raw_device_data(),
                                      o.raw_device_data()}),
                         qmap, kmap, q, k, v, key_padding_mask, o);
  return autograd::record(
      name, {q, k, v}, o,
      [qs = q.detach(), ks = k.detach(), vs = v.detach(), ms = key_padding_mask, args, qmap, kmap,
       z0](const std::vector<Tensor>& grads) {
        const Tensor& g = grads[0];
        Tensor dq = Tensor::empty(qs.shape(), g.dtype(), g.device()),
               dk = Tensor::empty(ks.shape(), g.dtype(), g.device()),
               dv = Tensor::empty(vs.shape(), g.dtype(), g.device());
        if constexpr (kCudaBuilt)
          feature_core_backward(
              choose_core(args, qmap, kmap, qs, ms,
                          {qs.raw_device_data(), ks.raw_device_data(), vs.raw_device_data(),
                           g.raw_device_data(), dq.raw_device_data(), dk.raw_device_data(),
                           dv.raw_device_data()}),
              qmap, kmap, qs, ks, vs, ms, g, dq, dk, dv);
        return std::vector<Tensor>{dq, dk, dv};
      });
}

}  // namespace forge::ops::attention
