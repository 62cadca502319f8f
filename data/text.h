// Byte-level text classification and document-pair retrieval (LRA's Text and
// Retrieval tasks, `tokenizer: char`).
//
// Tokens are the UTF-8 bytes of the text plus one, so 0 stays free for padding:
// token = byte + 1, vocabulary 257. This is what LRA's tfds ByteTextEncoder
// produces. A text longer than max_length keeps its first max_length bytes
// (LRA: `encode(text)[:max_length]`; 4000 for Text, 4000 per document for
// Retrieval), which may cut a multi-byte character: the model sees bytes.
//
// Files (no header; one example a line; a trailing '\r' and blank lines are
// ignored; no quoting or escapes, so a text holds no newline):
//   classification  `label<TAB>text`: everything after the first tab is the
//                   text (tabs included).
//   pairs           `label<TAB>text1<TAB>text2`, or LRA's AAN rows
//                   `label<TAB>id1<TAB>id2<TAB>text1<TAB>text2` (ids ignored).
// A label is a non-negative integer; LRA's AAN files write "1.0"/"0.0", so a
// fractional part of zeros is accepted. Errors name the file and line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/dataset.h"

namespace forge::data {

constexpr int64_t kByteVocabSize = 257;  // pad 0, bytes 1..256

// i64 [min(size, max_length)]: byte + 1 for each byte.
Tensor byte_tokens(std::string_view text, int64_t max_length);

struct TextOptions {
  int64_t max_length = 4000;  // tokens kept per document
  int64_t num_classes = 0;    // 0: the largest label + 1; else labels must be below it
};

// Texts packed back to back (bytes, already truncated), with their labels.
class TextStore {
 public:
  void add(std::string_view text, int64_t max_length);
  int64_t size() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  std::string_view text(int64_t i) const;
  int64_t num_truncated() const { return num_truncated_; }

 private:
  std::string bytes_;
  std::vector<int64_t> offsets_{0};
  int64_t num_truncated_ = 0;
};

// Example: input i64 [N <= max_length], label.
class TextClassification : public Dataset {
 public:
  explicit TextClassification(const std::string& tsv_path, TextOptions options = {});
  // In-memory (label, text) pairs; `name` is used in messages.
  TextClassification(const std::vector<std::pair<int64_t, std::string>>& examples, std::string name,
                     TextOptions options = {});

  int64_t size() const override { return texts_.size(); }
  Example get(int64_t i, Rng* rng) const override;
  int64_t num_classes() const override { return num_classes_; }
  std::string describe() const override;

  int64_t vocab_size() const { return kByteVocabSize; }

 private:
  void finish();

  std::string name_;
  TextOptions options_;
  TextStore texts_;
  std::vector<int64_t> labels_;
  int64_t num_classes_ = 0;
};

// Example: input i64 [N1], input2 i64 [N2] (each <= max_length), label.
class TextPairs : public Dataset {
 public:
  explicit TextPairs(const std::string& tsv_path, TextOptions options = {});

  int64_t size() const override { return first_.size(); }
  Example get(int64_t i, Rng* rng) const override;
  int64_t num_classes() const override { return num_classes_; }
  std::string describe() const override;

  int64_t vocab_size() const { return kByteVocabSize; }

 private:
  std::string name_;
  TextOptions options_;
  TextStore first_, second_;
  std::vector<int64_t> labels_;
  int64_t num_classes_ = 0;
};

}  // namespace forge::data
