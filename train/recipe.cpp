// Reading, checking and printing recipes (see recipe.h). The only file that
// includes yaml-cpp.
#include "train/recipe.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/names.h"

namespace forge::train {

constexpr NameTable<KeyType, 8> kKeyTypeNames{
    "key type",
    {"integer", "number", "boolean", "string", "choice", "list of integers", "list of numbers",
     "list of strings"}};

const char* key_type_name(KeyType t) { return name_of(kKeyTypeNames, t); }

namespace {

// "an integer", "a list of numbers", ... for messages.
std::string with_article(KeyType t) {
  const std::string name = key_type_name(t);
  return (name[0] == 'i' ? "an " : "a ") + name;
}

size_t key_index(const std::string& path) {
  const KeySpec* k = find_key(path);
  FORGE_CHECK(k != nullptr, "recipe: no key '{}' in the schema", path);
  return static_cast<size_t>(k - recipe_schema().data());
}

// The keys and sections directly under `section` ("" for the top level).
std::vector<std::string> children_of(const std::string& section) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  const std::string prefix = section.empty() ? "" : section + ".";
  for (const KeySpec& k : recipe_schema()) {
    if (k.path.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = k.path.substr(prefix.size());
    const size_t dot = rest.find('.');
    const std::string child = dot == std::string::npos ? rest : rest.substr(0, dot) + ".*";
    if (seen.insert(child).second)
      out.push_back(dot == std::string::npos ? child : rest.substr(0, dot));
  }
  return out;
}

bool is_section(const std::string& path) {
  const std::string prefix = path + ".";
  for (const KeySpec& k : recipe_schema())
    if (k.path.compare(0, prefix.size(), prefix) == 0) return true;
  return false;
}

// Levenshtein distance (insertions, deletions, substitutions) of a and b.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// " Did you mean 'model.attention.kind'?" for an unknown key `path`: a key of
// the same name in another section ("model.lr" -> "optimizer.lr"), else the
// key or section closest in spelling (a typo: within a third of the name, at
// most 3 edits); empty when nothing is close.
std::string did_you_mean(const std::string& path) {
  std::vector<std::string> candidates;
  for (const KeySpec& k : recipe_schema()) {
    candidates.push_back(k.path);
    for (size_t dot = k.path.find('.'); dot != std::string::npos; dot = k.path.find('.', dot + 1))
      candidates.push_back(k.path.substr(0, dot));
  }
  std::string best;
  const std::string leaf = path.substr(path.rfind('.') + 1);
  for (const KeySpec& k : recipe_schema())
    if (k.path != path && (k.path == leaf || k.path.ends_with("." + leaf))) {
      best = k.path;
      break;
    }
  size_t best_d = std::min<size_t>(3, std::max<size_t>(1, path.size() / 3)) + 1;
  for (const std::string& c : candidates) {
    const size_t d = best.empty() ? edit_distance(path, c) : best_d;
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best.empty() ? std::string() : fmt::format(" Did you mean '{}'?", best);
}

std::string where(const std::string& what, const YAML::Node& node) {
  const YAML::Mark m = node.Mark();
  if (m.line < 0) return what;
  return fmt::format("{}:{}:{}", what, m.line + 1, m.column + 1);
}

std::string scalar_text(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter e;
  e << YAML::Flow << node;
  return e.c_str();
}

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF) without control characters.
bool is_clean_text(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) return false;
      ++i;
      continue;
    }
    const size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (n == 0 || c > 0xf4 || i + n > s.size()) return false;
    uint32_t cp = c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto t = static_cast<unsigned char>(s[i + k]);
      if ((t & 0xc0) != 0x80) return false;
      cp = cp << 6 | (t & 0x3f);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0x80 && cp < 0xa0))
      return false;
    i += n;
  }
  return true;
}

