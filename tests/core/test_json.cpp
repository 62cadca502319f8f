// JSON: round trips, escapes and UTF-8, exact integers, and strict rejection
// (every error names the source and the byte offset).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/json.h"
#include "tests/test_util.h"

namespace forge::json {
namespace {

// The message of the forge::Error that parsing `text` throws ("" if none).
std::string parse_error(std::string_view text) {
  return testing::error_of([&] { parse(text, "input.json"); }, testing::IfNoError::allow);
}

TEST(JsonParse, Scalars) {
  EXPECT_TRUE(parse("null", "t").is_null());
  EXPECT_TRUE(parse("true", "t").as_bool());
  EXPECT_FALSE(parse(" \t\r\nfalse \n", "t").as_bool());
  EXPECT_EQ(parse("\"hi\"", "t").as_string(), "hi");
  EXPECT_EQ(parse("0", "t").as_int(), 0);
  EXPECT_EQ(parse("-17", "t").as_int(), -17);
  EXPECT_DOUBLE_EQ(parse("2.5", "t").as_double(), 2.5);
}

TEST(JsonParse, NestedStructureKeepsOrder) {
  const Value v = parse(R"({"z": [1, 2, {"a": null}], "b": {"c": true}, "a": "x"})", "t");
  ASSERT_TRUE(v.is_object());
  const Object& o = v.as_object();
  ASSERT_EQ(o.size(), 3u);
  EXPECT_EQ(o[0].first, "z");
  EXPECT_EQ(o[1].first, "b");
  EXPECT_EQ(o[2].first, "a");
  EXPECT_EQ(v.at("z").size(), 3u);
  EXPECT_EQ(v.at("z").at(1).as_int(), 2);
  EXPECT_TRUE(v.at("z").at(2).at("a").is_null());
  EXPECT_TRUE(v.at("b").at("c").as_bool());
  EXPECT_TRUE(v.contains("a"));
  EXPECT_FALSE(v.contains("q"));
  EXPECT_EQ(v.find("q"), nullptr);
  EXPECT_TRUE(parse("[]", "t").as_array().empty());
  EXPECT_TRUE(parse("{}", "t").as_object().empty());
}

TEST(JsonNumbers, IntegersBeyondDoublePrecisionAreExact) {
  // 2^53 + 1 is not a double; the int64 keeps it.
  EXPECT_EQ(parse("9007199254740993", "t").as_int(), 9007199254740993LL);
  EXPECT_EQ(parse("9223372036854775807", "t").as_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(parse("-9223372036854775808", "t").as_int(), std::numeric_limits<int64_t>::min());
  // Above int64, within uint64 (a 64-bit RNG seed).
  const Value u = parse("18446744073709551615", "t");
  EXPECT_TRUE(u.is_int());
  EXPECT_EQ(u.as_uint(), std::numeric_limits<uint64_t>::max());
  EXPECT_THROW(u.as_int(), Error);
  EXPECT_EQ(dump(u), "18446744073709551615");
  // Beyond uint64: only the double remains.
  const Value big = parse("18446744073709551616", "t");
  EXPECT_FALSE(big.is_int());
  EXPECT_DOUBLE_EQ(big.as_double(), 18446744073709551616.0);
  EXPECT_EQ(dump(parse("9007199254740993", "t")), "9007199254740993");
}

TEST(JsonNumbers, FloatsAndExponents) {
  EXPECT_DOUBLE_EQ(parse("1e3", "t").as_double(), 1000.0);
  EXPECT_DOUBLE_EQ(parse("1E+3", "t").as_double(), 1000.0);
  EXPECT_DOUBLE_EQ(parse("-2.5e-3", "t").as_double(), -0.0025);
  EXPECT_DOUBLE_EQ(parse("0.1", "t").as_double(), 0.1);
  EXPECT_DOUBLE_EQ(parse("1.7976931348623157e308", "t").as_double(),
                   std::numeric_limits<double>::max());
  EXPECT_FALSE(parse("1e3", "t").is_int());  // an exponent makes it a float
  EXPECT_FALSE(parse("1.0", "t").is_int());
  EXPECT_THROW(parse("1.5", "t").as_int(), Error);
  // Shortest round-trip text; integral floats keep a ".0" to stay floats.
  for (double d : {0.1, -2.5e-3, 1e300, 5e-324, 123456.789, 1.0 / 3.0, -0.0, 2.0}) {
    const Value back = parse(dump(Value(d)), "t");
    EXPECT_FALSE(back.is_int()) << dump(Value(d));
    EXPECT_EQ(back.as_double(), d) << dump(Value(d));
    EXPECT_EQ(std::signbit(back.as_double()), std::signbit(d));
  }
  EXPECT_EQ(dump(Value(2.0)), "2.0");
  EXPECT_EQ(dump(Value(0.5)), "0.5");
  EXPECT_THROW(dump(Value(std::numeric_limits<double>::infinity())), Error);
  EXPECT_THROW(dump(Value(std::numeric_limits<double>::quiet_NaN())), Error);
}

TEST(JsonStrings, Escapes) {
  const Value v = parse(R"("a\"b\\c\/d\b\f\n\r\t\u0041\u00e9")", "t");
  EXPECT_EQ(v.as_string(), "a\"b\\c/d\b\f\n\r\tA\xc3\xa9");
  // Dumping escapes quotes, backslashes and control characters, and reads back.
  const std::string raw = std::string("q\"b\\s\n\t\x01\x1f") + '\0' + "end";
  const std::string text = dump(Value(raw));
  EXPECT_EQ(text, R"("q\"b\\s\n\t\u0001\u001f\u0000end")");
  EXPECT_EQ(parse(text, "t").as_string(), raw);
}

TEST(JsonStrings, UnicodeEscapesBecomeUtf8) {
  EXPECT_EQ(parse(R"("\u20ac")", "t").as_string(), "\xe2\x82\xac");  // U+20AC euro sign
  EXPECT_EQ(parse(R"("\uD83D\uDE00")", "t").as_string(),
            "\xf0\x9f\x98\x80");  // U+1F600 via a surrogate pair
  EXPECT_EQ(parse(R"("\udbff\udfff")", "t").as_string(), "\xf4\x8f\xbf\xbf");  // U+10FFFF
  // Raw UTF-8 passes through, and dump writes it unescaped.
  const std::string s = "gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80";
  EXPECT_EQ(parse("\"" + s + "\"", "t").as_string(), s);
  EXPECT_EQ(dump(Value(s)), "\"" + s + "\"");
}

TEST(JsonRoundTrip, CompactAndIndented) {
  Value v;
  v["step"] = int64_t{1200};
  v["seed"] = uint64_t{0xfedcba9876543210ull};
  v["lr"] = 3e-4;
  v["name"] = "run \"a\"";
  v["flags"].push_back(true);
  v["flags"].push_back(Value());
  v["flags"].push_back(Value(Object{}));
  v["nested"]["deep"]["list"] = Value(Array{Value(1), Value(-2.5), Value("x")});
  const std::string compact = dump(v);
  EXPECT_EQ(
      compact,
      R"({"step":1200,"seed":18364758544493064720,"lr":0.0003,"name":"run \"a\"","flags":[true,null,{}],)"
      R"("nested":{"deep":{"list":[1,-2.5,"x"]}}})");
  EXPECT_EQ(parse(compact, "t"), v);
  const std::string pretty = dump(v, 2);
  EXPECT_NE(pretty.find("\n  \"step\": 1200,\n"), std::string::npos) << pretty;
  EXPECT_NE(pretty.find("\n      \"list\": [\n        1,\n"), std::string::npos) << pretty;
  EXPECT_EQ(parse(pretty, "t"), v);
  EXPECT_EQ(parse(pretty, "t").at("seed").as_uint(), 0xfedcba9876543210ull);
  EXPECT_EQ(dump(Value(Array{}), 2), "[]");
  EXPECT_EQ(dump(Value(Object{}), 2), "{}");
}

TEST(JsonAccessors, WrongTypesNameWhatWasFound) {
  const Value v = parse(R"({"n": 1.5, "s": "x", "a": [1]})", "t");
  try {
    v.at("n").as_int();
    FAIL() << "as_int on 1.5 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1.5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("integer"), std::string::npos) << e.what();
  }
  try {
    v.at("missing_key");
    FAIL() << "at() did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing_key"), std::string::npos) << e.what();
  }
  try {
    v.at("s").as_array();
    FAIL() << "as_array on a string did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("string"), std::string::npos) << e.what();
  }
  EXPECT_THROW(v.at("a").at(1), Error);
  EXPECT_THROW(v.at("s").as_double(), Error);
  EXPECT_THROW(v.at("s").as_bool(), Error);
  EXPECT_THROW(v.at("a").at("k"), Error);
  EXPECT_THROW(v.at("s").size(), Error);
  EXPECT_THROW(parse("-1", "t").as_uint(), Error);
}

