// TaylorShift attention on the GPU (see taylorshift_cuda.h).
//
// Direct form. A block owns 64 query rows (forward, dq) or 64 key rows (dk, dv)
// of one batch-head and loops over the other side in tiles of 64. Its 256
// threads form a 16 x 16 grid; thread (ty, tx) holds the tile entries
// (ty + 16 r, tx + 16 c), r, c < 4. A score tile is A = q^ k^^T with the row
// normalisations applied as factors, A_ij = (tau / ||q_i||) (1 / ||k_j||) q_i . k_j,
// then T = a A^2 + b A + c (0 at masked keys). No running maximum is needed:
// |A| <= |tau| bounds T, and the CPU divides by rowsum(T) directly too. The
// backward recomputes the tiles: with P = T / l, dP = dO v^T,
// dA = (dP - rowsum(do * o)) / l * (2 a A + b); one kernel over query tiles
// accumulates dq^ = dA k^, one over key tiles dk^ = dA^T q^ and dv = P^T dO.
//
// Efficient form. With x' = [x~ | 1] (a constant feature appended to q~ and k~;
// D1 = d + 1), E = dv + 1, and the feature weights
//   w(p, s) = a (p, s < d),  sigma^2 b (p < d = s),  0 (s < d = p),  sigma^4 c (p = s = d),
// the CPU's Y = a Fq S2 + sigma^2 b q~ S1 + sigma^4 c S0 is
//   Y_i = sum_{p,s} q'_ip q'_is Sw[(p,s)],  Sw = w ∘ S,  S [D1^2, E] = sum_j (k'_j ⊠ k'_j) v~_j^T
// (S2, S1 and S0 are blocks of S). Two GEMM kernels whose product features are
// formed inside their tiles, never stored, do all the work:
//   state:  out[(u,t), c] = sum_r X[r, u] X[r, t] V[r, c]           (a sum over rows)
//   apply:  out[i, c] = sum_{(u,t)} L[i, u] R[i, t] W[(u,t), c]     (per row)
// Forward: Sw = w ∘ state(k', v~); Y = apply(q', q', Sw); o = Y[:, 1:] / Y[:, 0].
// Backward, with dY from dO as the CPU's, Sym(W)[(s,e), p] = W[(p,s), e] + W[(s,p), e]:
//   dq' = apply(q', dY, Sym(Sw));  dS = w ∘ state(q', dY);
//   dk' = apply(k', v~, Sym(dS));  dv~ = apply(k', k', dS[:, 1:]);
// then back through the row normalisations (and tau).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "core/cuda_kernels.cuh"
#include "ops/attention/taylorshift_cuda.h"
#include "ops/attention/tile_engine.cuh"

namespace forge::cuda {

namespace {

constexpr int kTile = 64;                    // tile rows and columns of every tile kernel
constexpr int kSide = 16;                    // the 16 x 16 thread grid of a tile kernel
constexpr int kMicro = kTile / kSide;        // tile entries per thread and side
constexpr int kTileThreads = kSide * kSide;  // 256
constexpr int kChunk = 32;                   // inner-dimension chunk of the direct form's dots
constexpr int kChunkPitch = kChunk + 1;      // shared row pitch of a chunk (no bank conflicts)
constexpr int kScorePitch = kTile + 1;       // shared row pitch of a score tile
constexpr int kRowChunk = 16;                // rows per step of the state kernel
constexpr int kFeatChunk = 16;               // features per step of the apply kernel
constexpr int kFeatPitch = kFeatChunk + 1;

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// A launch's block count, which must fit grid.x.
unsigned blocks(int64_t n) {
  if (n > INT32_MAX) fail("attention::taylorshift: the problem needs more than 2^31 - 1 blocks");
  return static_cast<unsigned>(n);
}

// ---- shared by both forms ----

// Real keys of batch b: counts[b], or all M without a mask.
__device__ __forceinline__ int64_t real_keys(const int64_t* counts, int64_t b, int64_t M) {
  return counts != nullptr ? counts[b] : M;
}

__device__ __forceinline__ bool is_real(const uint8_t* kpm, int64_t b, int64_t M, int64_t j) {
  return kpm == nullptr || kpm[b * M + j] != 0;
}

// output_normalized's factor sqrt(n_b / d), computed in double as the CPU does.
template <typename A>
__device__ __forceinline__ A out_scale(bool normalized, int64_t n, int64_t d) {
  return normalized ? static_cast<A>(sqrt(static_cast<double>(n) / static_cast<double>(d))) : A(1);
}

// counts [B] = the real keys of each batch (one block per batch).
__global__ void count_keys_kernel(const uint8_t* kpm, int64_t M, int64_t* counts) {
  __shared__ long long red[kWarp];
  long long n = 0;
  for (int64_t j = threadIdx.x; j < M; j += blockDim.x) n += kpm[blockIdx.x * M + j] != 0;
  n = block_sum(n, red);
  if (threadIdx.x == 0) counts[blockIdx.x] = n;
}

// One warp per row r of x [rows, d] (rows = BH * R, head h = (r / R) % H):
// inv[r] = 1 / ||x_r|| (inv may be null) and, when xa is given, the augmented
// row xa[r] [d + 1] = [s_h x_r / ||x_r||, 1], s_h = sigma * (tau ? tau[h] : 1).
// As the CPU, no epsilon: a zero row gives inf and NaN.
template <typename T>
__global__ void normalize_rows_kernel(const T* x, int64_t rows, int64_t R, int64_t H, int64_t d,
                                      const T* tau, acc_t<T> sigma, acc_t<T>* inv, acc_t<T>* xa) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; r < rows;
       r += warps) {
    const T* xr = x + r * d;
    A ss = 0;
    for (int64_t c = lane; c < d; c += kWarp) {
      const A xv = to_acc<A>(xr[c]);
      ss += xv * xv;
    }
    const A iv = A(1) / sqrt(warp_sum(ss));
    if (inv != nullptr && lane == 0) inv[r] = iv;
    if (xa != nullptr) {
      const A scale = sigma * (tau != nullptr ? to_acc<A>(tau[(r / R) % H]) : A(1));
      A* out = xa + r * (d + 1);
      for (int64_t c = lane; c < d; c += kWarp) out[c] = scale * to_acc<A>(xr[c]) * iv;
      if (lane == 0) out[d] = A(1);
    }
  }
}

// dtau[h] = factor * sum over b, i of rows[(b H + h) N + i], one block per head,
// in a fixed order (each thread a fixed stride, then the block's fixed tree).
template <typename T>
__global__ void dtau_kernel(const acc_t<T>* rows, int64_t B, int64_t H, int64_t N, acc_t<T> factor,
                            T* dtau) {
  using A = acc_t<T>;
  __shared__ A red[kWarp];
  const int64_t h = blockIdx.x;
  A s = 0;
  for (int64_t t = threadIdx.x; t < B * N; t += blockDim.x)
    s += rows[((t / N) * H + h) * N + t % N];
  s = block_sum(s, red);
  if (threadIdx.x == 0) dtau[h] = from_acc<T>(factor * s);
}

// ---- direct form ----

template <typename A>
struct DirectParams {
  int64_t H, N, M, d, dv;
  A a, b, c;
  bool normalized;
  const uint8_t* kpm;     // [B, M] or null
  const int64_t* counts;  // [B] real keys, or null (all M are real)
};

// Xs [64, 64] = x[r0 + r, c0 + cc] of x [rows, cols], zero outside x.
template <typename T, typename A>
__device__ __forceinline__ void load_block(A* Xs, const T* x, int64_t r0, int64_t rows, int64_t c0,
                                           int64_t cols) {
  for (int idx = threadIdx.x; idx < kTile * kTile; idx += kTileThreads) {
    const int r = idx / kTile, cc = idx % kTile;
    const int64_t row = r0 + r, col = c0 + cc;
    Xs[r * kTile + cc] = row < rows && col < cols ? to_acc<A>(x[row * cols + col]) : A(0);
  }
}