// One scalar of `key`'s element type, from YAML text. Errors name the key,
// the value and the place.
json::Value convert_scalar(const KeySpec& key, KeyType type, const YAML::Node& node,
                           const std::string& place) {
  if (!node.IsScalar())
    FORGE_FAIL("recipe {}: '{}' expects {}, found '{}'", place, key.path, with_article(type),
               scalar_text(node));
  const std::string text = node.Scalar();
  // What the recipe says must be what runs, --dump-config shows and the run
  // directory keeps: YAML's printer would rewrite invalid UTF-8.
  if (!is_clean_text(text))
    FORGE_FAIL("recipe {}: '{}' holds invalid UTF-8 or a control character (found {} bytes: {})",
               place, key.path, text.size(), escaped(text));
  auto bad = [&](const char* expected) -> json::Value {
    FORGE_FAIL("recipe {}: '{}' expects {}, found '{}'", place, key.path, expected, text);
  };
  auto in_range = [&](double v) {
    if (v < key.min || v > key.max)
      FORGE_FAIL("recipe {}: '{}' = {} is out of range [{}, {}]", place, key.path, text, key.min,
                 key.max);
  };
  switch (type) {
    case KeyType::integer:
    case KeyType::int_list: {
      int64_t v = 0;
      if (!YAML::convert<int64_t>::decode(node, v)) return bad("an integer");
      in_range(static_cast<double>(v));
      return json::Value(v);
    }
    case KeyType::number:
    case KeyType::number_list: {
      double v = 0;
      if (!YAML::convert<double>::decode(node, v) || !std::isfinite(v))
        return bad("a finite number");
      in_range(v);
      return json::Value(v);
    }
    case KeyType::boolean: {
      bool v = false;
      if (!YAML::convert<bool>::decode(node, v)) return bad("true or false");
      return json::Value(v);
    }
    case KeyType::string:
      if (node.Tag() == "?" && (text == "~" || text == "null"))
        return bad("a string (quote it to mean the word)");
      return json::Value(text);
    case KeyType::choice:
    case KeyType::string_list:
      if (!key.choices.empty() &&
          std::find(key.choices.begin(), key.choices.end(), text) == key.choices.end())
        FORGE_FAIL("recipe {}: '{}' = '{}' is not one of: {}", place, key.path, text,
                   fmt::join(key.choices, ", "));
      return json::Value(text);
  }
  return bad("a value");
}

// The keys whose values become paths the run writes to. A recipe may come from
// anywhere (a checkpoint, a colleague): what it names stays inside the working
// directory. A directory elsewhere is the command line's to choose (--out).
void check_written_path(const KeySpec& key, const std::string& value, const std::string& place) {
  namespace fs = std::filesystem;
  const auto bad = [&](const char* why) {
    FORGE_FAIL("recipe {}: '{}' = '{}' {}", place, key.path, value, why);
  };
  if (key.path == "name") {
    if (value.empty() || value == "." || value == ".." || value.find('/') != std::string::npos)
      bad("must be one plain name (no '/', not '.' or '..'): the run directory is runs/<name>");
  } else if (key.path == "output.dir" && !value.empty()) {
    const fs::path p(value);
    if (p.is_absolute())
      bad("is an absolute path; a recipe names a directory under the working directory (give "
          "another place on the command line: attnforge train R.yaml --out DIR)");
    for (const fs::path& part : p)
      if (part == "..")
        bad("climbs out of the working directory with '..' (give such a place on the command "
            "line: --out DIR)");
  }
}

json::Value convert(const KeySpec& key, const YAML::Node& node, const std::string& place) {
  if (!node.IsDefined() || node.IsNull())
    FORGE_FAIL("recipe {}: '{}' has no value (expected {})", place, key.path,
               with_article(key.type));
  switch (key.type) {
    case KeyType::int_list:
    case KeyType::number_list:
    case KeyType::string_list: {
      if (!node.IsSequence())
        FORGE_FAIL("recipe {}: '{}' expects {} such as [a, b], found '{}'", place, key.path,
                   with_article(key.type), scalar_text(node));
      json::Array out;
      for (const YAML::Node& item : node) out.push_back(convert_scalar(key, key.type, item, place));
      return json::Value(out);
    }
    default: {
      json::Value v = convert_scalar(key, key.type, node, place);
      if (key.type == KeyType::string) check_written_path(key, v.as_string(), place);
      return v;
    }
  }
}

void emit_value(YAML::Emitter& e, const KeySpec& key, const json::Value& v) {
  switch (key.type) {
    case KeyType::integer:
      e << v.as_int();
      break;
    case KeyType::number: {
      // Shortest text that reads back to the same double.
      std::string t = fmt::format("{}", v.as_double());
      if (t.find_first_of(".eE") == std::string::npos && t.find("inf") == std::string::npos)
        t += ".0";
      e << t;
      break;
    }
    case KeyType::boolean:
      e << v.as_bool();
      break;
    case KeyType::string:
      e << YAML::DoubleQuoted << v.as_string();
      break;
    case KeyType::choice:
      e << v.as_string();
      break;
    case KeyType::int_list:
    case KeyType::number_list:
    case KeyType::string_list: {
      e << YAML::Flow << YAML::BeginSeq;
      for (const json::Value& item : v.as_array()) {
        if (key.type == KeyType::int_list)
          e << item.as_int();
        else if (key.type == KeyType::number_list)
          e << fmt::format("{}", item.as_double());
        else
          e << item.as_string();
      }
      e << YAML::EndSeq;
      break;
    }
  }
}

