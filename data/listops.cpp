// ListOps: tokens, printing, evaluation, the TSV reader and writer, LRA's
// generator and the Dataset over the examples.
#include "data/listops.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <unordered_set>
#include <utility>

#include "core/error.h"

namespace forge::data {

namespace {

constexpr std::array<std::string_view, kListOpsVocabSize> kTokenNames = {
    "<pad>", "[MIN", "[MAX", "[MED", "[SM", "]", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};

bool is_operator(uint8_t id) {
  return id >= kListOpsMin && id <= kListOpsSumMod;
}

// Shortens a line for an error message.
std::string excerpt(std::string_view s) {
  constexpr size_t kMax = 60;
  return s.size() <= kMax ? std::string(s) : std::string(s.substr(0, kMax)) + "...";
}

// Applies `op` to the arguments given as a histogram of the digits 0..9.
int apply_operator(uint8_t op, const std::array<int, 10>& counts) {
  int n = 0, sum = 0, lo = -1, hi = -1;
  for (int d = 0; d < 10; ++d) {
    if (!counts[d]) continue;
    if (lo < 0) lo = d;
    hi = d;
    n += counts[d];
    sum += d * counts[d];
  }
  switch (op) {
    case kListOpsMin:
      return lo;
    case kListOpsMax:
      return hi;
    case kListOpsSumMod:
      return sum % 10;
    default: {
      // int(np.median(args)): the middle value, or for an even count the mean
      // of the two middle values, truncated.
      auto kth = [&](int k) {  // the k-th smallest argument, 0-based
        for (int d = 0; d < 10; ++d) {
          if (k < counts[d]) return d;
          k -= counts[d];
        }
        return 9;
      };
      return n % 2 ? kth(n / 2) : (kth(n / 2 - 1) + kth(n / 2)) / 2;
    }
  }
}

// One LRA draw: appends the tokens of a tree to `out` and returns its value, or
// -1 once the tree reaches `limit` tokens (counting the `]`s still owed).
class TreeDraw {
 public:
  TreeDraw(const ListOpsGenConfig& config, Rng& rng, std::vector<uint8_t>& out)
      : config_(config), rng_(rng), out_(out) {}

  int node(int64_t depth) {
    const bool is_op = depth < config_.max_depth && rng_.uniform() <= config_.value_p;
    if (!is_op) {
      const int value = static_cast<int>(rng_.randint(10));
      return push(static_cast<uint8_t>(kListOpsDigit0 + value)) ? value : -1;
    }
    const int64_t num_args = rng_.randint(2, config_.max_args);
    const auto op = static_cast<uint8_t>(kListOpsMin + rng_.randint(4));
    ++owed_;
    if (!push(op)) return -1;
    std::array<int, 10> counts{};
    for (int64_t a = 0; a < num_args; ++a) {
      const int v = node(depth + 1);
      if (v < 0) return -1;
      ++counts[static_cast<size_t>(v)];
    }
    --owed_;
    if (!push(kListOpsClose)) return -1;
    return apply_operator(op, counts);
  }

 private:
  bool push(uint8_t id) {
    out_.push_back(id);
    return static_cast<int64_t>(out_.size()) + owed_ < config_.max_length;
  }

