// Attention maps of one example, drawn: what `attnforge attention-maps` and a
// run's output.attention_maps write.
//
//   DIR/layerLL_headHH.png   the head's attention matrix (rows: queries,
//                            columns: keys), coloured by a viridis-like map
//                            scaled to its largest weight
//   DIR/layerLL_headHH_image.png   ViTs: the input picture beside where the
//                            head looks: the class token's row over the patch
//                            grid (mean pooling: the mean over queries),
//                            resampled to the picture's size
//   DIR/rollout.png          ViTs whose every layer has N x N maps: attention
//                            rollout (Abnar & Zuidema 2020): the product over
//                            layers of 0.5 mean_heads(A) + 0.5 I, rows
//                            renormalised, read as above, beside the picture
// Mechanisms without explicit maps (efficient, linear, favor, ...) draw none;
// Linformer's are N x k.
#pragma once

#include <string>
#include <vector>

#include "data/loader.h"
#include "train/model.h"
#include "train/recipe.h"

namespace forge::train {

struct VitLayout {
  bool vit = false;
  bool cls = false;  // a class token before the patches (pool: cls)
  int64_t grid = 0;  // patches per side
};

VitLayout vit_layout(const Recipe& recipe);

// Attention rollout of square maps (layer -> (1, H, N, N)), first layer first:
// R = A~_L ... A~_1 with A~_l = 0.5 mean_h(A_l) + 0.5 I, rows renormalised.
// N x N, row-major.
std::vector<double> attention_rollout(const std::vector<Tensor>& maps);

struct AttentionMapsResult {
  std::vector<std::string> files;
  int64_t layers = 0, layers_with_maps = 0;
  bool rollout = false;
};

// Draws the maps of the first example of `batch` (placed as the model's
// inputs) into `dir` (created; not when no layer has a map: softmax, local,
// linformer and taylorshift heads have them, the linear forms none). A ViT's picture is that example's input
// [C, H, W], shown min-max scaled.
AttentionMapsResult draw_attention_maps(TaskModel& task, const data::Batch& batch,
                                        const VitLayout& layout, const std::string& dir);

}  // namespace forge::train
