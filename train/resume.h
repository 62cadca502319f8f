// `attnforge train --resume PATH [--out NEWDIR]`: which run continues, from
// which checkpoint, with which recipe.
//
//   PATH a run directory (or its latest checkpoint), no --out: the run goes on
//        in place from its latest checkpoint, with its recipe.yaml;
//   PATH an older checkpoint, no --out: refused (continuing there would
//        discard the newer checkpoints), naming the way with --out;
//   PATH any checkpoint (or run), --out NEWDIR: a new run in NEWDIR continuing
//        from that checkpoint, with the recipe stored in it.
#pragma once

#include <string>

#include "train/recipe.h"
#include "train/trainer.h"

namespace forge::train {

struct ResumePlan {
  Recipe recipe;         // before the command line's --set overrides
  TrainOptions options;  // run_dir and resume / resume_from set
};

// Throws forge::Error naming PATH and what was wrong (nothing there, a
// checkpoint that is not the latest, a run stopped before it started).
ResumePlan plan_resume(const std::string& path, const std::string& out_dir);

}  // namespace forge::train
