// core/names.h: one name table per enum, the lookups written once.
#include <gtest/gtest.h>

#include "core/names.h"
#include "tests/test_util.h"

namespace forge {
namespace {

enum class Colour { red, green, blue };
constexpr NameTable<Colour, 3> kColours{"colour", {"red", "green", "blue"}};

TEST(Names, EveryNameRoundTripsAndAnUnknownOneListsThem) {
  for (Colour c : {Colour::red, Colour::green, Colour::blue})
    EXPECT_EQ(enum_from_name(kColours, name_of(kColours, c)), c);
  EXPECT_STREQ(name_of(kColours, Colour::blue), "blue");
  EXPECT_EQ(names_of(kColours), (std::vector<std::string>{"red", "green", "blue"}));
  testing::expect_error([] { enum_from_name(kColours, "mauve"); },
                        {"unknown colour 'mauve'; expected one of: red, green, blue"});
  static_assert(name_of(kColours, Colour::green)[0] == 'g', "name_of is constexpr");
}

}  // namespace
}  // namespace forge
