// The data of a recipe: the training and evaluation datasets the `data.*`
// keys describe, and what they tell the model (classes, image size or
// vocabulary and length). ListOps and Pathfinder generate their data, when the
// recipe gives none, once into a cache shared by every run (data_cache_dir()).
#pragma once

#include <functional>
#include <string>

#include "data/dataset.h"
#include "data/loader.h"
#include "data/mixup.h"
#include "data/transforms.h"
#include "train/model.h"
#include "train/recipe.h"

namespace forge::train {

struct TaskData {
  data::DatasetPtr train, eval;
  DataShape shape;
  data::MixupOptions mixup;
};

// `split`: the evaluation split to open (empty: data.eval_split). `log`
// receives one line per dataset.
TaskData build_data(const Recipe& recipe, const std::string& split, bool open_train,
                    const std::function<void(const std::string&)>& log);

// The transform evaluation applies to a decoded picture for the recipe's image
// source (image_folder; Fashion-MNIST and Pathfinder pictures, resized to
// their size when another); for pixel sequences, unnormalised gray in [0, 1].
// What predict applies to image files.
data::ImageTransformOptions eval_image_transform(const Recipe& recipe);

// Where generated data is cached: $ATTNFORGE_CACHE, else
// $XDG_CACHE_HOME/attnforge, else ~/.cache/attnforge.
std::string data_cache_dir();

// The shape of a next-token source (lm_text, copy, seq2seq_tsv) from the
// recipe alone, without reading data (what generation needs); throws for the
// classification sources.
DataShape next_token_shape(const Recipe& recipe);

// Loader options of the recipe for training (shuffled, augmented, mixed) or evaluation.
data::LoaderOptions loader_options(const Recipe& recipe, const TaskData& data, bool train);

}  // namespace forge::train