// acc[r][c] = x[x0 + ty + 16 r] . y[y0 + tx + 16 c] for rows of x [xrows, n] and
// y [yrows, n] (0 past their ends), ty = threadIdx.x / 16, tx = threadIdx.x %
// 16: the tile engine's FMA product (tile_engine.cuh), its operand tiles in
// the shared memory of Xs and the Ys after it ([64, kChunkPitch] each). Starts with a barrier:
// whatever the block wrote to shared memory before the call is visible after it, and Xs, Ys may be
// overwritten.
template <typename T, typename A>
__device__ __forceinline__ void tile_dots(A* Xs, const T* x, int64_t x0, int64_t xrows, const T* y,
                                          int64_t y0, int64_t yrows, int64_t n,
                                          A (&acc)[kMicro][kMicro]) {
  static_assert(sizeof(tiles::FmaSmem<A>) <= 2 * kTile * kChunkPitch * sizeof(A),
                "the engine's operand tiles fit in Xs, Ys");
#pragma unroll
  for (int r = 0; r < kMicro; ++r)
#pragma unroll
    for (int c = 0; c < kMicro; ++c) acc[r][c] = A(0);
  __syncthreads();  // the previous readers of Xs, Ys are done
  tiles::fma_tile_product<true, true>(
      acc, n, *reinterpret_cast<tiles::FmaSmem<A>*>(Xs),
      [&](int m, int64_t k) {
        const int64_t row = x0 + m;
        return row < xrows ? to_acc<A>(x[row * n + k]) : A(0);
      },
      [&](int64_t k, int c) {
        const int64_t row = y0 + c;
        return row < yrows ? to_acc<A>(y[row * n + k]) : A(0);
      });
}

// acc[ch][r][c] += sum_j S[ty + 16 r, j] x[x0 + j, 64 ch + tx + 16 c]: a score tile
// S [64, kScorePitch] in shared memory times 64 rows of x [xrows, cols] (0 past
// its ends), in column blocks of 64 through shared Xb [64, 64]. Starts each
// block with a barrier (so S may be written just before the call).
template <typename T, typename A, int NC>
__device__ __forceinline__ void score_times_rows(const A* S, A* Xb, const T* x, int64_t x0,
                                                 int64_t xrows, int64_t cols, int ty, int tx,
                                                 A (&acc)[NC][kMicro][kMicro]) {
#pragma unroll
  for (int ch = 0; ch < NC; ++ch) {
    if (ch * kTile >= cols) break;  // uniform over the block
    __syncthreads();                // S is written; the previous readers of Xb are done
    load_block(Xb, x, x0, xrows, static_cast<int64_t>(ch) * kTile, cols);
    __syncthreads();
#pragma unroll 4
    for (int j = 0; j < kTile; ++j) {
      A sr[kMicro], xc[kMicro];
#pragma unroll
      for (int r = 0; r < kMicro; ++r) sr[r] = S[(ty + kSide * r) * kScorePitch + j];
#pragma unroll
      for (int c = 0; c < kMicro; ++c) xc[c] = Xb[j * kTile + tx + kSide * c];
#pragma unroll
      for (int r = 0; r < kMicro; ++r)
#pragma unroll
        for (int c = 0; c < kMicro; ++c) acc[ch][r][c] += sr[r] * xc[c];
    }
  }
}

