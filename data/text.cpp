// Byte-level text datasets: TSV parsing, byte tokens, the two Datasets.
#include "data/text.h"

#include <algorithm>
#include <fstream>
#include <utility>

#include "core/error.h"

namespace forge::data {

namespace {

std::string excerpt(std::string_view s) {
  constexpr size_t kMax = 60;
  return s.size() <= kMax ? std::string(s) : std::string(s.substr(0, kMax)) + "...";
}

// Calls fn(line, line_no) for each non-blank line, a trailing '\r' removed.
template <typename F>
void for_each_line(const std::string& path, const char* what, F&& fn) {
  std::ifstream in(path, std::ios::binary);
  FORGE_CHECK(in, "{}: cannot open {}", what, path);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) fn(std::string_view(line), line_no);
  }
  FORGE_CHECK(!in.bad(), "{}: reading {} failed", what, path);
}

// "3", "3.0", "3.00" -> 3; -1 when `s` is not such a number.
int64_t parse_label(std::string_view s) {
  const size_t dot = std::min(s.find('.'), s.size());
  const std::string_view whole = s.substr(0, dot);
  if (whole.empty() || whole.size() > 9) return -1;
  int64_t v = 0;
  for (char c : whole) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  if (dot < s.size()) {
    const std::string_view frac = s.substr(dot + 1);
    if (frac.empty() || frac.find_first_not_of('0') != std::string_view::npos) return -1;
  }
  return v;
}

int64_t checked_label(std::string_view field, const std::string& path, int64_t line_no) {
  const int64_t label = parse_label(field);
  FORGE_CHECK(label >= 0, "{}:{}: expected a non-negative integer label, found '{}'", path, line_no,
              excerpt(field));
  return label;
}

std::vector<std::string_view> split_tabs(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    if (tab == std::string_view::npos) break;
    fields.push_back(line.substr(start, tab - start));
    start = tab + 1;
  }
  fields.push_back(line.substr(start));
  return fields;
}

// num_classes from the options, or the largest label + 1; checks the labels.
int64_t resolve_classes(const std::vector<int64_t>& labels, const TextOptions& options,
                        const std::string& name) {
  FORGE_CHECK(!labels.empty(), "{}: no examples", name);
  const int64_t max_label = *std::max_element(labels.begin(), labels.end());
  if (options.num_classes <= 0) return max_label + 1;
  FORGE_CHECK(max_label < options.num_classes, "{}: label {} is not below num_classes {}", name,
              max_label, options.num_classes);
  return options.num_classes;
}

void check_options(const TextOptions& options, const std::string& name) {
  FORGE_CHECK(options.max_length > 0, "{}: max_length must be positive, got {}", name,
              options.max_length);
  FORGE_CHECK(options.num_classes >= 0, "{}: num_classes must be >= 0 (0: from the labels), got {}",
              name, options.num_classes);
}

}  // namespace

Tensor byte_tokens(std::string_view text, int64_t max_length) {
  FORGE_CHECK(max_length >= 0, "byte_tokens: max_length must be >= 0, got {}", max_length);
  const auto n = std::min(static_cast<int64_t>(text.size()), max_length);
  Tensor t = Tensor::empty({n}, DType::i64);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(text[static_cast<size_t>(i)]) + 1;
  return t;
}

void TextStore::add(std::string_view text, int64_t max_length) {
  const size_t kept = std::min(text.size(), static_cast<size_t>(max_length));
  num_truncated_ += kept < text.size();
  bytes_.append(text.substr(0, kept));
  offsets_.push_back(static_cast<int64_t>(bytes_.size()));
}

std::string_view TextStore::text(int64_t i) const {
  FORGE_CHECK(i >= 0 && i < size(), "TextStore: index {} out of range [0, {})", i, size());
  const auto b = static_cast<size_t>(offsets_[static_cast<size_t>(i)]);
  const auto e = static_cast<size_t>(offsets_[static_cast<size_t>(i) + 1]);
  return std::string_view(bytes_).substr(b, e - b);
}