void walk(const YAML::Node& node, const std::string& section, const std::string& what,
          std::vector<std::pair<const KeySpec*, json::Value>>& out) {
  if (!node.IsMap())
    FORGE_FAIL("recipe {}: {} must be a mapping of keys (found '{}')", where(what, node),
               section.empty() ? "the recipe" : "'" + section + "'", scalar_text(node));
  std::map<std::string, YAML::Mark> seen;  // keys of this mapping, where first given
  for (const auto& item : node) {
    const std::string name = item.first.Scalar();
    const std::string path = section.empty() ? name : section + "." + name;
    const std::string place = where(what, item.first);
    // YAML forbids a key twice in one mapping; the parser keeps both, and the
    // second would silently win.
    const auto [first, fresh] = seen.emplace(name, item.first.Mark());
    if (!fresh)
      FORGE_FAIL("recipe {}: '{}' is given twice in one mapping (first at line {}); keep one",
                 place, path, first->second.line + 1);
    if (const KeySpec* key = find_key(path)) {
      out.emplace_back(key, convert(*key, item.second, place));
    } else if (is_section(path)) {
      walk(item.second, path, what, out);
    } else {
      FORGE_FAIL("recipe {}: unknown key '{}'.{} Valid keys{}: {}", place, path, did_you_mean(path),
                 section.empty() ? " at the top level" : " under '" + section + "'",
                 fmt::join(children_of(section), ", "));
    }
  }
}

}  // namespace

Recipe::Recipe() {
  for (const KeySpec& k : recipe_schema()) values_.push_back(k.default_value);
  explicit_.assign(values_.size(), false);
}

void Recipe::assign(const KeySpec& key, const json::Value& v, bool explicit_value) {
  const size_t i = static_cast<size_t>(&key - recipe_schema().data());
  values_[i] = v;
  explicit_[i] = explicit_value;
}

Recipe Recipe::from_yaml(const std::string& text, const std::string& what) {
  YAML::Node root;
  try {
    // Every document, so that a second one is refused rather than ignored.
    const std::vector<YAML::Node> docs = YAML::LoadAll(text);
    FORGE_CHECK(docs.size() <= 1,
                "recipe {}:{}: a second YAML document (after '---'); a recipe is one document, "
                "and nothing of the second would be used: merge them, or put each in its own file",
                what, docs.size() > 1 ? docs[1].Mark().line + 1 : 0);
    if (!docs.empty()) root = docs[0];
  } catch (const YAML::Exception& e) {
    FORGE_FAIL("recipe {}:{}:{}: not valid YAML: {}", what, e.mark.line + 1, e.mark.column + 1,
               e.msg);
  }
  // An empty file would train the default model on the default data: surely
  // not what a user who gave this file meant.
  if (root.IsNull())
    FORGE_FAIL(
        "recipe {}: the recipe is empty (no keys); a recipe gives at least the keys it "
        "changes, e.g. 'model: {{type: vit}}' (every key: attnforge recipe-reference)",
        what);
  Recipe r;
  std::vector<std::pair<const KeySpec*, json::Value>> entries;
  walk(root, "", what, entries);
  for (auto& [key, value] : entries) r.assign(*key, value, true);
  return r;
}

Recipe Recipe::from_file(const std::string& path) {
  std::error_code ec;
  FORGE_CHECK(!std::filesystem::is_directory(path, ec),
              "recipe {}: is a directory, not a recipe file (a run directory is continued with "
              "attnforge train --resume {})",
              path, path);
  FORGE_CHECK(std::filesystem::exists(path, ec), "recipe {}: cannot open the file (does it exist?)",
              path);
  // The largest shipped recipe is about 1 KB; a file a thousand times larger
  // is not a recipe (and /dev/zero never ends).
  constexpr size_t kMaxRecipeBytes = size_t{1} << 20;
  return from_yaml(io::read_file(path, kMaxRecipeBytes), path);
}

