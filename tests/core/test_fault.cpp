// core/fault.h, the one failure-injection hook: a counted point fires at its
// N-th hit, an indexed one at index N, each once; a fault armed for one rank
// fires only there. (ATTNFORGE_FAULT's parsing and the kill action run in
// child processes: tests/train/test_checkpoint.cpp's KillAtEveryStepOfASave
// and KillHookSetWrongIsAnError; the step point under mpirun:
// tests/dist/test_data_parallel.cpp.)
#include <gtest/gtest.h>

#include <string>

#include "core/fault.h"

namespace forge {
namespace {

class FaultTest : public ::testing::Test {
 protected:
  void TearDown() override {
    fault::arm({});
    fault::set_rank(0);
  }
};

TEST_F(FaultTest, ACountedPointFiresAtItsNthHitOnce) {
  fault::arm({.point = "checkpoint", .at = 3});
  EXPECT_FALSE(fault::due("checkpoint"));
  EXPECT_FALSE(fault::due("step"));  // another point's hits do not count
  EXPECT_FALSE(fault::due("checkpoint"));
  try {
    fault::point("checkpoint", "rename the temp directory into place");
    FAIL() << "the third hit did not fire";
  } catch (const fault::InjectedFault& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fault::arm (checkpoint 3), simulated crash: rename the temp directory"),
              std::string::npos)
        << msg;
  }
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(fault::due("checkpoint"));
}

TEST_F(FaultTest, AnIndexedPointFiresAtItsIndexOnce) {
  fault::arm({.point = "step", .at = 4});
  EXPECT_FALSE(fault::due_at("step", 3));
  EXPECT_FALSE(fault::due_at("checkpoint", 4));
  EXPECT_TRUE(fault::due_at("step", 4));
  EXPECT_THROW(fault::fire("before step 5"), fault::InjectedFault);
  EXPECT_FALSE(fault::due_at("step", 4));
}

TEST_F(FaultTest, AFaultForOneRankFiresOnlyThere) {
  fault::arm({.point = "step", .at = 2, .rank = 1});
  EXPECT_FALSE(fault::due_at("step", 2));  // this process is rank 0
  fault::set_rank(1);
  EXPECT_TRUE(fault::due_at("step", 2));
}

TEST_F(FaultTest, ArmingReplacesAndNothingArmedNeverFires) {
  fault::arm({.point = "checkpoint", .at = 1});
  fault::arm({.point = "checkpoint", .at = 2});
  EXPECT_FALSE(fault::due("checkpoint"));
  EXPECT_TRUE(fault::due("checkpoint"));
  fault::arm({});
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(fault::due("checkpoint"));
    EXPECT_FALSE(fault::due_at("step", i));
  }
}

}  // namespace
}  // namespace forge
