// A small JSON value and a strict RFC 8259 parser/printer, for safetensors
// headers and checkpoint state files. Objects keep their insertion order (a
// dumped file reads in the order it was built); numbers keep the double and,
// when the text was an integer, the exact 64-bit value (RNG seeds and offsets
// do not survive a trip through a double).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace forge::json {

enum class Type { null, boolean, number, string, array, object };
const char* type_name(Type t);  // "null", "boolean", ...

class Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion order, unique keys

class Value {
 public:
  Value() = default;  // null
  Value(std::nullptr_t) {}
  Value(bool b) : v_(b) {}
  Value(double d) : v_(Number{d, 0, Number::Kind::floating}) {}
  // Every integer type; an unsigned value above INT64_MAX stays exact as a uint64.
  template <std::integral T>
  requires(!std::same_as<T, bool>) Value(T i) : v_(make_int(i)) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::move(a)) {}
  Value(Object o) : v_(std::move(o)) {}

  Type type() const { return static_cast<Type>(v_.index()); }
  bool is_null() const { return type() == Type::null; }
  bool is_bool() const { return type() == Type::boolean; }
  bool is_number() const { return type() == Type::number; }
  // A number written (or built) as an integer that fits int64 or uint64.
  bool is_int() const;
  bool is_string() const { return type() == Type::string; }
  bool is_array() const { return type() == Type::array; }
  bool is_object() const { return type() == Type::object; }

  // Each accessor throws forge::Error naming the type it found.
  bool as_bool() const;
  double as_double() const;
  int64_t as_int() const;    // an integer within int64
  uint64_t as_uint() const;  // a non-negative integer within uint64
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  // Objects: lookup by key (linear: objects here are headers and configs).
  const Value* find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  const Value& at(std::string_view key) const;  // throws naming the missing key
  // Inserts a null member when the key is missing; a null value becomes an object.
  Value& operator[](std::string_view key);

  // Arrays.
  const Value& at(size_t i) const;  // throws naming the index and the size
  void push_back(Value v);          // a null value becomes an array

  size_t size() const;  // members of an array or object; throws for other types

  // Structural equality; numbers compare as exact integers when both are
  // integers, as doubles otherwise.
  bool operator==(const Value& other) const;

 private:
  struct Number {
    double d = 0;
    uint64_t bits = 0;  // the exact integer, two's complement for `sint`
    enum class Kind : uint8_t { floating, sint, uint } kind = Kind::floating;
  };
  template <std::integral T>
  static Number make_int(T i) {
    if constexpr (std::is_signed_v<T>) {
      return {static_cast<double>(i), static_cast<uint64_t>(static_cast<int64_t>(i)),
              Number::Kind::sint};
    } else if (static_cast<uint64_t>(i) > static_cast<uint64_t>(INT64_MAX)) {
      return {static_cast<double>(i), static_cast<uint64_t>(i), Number::Kind::uint};
    } else {
      return {static_cast<double>(i), static_cast<uint64_t>(i), Number::Kind::sint};
    }
  }
  const Number& number() const;
  [[noreturn]] void wrong_type(const char* expected) const;

  friend std::string dump(const Value&, int);

  // Index order matches Type.
  std::variant<std::monostate, bool, Number, std::string, Array, Object> v_;
};

// Nesting deeper than this (arrays and objects) is rejected, so hostile input
// cannot exhaust the stack of the recursive parser.
constexpr int kMaxDepth = 64;

// Parses one JSON text (surrounding whitespace allowed, nothing else after it).
// Errors name `what` (a file name or "state"), the byte offset and what was
// expected. Duplicate object keys and unpaired surrogates are rejected.
Value parse(std::string_view text, std::string_view what);

// Compact when indent < 0; otherwise one member per line, indented by
// `indent` spaces per level. Non-finite numbers are an error (JSON has none).
std::string dump(const Value& value, int indent = -1);

}  // namespace forge::json
