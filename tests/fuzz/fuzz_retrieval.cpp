// The document-pair TSV reader of the retrieval task (TextPairs in
// data/text.h) on any bytes, as a file, with the default options and with a
// short max_length and a fixed class count. Every pair of a file that reads
// has two documents of at most max_length tokens and a label below num_classes.
#include <memory>

#include "data/text.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge;
  using namespace forge::data;
  fuzz::MemFile file(data, size);
  for (const TextOptions options :
       {TextOptions{}, TextOptions{.max_length = 5, .num_classes = 2}}) {
    std::unique_ptr<TextPairs> ds;
    if (!fuzz::accepts([&] { ds = std::make_unique<TextPairs>(file.path(), options); })) continue;
    FUZZ_REQUIRE(ds->size() >= 1 && ds->num_classes() >= 1);
    for (int64_t i = 0; i < ds->size(); ++i) {
      const Example e = ds->get(i, nullptr);
      FUZZ_REQUIRE(e.input.numel() <= options.max_length);
      FUZZ_REQUIRE(e.input2.numel() <= options.max_length);
      FUZZ_REQUIRE(e.label >= 0 && e.label < ds->num_classes());
    }
    ds->describe();
  }
  return 0;
}