// The sum of v over the 16 threads of one tile row (the tx of one ty: half a warp).
// Every lane of the warp must call it.
template <typename A>
__device__ __forceinline__ A row_sum16(A v) {
  for (int o = kSide / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The backward of y = scale * x / ||x|| for the 4 rows r of a thread's tile
// (xrow[r], dxrow[r]: the rows of x and dx; inv[r] = 1 / ||x||; rows that are
// not valid are skipped): given dy = acc at the columns 64 ch + tx + 16 c < d,
// writes dx = scale inv (dy - u (u . dy)), u = x inv, and returns u . dy of
// each row through udy. Every lane of the warp must call it.
template <typename T, typename A, int NC>
__device__ __forceinline__ void normalize_backward_tile(
    const T* const (&xrow)[kMicro], const A (&inv)[kMicro], const bool (&valid)[kMicro], A scale,
    int64_t d, int tx, const A (&acc)[NC][kMicro][kMicro], T* const (&dxrow)[kMicro],
    A (&udy)[kMicro]) {
#pragma unroll
  for (int r = 0; r < kMicro; ++r) {
    A s = 0;
#pragma unroll
    for (int ch = 0; ch < NC; ++ch)
#pragma unroll
      for (int c = 0; c < kMicro; ++c) {
        const int64_t col = static_cast<int64_t>(ch) * kTile + tx + kSide * c;
        if (valid[r] && col < d) s += to_acc<A>(xrow[r][col]) * inv[r] * acc[ch][r][c];
      }
    udy[r] = row_sum16(s);
    if (!valid[r]) continue;
#pragma unroll
    for (int ch = 0; ch < NC; ++ch)
#pragma unroll
      for (int c = 0; c < kMicro; ++c) {
        const int64_t col = static_cast<int64_t>(ch) * kTile + tx + kSide * c;
        if (col < d)
          dxrow[r][col] = from_acc<T>(scale * inv[r] *
                                      (acc[ch][r][c] - to_acc<A>(xrow[r][col]) * inv[r] * udy[r]));
      }
  }
}

template <typename A>
constexpr size_t kForwardSmem = (2 * kTile * kChunkPitch + kTile * kScorePitch + 3 * kTile) *
                                sizeof(A);
template <typename A>
constexpr size_t kDqSmem = (2 * kTile * kChunkPitch + kTile * kScorePitch + 5 * kTile) * sizeof(A);
template <typename A>
constexpr size_t kDkdvSmem = (2 * kTile * kChunkPitch + 2 * kTile * kScorePitch + 5 * kTile) *
                             sizeof(A);
// The [64, 64] blocks reuse the two chunk buffers.
static_assert(kTile * kTile <= 2 * kTile * kChunkPitch);

// One block per (query tile, bh): o [BH, N, dv] and l [BH, N] = rowsum(T).
// NC column blocks of 64 cover dv.
template <typename T, int NC>
__global__ void __launch_bounds__(kTileThreads)
    direct_forward_kernel(DirectParams<acc_t<T>> p, const T* q, const T* k, const T* v,
                          const T* tau, const acc_t<T>* qinv, const acc_t<T>* kinv, T* o,
                          acc_t<T>* l_out) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  A* Xs = reinterpret_cast<A*>(smem);  // tile_dots' q, k tiles (with Ys), then [64, 64] v blocks
  A* Ys = Xs + kTile * kChunkPitch;    // [64, kChunkPitch]: the rest of tile_dots' tiles
  A* Ts = Ys + kTile * kChunkPitch;    // [64 queries, kScorePitch] T of the tile
  A* qs = Ts + kTile * kScorePitch;    // [64] tau / ||q_i||, 0 past N
  A* ks = qs + kTile;                  // [64] 1 / ||k_j||, 0 past M
  A* kr = ks + kTile;                  // [64] 1 at a real key, 0 at a masked one or past M
  const int64_t tiles = ceil_div(p.N, kTile);
  const int64_t bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * kTile;
  const int64_t b = bh / p.H;
  const int tid = threadIdx.x, ty = tid / kSide, tx = tid % kSide;
  const T* qb = q + bh * p.N * p.d;
  const T* kb = k + bh * p.M * p.d;
  const T* vb = v + bh * p.M * p.dv;
  if (tid < kTile)
    qs[tid] = i0 + tid < p.N ? to_acc<A>(tau[bh % p.H]) * qinv[bh * p.N + i0 + tid] : A(0);
  A acc[NC][kMicro][kMicro] = {};
  A l[kMicro] = {};
  for (int64_t j0 = 0; j0 < p.M; j0 += kTile) {
    __syncthreads();  // the previous tile's readers of ks, kr, Ts are done
    if (tid < kTile) {
      const int64_t j = j0 + tid;
      ks[tid] = j < p.M ? kinv[bh * p.M + j] : A(0);
      kr[tid] = j < p.M && is_real(p.kpm, b, p.M, j) ? A(1) : A(0);
    }
    A s[kMicro][kMicro];
    tile_dots(Xs, qb, i0, p.N, kb, j0, p.M, p.d, s);
#pragma unroll
    for (int r = 0; r < kMicro; ++r)
#pragma unroll
      for (int c = 0; c < kMicro; ++c) {
        const int i = ty + kSide * r, j = tx + kSide * c;
        const A x = qs[i] * ks[j] * s[r][c];
        Ts[i * kScorePitch + j] = kr[j] != A(0) ? (p.a * x + p.b) * x + p.c : A(0);
      }
    __syncthreads();  // Ts is complete
#pragma unroll
    for (int r = 0; r < kMicro; ++r)
      for (int j = 0; j < kTile; ++j) l[r] += Ts[(ty + kSide * r) * kScorePitch + j];
    score_times_rows<T, A, NC>(Ts, Xs, vb, j0, p.M, p.dv, ty, tx, acc);
  }
  const A scale = out_scale<A>(p.normalized, real_keys(p.counts, b, p.M), p.d);
#pragma unroll
  for (int r = 0; r < kMicro; ++r) {
    const int64_t i = i0 + ty + kSide * r;
    if (i >= p.N) continue;
    const A f = l[r] != A(0) ? scale / l[r] : A(0);
    T* orow = o + (bh * p.N + i) * p.dv;
#pragma unroll
    for (int ch = 0; ch < NC; ++ch)
#pragma unroll
      for (int c = 0; c < kMicro; ++c) {
        const int64_t col = static_cast<int64_t>(ch) * kTile + tx + kSide * c;
        if (col < p.dv) orow[col] = from_acc<T>(acc[ch][r][c] * f);
      }
    if (tx == 0) l_out[bh * p.N + i] = l[r];
  }
}

// One block per (query tile, bh): dq [BH, N, d] and dtau_rows [BH, N] = u_i . dq^_i,
// u_i = q_i / ||q_i||. D [BH, N] = rowsum(do * o); NC column blocks cover d.
template <typename T, int NC>
__global__ void __launch_bounds__(kTileThreads)
    direct_dq_kernel(DirectParams<acc_t<T>> p, const T* q, const T* k, const T* v, const T* tau,
                     const acc_t<T>* qinv, const acc_t<T>* kinv, const acc_t<T>* l,
                     const acc_t<T>* D, const T* dout, T* dq, acc_t<T>* dtau_rows) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  A* Xs = reinterpret_cast<A*>(smem);  // tile_dots' tiles (with Ys), then [64, 64] k blocks
  A* Ys = Xs + kTile * kChunkPitch;    // [64, kChunkPitch]: the rest of tile_dots' tiles
  A* dAs = Ys + kTile * kChunkPitch;   // [64 queries, kScorePitch] dA_ij / ||k_j||
  A* qs = dAs + kTile * kScorePitch;   // [64] tau / ||q_i||, 0 past N
  A* il = qs + kTile;                  // [64] 1 / l_i (0 where l_i = 0 or past N)
  A* Dr = il + kTile;                  // [64] rowsum(do * o)
  A* ks = Dr + kTile;                  // [64] 1 / ||k_j||, 0 past M
  A* kr = ks + kTile;                  // [64] 1 at a real key, 0 at a masked one or past M
  const int64_t tiles = ceil_div(p.N, kTile);
  const int64_t bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * kTile;
  const int64_t b = bh / p.H;
  const int tid = threadIdx.x, ty = tid / kSide, tx = tid % kSide;
  const T* qb = q + bh * p.N * p.d;
  const T* kb = k + bh * p.M * p.d;
  const T* vb = v + bh * p.M * p.dv;
  const T* gb = dout + bh * p.N * p.dv;
  const A th = to_acc<A>(tau[bh % p.H]);
  if (tid < kTile) {
    const int64_t i = i0 + tid;
    const bool valid = i < p.N;
    qs[tid] = valid ? th * qinv[bh * p.N + i] : A(0);
    il[tid] = valid && l[bh * p.N + i] != A(0) ? A(1) / l[bh * p.N + i] : A(0);
    Dr[tid] = valid ? D[bh * p.N + i] : A(0);
  }
  const A scale = out_scale<A>(p.normalized, real_keys(p.counts, b, p.M), p.d);
  A dqh[NC][kMicro][kMicro] = {};
  for (int64_t j0 = 0; j0 < p.M; j0 += kTile) {
    __syncthreads();  // the previous tile's readers of ks, kr, dAs are done
    if (tid < kTile) {
      const int64_t j = j0 + tid;
      ks[tid] = j < p.M ? kinv[bh * p.M + j] : A(0);
      kr[tid] = j < p.M && is_real(p.kpm, b, p.M, j) ? A(1) : A(0);
    }
    A s[kMicro][kMicro], dp[kMicro][kMicro];
    tile_dots(Xs, qb, i0, p.N, kb, j0, p.M, p.d, s);
    tile_dots(Xs, gb, i0, p.N, vb, j0, p.M, p.dv, dp);
#pragma unroll
    for (int r = 0; r < kMicro; ++r)
#pragma unroll
      for (int c = 0; c < kMicro; ++c) {
        const int i = ty + kSide * r, j = tx + kSide * c;
        const A x = qs[i] * ks[j] * s[r][c];
        // dP = dO v^T with dO = scale * do; dq^ = dA k^ = (dA / ||k_j||) k_j.
        dAs[i * kScorePitch + j] =
            kr[j] != A(0) ? (scale * dp[r][c] - Dr[i]) * il[i] * (A(2) * p.a * x + p.b) * ks[j]
                          : A(0);
      }
    score_times_rows<T, A, NC>(dAs, Xs, kb, j0, p.M, p.d, ty, tx, dqh);
  }
  // q^ = tau q / ||q||: dq = tau / ||q|| (dq^ - u (u . dq^)), dtau = sum_i u_i . dq^_i.
  const T* xrow[kMicro];
  T* dxrow[kMicro];
  A inv[kMicro], udq[kMicro];
  bool valid[kMicro];
#pragma unroll
  for (int r = 0; r < kMicro; ++r) {
    const int64_t i = i0 + ty + kSide * r;
    valid[r] = i < p.N;
    inv[r] = valid[r] ? qinv[bh * p.N + i] : A(0);
    xrow[r] = qb + (valid[r] ? i : 0) * p.d;
    dxrow[r] = dq + (bh * p.N + (valid[r] ? i : 0)) * p.d;
  }
  normalize_backward_tile<T, A, NC>(xrow, inv, valid, th, p.d, tx, dqh, dxrow, udq);
#pragma unroll
  for (int r = 0; r < kMicro; ++r)
    if (valid[r] && tx == 0) dtau_rows[bh * p.N + i0 + ty + kSide * r] = udq[r];
}

