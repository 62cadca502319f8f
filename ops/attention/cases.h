// Every attention op's test and benchmark cases, declared once. Each consumer
// runs the same list:
//   - gradcheck in f64 at each case's own small dims
//     (tests/ops/attention/test_cases.cpp, `attnforge gradcheck`);
//   - the GPU against the CPU in f32, f64, bf16 and f16 at the same dims
//     (tests/cuda/test_cuda_attention_cases.cpp);
//   - forward and forward+backward time and peak memory at any dims
//     (bench/attention.cpp: `bench_attention`; its default table is the cases
//     marked `bench`, --mechanisms names any case).
// Adding a case (or a mechanism: a `<mechanism>_cases()` in its own file,
// joined in cases.cpp) is all it takes for every consumer to run it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "core/tensor.h"

namespace forge::ops::attention {

// The size a case runs at: q [B, H, N, d], k [B, H, M, d], v [B, H, M, dv].
struct CaseDims {
  int64_t B = 2, H = 2;
  int64_t N = 6, M = 6;
  int64_t d = 3, dv = 4;
  // The mechanism's own size: FAVOR+'s random features m, Linformer's
  // projected length k. 0: the reference libraries' default (int(d ln d);
  // 256).
  int64_t k = 0;
};

struct AttentionCase {
  std::string name;  // "<mechanism>/<option set>", e.g. "softmax/causal+mask"
  CaseDims dims;     // where gradcheck and the GPU comparison run it
  // The inputs at any dims (causal cases get N == M; lengths length_for()
  // allows), f64 on the CPU: q, k, v
  // and the op's learnable tensors uniform and requiring grad, then its other
  // tensors (projections, masks) in the order fn reads them.
  std::function<std::vector<Tensor>(const CaseDims&)> make_inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  // Tolerances, where the mechanism's definition needs other than the defaults
  // (FAVOR+'s stop-grad stabiliser: see favor.cpp).
  autograd::GradcheckOptions gradcheck = {};
  bool bench = false;  // a row of the benchmark's default table
  // N and M must be multiples of this (efficient's causal buckets).
  int64_t length_multiple = 1;
  // The shortest length >= n the case takes.
  int64_t length_for(int64_t n) const {
    return (n + length_multiple - 1) / length_multiple * length_multiple;
  }
};

// Each mechanism's file defines its own list; cases.cpp joins them.
std::vector<AttentionCase> softmax_cases();
std::vector<AttentionCase> local_cases();
std::vector<AttentionCase> efficient_cases();
std::vector<AttentionCase> linear_cases();
std::vector<AttentionCase> taylor_linear_cases();
std::vector<AttentionCase> linformer_cases();
std::vector<AttentionCase> favor_cases();
std::vector<AttentionCase> taylorshift_cases();

// Every mechanism's cases, in the order above.
const std::vector<AttentionCase>& attention_cases();
// The case of that name, or null.
const AttentionCase* find_attention_case(const std::string& name);

// Helpers of the cases' make_inputs:
// q [B, H, N, d], k [B, H, M, d], v [B, H, M, dv]: f64 uniform in [-1, 1)
// from seeds seed, seed + 1, seed + 2, requiring grad.
std::vector<Tensor> case_qkv(const CaseDims& s, uint64_t seed);
// A case on case_qkv(s, seed) and, when pad is not empty,
// case_padding_mask(s, pad) as a fourth input, at N x M: name, dims and
// make_inputs set, fn (and the rest) left to the caller.
AttentionCase qkv_case(std::string name, int64_t N, int64_t M, uint64_t seed,
                       std::vector<int64_t> pad = {});
// The pad of the masked qkv_cases: batch 0's last key, batch 1's last three.
inline const std::vector<int64_t> kCasePad = {1, 3};
// A case's optional input: in[i], or an undefined tensor when in has no i.
inline Tensor case_input(const std::vector<Tensor>& in, size_t i) {
  return i < in.size() ? in[i] : Tensor();
}
// A f64 tensor uniform in [lo, hi) from its own generator, requiring grad.
Tensor case_leaf(const Shape& shape, uint64_t seed, double lo = -1, double hi = 1);
// A [B, M] bool key padding mask: key j of batch b is masked where
// masked(b, j, M) holds (so one pattern serves every size).
Tensor case_key_mask(const CaseDims& s,
                     const std::function<bool(int64_t b, int64_t j, int64_t M)>& masked);
// The last pad[b] keys of batch b masked (batches past pad.size() keep all;
// a pad of M or more masks every key).
Tensor case_padding_mask(const CaseDims& s, const std::vector<int64_t>& pad);

}  // namespace forge::ops::attention
