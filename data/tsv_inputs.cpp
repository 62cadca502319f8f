#include "data/tsv_inputs.h"

#include <fmt/format.h>

#include "core/error.h"

namespace forge::data {

std::vector<TsvInput> parse_tsv_inputs(std::string_view content, const std::string& path,
                                       TsvLayout layout) {
  std::vector<TsvInput> out;
  size_t pos = 0;
  for (int64_t number = 1; pos < content.size(); ++number) {
    size_t nl = content.find('\n', pos);
    if (nl == std::string_view::npos) nl = content.size();
    std::string_view line = content.substr(pos, nl - pos);
    pos = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    std::vector<std::string_view> cols;
    for (size_t b = 0;;) {
      const size_t t = line.find('\t', b);
      cols.push_back(line.substr(b, t == std::string_view::npos ? std::string_view::npos : t - b));
      if (t == std::string_view::npos) break;
      b = t + 1;
    }
    TsvInput in;
    in.where = fmt::format("{}:{}", path, number);
    switch (layout) {
      case TsvLayout::listops:
        if (number == 1 && cols.size() == 2 && cols[0] == "Source") continue;
        in.text = cols.front();
        break;
      case TsvLayout::text:
        in.text = cols.size() == 1 ? line : line.substr(line.find('\t') + 1);
        break;
      case TsvLayout::pairs:
        FORGE_CHECK(cols.size() >= 2,
                    "predict: {}: the model compares document pairs: give two tab-separated "
                    "texts (the last two columns)",
                    in.where);
        in.text = cols[cols.size() - 2];
        in.text2 = cols.back();
        break;
    }
    out.push_back(std::move(in));
  }
  return out;
}

}  // namespace forge::data
