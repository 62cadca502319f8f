// train --resume (see resume.h).
#include "train/resume.h"

#include <filesystem>
#include <optional>

#include "core/error.h"
#include "train/checkpoint.h"

namespace forge::train {

namespace fs = std::filesystem;

ResumePlan plan_resume(const std::string& resume, const std::string& out) {
  std::error_code ec;
  FORGE_CHECK(fs::exists(resume, ec), "--resume {}: no such run directory or checkpoint", resume);
  const fs::path given = fs::path(resume).lexically_normal();
  const std::string base =
      (given.filename().empty() ? given.parent_path() : given).filename().string();
  const bool run_dir = fs::is_directory(given, ec) && base != "checkpoints" &&
                       !fs::exists(given / "model.safetensors", ec);
  std::optional<CheckpointRef> ref;
  if (!run_dir || !out.empty()) ref = resolve_checkpoint(resume, "--resume");
  ResumePlan plan;
  if (!out.empty()) {  // a new run from any checkpoint
    plan.options.resume_from = resume;
    plan.options.run_dir = out;
    plan.recipe = Recipe::from_yaml(read_checkpoint(ref->dir).recipe_yaml,
                                    ref->dir + "/model.safetensors (recipe)");
    return plan;
  }
  FORGE_CHECK(!ref || ref->latest,
              "--resume {}: {} is not the latest checkpoint of {}; continuing from it there would "
              "discard the newer ones. Continue from it in a new run directory: attnforge train "
              "--resume {} --out NEWDIR",
              resume, ref->dir, ref->run_dir.empty() ? "its run" : ref->run_dir, resume);
  plan.options.run_dir = ref ? ref->run_dir : resume;
  plan.options.resume = true;
  const fs::path file = fs::path(plan.options.run_dir) / "recipe.yaml";
  FORGE_CHECK(fs::exists(file, ec),
              "--resume {}: no recipe.yaml in {}: the run was stopped before it started; start it "
              "again with attnforge train RECIPE.yaml --out {}",
              resume, plan.options.run_dir, plan.options.run_dir);
  plan.recipe = Recipe::from_file(file.string());
  return plan;
}

}  // namespace forge::train
