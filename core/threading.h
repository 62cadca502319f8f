// CPU thread control. One OpenMP pool serves our kernels and OpenBLAS (we link
// the OpenMP build of OpenBLAS), so a single setting governs both.
#pragma once

#include <cstdint>

namespace forge {

void set_num_threads(int n);
int num_threads();
bool in_parallel_region();

// Runs fn(begin, end) over [0, n) split across threads when the work is worth
// it (n * cost_per_item above a grain), else serially on this thread.
template <typename F>
void parallel_for(int64_t n, int64_t cost_per_item, F&& fn);

}  // namespace forge

#include "core/threading_inl.h"