TextClassification::TextClassification(const std::string& tsv_path, TextOptions options)
    : name_(tsv_path), options_(options) {
  check_options(options_, name_);
  for_each_line(tsv_path, "TextClassification", [&](std::string_view line, int64_t line_no) {
    const size_t tab = line.find('\t');
    FORGE_CHECK(tab != std::string_view::npos,
                "{}:{}: expected 'label<TAB>text', found no tab in '{}'", tsv_path, line_no,
                excerpt(line));
    const int64_t label = checked_label(line.substr(0, tab), tsv_path, line_no);
    FORGE_CHECK(options_.num_classes <= 0 || label < options_.num_classes,
                "{}:{}: label {} is not below num_classes {}", tsv_path, line_no, label,
                options_.num_classes);
    labels_.push_back(label);
    texts_.add(line.substr(tab + 1), options_.max_length);
  });
  finish();
}

TextClassification::TextClassification(const std::vector<std::pair<int64_t, std::string>>& examples,
                                       std::string name, TextOptions options)
    : name_(std::move(name)), options_(options) {
  check_options(options_, name_);
  for (size_t i = 0; i < examples.size(); ++i) {
    FORGE_CHECK(examples[i].first >= 0, "{}: example {} has the negative label {}", name_, i,
                examples[i].first);
    labels_.push_back(examples[i].first);
    texts_.add(examples[i].second, options_.max_length);
  }
  finish();
}

void TextClassification::finish() {
  num_classes_ = resolve_classes(labels_, options_, name_);
}

Example TextClassification::get(int64_t i, Rng*) const {
  Example e;
  e.input = byte_tokens(texts_.text(i), options_.max_length);
  e.label = labels_[static_cast<size_t>(i)];
  return e;
}

std::string TextClassification::describe() const {
  return fmt::format("Text {}: {} documents, {} classes, bytes (vocab {}), {} truncated to {}",
                     name_, size(), num_classes_, kByteVocabSize, texts_.num_truncated(),
                     options_.max_length);
}

TextPairs::TextPairs(const std::string& tsv_path, TextOptions options)
    : name_(tsv_path), options_(options) {
  check_options(options_, name_);
  for_each_line(tsv_path, "TextPairs", [&](std::string_view line, int64_t line_no) {
    const std::vector<std::string_view> f = split_tabs(line);
    FORGE_CHECK(f.size() == 3 || f.size() == 5,
                "{}:{}: expected 'label<TAB>text1<TAB>text2' (3 fields) or LRA's "
                "'label<TAB>id1<TAB>id2<TAB>text1<TAB>text2' (5 fields), found {} field(s)",
                tsv_path, line_no, f.size());
    const int64_t label = checked_label(f[0], tsv_path, line_no);
    FORGE_CHECK(options_.num_classes <= 0 || label < options_.num_classes,
                "{}:{}: label {} is not below num_classes {}", tsv_path, line_no, label,
                options_.num_classes);
    labels_.push_back(label);
    first_.add(f[f.size() - 2], options_.max_length);
    second_.add(f[f.size() - 1], options_.max_length);
  });
  num_classes_ = resolve_classes(labels_, options_, name_);
}

Example TextPairs::get(int64_t i, Rng*) const {
  Example e;
  e.input = byte_tokens(first_.text(i), options_.max_length);
  e.input2 = byte_tokens(second_.text(i), options_.max_length);
  e.label = labels_[static_cast<size_t>(i)];
  return e;
}

std::string TextPairs::describe() const {
  return fmt::format(
      "Text pairs {}: {} pairs, {} classes, bytes (vocab {}), {} documents truncated to {}", name_,
      size(), num_classes_, kByteVocabSize, first_.num_truncated() + second_.num_truncated(),
      options_.max_length);
}

}  // namespace forge::data
