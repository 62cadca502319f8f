// The check the compiler cannot make of string-keyed recipe reads: every
// recipe key the code names (a string literal "section.name...") is a key of
// the schema (train/recipe_schema.cpp) or a group of keys, and every typed
// getter with a literal key (r.integer("loop.steps"), ...) is the getter of
// that key's type. Walks the library's and the programs' sources
// (FORGE_SOURCE_DIR), code only: comments and file names aside.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
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

// Checks one file's code (what = its name in errors).
void check_code(const std::string& what, const std::string& text, Findings& f) {
  const Schema& s = schema();
  const std::string code = code_only(text);
  static const std::regex literal(R"re("([a-z_]+(\.[a-z0-9_]+)+)")re");
  static const std::set<std::string> file_suffixes = {
      "safetensors", "py", "json", "yaml", "svg", "csv", "txt", "log", "tsv", "gz", "md", "jsonl"};
  for (std::sregex_iterator it(code.begin(), code.end(), literal), end; it != end; ++it) {
    const std::string name = (*it)[1];
    if (!s.sections.count(name.substr(0, name.find('.')))) continue;
    if (file_suffixes.count(name.substr(name.rfind('.') + 1))) continue;  // "model.safetensors"
    ++f.keys_named;
    if (!s.keys.count(name) && !s.groups.count(name))
      f.errors.push_back(what + ": \"" + name + "\" is no recipe key");
  }
  static const std::regex typed(
      R"re(\.(integer|number|boolean|string|int_list|number_list|string_list)\(\s*"([^"]+)")re");
  for (std::sregex_iterator it(code.begin(), code.end(), typed), end; it != end; ++it) {
    const std::string getter = (*it)[1], name = (*it)[2];
    const auto key = s.keys.find(name);
    if (key == s.keys.end()) continue;  // named above, or not a recipe read
    ++f.typed_reads;
    if (!getter_reads(getter, key->second))
      f.errors.push_back(what + ": " + getter + "(\"" + name + "\") reads a key of type " +
                         key_type_name(key->second));
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
  EXPECT_EQ(f.errors[1], "x.cpp: \"model.mlp_dimm\" is no recipe key");
  EXPECT_EQ(f.errors[2], "x.cpp: number(\"model.dim\") reads a key of type integer");
}

}  // namespace
}  // namespace forge::train
