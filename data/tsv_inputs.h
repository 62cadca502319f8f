// The examples of a TSV file written in a training set's layout, as
// `attnforge predict` reads new inputs for a sequence classifier: one example
// a line (a trailing '\r' and blank lines ignored), its texts by layout:
//   listops  `expression[<TAB>label]`: the first column (LRA's header line
//            "Source<TAB>Target" skipped);
//   text     `[label<TAB>]text`: everything after the first tab, or the line;
//   pairs    `[label<TAB>...]text1<TAB>text2`: the last two columns (fewer
//            than two is an error naming file:line).
// The texts are tokenized by the caller (listops_tokenize, byte_tokens).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace forge::data {

enum class TsvLayout { listops, text, pairs };

struct TsvInput {
  std::string where;  // "path:line"
  std::string text;
  std::string text2;  // pairs only
};

std::vector<TsvInput> parse_tsv_inputs(std::string_view content, const std::string& path,
                                       TsvLayout layout);

}  // namespace forge::data
