// timm's VisionTransformer names and attnforge's, as model.init_from maps a
// timm state dict (train/init_from.cpp): pure name and shape logic, no
// tensors, so that a fuzz target exercises it alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace forge::train {

// Where a tensor of timm's state dict goes: our name, and its rows
// [first_row, first_row + rows) of the tensor (rows -1: the whole tensor;
// attn.qkv splits in three along its first dimension).
struct TimmPart {
  std::string name;
  int64_t first_row = 0, rows = -1;
};

// The parts of timm tensor `name` of shape `shape` (blocks.L.norm1 ->
// transformer.layers.L.attn_norm.norm, blocks.L.attn.qkv -> to_q / to_k /
// to_v, blocks.L.mlp.fc1 -> ff.w1, norm -> transformer.norm.norm, ...);
// other names keep theirs. An attn.qkv tensor whose first dimension is not 3
// x dim (or that has none) is an error naming it.
std::vector<TimmPart> from_timm_name(const std::string& name, const std::vector<int64_t>& shape);

// A ViT position embedding of source_tokens rows resampled to target_tokens:
// the target is `extra` class-token rows then a g x g grid (extra = target -
// floor(sqrt(target))^2), and the source must be the same extra and a square
// grid. Errors name both counts.
struct PositionGrids {
  int64_t extra = 0, source = 0, target = 0;  // class rows; the grids' sides
};
PositionGrids position_grids(int64_t source_tokens, int64_t target_tokens);

}  // namespace forge::train
