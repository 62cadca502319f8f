// Reductions over any set of dims (negative dims count from the end; an empty
// dims list means all dims), with keepdim, f32 and f64 (also bf16 and f16 on a
// GPU), each with its backward.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace forge::ops {

using Dims = std::vector<int64_t>;

Tensor sum(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
// Gradient goes to the first maximum of each reduced group.
Tensor max(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor logsumexp(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
// Inclusive prefix sum along one dim.
Tensor cumsum(const Tensor& x, int64_t dim);

}  // namespace forge::ops
