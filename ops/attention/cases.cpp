#include "ops/attention/cases.h"

#include "core/rng.h"

namespace forge::ops::attention {

const std::vector<AttentionCase>& attention_cases() {
  static const std::vector<AttentionCase> all = [] {
    std::vector<AttentionCase> cases;
    for (auto list : {softmax_cases, local_cases, efficient_cases, linear_cases,
                      taylor_linear_cases, linformer_cases, favor_cases, taylorshift_cases}) {
      for (AttentionCase& c : list()) cases.push_back(std::move(c));
    }
    return cases;
  }();
  return all;
}

const AttentionCase* find_attention_case(const std::string& name) {
  for (const AttentionCase& c : attention_cases())
    if (c.name == name) return &c;
  return nullptr;
}

Tensor case_leaf(const Shape& shape, uint64_t seed, double lo, double hi) {
  Generator gen(seed);
  Tensor t = Tensor::rand(shape, DType::f64, &gen);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * p[i];
  t.set_requires_grad(true);
  return t;
}

std::vector<Tensor> case_qkv(const CaseDims& s, uint64_t seed) {
  return {case_leaf({s.B, s.H, s.N, s.d}, seed), case_leaf({s.B, s.H, s.M, s.d}, seed + 1),
          case_leaf({s.B, s.H, s.M, s.dv}, seed + 2)};
}

Tensor case_key_mask(const CaseDims& s,
                     const std::function<bool(int64_t b, int64_t j, int64_t M)>& masked) {
  Tensor m = Tensor::ones({s.B, s.M}, DType::boolean);
  bool* p = m.data<bool>();
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t j = 0; j < s.M; ++j) p[b * s.M + j] = !masked(b, j, s.M);
  return m;
}

Tensor case_padding_mask(const CaseDims& s, const std::vector<int64_t>& pad) {
  return case_key_mask(s, [&](int64_t b, int64_t j, int64_t M) {
    return b < static_cast<int64_t>(pad.size()) && j >= M - pad[static_cast<size_t>(b)];
  });
}

AttentionCase qkv_case(std::string name, int64_t N, int64_t M, uint64_t seed,
                       std::vector<int64_t> pad) {
  AttentionCase c;
  c.name = std::move(name);
  c.dims.N = N;
  c.dims.M = M;
  c.make_inputs = [seed, pad = std::move(pad)](const CaseDims& s) {
    std::vector<Tensor> in = case_qkv(s, seed);
    if (!pad.empty()) in.push_back(case_padding_mask(s, pad));
    return in;
  };
  return c;
}

}  // namespace forge::ops::attention
