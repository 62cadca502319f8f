// The sequence-to-sequence TSV reader (data/seq2seq.h: Seq2SeqTsv) on any
// bytes, as a plain file and as a ".gz" file (the bytes as they are, and
// gzip-compressed when they are not already), with the default lengths and
// with short ones. Every example of a file that reads: a source of 1 to
// max_source_length byte tokens; input2 = [start] + target bytes and target =
// target bytes + [end], equal lengths of at most max_target_length, each
// input2 token after the first the target token before it.
#include <memory>

#include "data/seq2seq.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void read_and_check(const std::string& path) {
  using namespace forge;
  using namespace forge::data;
  for (const Seq2SeqTsvOptions o :
       {Seq2SeqTsvOptions{}, Seq2SeqTsvOptions{.max_source_length = 3, .max_target_length = 2}}) {
    std::unique_ptr<Seq2SeqTsv> ds;
    if (!fuzz::accepts([&] { ds = std::make_unique<Seq2SeqTsv>(path, o); })) continue;
    FUZZ_REQUIRE(ds->size() >= 1);
    for (int64_t i = 0; i < ds->size(); ++i) {
      const Example e = ds->get(i, nullptr);
      const int64_t m = e.input.numel(), n = e.input2.numel();
      FUZZ_REQUIRE(m >= 1 && m <= o.max_source_length);
      FUZZ_REQUIRE(n >= 1 && n <= o.max_target_length && e.target.numel() == n);
      const int64_t* x = e.input.data<int64_t>();
      for (int64_t k = 0; k < m; ++k)
        FUZZ_REQUIRE(x[k] >= kSeq2SeqByteOffset && x[k] < kSeq2SeqByteVocabSize);
      const int64_t* in2 = e.input2.data<int64_t>();
      const int64_t* tgt = e.target.data<int64_t>();
      FUZZ_REQUIRE(in2[0] == kSeq2SeqStart);
      for (int64_t k = 1; k < n; ++k) FUZZ_REQUIRE(in2[k] == tgt[k - 1]);
      FUZZ_REQUIRE(tgt[n - 1] == kSeq2SeqEnd || tgt[n - 1] >= kSeq2SeqByteOffset);
    }
    ds->describe();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge::fuzz;
  {
    const MemFile plain(data, size);
    read_and_check(plain.path());
  }
  {
    const NamedFile as_gz(data, size, ".gz");
    read_and_check(as_gz.path());
  }
  if (!is_gzip(data, size)) {
    const std::vector<uint8_t> gz = gzip(data, size);
    const NamedFile packed(gz.data(), gz.size(), ".gz");
    read_and_check(packed.path());
  }
  return 0;
}
