// Recipes: the YAML file that says what a run trains and how. Every key is
// declared once in the schema (recipe_schema(): path, type, default, range,
// documentation); a recipe file is checked against it before anything runs:
// an unknown key is an error naming its full path, its line and the valid
// keys beside it; a wrong type or an out-of-range value is an error naming
// the key and the value. The resolved recipe (defaults filled in, --set
// overrides applied) is what runs, what --dump-config prints, and what every
// run directory and checkpoint keeps.
//
// yaml-cpp stays inside recipe.cpp: the rest of the program reads a Recipe
// through typed getters over a json::Value tree.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/json.h"

namespace forge::train {

enum class KeyType { integer, number, boolean, string, choice, int_list, number_list, string_list };
const char* key_type_name(KeyType t);

struct KeySpec {
  std::string path;  // "model.attention.kind"
  KeyType type;
  json::Value default_value;
  std::string doc;
  double min = -std::numeric_limits<double>::infinity();  // integer / number (and list elements)
  double max = std::numeric_limits<double>::infinity();
  std::vector<std::string> choices;  // choice (and string_list elements, when not empty)
};

// Every key, in the order the reference and --dump-config list them.
const std::vector<KeySpec>& recipe_schema();
const KeySpec* find_key(const std::string& path);

// The schema as Markdown (docs/RECIPES.md is this text).
std::string recipe_reference_markdown();

class Recipe {
 public:
  // Every key at its default.
  Recipe();
  // Parses and validates; `what` names the source in errors ("recipes/x.yaml").
  static Recipe from_yaml(const std::string& text, const std::string& what);
  static Recipe from_file(const std::string& path);

  // "a.b=value": value is a YAML scalar or flow list ("[1, 2]"); validated as
  // a file entry would be.
  void set(const std::string& assignment);

  // The resolved recipe as YAML, every key present, in schema order.
  std::string to_yaml() const;

  int64_t integer(const std::string& path) const;
  double number(const std::string& path) const;
  bool boolean(const std::string& path) const;
  const std::string& string(const std::string& path) const;  // string and choice keys
  std::vector<int64_t> int_list(const std::string& path) const;
  std::vector<double> number_list(const std::string& path) const;
  std::vector<std::string> string_list(const std::string& path) const;
  // Whether the file or a --set gave this key (not the default).
  bool is_set(const std::string& path) const;

  const json::Value& value(const std::string& path) const;

 private:
  void assign(const KeySpec& key, const json::Value& v, bool explicit_value);
  std::vector<json::Value> values_;  // indexed like recipe_schema()
  std::vector<bool> explicit_;
};

}  // namespace forge::train
