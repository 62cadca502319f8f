// Byte-level language modelling (enwik8 style, as in performer-pytorch's and
// linear-attention-transformer's examples/enwik8_simple/train.py): the bytes
// of one file, or of a directory's files back to back, cut into train / valid
// / test by byte offsets and served as windows of seq_len + 1 bytes:
//   input  = window[0, N)      i64 [N]
//   target = window[1, N + 1)  i64 [N]   (the byte after each input byte)
// with N = seq_len (shorter only for the last window of a sequential pass).
//
// Tokens are the bytes themselves, 0..255 (vocabulary 256, the references'
// num_tokens = 256). No token is free for padding: the loader pads with pad_id,
// and a loss must skip padded positions by the mask (the references' wrapper
// ignores target 0 instead, which enwik8's text never holds).
//
// Bits per byte: since a token is a byte, a mean cross-entropy in nats per
// target token is nats per byte, and bits_per_byte() divides it by ln 2. A
// sequential pass (random_windows = false) predicts every byte of the split
// but its first exactly once, target_bytes() = split_bytes() - 1 targets: sum
// the loss over the batches' unmasked targets and divide by that count.
#pragma once

#include <cstdint>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace forge::data {

constexpr int64_t kLmVocabSize = 256;

inline double bits_per_byte(double nats_per_byte) {
  return nats_per_byte / std::numbers::ln2;
}

enum class LmSplit { train, valid, test };
const char* lm_split_name(LmSplit split);  // "train", "valid", "test"

// Where the splits end: train = [0, train_end), valid = [train_end, valid_end),
// test = [valid_end, test_end), as byte offsets (the enwik8 convention, 90e6 /
// 5e6 / 5e6 of its 100e6 bytes) or, when the three *_fraction fields are all
// set (> 0), as fractions of the corpus' byte count: end = floor(fraction *
// total), each fraction in (0, 1], nondecreasing; the byte offsets are then
// ignored. All three fractions 0 (the default) uses the byte offsets; some set
// and others not is an error. An end past the corpus is cut to the corpus' end
// (a corpus shorter than test_end gives a shorter test split).
struct LmSplitPoints {
  int64_t train_end = 90'000'000;
  int64_t valid_end = 95'000'000;
  int64_t test_end = 100'000'000;
  double train_end_fraction = 0;
  double valid_end_fraction = 0;
  double test_end_fraction = 0;
};

// Byte range [begin, end) of a corpus.
struct LmRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The range of `split` in a corpus of `total` bytes (it may be empty). Throws
// for split points out of order or out of range, or a mix of offsets and fractions.
LmRange lm_split_range(const LmSplitPoints& points, LmSplit split, int64_t total);

struct LmFilesOptions {
  // A directory's regular files (not its subdirectories) are read when their
  // name matches one `include` pattern and no `exclude` pattern (fnmatch).
  std::vector<std::string> include = {"*"};
  std::vector<std::string> exclude{};
  int64_t max_bytes = int64_t{2} << 30;  // the corpus' bytes after decompression
};

// A corpus in memory, read once and shared by its splits.
struct LmCorpus {
  std::string root;                // the path given: a file or a directory
  std::vector<std::string> files;  // the files read, in order
  std::vector<int64_t> offsets;    // file k holds bytes [offsets[k], offsets[k + 1])
  std::string bytes;
  int64_t size() const { return static_cast<int64_t>(bytes.size()); }
  // "/data/enwik8", or "/data/books (3 files)" for a directory.
  std::string name() const;
  // The paths of the files that bytes [begin, end) come from, for messages.
  std::string files_in(LmRange range) const;
};

// Reads a file, or a directory's matching files sorted by name, concatenated;
// names ending in ".gz" are decompressed. Errors name the path: missing, a
// directory with no matching file, an empty file, more than max_bytes, a
// damaged gzip stream.
std::shared_ptr<const LmCorpus> read_lm_corpus(const std::string& path,
                                               const LmFilesOptions& options = {});

struct LmTextOptions {
  int64_t seq_len = 1024;  // N; a window holds N + 1 bytes
  LmSplitPoints splits{};
  // true (training): get(i, rng) with an rng draws a window starting uniformly
  // in [0, split_bytes - N - 1], and size() = split_bytes / N (the references'
  // __len__); with a null rng it gives the full window starting at
  // min(i N, split_bytes - N - 1). false (evaluation): size() counts the
  // sequential windows, example i = bytes [i N, i N + N + 1) of the split, the
  // last one cut at the split's end (kept when it has 2 bytes or more), so the
  // inputs tile the split without overlap; rng is not used. (The references
  // draw starts in [0, split_bytes - N - 2], torch.randint's high being
  // exclusive, so they never use the last full window, and they validate on
  // random windows too; ours measure the whole split once.)
  bool random_windows = true;
};

// Examples: input i64 [N], target i64 [N] (see above), label 0.
class LmText : public Dataset {
 public:
  // Throws, naming the corpus' files, the split, its byte range and seq_len,
  // when the split holds fewer than seq_len + 1 bytes.
  LmText(std::shared_ptr<const LmCorpus> corpus, LmSplit split, LmTextOptions options = {});

  int64_t size() const override { return size_; }
  Example get(int64_t i, Rng* rng) const override;
  int64_t num_classes() const override { return kLmVocabSize; }
  // "text (bytes) train: 90000000 bytes of /data/enwik8, random windows of 1024 + 1".
  std::string describe() const override;

  int64_t vocab_size() const { return kLmVocabSize; }
  LmRange range() const { return range_; }  // in the corpus
  int64_t split_bytes() const { return range_.size(); }
  int64_t target_bytes() const { return range_.size() - 1; }  // targets of a sequential pass

 private:
  std::shared_ptr<const LmCorpus> corpus_;
  LmSplit split_;
  LmTextOptions options_;
  LmRange range_;
  int64_t size_ = 0;
};

}  // namespace forge::data
