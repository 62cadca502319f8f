// The registry `attnforge gradcheck` runs: every mechanism is listed, names are
// unique, and every case passes gradcheck by name.
#include <gtest/gtest.h>

#include <set>

#include "ops/attention/registry.h"
#include "tests/test_util.h"

namespace forge {
namespace {

TEST(AttentionRegistry, ListsEveryMechanismOnceByName) {
  const auto& cases = ops::attention::gradcheck_registry();
  std::set<std::string> names, mechanisms;
  for (const auto& c : cases) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate case " << c.name;
    mechanisms.insert(c.name.substr(0, c.name.find('/')));
  }
  const std::set<std::string> expected = {"softmax",       "local",     "efficient", "linear",
                                          "taylor_linear", "linformer", "favor",     "taylorshift"};
  EXPECT_EQ(mechanisms, expected);
}

TEST(AttentionRegistry, EveryCasePassesGradcheck) {
  for (const auto& c : ops::attention::gradcheck_registry()) {
    SCOPED_TRACE(c.name);
    EXPECT_GRADCHECK(c.fn, c.make_inputs(), c.options);
  }
}

}  // namespace
}  // namespace forge
