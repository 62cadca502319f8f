// Fine-tuning: a model's weights from another run's checkpoint or from a
// state dict (model.init_from), instead of its random initialisation.
//
// The source: a checkpoint in any form resolve_checkpoint accepts, or a
// .safetensors file with attnforge's names or timm's ViT names (blocks.L.norm1,
// blocks.L.attn.qkv, blocks.L.attn.proj, blocks.L.norm2, blocks.L.mlp.fc1/fc2,
// norm, patch_embed.proj, cls_token, pos_embed, head: the fused qkv rows are
// split into to_q, to_k, to_v).
// Each of the model's tensors is then:
//   loaded       the source has it with the same shape (cast to the model's dtype);
//   resized      a ViT position embedding for another number of patches: the
//                grid is resampled (antialiased bilinear) to this model's, the
//                class token's row kept (timm resamples bicubically);
//   fresh        a classifier head (head.*) for another number of classes keeps
//                its initialisation;
//   missing      not in the source: keeps its initialisation.
// Source tensors the model does not have are reported as unexpected. Any
// other shape difference is an error naming the tensor, as is a source that
// fits nothing.
#pragma once

#include <string>
#include <vector>

#include "nn/module.h"

namespace forge::train {

struct InitReport {
  std::string source;  // the file or checkpoint directory read
  bool timm_names = false;
  std::vector<std::string> loaded, resized, fresh, missing, unexpected;
  std::string summary() const;  // one paragraph for the log
};

InitReport init_from(nn::Module& model, const std::string& source);

}  // namespace forge::train
