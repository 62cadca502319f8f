// model.init_from (see init_from.h).
#include "train/init_from.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <string_view>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "data/transforms.h"
#include "ops/ops.h"
#include "train/checkpoint.h"
#include "train/timm_names.h"

namespace forge::train {

namespace fs = std::filesystem;

namespace {

// timm's ViT names -> ours (train/timm_names.h); qkv is split in three.
std::map<std::string, Tensor> from_timm(const std::map<std::string, Tensor>& timm) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : timm)
    for (const TimmPart& part : from_timm_name(name, t.shape()))
      out[part.name] = part.rows < 0 ? t : ops::narrow(t, 0, part.first_row, part.rows);
  return out;
}

// A ViT position embedding [1, c + g'^2, D] resampled to [1, c + g^2, D].
Tensor resize_positions(const Tensor& source, const Tensor& target) {
  const int64_t D = target.size(2);
  // The class token's row, if any: the tokens beyond the largest square (1 + g^2 or g^2).
  const PositionGrids grids = position_grids(source.size(1), target.size(1));
  const int64_t extra = grids.extra, gs = grids.source, gt = grids.target;
  const Tensor src = source.to(DType::f32);
  // [1, extra + gs^2, D] -> grid [D, gs, gs] -> [D, gt, gt] -> [1, extra + gt^2, D]
  const Tensor cells =
      ops::permute(ops::reshape(ops::narrow(src, 1, extra, gs * gs), {gs, gs, D}), {2, 0, 1});
  const Tensor resized = data::resize(cells, gt, gt);
  Tensor rows = ops::reshape(ops::permute(resized, {1, 2, 0}), {1, gt * gt, D});
  if (extra > 0) rows = ops::cat({ops::narrow(src, 1, 0, extra), rows}, 1);
  return rows.to(target.dtype());
}

std::string shape_of(const Tensor& t) {
  return shape_str(t.shape());
}

}  // namespace

std::string InitReport::summary() const {
  std::string s = fmt::format("init_from {}{}: {} tensors loaded", source,
                              timm_names ? " (timm names)" : "", loaded.size());
  if (!resized.empty()) s += fmt::format("; resized: {}", fmt::join(resized, ", "));
  if (!fresh.empty()) s += fmt::format("; fresh (other classes): {}", fmt::join(fresh, ", "));
  if (!missing.empty())
    s += fmt::format("; missing, kept initialised: {}", fmt::join(missing, ", "));
  if (!unexpected.empty())
    s += fmt::format("; unexpected, ignored: {}", fmt::join(unexpected, ", "));
  return s;
}

InitReport init_from(nn::Module& model, const std::string& source) {
  InitReport report;
  std::map<std::string, Tensor> tensors;
  std::error_code ec;
  if (fs::is_regular_file(source, ec) && fs::path(source).extension() == ".safetensors") {
    report.source = source;
    tensors = safetensors::load(source).tensors;
  } else {
    const CheckpointRef ref = resolve_checkpoint(source, "model.init_from");
    report.source = ref.dir;
    tensors = read_checkpoint(ref.dir).model;
  }
  for (const auto& [name, t] : tensors)
    report.timm_names = report.timm_names || name.rfind("blocks.", 0) == 0;
  if (report.timm_names) tensors = from_timm(tensors);

  const std::map<std::string, Tensor> own = model.state_dict();
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, value)
  for (const auto& [name, dst] : own) {
    const auto it = tensors.find(name);
    if (it == tensors.end()) {
      report.missing.push_back(name);
      continue;
    }
    const Tensor& src = it->second;
    if (src.shape() == dst.shape()) {
      copies.emplace_back(dst, src.dtype() == dst.dtype() ? src : src.to(dst.dtype()));
      report.loaded.push_back(name);
    } else if (name == "pos_embed" && src.dim() == 3 && dst.dim() == 3 &&
               src.size(2) == dst.size(2)) {
      copies.emplace_back(dst, resize_positions(src, dst));
      report.resized.push_back(fmt::format("pos_embed {} -> {}", shape_of(src), shape_of(dst)));
    } else if (name.rfind("head.", 0) == 0) {
      report.fresh.push_back(
          fmt::format("{} ({} in the source, {} here)", name, shape_of(src), shape_of(dst)));
    } else {
      FORGE_FAIL(
          "model.init_from {}: {} is {} there but {} in this model; the model keys must match the "
          "source's (only the ViT position embedding and the classifier head may differ)",
          report.source, name, shape_of(src), shape_of(dst));
    }
  }
  for (const auto& [name, unused] : tensors)
    if (!own.contains(name)) report.unexpected.push_back(name);
  FORGE_CHECK(
      !report.loaded.empty(),
      "model.init_from {}: no tensor of the source fits this model (source names like '{}', "
      "model names like '{}')",
      report.source, tensors.empty() ? std::string("none") : tensors.begin()->first,
      own.empty() ? std::string("none") : own.begin()->first);
  NoGradGuard no_grad;
  for (auto& [dst, src] : copies)
    dst.copy_from(src.device() == dst.device() ? src : src.to(dst.device()));
  return report;
}

}  // namespace forge::train
