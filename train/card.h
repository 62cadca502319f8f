// The model card: what a checkpoint says about its model so that it can be
// used without reading our code (attnforge predict, export, another
// framework). Every checkpoint carries it as JSON, in model.safetensors'
// __metadata__ "card" and in state.json's "card" (train/checkpoint.h).
//
//   {"task": "classification",          classification | language modelling | sequence-to-sequence
//    "model": "vit",                    model.type; its sizes are in the recipe beside the card
//    "input": {...},                    what the model takes and how raw data becomes it:
//      images:  {"kind": "image", "channels": 1, "size": 28, "scale": "u8 / 255",
//                "mean": [0.286], "std": [0.353], "transform": "..."}
//      tokens:  {"kind": "tokens", "tokenizer": "listops" | "bytes + 1" | "pixels" | ...,
//                "vocab_size": 16, "max_length": 2000, "pad_id": 0, "pairs": false,
//                "vocabulary": ["<pad>", "[MIN", ...]  (listops only)}
//    "classes": ["T-shirt/top", ...],   names by class id (ids as text when the data has none)
//    "layout": ["...", ...]}            how the state dict's tensors are used (shapes, order,
//                                       norms, activation): what a reimplementation must match
#pragma once

#include "core/json.h"
#include "train/data.h"
#include "train/recipe.h"

namespace forge::train {

json::Value model_card(const Recipe& recipe, const TaskData& data);

}  // namespace forge::train
