// Loops shared by the optimizers and gradient clipping. Both give the same bits
// for any thread count: an elementwise update touches each element on its own,
// and a sum is taken over fixed blocks whose partial sums are added in order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/threading.h"

namespace forge::optim::detail {

// Runs fn(begin, end) over [0, n), split across threads when n is large.
// `cost` is about the flops per element.
template <typename F>
void elementwise(int64_t n, int64_t cost, F&& fn) {
  parallel_for(n, cost, fn);
}

constexpr int64_t kSumBlock = 8192;

// The sum over i in [0, n) of term(i) in f64. Blocks of kSumBlock elements are
// summed in parallel; the block sums are then added in block order.
template <typename F>
double blocked_sum(int64_t n, F&& term) {
  if (n <= 0) return 0;
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  parallel_for(blocks, 2 * kSumBlock, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double s = 0;
      const int64_t end = std::min(n, (b + 1) * kSumBlock);
      for (int64_t i = b * kSumBlock; i < end; ++i) s += term(i);
      partial[static_cast<size_t>(b)] = s;
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace forge::optim::detail
