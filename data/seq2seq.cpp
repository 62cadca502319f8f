// Sequence-to-sequence sources: the copy task and TSV text pairs.
#include "data/seq2seq.h"

#include <string_view>

#include "core/error.h"
#include "data/file_bytes.h"

namespace forge::data {

namespace {

// i64 [n]: byte + kSeq2SeqByteOffset for each byte, with `first` before them
// and `last` after them when they are >= 0.
Tensor byte_sequence(int64_t first, std::string_view bytes, int64_t last) {
  const int64_t n = static_cast<int64_t>(bytes.size()) + (first >= 0) + (last >= 0);
  Tensor t = Tensor::empty({n}, DType::i64);
  int64_t* p = t.data<int64_t>();
  if (first >= 0) *p++ = first;
  for (char c : bytes) *p++ = static_cast<uint8_t>(c) + kSeq2SeqByteOffset;
  if (last >= 0) *p = last;
  return t;
}

}  // namespace

CopyTask::CopyTask(CopyTaskOptions options) : options_(options) {
  FORGE_CHECK(options_.length > 0, "CopyTask: length must be positive, got {}", options_.length);
  FORGE_CHECK(options_.vocab_size >= 3,
              "CopyTask: vocab_size must be at least 3 (0 pad, 1 start, tokens from 2), got {}",
              options_.vocab_size);
  FORGE_CHECK(options_.size > 0, "CopyTask: size must be positive, got {}", options_.size);
}

Example CopyTask::get(int64_t i, Rng* rng) const {
  FORGE_CHECK(i >= 0 && i < options_.size, "CopyTask: index {} out of range [0, {})", i,
              options_.size);
  Rng fixed(Rng::mix({options_.eval_seed, static_cast<uint64_t>(i)}));
  Rng& r = rng ? *rng : fixed;
  const int64_t M = options_.length;
  Example e;
  e.input = Tensor::empty({M}, DType::i64);
  e.input2 = Tensor::empty({2 * M}, DType::i64);
  e.target = Tensor::empty({2 * M}, DType::i64);
  int64_t* src = e.input.data<int64_t>();
  int64_t* dec = e.input2.data<int64_t>();
  int64_t* tgt = e.target.data<int64_t>();
  for (int64_t t = 0; t < M; ++t) src[t] = 2 + r.randint(options_.vocab_size - 2);
  // tgt = [1] + src + src; input2 = tgt[:-1], target = tgt[1:].
  dec[0] = kSeq2SeqStart;
  for (int64_t t = 0; t < 2 * M; ++t) {
    tgt[t] = src[t % M];
    if (t + 1 < 2 * M) dec[t + 1] = tgt[t];
  }
  return e;
}

std::string CopyTask::describe() const {
  return fmt::format("copy task: {} examples, sources of {} tokens in [2, {}), tgt = 1 + src + src",
                     options_.size, options_.length, options_.vocab_size);
}

Seq2SeqTsv::Seq2SeqTsv(const std::string& path, Seq2SeqTsvOptions options)
    : path_(path), options_(options) {
  FORGE_CHECK(options_.max_source_length > 0,
              "Seq2SeqTsv: max_source_length must be positive, got {}", options_.max_source_length);
  FORGE_CHECK(options_.max_target_length > 0,
              "Seq2SeqTsv: max_target_length must be positive (it counts the end token), got {}",
              options_.max_target_length);
  std::string text;
  append_file_bytes(path, options_.max_bytes, text);
  std::string_view rest = text;
  int64_t line_no = 0;
  while (!rest.empty()) {
    const size_t newline = rest.find('\n');
    std::string_view line = rest.substr(0, newline);
    rest.remove_prefix(newline == std::string_view::npos ? rest.size() : newline + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t tab = line.find('\t');
    FORGE_CHECK(tab != std::string_view::npos,
                "{}:{}: expected 'source<TAB>target', found no tab in \"{}\"", path, line_no,
                escaped(line));
    FORGE_CHECK(tab > 0, "{}:{}: the source (before the tab) is empty", path, line_no);
    sources_.add(line.substr(0, tab), options_.max_source_length);
    targets_.add(line.substr(tab + 1), options_.max_target_length - 1);
  }
  FORGE_CHECK(sources_.size() > 0,
              "Seq2SeqTsv: '{}' holds no 'source<TAB>target' pair (it is empty or blank)", path);
}

Example Seq2SeqTsv::get(int64_t i, Rng*) const {
  const std::string_view target = targets_.text(i);
  Example e;
  e.input = byte_sequence(-1, sources_.text(i), -1);
  e.input2 = byte_sequence(kSeq2SeqStart, target, -1);
  e.target = byte_sequence(-1, target, kSeq2SeqEnd);
  return e;
}

std::string Seq2SeqTsv::describe() const {
  return fmt::format(
      "seq2seq pairs {}: {} pairs, bytes (vocab {}), {} sources truncated to {} tokens, {} "
      "targets truncated to {} tokens",
      path_, size(), kSeq2SeqByteVocabSize, sources_.num_truncated(), options_.max_source_length,
      targets_.num_truncated(), options_.max_target_length);
}

}  // namespace forge::data
