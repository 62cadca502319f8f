// The JSON reader (core/json.h) on any bytes. A document that parses must
// print, compact and indented, to text that parses back to the same value.
#include "core/json.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  json::Value v;
  if (!fuzz::accepts([&] { v = json::parse(text, "fuzz input"); })) return 0;
  for (int indent : {-1, 2}) {
    const std::string printed = json::dump(v, indent);
    FUZZ_REQUIRE(json::parse(printed, "printed") == v);
  }
  return 0;
}