// One block per (key tile, bh): dk [BH, M, d] and dv [BH, M, dv]. NC column
// blocks cover both d and dv.
template <typename T, int NC>
__global__ void __launch_bounds__(kTileThreads)
    direct_dkdv_kernel(DirectParams<acc_t<T>> p, const T* q, const T* k, const T* v, const T* tau,
                       const acc_t<T>* qinv, const acc_t<T>* kinv, const acc_t<T>* l,
                       const acc_t<T>* D, const T* dout, T* dk, T* dv) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  A* Xs = reinterpret_cast<A*>(smem);  // tile_dots' tiles (with Ys); [64, 64] do / q blocks
  A* Ys = Xs + kTile * kChunkPitch;    // [64, kChunkPitch]: the rest of tile_dots' tiles
  A* Ps = Ys + kTile * kChunkPitch;    // [64 keys, kScorePitch] scale * P_ij
  A* dAs = Ps + kTile * kScorePitch;   // [64 keys, kScorePitch] dA_ij tau / ||q_i||
  A* ks = dAs + kTile * kScorePitch;   // [64] 1 / ||k_j||, 0 past M
  A* kr = ks + kTile;                  // [64] 1 at a real key, 0 at a masked one or past M
  A* qs = kr + kTile;                  // [64] tau / ||q_i||, 0 past N
  A* il = qs + kTile;                  // [64] 1 / l_i (0 where l_i = 0 or past N)
  A* Dr = il + kTile;                  // [64] rowsum(do * o)
  const int64_t tiles = ceil_div(p.M, kTile);
  const int64_t bh = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * kTile;
  const int64_t b = bh / p.H;
  const int tid = threadIdx.x, ty = tid / kSide, tx = tid % kSide;
  const T* qb = q + bh * p.N * p.d;
  const T* kb = k + bh * p.M * p.d;
  const T* vb = v + bh * p.M * p.dv;
  const T* gb = dout + bh * p.N * p.dv;
  const A th = to_acc<A>(tau[bh % p.H]);
  if (tid < kTile) {
    const int64_t j = j0 + tid;
    ks[tid] = j < p.M ? kinv[bh * p.M + j] : A(0);
    kr[tid] = j < p.M && is_real(p.kpm, b, p.M, j) ? A(1) : A(0);
  }
  const A scale = out_scale<A>(p.normalized, real_keys(p.counts, b, p.M), p.d);
  A dva[NC][kMicro][kMicro] = {}, dkh[NC][kMicro][kMicro] = {};
  for (int64_t i0 = 0; i0 < p.N; i0 += kTile) {
    __syncthreads();  // the previous tile's readers of qs, il, Dr, Ps, dAs are done
    if (tid < kTile) {
      const int64_t i = i0 + tid;
      const bool valid = i < p.N;
      qs[tid] = valid ? th * qinv[bh * p.N + i] : A(0);
      il[tid] = valid && l[bh * p.N + i] != A(0) ? A(1) / l[bh * p.N + i] : A(0);
      Dr[tid] = valid ? D[bh * p.N + i] : A(0);
    }
    // Transposed tiles: entry (r, c) is key j = ty + 16 r, query i = tx + 16 c.
    A s[kMicro][kMicro], dp[kMicro][kMicro];
    tile_dots(Xs, kb, j0, p.M, qb, i0, p.N, p.d, s);
    tile_dots(Xs, vb, j0, p.M, gb, i0, p.N, p.dv, dp);
#pragma unroll
    for (int r = 0; r < kMicro; ++r)
#pragma unroll
      for (int c = 0; c < kMicro; ++c) {
        const int j = ty + kSide * r, i = tx + kSide * c;
        const A x = qs[i] * ks[j] * s[r][c];
        const bool real = kr[j] != A(0);
        // dv = P^T dO with dO = scale * do; dk^ = dA^T q^ = (dA tau / ||q_i||) q_i.
        Ps[j * kScorePitch + i] = real ? ((p.a * x + p.b) * x + p.c) * il[i] * scale : A(0);
        dAs[j * kScorePitch + i] =
            real ? (scale * dp[r][c] - Dr[i]) * il[i] * (A(2) * p.a * x + p.b) * qs[i] : A(0);
      }
    score_times_rows<T, A, NC>(Ps, Xs, gb, i0, p.N, p.dv, ty, tx, dva);
    score_times_rows<T, A, NC>(dAs, Xs, qb, i0, p.N, p.d, ty, tx, dkh);
  }
  const T* xrow[kMicro];
  T* dxrow[kMicro];
  A inv[kMicro], udk[kMicro];
  bool valid[kMicro];
#pragma unroll
  for (int r = 0; r < kMicro; ++r) {
    const int64_t j = j0 + ty + kSide * r;
    valid[r] = j < p.M;
    inv[r] = valid[r] ? kinv[bh * p.M + j] : A(0);
    xrow[r] = kb + (valid[r] ? j : 0) * p.d;
    dxrow[r] = dk + (bh * p.M + (valid[r] ? j : 0)) * p.d;
    if (!valid[r]) continue;
    T* dvrow = dv + (bh * p.M + j) * p.dv;
#pragma unroll
    for (int ch = 0; ch < NC; ++ch)
#pragma unroll
      for (int c = 0; c < kMicro; ++c) {
        const int64_t col = static_cast<int64_t>(ch) * kTile + tx + kSide * c;
        if (col < p.dv) dvrow[col] = from_acc<T>(dva[ch][r][c]);
      }
  }
  // k^ = k / ||k||: dk = (dk^ - u (u . dk^)) / ||k||.
  normalize_backward_tile<T, A, NC>(xrow, inv, valid, A(1), p.d, tx, dkh, dxrow, udk);
}

// ---- efficient form ----

// The feature weights w(f), f = p D1 + s (see the top of the file).
template <typename A>
struct FeatureWeights {
  int D1;
  A a, b2, c4;  // a, sigma^2 b, sigma^4 c
};

template <typename A>
__device__ __forceinline__ A feature_weight(const FeatureWeights<A>& w, int f) {
  const int d = w.D1 - 1, p = f / w.D1, s = f % w.D1;
  if (p < d) return s < d ? w.a : w.b2;
  return s < d ? A(0) : w.c4;
}

// One block per (64 features, 16 CPT columns, split, bh):
//   part[split, bh, f, c] = sum_{r in the split's rows} X[r, f / U] X[r, f % U] V[r, c]
// for X [BH, rows, U], V [BH, rows, C], f < U^2; the features are formed in
// shared memory, 16 rows at a time.
template <typename A, int CPT>
__global__ void __launch_bounds__(kTileThreads)
    state_kernel(const A* X, int U, const A* V, int C, int64_t rows, int64_t splits,
                 int64_t rows_per_split, int64_t BH, A* part) {
  constexpr int TC = kSide * CPT;
  __shared__ A Fs[kRowChunk * kTile];  // [16 rows, 64 features]
  __shared__ A Vs[kRowChunk * TC];     // [16 rows, TC columns]
  const int F = U * U;
  const int64_t ftiles = ceil_div(F, kTile), ctiles = ceil_div(C, TC);
  int64_t x = blockIdx.x;
  const int f0 = static_cast<int>(x % ftiles) * kTile;
  x /= ftiles;
  const int c0 = static_cast<int>(x % ctiles) * TC;
  x /= ctiles;
  const int64_t split = x % splits, bh = x / splits;
  const int64_t r_begin = split * rows_per_split;
  const int64_t r_end = std::min(rows, r_begin + rows_per_split);
  const A* Xb = X + bh * rows * U;
  const A* Vb = V + bh * rows * C;
  const int tid = threadIdx.x, ty = tid / kSide, tx = tid % kSide;
  A acc[kMicro][CPT] = {};
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kRowChunk) {
    __syncthreads();  // the previous step's readers of Fs, Vs are done
    for (int idx = tid; idx < kRowChunk * kTile; idx += kTileThreads) {
      const int64_t r = r0 + idx / kTile;
      const int f = f0 + idx % kTile;
      Fs[idx] = r < r_end && f < F ? Xb[r * U + f / U] * Xb[r * U + f % U] : A(0);
    }
    for (int idx = tid; idx < kRowChunk * TC; idx += kTileThreads) {
      const int64_t r = r0 + idx / TC;
      const int c = c0 + idx % TC;
      Vs[idx] = r < r_end && c < C ? Vb[r * C + c] : A(0);
    }
    __syncthreads();
#pragma unroll 4
    for (int rr = 0; rr < kRowChunk; ++rr) {
      A fr[kMicro], vc[CPT];
#pragma unroll
      for (int m = 0; m < kMicro; ++m) fr[m] = Fs[rr * kTile + ty + kSide * m];
#pragma unroll
      for (int c = 0; c < CPT; ++c) vc[c] = Vs[rr * TC + tx + kSide * c];
#pragma unroll
      for (int m = 0; m < kMicro; ++m)
#pragma unroll
        for (int c = 0; c < CPT; ++c) acc[m][c] += fr[m] * vc[c];
    }
  }
  A* out = part + (split * BH + bh) * static_cast<int64_t>(F) * C;
#pragma unroll
  for (int m = 0; m < kMicro; ++m) {
    const int f = f0 + ty + kSide * m;
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
      const int col = c0 + tx + kSide * c;
      if (f < F && col < C) out[static_cast<int64_t>(f) * C + col] = acc[m][c];
    }
  }
}

// out[bh, f, c] = w(f) * sum over the splits, in order, of part[split, bh, f, c]
// (n = BH F C). part may be out itself when there is one split.
template <typename A>
__global__ void state_finalize_kernel(const A* part, int64_t splits, int64_t n, int F, int C,
                                      FeatureWeights<A> w, A* out) {
  FORGE_GRID_STRIDE(i, n) {
    A s = 0;
    for (int64_t sp = 0; sp < splits; ++sp) s += part[sp * n + i];
    out[i] = feature_weight(w, static_cast<int>((i / C) % F)) * s;
  }
}

