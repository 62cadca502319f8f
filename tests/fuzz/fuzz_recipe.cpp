// Recipe::from_yaml (train/recipe.h) on any text. A recipe that reads must
// print (to_yaml: what --dump-config shows and every run keeps) to YAML that
// reads back to the same values.
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/recipe_values.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge;
  const std::string text(reinterpret_cast<const char*>(data), size);
  train::Recipe r;
  if (!fuzz::accepts([&] { r = train::Recipe::from_yaml(text, "fuzz input"); })) return 0;
  const train::Recipe back = train::Recipe::from_yaml(r.to_yaml(), "printed");
  FUZZ_REQUIRE(fuzz::same_values(back, r, false));
  return 0;
}