  const ListOpsGenConfig& config_;
  Rng& rng_;
  std::vector<uint8_t>& out_;
  int64_t owed_ = 0;  // `]` tokens of the open operators
};

}  // namespace

int64_t listops_token_id(std::string_view token) {
  for (size_t i = 1; i < kTokenNames.size(); ++i)
    if (token == kTokenNames[i]) return static_cast<int64_t>(i);
  return -1;
}

std::string_view listops_token_name(int64_t id) {
  FORGE_CHECK(id >= 1 && id < kListOpsVocabSize,
              "listops_token_name: expected an id in 1..{}, got {}", kListOpsVocabSize - 1, id);
  return kTokenNames[static_cast<size_t>(id)];
}

std::vector<uint8_t> listops_tokenize(std::string_view expression, std::string_view where) {
  std::vector<uint8_t> ids;
  ids.reserve(expression.size() / 2);
  size_t i = 0;
  while (i < expression.size()) {
    if (expression[i] == ' ') {
      ++i;
      continue;
    }
    const size_t end = std::min(expression.find(' ', i), expression.size());
    const std::string_view token = expression.substr(i, end - i);
    i = end;
    if (token == "(" || token == ")") continue;
    const int64_t id = listops_token_id(token);
    FORGE_CHECK(id > 0,
                "{}: unknown ListOps token '{}' (expected [MIN [MAX [MED [SM ] ( ) or a digit)",
                where, excerpt(token));
    ids.push_back(static_cast<uint8_t>(id));
  }
  return ids;
}

std::string listops_to_string(const std::vector<uint8_t>& tokens) {
  // LRA prints an operator with k arguments as k + 1 nested pairs:
  // ( ( ( [MAX 2 ) 9 ) ] ), so each operator needs its argument count first.
  std::vector<int64_t> num_args(tokens.size(), 0), open;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint8_t t = tokens[i];
    FORGE_CHECK(t >= 1 && t < kListOpsVocabSize, "listops_to_string: token {} has id {}", i, t);
    if (t == kListOpsClose) {
      FORGE_CHECK(!open.empty(), "listops_to_string: token {} closes no operator", i);
      open.pop_back();
      continue;
    }
    if (!open.empty()) ++num_args[static_cast<size_t>(open.back())];
    if (is_operator(t)) open.push_back(static_cast<int64_t>(i));
  }
  FORGE_CHECK(open.empty(), "listops_to_string: {} operators are not closed", open.size());

  std::string s;
  s.reserve(tokens.size() * 4);
  int64_t depth = 0;  // operators open at this point of the printing
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint8_t t = tokens[i];
    if (t == kListOpsClose) {
      s += " ] )";
      --depth;
      if (depth > 0) s += " )";
      continue;
    }
    // A space before every token but the first, outside operators too: a row
    // such as "5 6" (two expressions; the reader takes it) must not print as
    // the unknown token "56".
    if (i > 0) s += ' ';
    if (is_operator(t)) {
      for (int64_t k = 0; k <= num_args[i]; ++k) s += "( ";
      s += kTokenNames[t];
      ++depth;
    } else {
      s += kTokenNames[t];
      if (depth > 0) s += " )";
    }
  }
  return s;
}

int listops_eval(std::string_view expression) {
  // Kept apart from the generator's histogram arithmetic (apply_operator) so
  // that the tests check one against the other: each open operator keeps its
  // arguments as a list.
  const std::vector<uint8_t> ids = listops_tokenize(expression, "listops_eval");
  std::vector<std::pair<uint8_t, std::vector<int>>> stack;  // (operator, arguments)
  int result = -1;
  for (size_t i = 0; i < ids.size(); ++i) {
    FORGE_CHECK(result < 0, "listops_eval: token {} follows a complete expression", i);
    const uint8_t t = ids[i];
    if (is_operator(t)) {
      stack.push_back({t, {}});
      continue;
    }
    int value = t - kListOpsDigit0;
    if (t == kListOpsClose) {
      FORGE_CHECK(!stack.empty(), "listops_eval: token {} (']') closes no operator", i);
      auto& [op, args] = stack.back();
      FORGE_CHECK(!args.empty(), "listops_eval: operator closed at token {} has no arguments", i);
      std::sort(args.begin(), args.end());
      const size_t n = args.size();
      if (op == kListOpsMin) {
        value = args.front();
      } else if (op == kListOpsMax) {
        value = args.back();
      } else if (op == kListOpsMed) {  // int(np.median(args))
        value = n % 2 ? args[n / 2] : (args[n / 2 - 1] + args[n / 2]) / 2;
      } else {
        int sum = 0;
        for (int a : args) sum += a;
        value = sum % 10;
      }
      stack.pop_back();
    }
    if (stack.empty()) {
      result = value;
    } else {
      stack.back().second.push_back(value);
    }
  }
  FORGE_CHECK(stack.empty(), "listops_eval: {} operators are not closed", stack.size());
  FORGE_CHECK(result >= 0, "listops_eval: empty expression");
  return result;
}