// Sym [BH, D1 E, d]: Sym[(s E + e), p] = W[(p D1 + s), e] + W[(s D1 + p), e] for
// W [BH, D1^2, E] (n = BH D1 E d): the state's two slots of feature (p, s),
// arranged for the apply kernel's features (s, e) and outputs p < d.
template <typename A>
__global__ void symmetrize_kernel(const A* W, int D1, int E, int64_t n, A* sym) {
  const int d = D1 - 1;
  FORGE_GRID_STRIDE(i, n) {
    const int p = static_cast<int>(i % d);
    int64_t t = i / d;
    const int e = static_cast<int>(t % E);
    t /= E;
    const int s = static_cast<int>(t % D1);
    const int64_t bh = t / D1;
    const A* Wb = W + bh * D1 * D1 * static_cast<int64_t>(E);
    sym[i] = Wb[(p * D1 + s) * static_cast<int64_t>(E) + e] +
             Wb[(s * D1 + p) * static_cast<int64_t>(E) + e];
  }
}

template <typename A>
struct ApplyArgs {
  const A* L;  // [BH, rows, ldl]: the first factor of feature f, L[i, f / U2]
  int64_t ldl;
  const A* R;  // [BH, rows, ldr]: the second factor, R[i, f % U2]
  int64_t ldr;
  int U2, F;   // features f < F
  const A* W;  // per bh W + bh * wstride: [F, C] with row pitch ldw
  int64_t ldw, wstride;
  int C;  // output columns
  int64_t rows, BH;
  A* out;  // [BH, rows, ldo]
  int64_t ldo;
};

// One block per (64 rows, 16 CPT columns, bh):
//   out[i, c] = sum_{f < F} L[i, f / U2] R[i, f % U2] W[f, c],
// the features formed in shared memory, 16 at a time.
template <typename A, int CPT>
__global__ void __launch_bounds__(kTileThreads) apply_kernel(ApplyArgs<A> g) {
  constexpr int TC = kSide * CPT;
  __shared__ A Fs[kTile * kFeatPitch];  // [64 rows, 16 features]
  __shared__ A Ws[kFeatChunk * TC];     // [16 features, TC columns]
  const int64_t rtiles = ceil_div(g.rows, kTile), ctiles = ceil_div(g.C, TC);
  int64_t x = blockIdx.x;
  const int64_t i0 = (x % rtiles) * kTile;
  x /= rtiles;
  const int c0 = static_cast<int>(x % ctiles) * TC;
  const int64_t bh = x / ctiles;
  const A* Lb = g.L + bh * g.rows * g.ldl;
  const A* Rb = g.R + bh * g.rows * g.ldr;
  const A* Wb = g.W + bh * g.wstride;
  const int tid = threadIdx.x, ty = tid / kSide, tx = tid % kSide;
  A acc[kMicro][CPT] = {};
  for (int f0 = 0; f0 < g.F; f0 += kFeatChunk) {
    __syncthreads();  // the previous step's readers of Fs, Ws are done
    for (int idx = tid; idx < kTile * kFeatChunk; idx += kTileThreads) {
      const int r = idx / kFeatChunk, ff = idx % kFeatChunk;
      const int64_t i = i0 + r;
      const int f = f0 + ff;
      Fs[r * kFeatPitch + ff] =
          i < g.rows && f < g.F ? Lb[i * g.ldl + f / g.U2] * Rb[i * g.ldr + f % g.U2] : A(0);
    }
    for (int idx = tid; idx < kFeatChunk * TC; idx += kTileThreads) {
      const int f = f0 + idx / TC, c = c0 + idx % TC;
      Ws[idx] = f < g.F && c < g.C ? Wb[f * g.ldw + c] : A(0);
    }
    __syncthreads();
#pragma unroll 4
    for (int ff = 0; ff < kFeatChunk; ++ff) {
      A fr[kMicro], wc[CPT];
#pragma unroll
      for (int m = 0; m < kMicro; ++m) fr[m] = Fs[(ty + kSide * m) * kFeatPitch + ff];
#pragma unroll
      for (int c = 0; c < CPT; ++c) wc[c] = Ws[ff * TC + tx + kSide * c];
#pragma unroll
      for (int m = 0; m < kMicro; ++m)
#pragma unroll
        for (int c = 0; c < CPT; ++c) acc[m][c] += fr[m] * wc[c];
    }
  }
  A* out = g.out + bh * g.rows * g.ldo;
#pragma unroll
  for (int m = 0; m < kMicro; ++m) {
    const int64_t i = i0 + ty + kSide * m;
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
      const int col = c0 + tx + kSide * c;
      if (i < g.rows && col < g.C) out[i * g.ldo + col] = acc[m][c];
    }
  }
}

// v~ [BH, M, E]: v~[j] = f_j [1 | v_j], f_j = 1 / max(n_b, 1) at a real key and
// 0 at a masked one (n = BH M E).
template <typename T>
__global__ void values_kernel(const T* v, const uint8_t* kpm, const int64_t* counts, int64_t H,
                              int64_t M, int64_t dv, int64_t n, acc_t<T>* vt) {
  using A = acc_t<T>;
  const int64_t E = dv + 1;
  FORGE_GRID_STRIDE(i, n) {
    const int64_t e = i % E, r = i / E, j = r % M, b = r / M / H;
    const A f = is_real(kpm, b, M, j)
                    ? A(1) / static_cast<A>(std::max<int64_t>(real_keys(counts, b, M), 1))
                    : A(0);
    vt[i] = e == 0 ? f : f * to_acc<A>(v[r * dv + e - 1]);
  }
}

// o [BH, N, dv] = Y[:, 1:] scale_b / y0 and y0 [BH, N] = Y[:, 0] (0 when batch b
// has no real key) from Y [BH, N, E] (n = BH N E: one element of Y each).
template <typename T>
__global__ void efficient_output_kernel(const acc_t<T>* Y, const int64_t* counts, bool normalized,
                                        int64_t H, int64_t N, int64_t M, int64_t d, int64_t dv,
                                        int64_t n, T* o, acc_t<T>* y0) {
  using A = acc_t<T>;
  const int64_t E = dv + 1;
  FORGE_GRID_STRIDE(i, n) {
    const int64_t e = i % E, r = i / E, b = r / N / H;
    const int64_t keys = real_keys(counts, b, M);
    const A y = keys > 0 ? Y[r * E] : A(0);
    if (e == 0) {
      y0[r] = y;
    } else {
      const A f = y != A(0) ? out_scale<A>(normalized, keys, d) / y : A(0);
      o[r * dv + e - 1] = from_acc<T>(Y[i] * f);
    }
  }
}

// One warp per row r < rows = BH N: dY [BH, N, E] = [-D, scale_b do] / y0 with
// D = do . o (0 where y0 = 0), as the CPU.
template <typename T>
__global__ void efficient_dy_kernel(const T* o, const T* dout, const acc_t<T>* y0,
                                    const int64_t* counts, bool normalized, int64_t rows, int64_t H,
                                    int64_t N, int64_t M, int64_t d, int64_t dv, acc_t<T>* dY) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; r < rows;
       r += warps) {
    const T* orow = o + r * dv;
    const T* grow = dout + r * dv;
    A D = 0;
    for (int64_t x = lane; x < dv; x += kWarp) D += to_acc<A>(grow[x]) * to_acc<A>(orow[x]);
    D = warp_sum(D);
    const int64_t b = r / N / H;
    const A f = y0[r] != A(0) ? A(1) / y0[r] : A(0);
    const A scale = out_scale<A>(normalized, real_keys(counts, b, M), d);
    A* dy = dY + r * (dv + 1);
    if (lane == 0) dy[0] = -D * f;
    for (int64_t x = lane; x < dv; x += kWarp) dy[1 + x] = scale * to_acc<A>(grow[x]) * f;
  }
}

// One warp per row r of x [rows, d] (rows = BH R, head h = (r / R) % H), the
// backward of y = s_h x / ||x||, s_h = sigma * (tau ? tau[h] : 1), given
// dy = g[r, :d] (row pitch ldg): dx = s_h inv (dy - u (u . dy)), u = x inv;
// udy[r] = u . dy when udy is given (the share of d s_h / d tau / sigma).
template <typename T>
__global__ void normalize_backward_kernel(const T* x, const acc_t<T>* inv, const acc_t<T>* g,
                                          int64_t ldg, int64_t rows, int64_t R, int64_t H,
                                          int64_t d, const T* tau, acc_t<T> sigma, T* dx,
                                          acc_t<T>* udy) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; r < rows;
       r += warps) {
    const T* xr = x + r * d;
    const A* gr = g + r * ldg;
    const A iv = inv[r];
    A s = 0;
    for (int64_t c = lane; c < d; c += kWarp) s += to_acc<A>(xr[c]) * iv * gr[c];
    s = warp_sum(s);
    const A scale = sigma * (tau != nullptr ? to_acc<A>(tau[(r / R) % H]) : A(1));
    for (int64_t c = lane; c < d; c += kWarp)
      dx[r * d + c] = from_acc<T>(scale * iv * (gr[c] - to_acc<A>(xr[c]) * iv * s));
    if (udy != nullptr && lane == 0) udy[r] = s;
  }
}

