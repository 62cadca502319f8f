// Layout ops. reshape/view and slicing dim 0 share storage; every other op
// writes a new contiguous tensor. Each has its backward. Dims may be negative.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace forge::ops {

Tensor reshape(const Tensor& x, const Shape& shape);  // one -1 is inferred
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);  // dim must have size 1
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& perm);
// Elements [start, start + length) of `dim` (free when dim is the first).
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
// Python-style x[..., start:end:step, ...] on one dim; start/end are clamped, may be negative.
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
std::vector<Tensor> split(const Tensor& x, int64_t split_size,
                          int64_t dim);  // last piece may be smaller
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);
// Constant padding; `pads` holds (before, after) pairs starting from the LAST
// dim, as torch.nn.functional.pad. Negative pads crop.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value = 0.0);
// Token shift (linear-attention-transformer's PreShiftTokens) of x (B, N, D):
// the features are cut into shifts.size() segments of D / shifts.size() (any
// remainder stays where it is, at the end) and segment s moves shifts[s]
// positions along N, out[:, i] = x[:, i - shifts[s]], with zeros shifted in.
// The moving segments are read from `moving` (B, N, D) when it is given (x with
// padded positions zeroed, say), else from x. One box copy per segment each
// way, where narrow / pad / cat would copy and zero-fill every segment twice.
Tensor token_shift(const Tensor& x, const std::vector<int64_t>& shifts,
                   const Tensor& moving = Tensor());
// index (i32/i64, 1-d): out = x taken at `index` along dim.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out[i][j][k] = x[i][index[i][j][k]][k] for dim = 1 (index has x's rank).
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// weight (V, D), ids (any shape, i32/i64) -> (ids..., D). padding_idx rows get no gradient (-1:
// none).
Tensor embedding(const Tensor& weight, const Tensor& ids, int64_t padding_idx = -1);

}  // namespace forge::ops
