#include "core/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/names.h"

namespace forge::json {

constexpr NameTable<Type, 6> kTypeNames{"JSON type",
                                        {"null", "boolean", "number", "string", "array", "object"}};

const char* type_name(Type t) {
  return name_of(kTypeNames, t);
}

// ---- Value ----

void Value::wrong_type(const char* expected) const {
  std::string found = type_name(type());
  if (is_number()) found = fmt::format("the number {}", dump(*this));
  FORGE_FAIL("JSON: expected {}, found {}", expected, found);
}

const Value::Number& Value::number() const {
  if (!is_number()) wrong_type("a number");
  return std::get<Number>(v_);
}

bool Value::is_int() const {
  return is_number() && std::get<Number>(v_).kind != Number::Kind::floating;
}

bool Value::as_bool() const {
  if (!is_bool()) wrong_type("a boolean");
  return std::get<bool>(v_);
}

double Value::as_double() const {
  return number().d;
}

int64_t Value::as_int() const {
  const Number& n = number();
  if (n.kind != Number::Kind::sint) wrong_type("an integer within int64");
  return static_cast<int64_t>(n.bits);
}

uint64_t Value::as_uint() const {
  const Number& n = number();
  if (n.kind == Number::Kind::floating ||
      (n.kind == Number::Kind::sint && static_cast<int64_t>(n.bits) < 0)) {
    wrong_type("a non-negative integer within uint64");
  }
  return n.bits;
}

const std::string& Value::as_string() const {
  if (!is_string()) wrong_type("a string");
  return std::get<std::string>(v_);
}

const Array& Value::as_array() const {
  if (!is_array()) wrong_type("an array");
  return std::get<Array>(v_);
}

Array& Value::as_array() {
  if (!is_array()) wrong_type("an array");
  return std::get<Array>(v_);
}

const Object& Value::as_object() const {
  if (!is_object()) wrong_type("an object");
  return std::get<Object>(v_);
}

Object& Value::as_object() {
  if (!is_object()) wrong_type("an object");
  return std::get<Object>(v_);
}

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : as_object()) {
    if (k == key) return &v;
  }
  return nullptr;
}

const Value& Value::at(std::string_view key) const {
  const Value* v = find(key);
  FORGE_CHECK(v != nullptr, "JSON: missing key \"{}\"", key);
  return *v;
}

Value& Value::operator[](std::string_view key) {
  if (is_null()) v_ = Object{};
  Object& o = as_object();
  for (auto& [k, v] : o) {
    if (k == key) return v;
  }
  o.emplace_back(std::string(key), Value());
  return o.back().second;
}

const Value& Value::at(size_t i) const {
  const Array& a = as_array();
  FORGE_CHECK(i < a.size(), "JSON: index {} is out of range for an array of {} elements", i,
              a.size());
  return a[i];
}

void Value::push_back(Value v) {
  if (is_null()) v_ = Array{};
  as_array().push_back(std::move(v));
}

size_t Value::size() const {
  if (is_array()) return std::get<Array>(v_).size();
  if (is_object()) return std::get<Object>(v_).size();
  wrong_type("an array or an object");
}

bool Value::operator==(const Value& other) const {
  if (type() != other.type()) return false;
  switch (type()) {
    case Type::null:
      return true;
    case Type::boolean:
      return std::get<bool>(v_) == std::get<bool>(other.v_);
    case Type::number: {
      const Number &a = std::get<Number>(v_), &b = std::get<Number>(other.v_);
      if (a.kind != Number::Kind::floating && b.kind != Number::Kind::floating) {
        return a.kind == b.kind && a.bits == b.bits;
      }
      return a.d == b.d;
    }
    case Type::string:
      return std::get<std::string>(v_) == std::get<std::string>(other.v_);
    case Type::array:
      return std::get<Array>(v_) == std::get<Array>(other.v_);
    case Type::object:
      return std::get<Object>(v_) == std::get<Object>(other.v_);
  }
  return false;
}

// ---- UTF-8 ----

namespace {

// Length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), or 0 when it is malformed.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates U+D800..U+DFFF
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return len;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---- parser ----

class Parser {
 public:
  Parser(std::string_view text, std::string_view what) : s_(text), what_(what) {}

