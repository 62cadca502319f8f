// The process-wide settings a recipe makes before a run trains or a checkpoint
// is evaluated: the GPU kernels and the CPU threads.
#pragma once

#include "train/recipe.h"

namespace forge::dist {
class Group;
}  // namespace forge::dist

namespace forge::train {

// The recipe's choices of GPU kernels: TF32 for f32 GEMMs, and the attention
// kernels (model.attention.backend: the flash engine of softmax / local /
// linformer, and the tensor-core core of the linear family with mma or cudnn).
void apply_gpu_kernels(const Recipe& recipe);

// The recipe's threads, or every core of the host shared evenly by the
// processes of a data-parallel job on it.
void apply_threads(const Recipe& recipe, const dist::Group& group);

}  // namespace forge::train