void Recipe::set(const std::string& assignment) {
  const size_t eq = assignment.find('=');
  FORGE_CHECK(eq != std::string::npos && eq > 0,
              "--set '{}': expected key=value, e.g. --set optimizer.lr=3e-4", assignment);
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  const KeySpec* key = find_key(path);
  if (!key) {
    std::string section =
        path.substr(0, path.rfind('.') == std::string::npos ? 0 : path.rfind('.'));
    while (!section.empty() && !is_section(section))
      section = section.substr(0, section.rfind('.') == std::string::npos ? 0 : section.rfind('.'));
    FORGE_FAIL("--set {}: unknown key '{}'.{} Valid keys{}: {}", assignment, path,
               did_you_mean(path),
               section.empty() ? " at the top level" : " under '" + section + "'",
               fmt::join(children_of(section), ", "));
  }
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    FORGE_FAIL("--set {}: the value is not valid YAML: {}", assignment, e.msg);
  }
  if (key->type == KeyType::string && !node.IsScalar()) node = YAML::Node(text);
  assign(*key, convert(*key, node, "--set " + assignment), true);
}

std::string Recipe::to_yaml() const {
  YAML::Emitter e;
  e << YAML::BeginMap;
  std::vector<std::string> open;  // the sections currently open
  const auto& schema = recipe_schema();
  for (size_t i = 0; i < schema.size(); ++i) {
    const KeySpec& k = schema[i];
    std::vector<std::string> parts;
    std::stringstream ss(k.path);
    for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
    const std::vector<std::string> sections(parts.begin(), parts.end() - 1);
    size_t common = 0;
    while (common < open.size() && common < sections.size() && open[common] == sections[common])
      ++common;
    for (size_t j = open.size(); j > common; --j) e << YAML::EndMap;
    open.resize(common);
    for (size_t j = common; j < sections.size(); ++j) {
      e << YAML::Key << sections[j] << YAML::Value << YAML::BeginMap;
      open.push_back(sections[j]);
    }
    e << YAML::Key << parts.back() << YAML::Value;
    emit_value(e, k, values_[i]);
  }
  for (size_t j = 0; j < open.size(); ++j) e << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

const json::Value& Recipe::value(const std::string& path) const {
  return values_[key_index(path)];
}

bool Recipe::is_set(const std::string& path) const {
  return explicit_[key_index(path)];
}

int64_t Recipe::integer(const std::string& path) const {
  return value(path).as_int();
}
double Recipe::number(const std::string& path) const {
  return value(path).as_double();
}
bool Recipe::boolean(const std::string& path) const {
  return value(path).as_bool();
}
const std::string& Recipe::string(const std::string& path) const {
  return value(path).as_string();
}

std::vector<int64_t> Recipe::int_list(const std::string& path) const {
  std::vector<int64_t> out;
  for (const json::Value& v : value(path).as_array()) out.push_back(v.as_int());
  return out;
}
std::vector<double> Recipe::number_list(const std::string& path) const {
  std::vector<double> out;
  for (const json::Value& v : value(path).as_array()) out.push_back(v.as_double());
  return out;
}
std::vector<std::string> Recipe::string_list(const std::string& path) const {
  std::vector<std::string> out;
  for (const json::Value& v : value(path).as_array()) out.push_back(v.as_string());
  return out;
}

std::string recipe_reference_markdown() {
  std::string out =
      "# Recipe reference\n\n"
      "Every key a recipe may hold, generated from the schema in train/recipe_schema.cpp\n"
      "(`attnforge recipe-reference > docs/RECIPES.md`; a test keeps this file in step).\n"
      "A recipe gives only the keys it changes; `attnforge train R.yaml --dump-config`\n"
      "prints all of them as the run will use them. Override any key on the command\n"
      "line with `--set section.key=value` (a YAML scalar, or a list such as `[a, b]`).\n";
  std::string section = "\x01";
  for (const KeySpec& k : recipe_schema()) {
    const size_t dot = k.path.rfind('.');
    const std::string sec = dot == std::string::npos ? "" : k.path.substr(0, dot);
    if (sec != section) {
      section = sec;
      out += fmt::format(
          "\n### {}\n\n| key | type | default | range / choices | meaning "
          "|\n|---|---|---|---|---|\n",
          sec.empty() ? "top level" : "`" + sec + "`");
    }
    std::string range;
    if (!k.choices.empty()) {
      range = fmt::format("{}", fmt::join(k.choices, ", "));
    } else if (std::isfinite(k.min) || std::isfinite(k.max)) {
      range = fmt::format("[{}, {}]", std::isfinite(k.min) ? fmt::format("{}", k.min) : "-inf",
                          std::isfinite(k.max) ? fmt::format("{}", k.max) : "inf");
    }
    std::string def = json::dump(k.default_value);
    out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", k.path, key_type_name(k.type), def,
                       range, k.doc);
  }
  return out;
}

}  // namespace forge::train