  Value document() {
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("the end of the input after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(std::string_view expected) const { fail_at(pos_, expected); }

  [[noreturn]] void fail_at(size_t pos, std::string_view expected) const {
    std::string found = "the end of the input";
    if (pos < s_.size()) {
      const auto c = static_cast<unsigned char>(s_[pos]);
      found = c >= 0x20 && c < 0x7F ? fmt::format("'{}'", static_cast<char>(c))
                                    : fmt::format("byte 0x{:02x}", c);
    }
    FORGE_FAIL("{}: invalid JSON at byte {}: expected {}, found {}", what_, pos, expected, found);
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  void skip_ws() {
    while (!at_end() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  void expect_literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) {
      fail("a value (object, array, string, number, true, false or null)");
    }
    pos_ += word.size();
  }

  Value value(int depth) {
    if (at_end()) fail("a value");
    switch (s_[pos_]) {
      case '{':
        return object(depth + 1);
      case '[':
        return array(depth + 1);
      case '"':
        return Value(string());
      case 't':
        expect_literal("true");
        return Value(true);
      case 'f':
        expect_literal("false");
        return Value(false);
      case 'n':
        expect_literal("null");
        return Value();
      default:
        if (s_[pos_] == '-' || (s_[pos_] >= '0' && s_[pos_] <= '9')) return number();
        fail("a value (object, array, string, number, true, false or null)");
    }
  }

  void check_depth(int depth) const {
    if (depth > kMaxDepth) {
      FORGE_FAIL(
          "{}: invalid JSON at byte {}: nesting deeper than {} levels (expected at most that many)",
          what_, pos_, kMaxDepth);
    }
  }

  Value array(int depth) {
    check_depth(depth);
    ++pos_;  // '['
    Array out;
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return Value(std::move(out));
    }
    while (true) {
      skip_ws();
      out.push_back(value(depth));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() == ']') {
        ++pos_;
        return Value(std::move(out));
      } else {
        fail("',' or ']' in an array");
      }
    }
  }

  Value object(int depth) {
    check_depth(depth);
    ++pos_;  // '{'
    Object out;
    std::vector<size_t> key_pos;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return Value(std::move(out));
    }
    while (true) {
      skip_ws();
      if (peek() != '"') fail(out.empty() ? "a string key or '}'" : "a string key after ','");
      key_pos.push_back(pos_);
      std::string key = string();
      skip_ws();
      if (peek() != ':') fail("':' after an object key");
      ++pos_;
      skip_ws();
      out.emplace_back(std::move(key), value(depth));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() == '}') {
        ++pos_;
        break;
      } else {
        fail("',' or '}' in an object");
      }
    }
    // Duplicate keys: sort member indices by key (stable, so the later one of a
    // pair is reported), O(n log n) even for hostile headers with many keys.
    std::vector<size_t> order(out.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return out[a].first < out[b].first; });
    for (size_t i = 1; i < order.size(); ++i) {
      if (out[order[i]].first == out[order[i - 1]].first) {
        FORGE_FAIL(
            "{}: invalid JSON at byte {}: expected unique keys in an object, found duplicate key "
            "\"{}\"",
            what_, key_pos[order[i]], out[order[i]].first);
      }
    }
    return Value(std::move(out));
  }

  uint32_t hex4() {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = peek();
      uint32_t d;
      if (c >= '0' && c <= '9') {
        d = static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        d = static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        d = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        fail("four hex digits after \\u");
      }
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail("'\"' to close the string");
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("a control character in a string to be escaped (\\n, \\t, \\u00XX)");
      if (c == '\\') {
        ++pos_;
        const char e = peek();
        switch (e) {
          case '"':
            out += '"';
            break;
          case '\\':
            out += '\\';
            break;
          case '/':
            out += '/';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'n':
            out += '\n';
            break;
          case 'r':
            out += '\r';
            break;
          case 't':
            out += '\t';
            break;
          case 'u': {
            const size_t start = pos_ - 1;
            ++pos_;
            uint32_t cp = hex4();
            if (cp >= 0xDC00 && cp <= 0xDFFF)
              fail_at(start, "a high surrogate (\\uD800-\\uDBFF) before a low one");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (s_.substr(pos_, 2) != "\\u")
                fail("a low surrogate (\\uDC00-\\uDFFF) after a high surrogate");
              const size_t low_start = pos_;
              pos_ += 2;
              const uint32_t lo = hex4();
              if (lo < 0xDC00 || lo > 0xDFFF) {
                fail_at(low_start, "a low surrogate (\\uDC00-\\uDFFF) after a high surrogate");
              }
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            append_utf8(out, cp);
            continue;  // hex4 already advanced past the escape
          }
          default:
            fail("an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
        }
        ++pos_;
        continue;
      }
      const size_t len = utf8_sequence_length(s_, pos_);
      if (len == 0) fail("valid UTF-8 in a string");
      out.append(s_.substr(pos_, len));
      pos_ += len;
    }
  }

  Value number() {
    // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    const size_t start = pos_;
    const auto digit = [&] { return !at_end() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (digit()) {
      while (digit()) ++pos_;
    } else {
      fail("a digit");
    }
    bool integral = true;
    if (peek() == '.') {
      integral = false;
      ++pos_;
      if (!digit()) fail("a digit after the decimal point");
      while (digit()) ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      integral = false;
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!digit()) fail("a digit in the exponent");
      while (digit()) ++pos_;
    }
    const char* b = s_.data() + start;
    const char* e = s_.data() + pos_;
    if (integral) {
      int64_t i;
      if (auto r = std::from_chars(b, e, i); r.ec == std::errc() && r.ptr == e) return Value(i);
      uint64_t u;
      if (auto r = std::from_chars(b, e, u); r.ec == std::errc() && r.ptr == e) return Value(u);
    }
    double d;
    const auto r = std::from_chars(b, e, d);
    if (r.ec != std::errc() || r.ptr != e) fail_at(start, "a number within the range of a double");
    return Value(d);
  }

  std::string_view s_;
  std::string_view what_;
  size_t pos_ = 0;
};

