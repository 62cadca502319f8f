// Byte-level language-modelling corpora: reading, splits, windows.
#include "data/lm_text.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/names.h"
#include "data/file_bytes.h"

namespace forge::data {

namespace {

namespace fs = std::filesystem;

bool matches_any(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) {
    return fnmatch(p.c_str(), name.c_str(), 0) == 0;
  });
}

// The regular files of `dir` whose names pass the patterns, sorted by name.
std::vector<std::string> list_files(const std::string& dir, const LmFilesOptions& options) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && matches_any(options.include, name) &&
        !matches_any(options.exclude, name))
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> paths;
  for (const std::string& name : names) paths.push_back((fs::path(dir) / name).string());
  return paths;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

int64_t end_of(int64_t offset, double fraction, bool fractions, int64_t total) {
  const int64_t end =
      fractions ? static_cast<int64_t>(std::floor(fraction * static_cast<double>(total))) : offset;
  return std::min(end, total);
}

}  // namespace

constexpr NameTable<LmSplit, 3> kLmSplitNames{"split", {"train", "valid", "test"}};

const char* lm_split_name(LmSplit split) { return name_of(kLmSplitNames, split); }

LmRange lm_split_range(const LmSplitPoints& p, LmSplit split, int64_t total) {
  const int set =
      (p.train_end_fraction != 0) + (p.valid_end_fraction != 0) + (p.test_end_fraction != 0);
  FORGE_CHECK(set == 0 || set == 3,
              "LM split points: give all three end fractions (train {}, valid {}, test {}) or "
              "none (then the byte offsets are used)",
              p.train_end_fraction, p.valid_end_fraction, p.test_end_fraction);
  const bool fractions = set == 3;
  if (fractions) {
    FORGE_CHECK(p.train_end_fraction > 0 && p.train_end_fraction <= p.valid_end_fraction &&
                    p.valid_end_fraction <= p.test_end_fraction && p.test_end_fraction <= 1,
                "LM split points: the end fractions must satisfy 0 < train {} <= valid {} <= "
                "test {} <= 1",
                p.train_end_fraction, p.valid_end_fraction, p.test_end_fraction);
  } else {
    FORGE_CHECK(p.train_end > 0 && p.train_end <= p.valid_end && p.valid_end <= p.test_end,
                "LM split points: the byte offsets must satisfy 0 < train_end {} <= valid_end {} "
                "<= test_end {}",
                p.train_end, p.valid_end, p.test_end);
  }
  const int64_t train_end = end_of(p.train_end, p.train_end_fraction, fractions, total);
  const int64_t valid_end = end_of(p.valid_end, p.valid_end_fraction, fractions, total);
  const int64_t test_end = end_of(p.test_end, p.test_end_fraction, fractions, total);
  switch (split) {
    case LmSplit::train:
      return {0, train_end};
    case LmSplit::valid:
      return {train_end, valid_end};
    case LmSplit::test:
      return {valid_end, test_end};
  }
  return {};
}

std::string LmCorpus::name() const {
  if (files.size() == 1 && files[0] == root) return root;
  return fmt::format("{} ({} file{})", root, files.size(), files.size() == 1 ? "" : "s");
}

std::string LmCorpus::files_in(LmRange range) const {
  constexpr size_t kListed = 4;
  std::vector<std::string> hit;
  size_t count = 0;
  for (size_t k = 0; k < files.size(); ++k)
    if (offsets[k] < range.end && offsets[k + 1] > range.begin && count++ < kListed)
      hit.push_back(files[k]);
  if (count > kListed) hit.push_back(fmt::format("and {} more", count - kListed));
  return hit.empty() ? name() : join(hit);
}

std::shared_ptr<const LmCorpus> read_lm_corpus(const std::string& path,
                                               const LmFilesOptions& options) {
  FORGE_CHECK(fs::exists(path), "LM corpus: '{}' does not exist", path);
  FORGE_CHECK(options.max_bytes > 0, "LM corpus: max_bytes must be positive, got {}",
              options.max_bytes);
  auto corpus = std::make_shared<LmCorpus>();
  corpus->root = path;
  if (fs::is_directory(path)) {
    corpus->files = list_files(path, options);
    FORGE_CHECK(!corpus->files.empty(),
                "LM corpus: the directory '{}' has no regular file matching include [{}] and not "
                "exclude [{}]",
                path, join(options.include), join(options.exclude));
  } else {
    corpus->files = {path};
  }
  corpus->offsets = {0};
  for (const std::string& file : corpus->files) {
    const int64_t n = append_file_bytes(file, options.max_bytes, corpus->bytes);
    FORGE_CHECK(n > 0, "LM corpus: '{}' is empty{}", file,
                corpus->files.size() > 1 ? "; remove it or exclude it" : "");
    corpus->offsets.push_back(corpus->size());
  }
  return corpus;
}

LmText::LmText(std::shared_ptr<const LmCorpus> corpus, LmSplit split, LmTextOptions options)
    : corpus_(std::move(corpus)), split_(split), options_(std::move(options)) {
  FORGE_CHECK(corpus_ != nullptr, "LmText: corpus is null");
  FORGE_CHECK(options_.seq_len > 0, "LmText: seq_len must be positive, got {}", options_.seq_len);
  range_ = lm_split_range(options_.splits, split_, corpus_->size());
  const int64_t n = options_.seq_len, len = range_.size();
  FORGE_CHECK(len >= n + 1,
              "LmText: the {} split of {} is bytes [{}, {}) of its {}: {} bytes, but a window of "
              "seq_len {} needs {} bytes; lower seq_len or move the split points",
              lm_split_name(split_), corpus_->files_in(range_), range_.begin, range_.end,
              corpus_->size(), std::max<int64_t>(len, 0), n, n + 1);
  size_ = options_.random_windows ? len / n : (len - 2) / n + 1;
}

Example LmText::get(int64_t i, Rng* rng) const {
  FORGE_CHECK(i >= 0 && i < size_, "LmText: index {} out of range [0, {})", i, size_);
  const int64_t n = options_.seq_len, len = range_.size();
  int64_t start = i * n;
  if (options_.random_windows)
    start = rng ? rng->randint(0, len - n - 1) : std::min(start, len - n - 1);
  const int64_t count = std::min(n + 1, len - start) - 1;  // input (and target) tokens
  const auto* bytes = reinterpret_cast<const uint8_t*>(corpus_->bytes.data()) + range_.begin;
  Example e;
  e.input = Tensor::empty({count}, DType::i64);
  e.target = Tensor::empty({count}, DType::i64);
  int64_t* in = e.input.data<int64_t>();
  int64_t* out = e.target.data<int64_t>();
  for (int64_t t = 0; t < count; ++t) {
    in[t] = bytes[start + t];
    out[t] = bytes[start + t + 1];
  }
  return e;
}

std::string LmText::describe() const {
  return fmt::format("text (bytes) {}: {} bytes of {}, {} windows of {} + 1", lm_split_name(split_),
                     split_bytes(), corpus_->name(),
                     options_.random_windows ? "random" : "sequential", options_.seq_len);
}

}  // namespace forge::data
