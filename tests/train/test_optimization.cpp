// The recipe's optimizer and schedule (train/optimization.h): a warmup longer
// than the run is cut or named for every schedule kind that has one, and
// optimizer.freeze says what it froze.
#include <gtest/gtest.h>

#include "nn/layers.h"
#include "optim/schedule.h"
#include "train/optimization.h"

namespace forge::train {
namespace {

struct Built {
  optim::ScheduleConfig schedule;
  std::vector<std::string> notes;
};

Built schedule_of(const std::string& kind, const std::vector<std::string>& sets,
                  int64_t total_steps, int64_t steps_per_epoch = 10) {
  Recipe r;
  r.set("schedule.kind=" + kind);
  for (const std::string& s : sets) r.set(s);
  Built b;
  b.schedule = make_schedule(r, total_steps, steps_per_epoch, &b.notes);
  return b;
}

// cosine, linear_decay, linear_warmup and step: a warmup of 100 steps in a run
// of 20 is cut to 20, said once, and the last update has the full lr.
TEST(MakeSchedule, EveryKindWithAWarmupCutsOneLongerThanTheRun) {
  for (const std::string kind : {"cosine", "linear_decay", "linear_warmup", "step"}) {
    SCOPED_TRACE(kind);
    const Built b = schedule_of(kind, {"schedule.warmup_steps=100", "schedule.step_size=50"}, 20);
    EXPECT_EQ(b.schedule.warmup_steps, 20);
    ASSERT_EQ(b.notes.size(), 1u);
    EXPECT_NE(b.notes[0].find("schedule.warmup_steps makes a warmup of 100 steps, longer than "
                              "this run's 20 steps: the warmup is cut to 20"),
              std::string::npos)
        << b.notes[0];
    EXPECT_DOUBLE_EQ(optim::lr_factor(b.schedule, 19), 1.0);
    EXPECT_DOUBLE_EQ(optim::lr_factor(b.schedule, 0), 1.0 / 20);
  }
}

TEST(MakeSchedule, AWarmupInEpochsIsCutAndNamedAsGiven) {
  const Built b = schedule_of("linear_warmup", {"schedule.warmup_epochs=5"}, 20, 10);
  EXPECT_EQ(b.schedule.warmup_steps, 20);
  ASSERT_EQ(b.notes.size(), 1u);
  EXPECT_NE(b.notes[0].find("schedule.warmup_epochs makes a warmup of 50 steps"), std::string::npos)
      << b.notes[0];
}

// rsqrt's peak is lr / sqrt(W): the warmup is kept and the note says how far
// the run gets ((20 - 1) / 8000 = 0.24% of the peak) and how to shorten it.
TEST(MakeSchedule, RsqrtKeepsItsWarmupAndSaysHowFarTheRunGets) {
  const Built b = schedule_of("rsqrt", {"schedule.warmup_steps=8000"}, 20);
  EXPECT_EQ(b.schedule.warmup_steps, 8000);
  ASSERT_EQ(b.notes.size(), 1u);
  EXPECT_NE(b.notes[0].find("this run ends at 0.24% of that peak"), std::string::npos)
      << b.notes[0];
  EXPECT_NE(b.notes[0].find("--set schedule.warmup_steps=2"), std::string::npos) << b.notes[0];
  // What the note says is what the schedule does.
  EXPECT_NEAR(optim::lr_factor(b.schedule, 19) * std::sqrt(8000.0), 19.0 / 8000, 1e-15);
}

TEST(MakeSchedule, AWarmupWithinTheRunIsLeftAloneForEveryKind) {
  for (const std::string kind : {"cosine", "linear_decay", "linear_warmup", "step", "rsqrt"}) {
    SCOPED_TRACE(kind);
    const Built b = schedule_of(kind, {"schedule.warmup_steps=20", "schedule.step_size=50"}, 20);
    EXPECT_EQ(b.schedule.warmup_steps, 20);
    EXPECT_TRUE(b.notes.empty());
  }
  const Built constant = schedule_of("constant", {}, 20);
  EXPECT_EQ(constant.schedule.warmup_steps, 0);
  EXPECT_TRUE(constant.notes.empty());
}

TEST(MakeOptimizer, FreezeSaysWhatItFroze) {
  nn::Linear model(3, 2);
  Recipe r;
  r.set("optimizer.freeze=[bias]");
  std::vector<std::string> info;
  const auto opt = make_optimizer(r, model, &info);
  EXPECT_EQ(opt->parameters().size(), 1u);  // the weight only
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0], "optimizer.freeze: not trained: 'bias': 1 tensor of 2 values (bias)");
  // Nothing frozen, nothing said.
  info.clear();
  make_optimizer(Recipe(), model, &info);
  EXPECT_TRUE(info.empty());
}

}  // namespace
}  // namespace forge::train