// dv [BH, M, dv] = f_j dvt[j] with f_j of values_kernel (n = BH M dv): v~ = f [1 | v].
template <typename T>
__global__ void value_grads_kernel(const acc_t<T>* dvt, const uint8_t* kpm, const int64_t* counts,
                                   int64_t H, int64_t M, int64_t dv, int64_t n, T* dv_out) {
  using A = acc_t<T>;
  FORGE_GRID_STRIDE(i, n) {
    const int64_t r = i / dv, j = r % M, b = r / M / H;
    const A f = is_real(kpm, b, M, j)
                    ? A(1) / static_cast<A>(std::max<int64_t>(real_keys(counts, b, M), 1))
                    : A(0);
    dv_out[i] = from_acc<T>(f * dvt[i]);
  }
}

// ---- launchers ----

// Launches a tile kernel (256 threads) over n blocks with `smem` bytes of
// dynamic shared memory, more than the default 48 KiB where needed.
template <typename... KArgs, typename... Args>
void launch_tiles(void (*kernel)(KArgs...), int64_t n, size_t smem, int device, const char* name,
                  Args... args) {
  if (n == 0) return;
  FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  kernel<<<blocks(n), kTileThreads, smem, stream(device)>>>(args...);
  FORGE_CUDA_CHECK_LAUNCH(name);
}

// Calls f(std::integral_constant<int, NC>) with NC column blocks of 64 covering dim.
template <typename F>
void with_column_blocks(int64_t dim, F&& f) {
  if (dim > kTaylorShiftDirectMaxDim)
    fail("attention::taylorshift: the direct form's GPU kernels take d, dv <= 256");
  if (dim <= kTile)
    f(std::integral_constant<int, 1>());
  else if (dim <= 2 * kTile)
    f(std::integral_constant<int, 2>());
  else
    f(std::integral_constant<int, 4>());
}

// Columns per thread of the state / apply kernels for C output columns: a tile
// is 16 CPT columns wide; wider outputs take several tiles of 144.
int columns_per_thread(int64_t C) {
  const int64_t need = ceil_div(C, kSide);
  for (int cpt : {1, 2, 3, 4, 5, 8})
    if (need <= cpt) return cpt;
  return 9;
}

// Calls f(std::integral_constant<int, CPT>) with CPT = columns_per_thread(C).
template <typename F>
void with_columns(int64_t C, F&& f) {
  switch (columns_per_thread(C)) {
    case 1:
      return f(std::integral_constant<int, 1>());
    case 2:
      return f(std::integral_constant<int, 2>());
    case 3:
      return f(std::integral_constant<int, 3>());
    case 4:
      return f(std::integral_constant<int, 4>());
    case 5:
      return f(std::integral_constant<int, 5>());
    case 8:
      return f(std::integral_constant<int, 8>());
    default:
      return f(std::integral_constant<int, 9>());
  }
}

// Splits of the rows of a state sum over [F, C] (each summed by its own blocks,
// then added in order): enough blocks for 4 per multiprocessor, at most 64
// splits and at least 256 rows each.
int64_t state_splits(int64_t F, int64_t C, int64_t rows, int64_t BH, int device) {
  const int64_t tiles = ceil_div(F, kTile) * ceil_div(C, kSide * columns_per_thread(C)) * BH;
  if (tiles == 0) return 1;
  const int64_t want = ceil_div(4 * static_cast<int64_t>(multiprocessor_count(device)), tiles);
  return std::max<int64_t>(1, std::min({want, int64_t{64}, ceil_div(rows, 256)}));
}

// The scratch buffers of one call, carved from one allocation (acc = the
// accumulation type; D1 = d + 1, E = dv + 1). Null where the call needs none.
struct ScratchLayout {
  int64_t* counts = nullptr;  // [B] real keys (with a mask)
  void* qinv = nullptr;       // acc [BH, N] 1 / ||q_i||
  void* kinv = nullptr;       // acc [BH, M] 1 / ||k_j||
  void* udq = nullptr;        // acc [BH, N] u_i . dq^_i, the rows' shares of dtau (backward)
  void* D = nullptr;          // acc [BH, N] rowsum(do * o) (direct backward)
  void* qa = nullptr;         // acc [BH, N, D1] q' (efficient)
  void* ka = nullptr;         // acc [BH, M, D1] k'
  void* vt = nullptr;         // acc [BH, M, E] v~
  void* W1 = nullptr;         // acc [BH, D1^2, E] Sw; in the backward then dS
  void* W2 = nullptr;         // acc [BH, D1 E, d] Sym(Sw), then Sym(dS) (backward)
  void* part = nullptr;       // acc [splits, BH, D1^2, E] partial state sums (splits > 1)
  void* rowsE = nullptr;      // acc [BH, N, E] Y (forward) or dY (backward)
  void* G = nullptr;          // acc [BH, max(N, M), max(d, dv)] dq', then dk', then dv~
  int64_t bytes = 0;
};

// The layout of the scratch at `base` (null: only count the bytes).
ScratchLayout carve(const TaylorShiftArgs& a, bool backward, int device, void* base) {
  ScratchLayout s;
  char* at = static_cast<char*>(base);
  auto take = [&](int64_t n, int64_t elem) -> void* {
    if (n <= 0) return nullptr;
    const int64_t offset = ceil_div(s.bytes, 256) * 256;
    s.bytes = offset + n * elem;
    return at != nullptr ? at + offset : nullptr;
  };
  const int64_t acc = a.dtype == DType::f64 ? 8 : 4;
  const int64_t BH = a.B * a.H, D1 = a.d + 1, E = a.dv + 1, F = D1 * D1;
  if (a.kpm != nullptr) s.counts = static_cast<int64_t*>(take(a.B, sizeof(int64_t)));
  if (a.direct || backward) {
    s.qinv = take(BH * a.N, acc);
    s.kinv = take(BH * a.M, acc);
  }
  if (backward) s.udq = take(BH * a.N, acc);
  if (a.direct) {
    if (backward) s.D = take(BH * a.N, acc);
    return s;
  }
  s.qa = take(BH * a.N * D1, acc);
  s.ka = take(BH * a.M * D1, acc);
  s.vt = take(BH * a.M * E, acc);
  s.W1 = take(BH * F * E, acc);
  int64_t splits = state_splits(F, E, a.M, BH, device);
  if (backward) splits = std::max(splits, state_splits(F, E, a.N, BH, device));
  if (splits > 1) s.part = take(splits * BH * F * E, acc);
  s.rowsE = take(BH * a.N * E, acc);
  if (backward) {
    s.W2 = take(BH * D1 * E * a.d, acc);
    s.G = take(BH * std::max(a.N, a.M) * std::max(a.d, a.dv), acc);
  }
  return s;
}

void count_keys(const TaylorShiftArgs& a, int64_t* counts, int device) {
  if (counts == nullptr || a.B == 0) return;
  count_keys_kernel<<<blocks(a.B), kThreads, 0, stream(device)>>>(a.kpm, a.M, counts);
  FORGE_CUDA_CHECK_LAUNCH("taylorshift count_keys");
}

// inv and / or xa of normalize_rows_kernel for x [BH, R, d].
template <typename T>
void normalize(const T* x, int64_t R, const TaylorShiftArgs& a, const T* tau, acc_t<T> sigma,
               acc_t<T>* inv, acc_t<T>* xa, int device) {
  const int64_t rows = a.B * a.H * R;
  if (rows == 0) return;
  normalize_rows_kernel<T><<<grid_for(rows * kWarp, device), kThreads, 0, stream(device)>>>(
      x, rows, R, a.H, a.d, tau, sigma, inv, xa);
  FORGE_CUDA_CHECK_LAUNCH("taylorshift normalize_rows");
}