int64_t listops_depth(const std::vector<uint8_t>& tokens) {
  int64_t open = 0, depth = 0;
  for (uint8_t t : tokens) {
    if (is_operator(t)) {
      ++open;
    } else if (t == kListOpsClose) {
      FORGE_CHECK(open > 0, "listops_depth: ']' closes no operator");
      --open;
    } else {
      depth = std::max(depth, open + 1);
    }
  }
  FORGE_CHECK(open == 0, "listops_depth: {} operators are not closed", open);
  return depth;
}

std::vector<ListOpsExample> read_listops_tsv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FORGE_CHECK(in, "ListOps: cannot open {}", path);
  std::vector<ListOpsExample> examples;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_no == 1) {
      FORGE_CHECK(line == "Source\tTarget",
                  "{}:1: expected the header 'Source<TAB>Target' of an LRA ListOps TSV, found '{}'",
                  path, excerpt(line));
      continue;
    }
    if (line.empty()) continue;
    const size_t tab = line.find('\t');
    FORGE_CHECK(tab != std::string::npos,
                "{}:{}: expected 'expression<TAB>target', found no tab in '{}'", path, line_no,
                excerpt(line));
    const std::string_view target = std::string_view(line).substr(tab + 1);
    FORGE_CHECK(target.size() == 1 && target[0] >= '0' && target[0] <= '9',
                "{}:{}: expected a target digit 0..9, found '{}'", path, line_no, excerpt(target));
    const std::string where = fmt::format("{}:{}", path, line_no);
    ListOpsExample e;
    e.tokens = listops_tokenize(std::string_view(line).substr(0, tab), where);
    FORGE_CHECK(!e.tokens.empty(), "{}: empty expression", where);
    e.label = target[0] - '0';
    examples.push_back(std::move(e));
  }
  FORGE_CHECK(line_no > 0, "{}: empty file; expected the header 'Source<TAB>Target'", path);
  return examples;
}

void write_listops_tsv(const std::string& path, const std::vector<ListOpsExample>& examples) {
  const std::string tmp = path + ".tmp";
  try {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    FORGE_CHECK(out, "ListOps: cannot create {}", tmp);
    out << "Source\tTarget\n";
    for (size_t i = 0; i < examples.size(); ++i) {
      const ListOpsExample& e = examples[i];
      FORGE_CHECK(e.label >= 0 && e.label <= 9,
                  "write_listops_tsv: example {} has label {}, expected 0..9", i, e.label);
      out << listops_to_string(e.tokens) << '\t' << e.label << '\n';
    }
    out.close();
    FORGE_CHECK(out, "ListOps: writing {} failed", tmp);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  FORGE_CHECK(!ec, "ListOps: cannot rename {} to {}: {}", tmp, path, ec.message());
}

void write_listops_splits(const std::string& dir, const ListOpsSplits& splits,
                          const std::string& task) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path d(dir);
  write_listops_tsv((d / (task + "_train.tsv")).string(), splits.train);
  write_listops_tsv((d / (task + "_val.tsv")).string(), splits.val);
  write_listops_tsv((d / (task + "_test.tsv")).string(), splits.test);
}

