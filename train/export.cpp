// attnforge export (see export.h).
#include "train/export.h"

#include <unistd.h>

#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "core/version.h"
#include "ops/ops.h"
#include "train/checkpoint.h"
#include "train/outputs.h"
#include "train/recipe.h"

namespace forge::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPytorchModel =
#include "pytorch_model_py.inc"  // generated from train/pytorch_model.py
    ;

// What model.py rebuilds; any other value of these keys is refused.
struct Supported {
  const char* key;
  std::vector<std::string> values;
};
const std::vector<Supported>& supported() {
  static const std::vector<Supported> s = {
      {"model.attend_axially", {"false"}},
      {"model.dual_encoder", {"false"}},
  };
  return s;
}

std::string text_of(const json::Value& v) {
  if (v.is_string()) return v.as_string();
  if (v.is_bool()) return v.as_bool() ? "true" : "false";
  return json::dump(v);
}

// The model.* keys of the recipe as nested JSON: {"type": "vit", ..., "attention": {...}}.
json::Value model_keys(const Recipe& r) {
  json::Value out;
  for (const KeySpec& k : recipe_schema()) {
    if (k.path.rfind("model.", 0) != 0) continue;
    json::Value* at = &out;
    size_t begin = 6;
    for (size_t dot = k.path.find('.', begin); dot != std::string::npos;
         dot = k.path.find('.', begin)) {
      at = &(*at)[k.path.substr(begin, dot - begin)];
      begin = dot + 1;
    }
    (*at)[k.path.substr(begin)] = r.value(k.path);
  }
  return out;
}

// timm's VisionTransformer names for a softmax ViT (blocks.L.norm1, attn.qkv
// with the rows of to_q, to_k, to_v stacked, attn.proj, norm2, mlp.fc1,
// mlp.fc2; norm; the rest as ours), and the create_model arguments that
// build it. The recipe must be a model timm's class computes.
json::Value timm_arguments(const Recipe& r) {
  const auto need = [&](bool ok, const std::string& what) {
    FORGE_CHECK(ok,
                "export --format timm: {}; timm's VisionTransformer computes softmax ViTs with "
                "pre-norm LayerNorm (eps 1e-6), GELU, a final norm and class-token pooling (use "
                "--format pytorch for the others)",
                what);
  };
  need(r.string("model.type") == "vit", "model.type is " + r.string("model.type"));
  need(r.string("model.attention.kind") == "softmax" &&
           r.string_list("model.attention.per_layer").empty(),
       "the attention is not softmax in every layer");
  need(r.string("model.norm") == "layer" && !r.boolean("model.post_norm") &&
           r.boolean("model.final_norm") && r.string("model.final_norm_kind") == "layer",
       "the norms are not pre-norm LayerNorms with a final LayerNorm");
  need(r.number("model.norm_eps") == 1e-6,
       fmt::format("model.norm_eps is {}", r.number("model.norm_eps")));
  need(r.string("model.activation") == "gelu" && !r.boolean("model.glu"),
       "the feed-forward is not GELU");
  need(r.string("model.pool") == "cls", "model.pool is " + r.string("model.pool"));
  need(!r.boolean("model.shift_tokens"), "model.shift_tokens is true (timm's blocks do not shift)");
  need(r.boolean("model.out_bias"), "model.out_bias is false (timm's attn.proj has a bias)");
  need(r.number("model.attention.scale") == 0, "model.attention.scale is set");
  need(r.integer("model.head_dim") * r.integer("model.heads") == r.integer("model.dim"),
       "head_dim x heads is not dim");
  const int64_t dim = r.integer("model.dim"), depth = r.integer("model.depth"),
                heads = r.integer("model.heads"), patch = r.integer("model.patch_size"),
                size = r.integer("model.image_size");
  // The registered name when the sizes are a standard ViT's; the arguments set them anyway.
  std::string name = "vit_base_patch16_224";
  if (depth == 12 && patch == 16 && size == 224 && dim == 192 && heads == 3)
    name = "vit_tiny_patch16_224";
  if (depth == 12 && patch == 16 && size == 224 && dim == 384 && heads == 6)
    name = "vit_small_patch16_224";
  json::Value a;
  a["model_name"] = name;
  json::Value& k = a["kwargs"];
  k["img_size"] = size;
  k["patch_size"] = patch;
  k["in_chans"] = r.integer("model.channels");
  k["num_classes"] = r.integer("model.classes");
  k["embed_dim"] = dim;
  k["depth"] = depth;
  k["num_heads"] = heads;
  k["mlp_ratio"] = static_cast<double>(r.integer("model.mlp_dim")) / static_cast<double>(dim);
  k["qkv_bias"] = r.boolean("model.qkv_bias");
  k["class_token"] = true;
  k["global_pool"] = "token";
  return a;
}

