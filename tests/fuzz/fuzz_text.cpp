// The byte-level text classification TSV reader (TextClassification in
// data/text.h) on any bytes, as a file, with the default options and with a
// short max_length and a fixed class count. Every example of a file that reads
// has at most max_length tokens in 1..256 and a label below num_classes.
#include <memory>

#include "data/text.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge;
  using namespace forge::data;
  fuzz::MemFile file(data, size);
  for (const TextOptions options :
       {TextOptions{}, TextOptions{.max_length = 5, .num_classes = 3}}) {
    std::unique_ptr<TextClassification> ds;
    if (!fuzz::accepts([&] { ds = std::make_unique<TextClassification>(file.path(), options); }))
      continue;
    FUZZ_REQUIRE(ds->size() >= 1 && ds->num_classes() >= 1);
    for (int64_t i = 0; i < ds->size(); ++i) {
      const Example e = ds->get(i, nullptr);
      FUZZ_REQUIRE(e.input.numel() <= options.max_length);
      const int64_t* t = e.input.data<int64_t>();
      for (int64_t k = 0; k < e.input.numel(); ++k) FUZZ_REQUIRE(t[k] >= 1 && t[k] <= 256);
      FUZZ_REQUIRE(e.label >= 0 && e.label < ds->num_classes());
    }
    ds->describe();
  }
  return 0;
}
