// predict's TSV input (data/tsv_inputs.h: parse_tsv_inputs) on any bytes, in
// each layout, and each text through the tokenizer predict gives it
// (listops_tokenize, byte_tokens). Every example names its line, in order;
// its texts are parts of that line (no tab in a listops or pair text); token
// ids are ListOps' or bytes.
#include <string>

#include "data/listops.h"
#include "data/text.h"
#include "data/tsv_inputs.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge;
  using namespace forge::data;
  const std::string content(reinterpret_cast<const char*>(data), size);
  for (TsvLayout layout : {TsvLayout::listops, TsvLayout::text, TsvLayout::pairs}) {
    std::vector<TsvInput> inputs;
    if (!fuzz::accepts([&] { inputs = parse_tsv_inputs(content, "in.tsv", layout); })) continue;
    int64_t last = 0;
    for (const TsvInput& in : inputs) {
      FUZZ_REQUIRE(in.where.rfind("in.tsv:", 0) == 0);
      const int64_t line = std::stoll(in.where.substr(7));
      FUZZ_REQUIRE(line > last);
      last = line;
      FUZZ_REQUIRE(in.text.size() <= size && in.text2.size() <= size);
      if (layout != TsvLayout::text) FUZZ_REQUIRE(in.text.find('\t') == std::string::npos);
      FUZZ_REQUIRE(in.text2.find('\t') == std::string::npos);
      if (layout == TsvLayout::listops) {
        std::vector<uint8_t> ids;
        if (fuzz::accepts([&] { ids = listops_tokenize(in.text, in.where); }))
          for (uint8_t id : ids) FUZZ_REQUIRE(id >= 1 && id < kListOpsVocabSize);
      } else {
        for (const std::string* t : {&in.text, &in.text2}) {
          const Tensor x = byte_tokens(*t, 8);
          FUZZ_REQUIRE(x.numel() <= 8);
        }
      }
    }
  }
  return 0;
}
