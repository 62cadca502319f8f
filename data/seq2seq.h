// Sequence-to-sequence sources for encoder-decoders. An example is
//   input  = the source, the encoder's input      i64 [M]
//   input2 = tgt[:-1], the decoder's input        i64 [N2]
//   target = tgt[1:], what the decoder predicts   i64 [N2]
// where tgt is the whole target sequence, starting with the start token 1;
// token 0 is padding. This is the split performer-pytorch's
// AutoregressiveWrapper makes of `seq_out` (xi = x[:, :-1], xo = x[:, 1:]).
//
// CopyTask: performer-pytorch's examples/toy_tasks/enc_dec_copy.py (and
// linear-attention-transformer's copy_task.py): src is M = 32 tokens uniform in
// [2, V) with V = NUM_TOKENS = 16 + 2, tgt = [1] + src + src (DEC_SEQ_LEN =
// 64 + 1 tokens), so input2 and target have 2M = 64 tokens each. No example
// is padded: all have the same lengths.
//
// Seq2SeqTsv: `source<TAB>target` lines of UTF-8 text (no header; everything
// after the first tab is the target; a trailing '\r' and blank lines are
// ignored); the file may be gzip-compressed (a name ending in ".gz"). Tokens
// are byte + 3, leaving 0 pad, 1 start, 2 end: vocabulary 259. The source is
// its bytes' tokens (no start or end token), tgt = [1] + target bytes + [2].
// Errors name file:line: a line without a tab, an empty source; a file with no
// pair is an error too.
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"
#include "data/text.h"

namespace forge::data {

constexpr int64_t kSeq2SeqPad = 0;
constexpr int64_t kSeq2SeqStart = 1;
constexpr int64_t kSeq2SeqEnd = 2;         // Seq2SeqTsv only
constexpr int64_t kSeq2SeqByteOffset = 3;  // Seq2SeqTsv: token = byte + 3
constexpr int64_t kSeq2SeqByteVocabSize = 256 + kSeq2SeqByteOffset;

struct CopyTaskOptions {
  int64_t length = 32;      // M, the source length (ENC_SEQ_LEN)
  int64_t vocab_size = 18;  // V (NUM_TOKENS = 16 + 2); source tokens are uniform in [2, V)
  int64_t size = 1024;      // examples an epoch (e.g. 128 for an evaluation set)
  // rng null: example i is drawn from Rng(Rng::mix({eval_seed, i})), a fixed set.
  uint64_t eval_seed = 0;
};

// Examples: input i64 [M], input2 and target i64 [2M], label 0. With an rng
// the source is drawn from it (the loader seeds it per (seed, epoch, index)).
class CopyTask : public Dataset {
 public:
  explicit CopyTask(CopyTaskOptions options = {});

  int64_t size() const override { return options_.size; }
  Example get(int64_t i, Rng* rng) const override;
  int64_t num_classes() const override { return options_.vocab_size; }
  // "copy task: 1024 examples, sources of 32 tokens in [2, 18), tgt = 1 + src + src".
  std::string describe() const override;

  int64_t vocab_size() const { return options_.vocab_size; }

 private:
  CopyTaskOptions options_;
};

struct Seq2SeqTsvOptions {
  int64_t max_source_length = 1024;  // source bytes kept: input has at most this many tokens
  // input2 / target have at most this many tokens: the first max_target_length - 1
  // target bytes are kept, then the end token (in target) still follows.
  int64_t max_target_length = 1024;
  int64_t max_bytes = int64_t{2} << 30;  // the file's bytes after decompression
};

// Examples: input i64 [M <= max_source_length], input2 = [1] + bytes + 3 and
// target = bytes + 3 + [2], i64 [N2 <= max_target_length]; label 0.
class Seq2SeqTsv : public Dataset {
 public:
  explicit Seq2SeqTsv(const std::string& path, Seq2SeqTsvOptions options = {});

  int64_t size() const override { return sources_.size(); }
  Example get(int64_t i, Rng* rng) const override;
  int64_t num_classes() const override { return kSeq2SeqByteVocabSize; }
  std::string describe() const override;

  int64_t vocab_size() const { return kSeq2SeqByteVocabSize; }

 private:
  std::string path_;
  Seq2SeqTsvOptions options_;
  TextStore sources_, targets_;  // bytes, already truncated
};

}  // namespace forge::data
