// Recipe::set (train/recipe.h), the `--set key=value` of the command line:
// each line of the input is one assignment, applied in order to one recipe as
// repeated --set flags are. A rejected assignment leaves the recipe as it
// was; the result must print (to_yaml) to YAML that reads back to the same
// values.
#include <algorithm>

#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/recipe_values.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  train::Recipe r;
  bool changed = false;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    const std::string assignment(text.substr(begin, end - begin));
    const train::Recipe before = r;
    if (fuzz::accepts([&] { r.set(assignment); })) {
      changed = true;
    } else {
      FUZZ_REQUIRE(fuzz::same_values(r, before, true));
    }
    begin = end + 1;
  }
  if (!changed) return 0;  // the defaults print and read back in every other run
  const train::Recipe back = train::Recipe::from_yaml(r.to_yaml(), "printed");
  FUZZ_REQUIRE(fuzz::same_values(back, r, false));
  return 0;
}
