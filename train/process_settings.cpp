// The process-wide settings of a recipe (see process_settings.h).
#include "train/process_settings.h"

#include <algorithm>
#include <string>

#include "core/threading.h"
#include "dist/group.h"
#include "ops/attention/attention.h"
#include "ops/linalg/matmul.h"

namespace forge::train {

void apply_gpu_kernels(const Recipe& r) {
  ops::set_allow_tf32(r.boolean("allow_tf32"));
  const std::string backend = r.string("model.attention.backend");
  ops::attention::set_flash_engine(backend == "mma"     ? cuda::FlashEngine::mma
                                   : backend == "cudnn" ? cuda::FlashEngine::cudnn
                                                        : cuda::FlashEngine::tiled);
  ops::attention::set_linear_engine(backend == "tiled" ? cuda::LinearEngine::fma
                                                       : cuda::LinearEngine::mma);
}

void apply_threads(const Recipe& r, const dist::Group& group) {
  if (r.integer("threads") > 0)
    set_num_threads(static_cast<int>(r.integer("threads")));
  else if (group.local_size() > 1)
    set_num_threads(std::max(1, num_threads() / group.local_size()));
}

}  // namespace forge::train