ListOpsSplits generate_listops(const ListOpsGenConfig& c, uint64_t seed) {
  FORGE_CHECK(c.max_depth >= 1, "ListOps generator: max_depth must be >= 1, got {}", c.max_depth);
  FORGE_CHECK(c.max_args >= 2, "ListOps generator: max_args must be >= 2, got {}", c.max_args);
  FORGE_CHECK(c.min_length >= 0 && c.max_length > c.min_length + 1,
              "ListOps generator: need 0 <= min_length < max_length - 1 (lengths are strictly "
              "between), got min_length {} and max_length {}",
              c.min_length, c.max_length);
  FORGE_CHECK(c.value_p > 0 && c.value_p <= 1,
              "ListOps generator: value_p (the probability of an operator) must be in (0, 1], "
              "got {}",
              c.value_p);
  FORGE_CHECK(c.num_train >= 0 && c.num_val >= 0 && c.num_test >= 0,
              "ListOps generator: split sizes must be >= 0, got {}/{}/{}", c.num_train, c.num_val,
              c.num_test);
  const int64_t total = c.num_train + c.num_val + c.num_test;
  // Give up when this many draws in a row are too short, too long or repeats:
  // the configuration cannot supply `total` distinct trees in reasonable time.
  constexpr int64_t kMaxFailures = 2'000'000;

  Rng rng(seed);
  std::unordered_set<std::string> seen;
  std::vector<ListOpsExample> all;
  all.reserve(static_cast<size_t>(total));
  std::vector<uint8_t> tokens;
  int64_t failures = 0;
  while (static_cast<int64_t>(all.size()) < total) {
    tokens.clear();
    TreeDraw draw(c, rng, tokens);
    const int value = draw.node(1);
    const auto length = static_cast<int64_t>(tokens.size());
    if (value >= 0 && length > c.min_length && seen.emplace(tokens.begin(), tokens.end()).second) {
      all.push_back({tokens, value});
      failures = 0;
      continue;
    }
    FORGE_CHECK(++failures < kMaxFailures,
                "ListOps generator: {} draws in a row gave no new tree with {} < length < {} "
                "(max_depth {}, max_args {}, value_p {}) after {} of {} examples",
                kMaxFailures, c.min_length, c.max_length, c.max_depth, c.max_args, c.value_p,
                all.size(), total);
  }
  ListOpsSplits s;
  const auto a = all.begin();
  s.train.assign(a, a + c.num_train);
  s.val.assign(a + c.num_train, a + c.num_train + c.num_val);
  s.test.assign(a + c.num_train + c.num_val, all.end());
  return s;
}

ListOps::ListOps(const std::string& tsv_path, ListOpsOptions options)
    : name_(tsv_path), options_(options) {
  add(read_listops_tsv(tsv_path));
}

ListOps::ListOps(const std::vector<ListOpsExample>& examples, std::string name,
                 ListOpsOptions options)
    : name_(std::move(name)), options_(options) {
  add(examples);
}

void ListOps::add(const std::vector<ListOpsExample>& examples) {
  FORGE_CHECK(options_.max_length > 0, "ListOps {}: max_length must be positive, got {}", name_,
              options_.max_length);
  FORGE_CHECK(!examples.empty(), "ListOps {}: no examples", name_);
  offsets_.reserve(examples.size() + 1);
  offsets_.push_back(0);
  for (size_t i = 0; i < examples.size(); ++i) {
    const ListOpsExample& e = examples[i];
    FORGE_CHECK(e.label >= 0 && e.label < kListOpsNumClasses,
                "ListOps {}: example {} has label {}, expected 0..9", name_, i, e.label);
    const auto n = static_cast<int64_t>(e.tokens.size());
    const int64_t kept = std::min(n, options_.max_length);
    num_truncated_ += n > kept;
    max_seen_length_ = std::max(max_seen_length_, n);
    for (int64_t k = 0; k < kept; ++k) {
      const uint8_t t = e.tokens[static_cast<size_t>(k)];
      FORGE_CHECK(t >= 1 && t < kListOpsVocabSize, "ListOps {}: example {} token {} has id {}",
                  name_, i, k, t);
      tokens_.push_back(t);
    }
    offsets_.push_back(static_cast<int64_t>(tokens_.size()));
    labels_.push_back(e.label);
  }
}

Example ListOps::get(int64_t i, Rng*) const {
  FORGE_CHECK(i >= 0 && i < size(), "ListOps {}: index {} out of range [0, {})", name_, i, size());
  const auto b = static_cast<size_t>(offsets_[static_cast<size_t>(i)]);
  const auto e = static_cast<size_t>(offsets_[static_cast<size_t>(i) + 1]);
  Tensor t = Tensor::empty({static_cast<int64_t>(e - b)}, DType::i64);
  int64_t* p = t.data<int64_t>();
  for (size_t k = b; k < e; ++k) *p++ = tokens_[k];
  Example ex;
  ex.input = t;
  ex.label = labels_[static_cast<size_t>(i)];
  return ex;
}

std::string ListOps::describe() const {
  return fmt::format("ListOps {}: {} examples, vocab {}, longest {} tokens, {} truncated to {}",
                     name_, size(), kListOpsVocabSize, max_seen_length_, num_truncated_,
                     options_.max_length);
}

}  // namespace forge::data
