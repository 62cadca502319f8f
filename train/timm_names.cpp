#include "train/timm_names.h"

#include <cmath>
#include <map>
#include <optional>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace forge::train {

namespace {

// "blocks.<L>.<rest>" -> (L, rest); nullopt for other names.
std::optional<std::pair<std::string, std::string>> timm_block(const std::string& name) {
  constexpr std::string_view prefix = "blocks.";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return std::nullopt;
  const std::string layer = name.substr(prefix.size(), dot - prefix.size());
  if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::make_pair(layer, name.substr(dot + 1));
}

// The largest g with g * g <= n (n >= 0), exactly.
int64_t floor_sqrt(int64_t n) {
  auto g = static_cast<int64_t>(std::sqrt(static_cast<double>(n)));
  while (g > 0 && g > n / g) --g;
  while ((g + 1) <= n / (g + 1)) ++g;
  return g;
}

}  // namespace

std::vector<TimmPart> from_timm_name(const std::string& name, const std::vector<int64_t>& shape) {
  static const std::map<std::string, std::string> in_block = {{"norm1", "attn_norm.norm"},
                                                              {"attn.proj", "attn.to_out"},
                                                              {"norm2", "ff_norm.norm"},
                                                              {"mlp.fc1", "ff.w1"},
                                                              {"mlp.fc2", "ff.w2"}};
  if (const auto block = timm_block(name)) {
    const std::string layer = "transformer.layers." + block->first + ".";
    const std::string& rest = block->second;
    const size_t dot = rest.rfind('.');
    if (dot == std::string::npos) return {{name}};  // blocks.L.x: not one of timm's
    const std::string module = rest.substr(0, dot), leaf = rest.substr(dot + 1);
    if (module == "attn.qkv") {
      FORGE_CHECK(!shape.empty() && shape[0] % 3 == 0,
                  "init_from: {} has shape [{}], not 3 x dim rows", name, fmt::join(shape, ", "));
      const int64_t d = shape[0] / 3;
      return {{layer + "attn.to_q." + leaf, 0, d},
              {layer + "attn.to_k." + leaf, d, d},
              {layer + "attn.to_v." + leaf, 2 * d, d}};
    }
    const auto it = in_block.find(module);
    return {{it == in_block.end() ? name : layer + it->second + "." + leaf}};
  }
  if (name.rfind("norm.", 0) == 0 || name.rfind("fc_norm.", 0) == 0)
    return {{"transformer.norm.norm." + name.substr(name.find('.') + 1)}};
  return {{name}};
}

PositionGrids position_grids(int64_t source_tokens, int64_t target_tokens) {
  FORGE_CHECK(source_tokens >= 0 && target_tokens >= 0,
              "init_from: pos_embed token counts must not be negative ({} and {})", source_tokens,
              target_tokens);
  PositionGrids g;
  g.target = floor_sqrt(target_tokens);
  g.extra = target_tokens - g.target * g.target;
  FORGE_CHECK(source_tokens >= g.extra,
              "init_from: pos_embed with {} tokens is not {} class token(s) and a square grid "
              "(this model's {} tokens)",
              source_tokens, g.extra, target_tokens);
  g.source = floor_sqrt(source_tokens - g.extra);
  FORGE_CHECK(g.target >= 1 && g.source >= 1 && g.source * g.source == source_tokens - g.extra,
              "init_from: pos_embed with {} tokens is not {} class token(s) and a square grid "
              "(this model's {} tokens)",
              source_tokens, g.extra, target_tokens);
  return g;
}

}  // namespace forge::train
