// The check the compiler cannot make of string-keyed recipe reads: every
// recipe key the code names (a string literal "section.name...") is a key of
// the schema (train/recipe_schema.cpp) or a group of keys, and every typed
// getter with a literal key (r.integer("loop.steps"), ...) is the getter of
// that key's type. Walks the library's and the programs' sources
// (FORGE_SOURCE_DIR), code only: comments and file names aside.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/test_util.h"
#include "train/recipe.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;

// `text` with its comments blanked (string and character literals kept).
std::string code_only(const std::string& text) {
  std::string out = text;
  enum { code, line_comment, block_comment, string_lit, char_lit } state = code;
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i], next = i + 1 < out.size() ? out[i + 1] : '\0';
    switch (state) {
      case code:
        if (c == '/' && next == '/')
          state = line_comment;
        else if (c == '/' && next == '*')
          state = block_comment;
        else if (c == '"')
          state = string_lit;
        else if (c == '\'')
          state = char_lit;
        break;
      case line_comment:
        if (c == '\n') state = code;
        break;
      case block_comment:
        if (c == '*' && next == '/') {
          out[i] = out[i + 1] = ' ';
          ++i;
          state = code;
        }
        break;
      case string_lit:
      case char_lit:
        if (c == '\\')
          ++i;
        else if (c == (state == string_lit ? '"' : '\''))
          state = code;
        break;
    }
    if ((state == line_comment || state == block_comment) && out[i] != '\n') out[i] = ' ';
  }
  return out;
}

struct Schema {
  std::map<std::string, KeyType> keys;
  std::set<std::string> groups, sections;  // "model.attention"; "model"
};

const Schema& schema() {
  static const Schema s = [] {
    Schema s;
    for (const KeySpec& k : recipe_schema()) {
      s.keys[k.path] = k.type;
      for (size_t dot = k.path.find('.'); dot != std::string::npos; dot = k.path.find('.', dot + 1))
        s.groups.insert(k.path.substr(0, dot));
      if (k.path.find('.') != std::string::npos)
        s.sections.insert(k.path.substr(0, k.path.find('.')));
    }
    return s;
  }();
  return s;
}

bool getter_reads(const std::string& getter, KeyType t) {
  static const std::map<std::string, std::set<KeyType>> reads = {
      {"integer", {KeyType::integer}},        {"number", {KeyType::number}},
      {"boolean", {KeyType::boolean}},        {"string", {KeyType::string, KeyType::choice}},
      {"int_list", {KeyType::int_list}},      {"number_list", {KeyType::number_list}},
      {"string_list", {KeyType::string_list}}};
  return reads.at(getter).count(t) > 0;
}

struct Findings {
  int keys_named = 0, typed_reads = 0;
  std::vector<std::string> errors;
};

// The string literals of `code` (comments already blanked): each one's text
// and where its opening quote stands. Escapes are kept as written.
std::vector<std::pair<std::string, size_t>> string_literals(const std::string& code) {
  std::vector<std::pair<std::string, size_t>> out;
  for (size_t i = 0; i < code.size(); ++i) {
    if (code[i] == '\'') {  // a character literal: '"' is not a string
      for (++i; i < code.size() && code[i] != '\''; ++i)
        if (code[i] == '\\') ++i;
      continue;
    }
    if (code[i] != '"') continue;
    const size_t open = i;
    for (++i; i < code.size() && code[i] != '"'; ++i)
      if (code[i] == '\\') ++i;
    out.emplace_back(code.substr(open + 1, i - open - 1), open);
  }
  return out;
}

// "model.attention.kind": a lower-case name, then one or more ".name" parts.
bool looks_like_key(const std::string& s) {
  const size_t dot = s.find('.');
  if (dot == std::string::npos || dot == 0 || s.back() == '.') return false;
  if (s.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") != dot) return false;
  return s.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_.") == std::string::npos &&
         s.find("..") == std::string::npos;
}

// Checks one file's code (what = its name in errors).
void check_code(const std::string& what, const std::string& text, Findings& f) {
  const Schema& s = schema();
  const std::string code = code_only(text);
  static const std::set<std::string> file_suffixes = {
      "safetensors", "py", "json", "yaml", "svg", "csv", "txt", "log", "tsv", "gz", "md", "jsonl"};
  static const std::vector<std::string> getters = {
      "integer", "number", "boolean", "string", "int_list", "number_list", "string_list"};
  for (const auto& [name, at] : string_literals(code)) {
    if (!looks_like_key(name) || !s.sections.count(name.substr(0, name.find('.')))) continue;
    if (file_suffixes.count(name.substr(name.rfind('.') + 1))) continue;  // "model.safetensors"
    ++f.keys_named;
    if (!s.keys.count(name) && !s.groups.count(name)) {
      f.errors.push_back(what + ": \"" + name + "\" is no recipe key");
      continue;
    }
    // A typed read: ".getter(" then white space before the literal.
    size_t p = at;
    while (p > 0 && std::isspace(static_cast<unsigned char>(code[p - 1]))) --p;
    if (p == 0 || code[p - 1] != '(') continue;
    for (const std::string& g : getters) {
      const std::string call = "." + g + "(";
      if (p < call.size() || code.compare(p - call.size(), call.size(), call) != 0) continue;
      const auto key = s.keys.find(name);
      if (key == s.keys.end()) break;  // a group: not a read
      ++f.typed_reads;
      if (!getter_reads(g, key->second))
        f.errors.push_back(what + ": " + g + "(\"" + name + "\") reads a key of type " +
                           key_type_name(key->second));
    }
  }
}

TEST(RecipeKeys, EveryKeyTheCodeNamesIsInTheSchemaReadWithItsType) {
  Findings f;
  int files = 0;
  for (const char* dir :
       {"core", "autograd", "ops", "nn", "optim", "data", "dist", "train", "apps", "bench"}) {
    for (const auto& e : fs::recursive_directory_iterator(fs::path(FORGE_SOURCE_DIR) / dir)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
      ++files;
      check_code(fs::relative(e.path(), FORGE_SOURCE_DIR).string(), testing::read_file(e.path()),
                 f);
    }
  }
  for (const std::string& e : f.errors) ADD_FAILURE() << e;
  // The walk found the code that reads recipes (not an empty or wrong folder).
  EXPECT_GT(files, 200);
  EXPECT_GT(f.keys_named, 250);
  EXPECT_GT(f.typed_reads, 200);
}

// The check fails a misspelt key, a getter of the wrong type, and a key named
// through a helper; it ignores comments and file names.
TEST(RecipeKeys, TheCheckCatchesAMisspeltKeyAndAWrongGetter) {
  Findings f;
  check_code("x.cpp",
             "int64_t a = r.integer(\"model.dimm\");\n"
             "double b = r.number(\"model.dim\");\n"
             "const auto& c = r.string(\"model.attention.kind\");\n"
             "size_from(r, \"model.mlp_dimm\", 3);\n"
             "// r.integer(\"model.nothing\") in a comment\n"
             "write(\"model.safetensors\");\n",
             f);
  ASSERT_EQ(f.errors.size(), 3u);
  EXPECT_EQ(f.errors[0], "x.cpp: \"model.dimm\" is no recipe key");
  EXPECT_EQ(f.errors[1], "x.cpp: number(\"model.dim\") reads a key of type integer");
  EXPECT_EQ(f.errors[2], "x.cpp: \"model.mlp_dimm\" is no recipe key");
}

}  // namespace
}  // namespace forge::train
