// The ListOps TSV reader (data/listops.h) on any bytes, as a file, and what
// the Dataset does with the examples. An example that reads prints in LRA's
// form (when its brackets balance) and that text tokenizes back to the same
// ids; when it evaluates, its value is a digit.
#include "data/listops.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge;
  using namespace forge::data;
  fuzz::MemFile file(data, size);
  std::vector<ListOpsExample> examples;
  if (!fuzz::accepts([&] { examples = read_listops_tsv(file.path()); })) return 0;
  for (const ListOpsExample& e : examples) {
    FUZZ_REQUIRE(!e.tokens.empty() && e.label >= 0 && e.label <= 9);
    std::string printed;
    if (!fuzz::accepts([&] { printed = listops_to_string(e.tokens); })) continue;
    FUZZ_REQUIRE(listops_tokenize(printed) == e.tokens);
    FUZZ_REQUIRE(listops_depth(e.tokens) >= 0);
    int value = -1;
    if (fuzz::accepts([&] { value = listops_eval(printed); }))
      FUZZ_REQUIRE(value >= 0 && value <= 9);
  }
  if (examples.empty()) return 0;
  const ListOps ds(examples, "fuzz input", {.max_length = 8});
  FUZZ_REQUIRE(ds.size() == static_cast<int64_t>(examples.size()));
  for (int64_t i = 0; i < ds.size(); ++i) {
    const Example ex = ds.get(i, nullptr);
    FUZZ_REQUIRE(ex.input.numel() >= 1 && ex.input.numel() <= 8);
    FUZZ_REQUIRE(ex.label == examples[static_cast<size_t>(i)].label);
  }
  ds.describe();
  return 0;
}