std::map<std::string, Tensor> to_timm_names(const std::map<std::string, Tensor>& ours,
                                            int64_t depth) {
  std::map<std::string, Tensor> out;
  std::set<std::string> used;
  const auto take = [&](const std::string& mine, const std::string& theirs) {
    if (!ours.contains(mine)) return;
    out[theirs] = ours.at(mine);
    used.insert(mine);
  };
  for (const char* name : {"cls_token", "pos_embed", "patch_embed.proj.weight",
                           "patch_embed.proj.bias", "head.weight", "head.bias"})
    take(name, name);
  take("transformer.norm.norm.weight", "norm.weight");
  take("transformer.norm.norm.bias", "norm.bias");
  const std::vector<std::pair<std::string, std::string>> in_block = {{"attn_norm.norm", "norm1"},
                                                                     {"attn.to_out", "attn.proj"},
                                                                     {"ff_norm.norm", "norm2"},
                                                                     {"ff.w1", "mlp.fc1"},
                                                                     {"ff.w2", "mlp.fc2"}};
  for (int64_t l = 0; l < depth; ++l) {
    const std::string o = fmt::format("transformer.layers.{}.", l),
                      b = fmt::format("blocks.{}.", l);
    for (const std::string leaf : {".weight", ".bias"}) {
      for (const auto& [mine, theirs] : in_block) take(o + mine + leaf, b + theirs + leaf);
      std::vector<Tensor> qkv;
      for (const char* p : {"attn.to_q", "attn.to_k", "attn.to_v"})
        if (ours.contains(o + p + leaf)) {
          qkv.push_back(ours.at(o + p + leaf));
          used.insert(o + p + leaf);
        }
      if (!qkv.empty()) out[b + "attn.qkv" + leaf] = ops::cat(qkv, 0);
    }
  }
  for (const auto& [name, unused] : ours)
    FORGE_CHECK(used.contains(name), "export --format timm: {} has no place in timm's ViT", name);
  return out;
}

}  // namespace

const char* pytorch_model_source() {
  return kPytorchModel;
}

ExportResult export_checkpoint(const ExportRequest& q) {
  FORGE_CHECK(q.format == "pytorch" || q.format == "timm",
              "export: --format {}: the formats are: pytorch, timm", q.format);
  FORGE_CHECK(!q.out_dir.empty(), "export: give the directory to write (--out DIR)");
  std::error_code ec;
  check_output_dir(q.out_dir, "export --out", true);  // never a checkpoint, a directory if any
  FORGE_CHECK(q.overwrite || !fs::exists(q.out_dir, ec),
              "export --out {}: exists; nothing was written. Export into a new directory, or add "
              "--overwrite to replace an earlier export there",
              q.out_dir);
  if (q.overwrite && fs::exists(q.out_dir, ec))
    for (const auto& e : fs::directory_iterator(q.out_dir, ec)) {
      const std::string name = e.path().filename().string();
      FORGE_CHECK(name == "model.safetensors" || name == "config.json" || name == "model.py",
                  "export --out {} --overwrite: the directory holds '{}', which no export writes; "
                  "export into a new directory (only an earlier export is replaced)",
                  q.out_dir, name);
    }
  const CheckpointRef ref = resolve_checkpoint(q.checkpoint, "export");
  const Checkpoint c = read_checkpoint(ref.dir);
  const Recipe r = Recipe::from_yaml(c.recipe_yaml, ref.dir + "/model.safetensors (recipe)");
  FORGE_CHECK(c.card.is_object(),
              "export: {} was written before checkpoints carried a model card (format 1); load it "
              "with this attnforge and save it again (attnforge train --resume) first",
              ref.dir);
  const bool timm = q.format == "timm";
  for (const Supported& s : timm ? std::vector<Supported>{} : supported()) {
    const std::string v = text_of(r.value(s.key));
    FORGE_CHECK(std::find(s.values.begin(), s.values.end(), v) != s.values.end(),
                "export --format {}: {} = {} is not rebuilt by the exported model.py (it rebuilds "
                "{})",
                q.format, s.key, v, fmt::join(s.values, ", "));
  }

  json::Value config;
  config["format"] = "attnforge-export-1";
  config["attnforge"]["version"] = forge::version();
  config["attnforge"]["commit"] = forge::git_commit();
  config["source"]["checkpoint"] = ref.dir;
  if (ref.step) config["source"]["step"] = *ref.step;
  config["source"]["weights"] = q.ema ? "ema" : "model";
  config["model"] = model_keys(r);
  config["card"] = c.card;
  if (timm) config["timm"] = timm_arguments(r);

  std::map<std::string, Tensor> tensors;
  for (const auto& [name, t] : checkpoint_weights(c, q.ema, "export --ema " + ref.dir))
    tensors.emplace(name, is_floating(t.dtype()) && t.dtype() != DType::f32 ? t.to(DType::f32) : t);
  if (timm) tensors = to_timm_names(tensors, r.integer("model.depth"));

  // Built aside and renamed: a directory at out_dir is always whole.
  const fs::path dir = fs::path(q.out_dir).lexically_normal();
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  FORGE_CHECK(!ec, "export: cannot create {}: {}", tmp.string(), ec.message());
  try {
    safetensors::save((tmp / "model.safetensors").string(), tensors, {{"format", "pt"}});
    io::write_file_atomic((tmp / "config.json").string(), json::dump(config, 2) + "\n");
    if (!timm) io::write_file_atomic((tmp / "model.py").string(), kPytorchModel);
    // An earlier export (checked above) goes only once the new one is whole.
    if (q.overwrite && fs::exists(dir, ec)) {
      const fs::path old = dir.string() + ".old-" + std::to_string(::getpid());
      fs::rename(dir, old);
      fs::rename(tmp, dir);
      fs::remove_all(old, ec);
    } else {
      fs::rename(tmp, dir);
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  ExportResult result;
  result.checkpoint = ref.dir;
  result.dir = dir.string();
  result.tensors = static_cast<int64_t>(tensors.size());
  return result;
}

}  // namespace forge::train