// ---- printer ----

void dump_string(std::string& out, std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    FORGE_CHECK(len != 0, "JSON dump: string has invalid UTF-8 at byte {}: \"{}\"", i, s);
    i += len;
  }
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

}  // namespace

Value parse(std::string_view text, std::string_view what) {
  return Parser(text, what).document();
}

namespace {

void newline(std::string& out, int indent, int level) {
  if (indent < 0) return;
  out += '\n';
  out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
}

}  // namespace

std::string dump(const Value& value, int indent) {
  std::string out;
  // Recursive lambda over (value, nesting level).
  const auto rec = [&](const auto& self, const Value& v, int level) -> void {
    switch (v.type()) {
      case Type::null:
        out += "null";
        break;
      case Type::boolean:
        out += v.as_bool() ? "true" : "false";
        break;
      case Type::number: {
        const Value::Number& n = std::get<Value::Number>(v.v_);
        if (n.kind == Value::Number::Kind::sint) {
          out += fmt::format("{}", static_cast<int64_t>(n.bits));
        } else if (n.kind == Value::Number::Kind::uint) {
          out += fmt::format("{}", n.bits);
        } else {
          FORGE_CHECK(std::isfinite(n.d), "JSON dump: {} has no JSON representation", n.d);
          // Shortest text that reads back to the same double; keep a '.0' on
          // integral values so that they read back as floating numbers.
          std::string s = fmt::format("{}", n.d);
          if (s.find_first_of(".e") == std::string::npos) s += ".0";
          out += s;
        }
        break;
      }
      case Type::string:
        dump_string(out, v.as_string());
        break;
      case Type::array: {
        const Array& a = v.as_array();
        out += '[';
        for (size_t i = 0; i < a.size(); ++i) {
          if (i) out += ',';
          newline(out, indent, level + 1);
          self(self, a[i], level + 1);
        }
        if (!a.empty()) newline(out, indent, level);
        out += ']';
        break;
      }
      case Type::object: {
        const Object& o = v.as_object();
        out += '{';
        for (size_t i = 0; i < o.size(); ++i) {
          if (i) out += ',';
          newline(out, indent, level + 1);
          dump_string(out, o[i].first);
          out += indent < 0 ? ":" : ": ";
          self(self, o[i].second, level + 1);
        }
        if (!o.empty()) newline(out, indent, level);
        out += '}';
        break;
      }
    }
  };
  rec(rec, value, 0);
  return out;
}

}  // namespace forge::json