// dx of normalize_backward_kernel for x [BH, R, d] from g (row pitch ldg).
template <typename T>
void normalize_backward(const T* x, const acc_t<T>* inv, const acc_t<T>* g, int64_t ldg, int64_t R,
                        const TaylorShiftArgs& a, const T* tau, acc_t<T> sigma, T* dx,
                        acc_t<T>* udy, int device) {
  const int64_t rows = a.B * a.H * R;
  if (rows == 0) return;
  normalize_backward_kernel<T><<<grid_for(rows * kWarp, device), kThreads, 0, stream(device)>>>(
      x, inv, g, ldg, rows, R, a.H, a.d, tau, sigma, dx, udy);
  FORGE_CUDA_CHECK_LAUNCH("taylorshift normalize_backward");
}

// out [BH, U^2, C] = w ∘ sum over rows of (X_r ⊠ X_r) V_r^T for X [BH, rows, U],
// V [BH, rows, C]; `part` holds the splits' partial sums when there are several.
template <typename A>
void launch_state(const A* X, int64_t U, const A* V, int64_t C, int64_t rows, int64_t BH,
                  const FeatureWeights<A>& w, A* part, A* out, int device) {
  const int64_t F = U * U, splits = state_splits(F, C, rows, BH, device);
  A* dst = splits > 1 ? part : out;
  with_columns(C, [&](auto cpt) {
    constexpr int CPT = decltype(cpt)::value;
    const int64_t n = ceil_div(F, kTile) * ceil_div(C, kSide * CPT) * splits * BH;
    state_kernel<A, CPT><<<blocks(n), kTileThreads, 0, stream(device)>>>(
        X, static_cast<int>(U), V, static_cast<int>(C), rows, splits, ceil_div(rows, splits), BH,
        dst);
    FORGE_CUDA_CHECK_LAUNCH("taylorshift state");
  });
  const int64_t n = BH * F * C;
  state_finalize_kernel<A><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
      dst, splits, n, static_cast<int>(F), static_cast<int>(C), w, out);
  FORGE_CUDA_CHECK_LAUNCH("taylorshift state_finalize");
}

template <typename A>
void launch_apply(const ApplyArgs<A>& g, int device) {
  if (g.rows == 0 || g.C == 0) return;
  with_columns(g.C, [&](auto cpt) {
    constexpr int CPT = decltype(cpt)::value;
    const int64_t n = ceil_div(g.rows, kTile) * ceil_div(g.C, kSide * CPT) * g.BH;
    apply_kernel<A, CPT><<<blocks(n), kTileThreads, 0, stream(device)>>>(g);
    FORGE_CUDA_CHECK_LAUNCH("taylorshift apply");
  });
}

// sym [BH, D1 E, d] of symmetrize_kernel from W [BH, D1^2, E].
template <typename A>
void launch_symmetrize(const A* W, int64_t D1, int64_t E, int64_t BH, A* sym, int device) {
  const int64_t n = BH * D1 * E * (D1 - 1);
  symmetrize_kernel<A><<<grid_for(n, device), kThreads, 0, stream(device)>>>(
      W, static_cast<int>(D1), static_cast<int>(E), n, sym);
  FORGE_CUDA_CHECK_LAUNCH("taylorshift symmetrize");
}

template <typename A>
DirectParams<A> direct_params(const TaylorShiftArgs& a, const int64_t* counts) {
  return {a.H,
          a.N,
          a.M,
          a.d,
          a.dv,
          static_cast<A>(a.a),
          static_cast<A>(a.b),
          static_cast<A>(a.c),
          a.output_normalized,
          a.kpm,
          counts};
}

// sigma = d^1/4 and the feature weights, rounded as the CPU rounds them.
template <typename A>
A sigma_of(const TaylorShiftArgs& a) {
  return static_cast<A>(std::pow(static_cast<double>(a.d), 0.25));
}
template <typename A>
FeatureWeights<A> weights_of(const TaylorShiftArgs& a) {
  const A sig = sigma_of<A>(a), sig2 = sig * sig;
  return {static_cast<int>(a.d + 1), static_cast<A>(a.a), static_cast<A>(a.b) * sig2,
          static_cast<A>(a.c) * sig2 * sig2};
}

template <typename T>
void direct_forward(const TaylorShiftArgs& a, const ScratchLayout& s, const T* q, const T* k,
                    const T* v, const T* tau, T* o, acc_t<T>* norm, int device) {
  using A = acc_t<T>;
  A* qinv = static_cast<A*>(s.qinv);
  A* kinv = static_cast<A*>(s.kinv);
  normalize<T>(q, a.N, a, nullptr, A(1), qinv, nullptr, device);
  normalize<T>(k, a.M, a, nullptr, A(1), kinv, nullptr, device);
  const DirectParams<A> p = direct_params<A>(a, s.counts);
  with_column_blocks(std::max(a.d, a.dv), [&](auto nc) {
    constexpr int NC = decltype(nc)::value;
    launch_tiles(direct_forward_kernel<T, NC>, ceil_div(a.N, kTile) * a.B * a.H, kForwardSmem<A>,
                 device, "taylorshift direct_forward", p, q, k, v, tau, static_cast<const A*>(qinv),
                 static_cast<const A*>(kinv), o, norm);
  });
}

template <typename T>
void efficient_forward(const TaylorShiftArgs& a, const ScratchLayout& s, const T* q, const T* k,
                       const T* v, const T* tau, T* o, acc_t<T>* norm, int device) {
  using A = acc_t<T>;
  const int64_t BH = a.B * a.H, D1 = a.d + 1, E = a.dv + 1, F = D1 * D1;
  const A sig = sigma_of<A>(a);
  A* qa = static_cast<A*>(s.qa);
  A* ka = static_cast<A*>(s.ka);
  A* vt = static_cast<A*>(s.vt);
  A* Sw = static_cast<A*>(s.W1);
  A* Y = static_cast<A*>(s.rowsE);
  normalize<T>(q, a.N, a, tau, sig, nullptr, qa, device);
  normalize<T>(k, a.M, a, nullptr, sig, nullptr, ka, device);
  const int64_t nv = BH * a.M * E;
  values_kernel<T><<<grid_for(nv, device), kThreads, 0, stream(device)>>>(v, a.kpm, s.counts, a.H,
                                                                          a.M, a.dv, nv, vt);
  FORGE_CUDA_CHECK_LAUNCH("taylorshift values");
  launch_state<A>(ka, D1, vt, E, a.M, BH, weights_of<A>(a), static_cast<A*>(s.part), Sw, device);
  // Y [BH, N, E] = apply(q', q', Sw): features (p, s) < D1^2.
  launch_apply<A>({qa, D1, qa, D1, static_cast<int>(D1), static_cast<int>(F), Sw, E, F * E,
                   static_cast<int>(E), a.N, BH, Y, E},
                  device);
  const int64_t ny = BH * a.N * E;
  efficient_output_kernel<T><<<grid_for(ny, device), kThreads, 0, stream(device)>>>(
      Y, s.counts, a.output_normalized, a.H, a.N, a.M, a.d, a.dv, ny, o, norm);
  FORGE_CUDA_CHECK_LAUNCH("taylorshift efficient_output");
}