struct Malformed {
  const char* text;
  size_t offset;  // where the error is reported
};

TEST(JsonReject, MalformedInputNamesSourceAndOffset) {
  const Malformed cases[] = {
      {"", 0},                      // empty
      {"   ", 3},                   // only whitespace
      {"[1, 2,]", 6},               // trailing comma in an array
      {"{\"a\": 1,}", 8},           // trailing comma in an object
      {"{\"a\" 1}", 5},             // missing colon
      {"{a: 1}", 1},                // unquoted key
      {"[1 2]", 3},                 // missing comma
      {"[1, 2", 5},                 // unclosed array
      {"{\"a\": 1", 7},             // unclosed object
      {"\"abc", 4},                 // unclosed string
      {"01", 1},                    // leading zero, then garbage
      {"-", 1},                     // sign only
      {"1.", 2},                    // no fraction digits
      {".5", 0},                    // no integer part
      {"1e", 2},                    // no exponent digits
      {"1e+", 3},                   // no exponent digits after the sign
      {"+1", 0},                    // plus sign
      {"0x10", 1},                  // hex
      {"NaN", 0},                   // not JSON
      {"Infinity", 0},              // not JSON either
      {"1e400", 0},                 // beyond a double
      {"tru", 0},                   // truncated literal
      {"nul", 0},                   // truncated literal
      {"True", 0},                  // wrong case
      {"[1] x", 4},                 // trailing garbage
      {"{} {}", 3},                 // two documents
      {"\"a\\x\"", 3},              // unknown escape
      {"\"\\u12G4\"", 5},           // bad hex digit
      {"\"\\u12\"", 5},             // short \u escape
      {"\"\\uD800\"", 7},           // high surrogate alone
      {"\"\\uD800\\u0041\"", 7},    // high surrogate with a non-surrogate
      {"\"\\uDC00\"", 1},           // low surrogate first
      {"\"a\tb\"", 2},              // raw control character
      {"\"\xff\"", 1},              // invalid UTF-8 byte
      {"\"\xc0\xaf\"", 1},          // overlong encoding
      {"\"\xed\xa0\x80\"", 1},      // UTF-8-encoded surrogate
      {"\"\xe2\x82\"", 1},          // truncated sequence
      {"{\"k\": 1, \"k\": 2}", 9},  // duplicate key
  };
  for (const Malformed& c : cases) {
    const std::string msg = parse_error(c.text);
    ASSERT_FALSE(msg.empty()) << "accepted: " << c.text;
    EXPECT_NE(msg.find("input.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("at byte " + std::to_string(c.offset) + ":"), std::string::npos)
        << "input " << c.text << " -> " << msg;
    EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
  }
}

TEST(JsonReject, MessagesSayWhatWasExpected) {
  EXPECT_NE(parse_error("[1, 2,]").find("expected a value"), std::string::npos)
      << parse_error("[1, 2,]");
  EXPECT_NE(parse_error("{\"a\" 1}").find("expected ':'"), std::string::npos);
  EXPECT_NE(parse_error("[1] x").find("end of the input"), std::string::npos);
  EXPECT_NE(parse_error("[1] x").find("found 'x'"), std::string::npos);
  EXPECT_NE(parse_error("{\"k\": 1, \"k\": 2}").find("duplicate key \"k\""), std::string::npos);
}

TEST(JsonReject, DepthLimit) {
  const auto nested = [](int depth) {
    return std::string(static_cast<size_t>(depth), '[') +
           std::string(static_cast<size_t>(depth), ']');
  };
  EXPECT_NO_THROW(parse(nested(kMaxDepth), "t"));
  const std::string msg = parse_error(nested(kMaxDepth + 1));
  EXPECT_NE(msg.find("nesting deeper than 64"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at byte 64"), std::string::npos) << msg;
  // Far deeper input fails the same way instead of overflowing the stack.
  EXPECT_THROW(parse(std::string(1000000, '['), "t"), Error);
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  EXPECT_THROW(parse(objects, "t"), Error);
}

TEST(JsonDump, RejectsInvalidUtf8) {
  EXPECT_THROW(dump(Value(std::string("bad \xff byte"))), Error);
  Value o;
  o[std::string("key\xc3")] = 1;
  EXPECT_THROW(dump(o), Error);
}

}  // namespace
}  // namespace forge::json
