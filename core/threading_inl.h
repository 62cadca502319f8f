#pragma once

#include <omp.h>

#include <algorithm>

namespace forge {

// Below this many "cost units" (about one flop or one byte each) the fork/join
// overhead of an OpenMP region outweighs the work.
constexpr int64_t kParallelGrain = 32768;

template <typename F>
void parallel_for(int64_t n, int64_t cost_per_item, F&& fn) {
  if (n <= 0) return;
  const int64_t threads = num_threads();
  if (threads <= 1 || in_parallel_region() ||
      n * std::max<int64_t>(cost_per_item, 1) < kParallelGrain) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunks = std::min<int64_t>(threads, n);
#pragma omp parallel for num_threads(static_cast <int>(chunks)) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    fn(begin, end);
  }
}

}  // namespace forge