template <typename T>
void direct_backward(const TaylorShiftArgs& a, const ScratchLayout& s, const T* q, const T* k,
                     const T* v, const T* tau, const T* o, const acc_t<T>* norm, const T* dout,
                     T* dq, T* dk, T* dv, int device) {
  using A = acc_t<T>;
  const int64_t BH = a.B * a.H;
  A* qinv = static_cast<A*>(s.qinv);
  A* kinv = static_cast<A*>(s.kinv);
  A* D = static_cast<A*>(s.D);
  normalize<T>(q, a.N, a, nullptr, A(1), qinv, nullptr, device);
  normalize<T>(k, a.M, a, nullptr, A(1), kinv, nullptr, device);
  if (BH * a.N > 0) {
    row_dot_kernel<T><<<grid_for(BH * a.N * kWarp, device), kThreads, 0, stream(device)>>>(
        dout, o, BH * a.N, a.dv, D);
    FORGE_CUDA_CHECK_LAUNCH("taylorshift row_dot");
  }
  const DirectParams<A> p = direct_params<A>(a, s.counts);
  with_column_blocks(std::max(a.d, a.dv), [&](auto nc) {
    constexpr int NC = decltype(nc)::value;
    launch_tiles(direct_dq_kernel<T, NC>, ceil_div(a.N, kTile) * BH, kDqSmem<A>, device,
                 "taylorshift direct_dq", p, q, k, v, tau, static_cast<const A*>(qinv),
                 static_cast<const A*>(kinv), norm, static_cast<const A*>(D), dout, dq,
                 static_cast<A*>(s.udq));
    launch_tiles(direct_dkdv_kernel<T, NC>, ceil_div(a.M, kTile) * BH, kDkdvSmem<A>, device,
                 "taylorshift direct_dkdv", p, q, k, v, tau, static_cast<const A*>(qinv),
                 static_cast<const A*>(kinv), norm, static_cast<const A*>(D), dout, dk, dv);
  });
}

template <typename T>
void efficient_backward(const TaylorShiftArgs& a, const ScratchLayout& s, const T* q, const T* k,
                        const T* v, const T* tau, const T* o, const acc_t<T>* norm, const T* dout,
                        T* dq, T* dk, T* dv, int device) {
  using A = acc_t<T>;
  const int64_t BH = a.B * a.H, D1 = a.d + 1, E = a.dv + 1, F = D1 * D1;
  const A sig = sigma_of<A>(a);
  const FeatureWeights<A> w = weights_of<A>(a);
  A* qinv = static_cast<A*>(s.qinv);
  A* kinv = static_cast<A*>(s.kinv);
  A* qa = static_cast<A*>(s.qa);
  A* ka = static_cast<A*>(s.ka);
  A* vt = static_cast<A*>(s.vt);
  A* W1 = static_cast<A*>(s.W1);
  A* W2 = static_cast<A*>(s.W2);
  A* part = static_cast<A*>(s.part);
  A* dY = static_cast<A*>(s.rowsE);
  A* G = static_cast<A*>(s.G);
  normalize<T>(q, a.N, a, tau, sig, qinv, qa, device);
  normalize<T>(k, a.M, a, nullptr, sig, kinv, ka, device);
  const int64_t nv = BH * a.M * E;
  values_kernel<T><<<grid_for(nv, device), kThreads, 0, stream(device)>>>(v, a.kpm, s.counts, a.H,
                                                                          a.M, a.dv, nv, vt);
  FORGE_CUDA_CHECK_LAUNCH("taylorshift values");
  launch_state<A>(ka, D1, vt, E, a.M, BH, w, part, W1, device);  // W1 = Sw
  if (BH * a.N > 0) {
    efficient_dy_kernel<T><<<grid_for(BH * a.N * kWarp, device), kThreads, 0, stream(device)>>>(
        o, dout, norm, s.counts, a.output_normalized, BH * a.N, a.H, a.N, a.M, a.d, a.dv, dY);
    FORGE_CUDA_CHECK_LAUNCH("taylorshift efficient_dy");
  }
  const int d = static_cast<int>(a.d), FE = static_cast<int>(D1 * E);
  // dq' [BH, N, d] = apply(q', dY, Sym(Sw)): features (s, e) < D1 E.
  launch_symmetrize<A>(W1, D1, E, BH, W2, device);
  launch_apply<A>(
      {qa, D1, dY, E, static_cast<int>(E), FE, W2, a.d, D1 * E * a.d, d, a.N, BH, G, a.d}, device);
  normalize_backward<T>(q, qinv, G, a.d, a.N, a, tau, sig, dq, static_cast<A*>(s.udq), device);
  // W1 = dS = w ∘ state(q', dY); dk' [BH, M, d] = apply(k', v~, Sym(dS)).
  launch_state<A>(qa, D1, dY, E, a.N, BH, w, part, W1, device);
  launch_symmetrize<A>(W1, D1, E, BH, W2, device);
  launch_apply<A>(
      {ka, D1, vt, E, static_cast<int>(E), FE, W2, a.d, D1 * E * a.d, d, a.M, BH, G, a.d}, device);
  normalize_backward<T>(k, kinv, G, a.d, a.M, a, nullptr, sig, dk, nullptr, device);
  // dv~[:, 1:] [BH, M, dv] = apply(k', k', dS[:, 1:]); dv = f_j dv~[:, 1:].
  launch_apply<A>({ka, D1, ka, D1, static_cast<int>(D1), static_cast<int>(F), W1 + 1, E, F * E,
                   static_cast<int>(a.dv), a.M, BH, G, a.dv},
                  device);
  const int64_t ndv = BH * a.M * a.dv;
  value_grads_kernel<T><<<grid_for(ndv, device), kThreads, 0, stream(device)>>>(
      G, a.kpm, s.counts, a.H, a.M, a.dv, ndv, dv);
  FORGE_CUDA_CHECK_LAUNCH("taylorshift value_grads");
}

}  // namespace

int64_t taylorshift_scratch_bytes(const TaylorShiftArgs& a, bool backward, int device) {
  return carve(a, backward, device, nullptr).bytes;
}

void taylorshift_forward(const TaylorShiftArgs& a, const void* q, const void* k, const void* v,
                         const void* tau, void* o, void* norm, void* scratch, int device) {
  if (a.B * a.H * a.N == 0) return;
  DeviceGuard guard(device);
  const ScratchLayout s = carve(a, false, device, scratch);
  count_keys(a, s.counts, device);
  FORGE_CUDA_DISPATCH_FLOAT(a.dtype, "attention::taylorshift", [&] {
    using A = acc_type;
    const auto* qp = static_cast<const scalar_t*>(q);
    const auto* kp = static_cast<const scalar_t*>(k);
    const auto* vp = static_cast<const scalar_t*>(v);
    const auto* tp = static_cast<const scalar_t*>(tau);
    auto* op = static_cast<scalar_t*>(o);
    auto* np = static_cast<A*>(norm);
    if (a.direct)
      direct_forward<scalar_t>(a, s, qp, kp, vp, tp, op, np, device);
    else
      efficient_forward<scalar_t>(a, s, qp, kp, vp, tp, op, np, device);
  });
}

void taylorshift_backward(const TaylorShiftArgs& a, const void* q, const void* k, const void* v,
                          const void* tau, const void* o, const void* norm, const void* dout,
                          void* dq, void* dk, void* dv, void* dtau, void* scratch, int device) {
  DeviceGuard guard(device);
  const ScratchLayout s = carve(a, true, device, scratch);
  count_keys(a, s.counts, device);
  FORGE_CUDA_DISPATCH_FLOAT(a.dtype, "attention::taylorshift backward", [&] {
    using A = acc_type;
    const auto* qp = static_cast<const scalar_t*>(q);
    const auto* kp = static_cast<const scalar_t*>(k);
    const auto* vp = static_cast<const scalar_t*>(v);
    const auto* tp = static_cast<const scalar_t*>(tau);
    const auto* op = static_cast<const scalar_t*>(o);
    const auto* np = static_cast<const A*>(norm);
    const auto* gp = static_cast<const scalar_t*>(dout);
    auto* dqp = static_cast<scalar_t*>(dq);
    auto* dkp = static_cast<scalar_t*>(dk);
    auto* dvp = static_cast<scalar_t*>(dv);
    if (a.B * a.H > 0) {
      if (a.direct)
        direct_backward<scalar_t>(a, s, qp, kp, vp, tp, op, np, gp, dqp, dkp, dvp, device);
      else
        efficient_backward<scalar_t>(a, s, qp, kp, vp, tp, op, np, gp, dqp, dkp, dvp, device);
    }
    // dtau[h] = sum of the rows' u . dq^ (direct: q^ = tau u) or sigma times it
    // (efficient: q~ = sigma tau u).
    if (a.H > 0) {
      const A factor = a.direct ? A(1) : sigma_of<A>(a);
      dtau_kernel<scalar_t><<<blocks(a.H), kThreads, 0, stream(device)>>>(
          static_cast<const A*>(s.udq), a.B, a.H, a.N, factor, static_cast<scalar_t*>(dtau));
      FORGE_CUDA_CHECK_LAUNCH("taylorshift dtau");
    }
  });
}

}  // namespace forge::cuda
