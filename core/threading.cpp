#include "core/threading.h"

#include "core/error.h"

namespace forge {

void set_num_threads(int n) {
  FORGE_CHECK(n >= 1, "set_num_threads: expected at least 1 thread, got {}", n);
  omp_set_num_threads(n);
}

int num_threads() {
  return omp_get_max_threads();
}

bool in_parallel_region() {
  return omp_in_parallel() != 0;
}

}  // namespace forge
