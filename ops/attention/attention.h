// The attention mechanisms of docs/ATTENTION.md (their exact formulas and a
// user's guide), each ONE autograd op with its own fused forward and backward.
//
// Shapes (the letters never change meaning): q [B, H, N, d]; k [B, H, M, d];
// v [B, H, M, dv]; output [B, H, N, dv]. key_padding_mask (optional, may be an
// undefined Tensor) is [B, M], bool or u8, true = a real token. `causal`
// means query i sees keys j <= i and needs N == M. f32 and f64 on the CPU.
#pragma once

#include <cstdint>

#include "core/names.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/attention/flash_cuda.h"
#include "ops/attention/linear_core_cuda.h"

namespace forge::ops::attention {

// ---- softmax: scaled dot-product attention, tiled (online softmax) ----
struct SoftmaxOptions {
  double scale = 0;  // 0: d^-1/2
  bool causal = false;
  double dropout = 0;        // on the attention probabilities; 0 when not training
  Generator* gen = nullptr;  // dropout's generator (the default one when null)
};
Tensor softmax(const Tensor& q, const Tensor& k, const Tensor& v,
               const Tensor& key_padding_mask = Tensor(), const SoftmaxOptions& options = {});

// ---- local: blocked sliding-window attention (self-attention, N == M) ----
struct LocalOptions {
  int64_t window = 64;
  int64_t look_backward = 1;
  int64_t look_forward = -1;  // -1: 0 when causal, else 1
  bool causal = false;
  double dropout = 0;
  Generator* gen = nullptr;
};
Tensor local(const Tensor& q, const Tensor& k, const Tensor& v,
             const Tensor& key_padding_mask = Tensor(), const LocalOptions& options = {});

// The GPU kernels of softmax, local and Linformer attention (forward and
// backward), for the whole process: cuda::FlashEngine::tiled (the default),
// ::mma (issue 29's tensor-core kernels: bf16 / f16 with d = dv = 64 or 128
// and no dropout, other cases stay tiled) or ::cudnn (cuDNN's fused attention
// where it takes the case, else as mma); mma and cudnn have not yet run on a
// GPU (docs/GPU.md). The CPU kernels ignore it.
void set_flash_engine(cuda::FlashEngine engine);
cuda::FlashEngine flash_engine();

// The GPU core of linear, efficient and taylor_linear attention, for the
// whole process: cuda::LinearEngine::fma (the default) or ::mma (issue 30's
// tensor-core kernels: bf16 / f16, non-causal, feature and value dims of 64
// or 128, elu + 1 fused into the tiles for linear; other cases stay fma); mma
// has not yet run on a GPU (docs/GPU.md). The CPU kernels ignore it.
void set_linear_engine(cuda::LinearEngine engine);
cuda::LinearEngine linear_engine();

// ---- efficient: Efficient Attention (Shen et al.) ----
struct EfficientOptions {
  bool causal = false;
  int64_t bucket_size = 64;  // causal blind-spot buckets; 1 = full causal prefix
};
Tensor efficient(const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& key_padding_mask = Tensor(), const EfficientOptions& options = {});

// ---- linear: elu(x) + 1 feature map (Katharopoulos et al.) ----
struct LinearOptions {
  bool causal = false;
  double eps = 1e-6;
};
Tensor linear(const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& key_padding_mask = Tensor(), const LinearOptions& options = {});

// ---- taylor_linear: first-order Taylor attention (Li et al.), non-causal ----
Tensor taylor_linear(const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& key_padding_mask = Tensor());

// ---- linformer: sequence projections E, F [kdim, Mmax] with biases [kdim] ----
// Inputs shorter than Mmax use the first M columns of E and F.
struct LinformerOptions {
  double dropout = 0;
  Generator* gen = nullptr;
};
Tensor linformer(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& E,
                 const Tensor& F, const Tensor& bias_E, const Tensor& bias_F,
                 const Tensor& key_padding_mask = Tensor(), const LinformerOptions& options = {});

// ---- favor: Performer FAVOR+ ----
enum class FavorKernel { softmax, relu, no_projection };
inline constexpr NameTable<FavorKernel, 3> kFavorKernelNames{"favor kernel",
                                                             {"softmax", "relu", "no_projection"}};
enum class FavorStabilizer { prefix, global };  // causal softmax kernel only
inline constexpr NameTable<FavorStabilizer, 2> kFavorStabilizerNames{"favor stabilizer",
                                                                     {"prefix", "global"}};
struct FavorOptions {
  FavorKernel kernel = FavorKernel::softmax;
  bool causal = false;
  FavorStabilizer stabilizer = FavorStabilizer::prefix;
};
// W [m, d] (no gradient); undefined for FavorKernel::no_projection.
Tensor favor(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& W,
             const Tensor& key_padding_mask = Tensor(), const FavorOptions& options = {});
// The Gaussian orthogonal random matrix [m, d]; scaling 0: rows scaled by the
// norms of Gaussian vectors, 1: by sqrt(d). Drawn from `gen` (default when null).
Tensor gaussian_orthogonal_random_matrix(int64_t m, int64_t d, int scaling = 0,
                                         DType dtype = DType::f32, Generator* gen = nullptr);

// ---- taylorshift: TaylorShift (Nauen et al.), direct and efficient ----
struct TaylorShiftOptions {
  double a = 0.5, b = 1.0, c = 1.0;
  int64_t n0 = 0;  // switch point: direct when N <= n0; 0: d^2 + d + 1; -1: always efficient
  bool output_normalized = false;  // multiply the output by sqrt(N / d)
};
// tau [H]: the per-head temperature (learnable).
Tensor taylorshift(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& tau,
                   const Tensor& key_padding_mask = Tensor(),
                   const TaylorShiftOptions& options = {});

// TaylorShift's self-check (the reference's comparison of its two forms): the
// mean absolute and mean relative difference |direct - efficient| (relative to
// |direct|) on random q, k, v ~ N(0, 1) of [B, H, N, d] and tau = 1.
struct FormDifference {
  double mean_abs = 0, mean_rel = 0;
};
FormDifference taylorshift_form_difference(int64_t B, int64_t H, int64_t N, int64_t d,
                                           DType dtype = DType::f32, uint64_t seed = 0);

}  // namespace forge::ops::attention
