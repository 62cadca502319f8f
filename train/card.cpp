// The model card (see card.h).
#include "train/card.h"

#include <algorithm>

#include "data/listops.h"
#include "data/lm_text.h"
#include "data/pixel_sequence.h"
#include "data/seq2seq.h"
#include "data/text.h"

namespace forge::train {

namespace {

json::Value numbers(const std::vector<double>& v) {
  json::Array a;
  for (double x : v) a.emplace_back(x);
  return json::Value(std::move(a));
}

json::Value image_input(const Recipe& r, const DataShape& shape) {
  const data::ImageTransformOptions t = eval_image_transform(r);
  json::Value in;
  in["kind"] = "image";
  in["channels"] = shape.channels;
  in["size"] = shape.image_size;
  in["scale"] = "u8 / 255";
  in["interpolation"] = data::interpolation_name(t.interpolation);
  in["crop_pct"] = t.crop_pct;
  in["mean"] = numbers(data::effective_mean(t));
  in["std"] = numbers(data::effective_std(t));
  in["transform"] =
      r.string("data.dataset") == "image_folder"
          ? fmt::format(
                "resize the shorter side to floor({} / crop_pct {}) = {} (antialiased {}, as "
                "PIL), centre-crop {}x{}, RGB",
                t.size, t.crop_pct, static_cast<int64_t>(static_cast<double>(t.size) / t.crop_pct),
                data::interpolation_name(t.interpolation), t.size, t.size)
          : fmt::format(
                "gray; a picture of another size is resized to {}x{} (antialiased "
                "bilinear)",
                t.size, t.size);
  in["layout"] = "[C, H, W] per example, batched as [B, C, H, W]";
  return in;
}

json::Value token_input(const Recipe& r, const DataShape& shape) {
  const std::string& kind = r.string("data.dataset");
  json::Value in;
  in["kind"] = "tokens";
  in["vocab_size"] = shape.vocab_size;
  in["max_length"] = shape.max_length;
  in["pad_id"] = 0;
  in["pairs"] = shape.pairs;
  if (kind == "listops") {
    in["tokenizer"] = "listops: space-separated tokens, parentheses dropped";
    json::Array vocabulary{json::Value("<pad>")};
    for (int64_t id = 1; id < data::kListOpsVocabSize; ++id)
      vocabulary.emplace_back(std::string(data::listops_token_name(id)));
    in["vocabulary"] = json::Value(std::move(vocabulary));
  } else if (kind == "text" || kind == "retrieval") {
    in["tokenizer"] =
        "bytes + 1: each UTF-8 byte b is token b + 1 (0 pads); the first max_length kept";
  } else if (kind == "pixels" || kind == "pathfinder") {
    const data::ImageTransformOptions t = eval_image_transform(r);
    in["tokenizer"] = fmt::format(
        "pixels: a {}x{} gray picture (RGB to luma 0.299 R + 0.587 G + 0.114 B) row by row, "
        "token = the 8-bit gray level round(255 * gray)",
        t.size, t.size);
  } else if (kind == "lm_text") {
    in["tokenizer"] = "bytes: each byte is its own token (0..255)";
  } else if (kind == "seq2seq_tsv") {
    in["tokenizer"] =
        fmt::format("bytes + {}: each byte b is token b + {}; pad {}, start {}, end {}",
                    data::kSeq2SeqByteOffset, data::kSeq2SeqByteOffset, data::kSeq2SeqPad,
                    data::kSeq2SeqStart, data::kSeq2SeqEnd);
  } else {
    in["tokenizer"] = fmt::format("{}: token ids as the data source gives them", kind);
  }
  if (shape.task == Task::seq2seq) {
    in["target_vocab_size"] = shape.target_vocab_size;
    in["target_length"] = shape.target_length;
  }
  return in;
}

// How the state dict is used: what a reimplementation must match.
json::Value layout(const Recipe& r) {
  const std::string& type = r.string("model.type");
  const bool post = r.boolean("model.post_norm");
  json::Array notes;
  const auto note = [&](std::string s) { notes.emplace_back(std::move(s)); };
  note("Linear NAME.weight is [out, in] and NAME.bias [out]: y = x W^T + b (torch.nn.Linear)");
  note(fmt::format(
      "blocks transformer.layers.L: {} with {} (eps model.norm_eps); x = {} then x = {}",
      post ? "post-norm" : "pre-norm", r.string("model.norm"),
      post ? "attn_norm(x + attn(x))" : "x + attn(attn_norm(x))",
      post ? "ff_norm(x + ff(x))" : "x + ff(ff_norm(x))"));
  note(fmt::format(
      "attention: q = to_q(x), k = to_k(x), v = to_v(x), each [B, N, heads * head_dim] split as "
      "[B, N, heads, head_dim] (head-major: columns h * head_dim .. (h + 1) * head_dim - 1 are "
      "head h); out = to_out(concat of heads). timm's fused qkv.weight is the rows of to_q, to_k "
      "and to_v stacked in that order; mechanism {} (docs/ATTENTION.md)",
      r.string("model.attention.kind")));
  note(fmt::format("feed-forward: ff.w1 -> {} -> ff.w2{}",
                   r.string("model.activation") == "gelu" ? "GELU (exact, erf)" : "ReLU",
                   r.boolean("model.glu") ? " (GLU: w1's output halves are value, gate)" : ""));
  const auto per_layer = r.string_list("model.attention.per_layer");
  if (r.string("model.attention.kind") == "linformer" ||
      std::find(per_layer.begin(), per_layer.end(), "linformer") != per_layer.end())
    note(fmt::format(
        "Linformer: transformer.projections.I is Linear(seq_len -> k) applied along the sequence "
        "(keys [B, h, N, d] -> E(k^T)^T [B, h, k, d]); sharing {}: E of (layer L, head H) is I = "
        "(L * heads + H) * 2 and F is I + 1 (none), I = L * 2 and L * 2 + 1 (headwise), "
        "I = L for both (kv), I = 0 for both (layerwise)",
        r.string("model.attention.sharing")));
  if (type == "vit")
    note(fmt::format(
        "ViT: patch_embed.proj is a Conv2d(channels, dim, patch, stride patch) [dim, C, p, p]; "
        "tokens = patches row-major{} + pos_embed; after the blocks {}{} pooling, then head",
        r.string("model.pool") == "cls" ? ", cls_token prepended" : "",
        r.boolean("model.final_norm") && !post
            ? "the final norm (transformer.norm) over every token, then "
            : "",
        r.string("model.pool")));
  return json::Value(std::move(notes));
}

}  // namespace

json::Value model_card(const Recipe& r, const TaskData& data) {
  const DataShape& shape = data.shape;
  json::Value card;
  card["task"] = task_name(shape.task);
  card["model"] = r.string("model.type");
  card["input"] = shape.images ? image_input(r, shape) : token_input(r, shape);
  if (shape.task == Task::classification) {
    std::vector<std::string> names = (data.eval ? data.eval : data.train)->class_names();
    const int64_t classes =
        r.integer("model.classes") > 0 ? r.integer("model.classes") : shape.classes;
    json::Array out;
    for (int64_t c = 0; c < classes; ++c)
      out.emplace_back(static_cast<size_t>(c) < names.size() ? names[static_cast<size_t>(c)]
                                                             : std::to_string(c));
    card["classes"] = json::Value(std::move(out));
  }
  card["layout"] = layout(r);
  return card;
}

}  // namespace forge::train
