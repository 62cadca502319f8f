// The language-model corpus reader (data/lm_text.h: read_lm_corpus, and
// LmText's windows over it) on any bytes, as a plain file and as a ".gz" file
// (the bytes as they are, and gzip-compressed when they are not already).
// A corpus that reads holds the file's bytes (decompressed), and every window
// of a split that opens is seq_len + 1 bytes or fewer, targets the inputs
// shifted by one, every token a byte.
#include <memory>

#include "data/lm_text.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void read_and_check(const std::string& path, bool plain, size_t size) {
  using namespace forge;
  using namespace forge::data;
  LmFilesOptions files;
  files.max_bytes = int64_t{64} << 20;
  std::shared_ptr<const LmCorpus> corpus;
  if (!fuzz::accepts([&] { corpus = read_lm_corpus(path, files); })) return;
  FUZZ_REQUIRE(corpus->size() >= 1 && corpus->files.size() == 1);
  if (plain) FUZZ_REQUIRE(static_cast<size_t>(corpus->size()) == size);
  LmTextOptions o;
  o.seq_len = 7;
  o.splits.train_end_fraction = 0.5;
  o.splits.valid_end_fraction = 0.75;
  o.splits.test_end_fraction = 1;
  for (LmSplit split : {LmSplit::train, LmSplit::valid, LmSplit::test})
    for (bool random : {true, false}) {
      o.random_windows = random;
      std::unique_ptr<LmText> ds;
      if (!fuzz::accepts([&] { ds = std::make_unique<LmText>(corpus, split, o); })) continue;
      for (int64_t i = 0; i < ds->size() && i < 64; ++i) {
        const Example e = ds->get(i, nullptr);
        const int64_t n = e.input.numel();
        FUZZ_REQUIRE(n >= 1 && n <= o.seq_len && e.target.numel() == n);
        const int64_t* x = e.input.data<int64_t>();
        const int64_t* y = e.target.data<int64_t>();
        for (int64_t k = 0; k < n; ++k) FUZZ_REQUIRE(x[k] >= 0 && x[k] < kLmVocabSize);
        for (int64_t k = 0; k + 1 < n; ++k) FUZZ_REQUIRE(y[k] == x[k + 1]);
      }
      ds->describe();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge::fuzz;
  {
    const MemFile plain(data, size);
    read_and_check(plain.path(), true, size);
  }
  {
    const NamedFile as_gz(data, size, ".gz");
    read_and_check(as_gz.path(), false, size);
  }
  if (!is_gzip(data, size)) {
    const std::vector<uint8_t> gz = gzip(data, size);
    const NamedFile packed(gz.data(), gz.size(), ".gz");
    read_and_check(packed.path(), false, size);
  }
  return 0;
}
