// The CheckpointManager: a run's checkpoints, pruning (keep_last,
// keep_best), the latest / best pointers and the fallbacks past damaged
// ones, a simulated crash and a real SIGKILL at every step of a save.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "core/fault.h"
#include "core/safetensors.h"
#include "tests/test_util.h"
#include "tests/train/checkpoint_test_util.h"
#include "train/checkpoint.h"

namespace forge::train {
namespace {

using namespace checkpoint_testing;

class CheckpointManagerTest : public CheckpointTest {
 protected:
  CheckpointManager manager(int keep_last, int keep_best, const std::string& metric = "",
                            const std::string& mode = "max") {
    return CheckpointManager(root_.string(), keep_last, keep_best, metric, mode,
                             [this](const std::string& w) { warned_.push_back(w); });
  }
  fs::path ckdir() const { return root_ / "checkpoints"; }
  std::string path(int64_t step) const {
    return (ckdir() / CheckpointManager::name_of(step)).string();
  }
  std::vector<std::string> paths(std::initializer_list<int64_t> steps) const {
    std::vector<std::string> out;
    for (int64_t s : steps) out.push_back(path(s));
    return out;
  }
  std::vector<std::string> warned_;
};

TEST_F(CheckpointManagerTest, KeepLastPrunesAndWritesLatest) {
  auto m = manager(2, 0);
  EXPECT_FALSE(m.latest());
  EXPECT_TRUE(m.list().empty());
  for (int64_t s = 1; s <= 5; ++s) EXPECT_EQ(m.save(s * 10, make_checkpoint(s), {}), path(s * 10));
  EXPECT_EQ(CheckpointManager::name_of(1234), "step-00001234");
  EXPECT_EQ(m.list(), paths({40, 50}));
  EXPECT_EQ(m.latest(), path(50));
  EXPECT_FALSE(m.best());
  EXPECT_EQ(read_file(ckdir() / "latest"), "step-00000050\n");
  EXPECT_FALSE(fs::is_symlink(ckdir() / "latest"));
  EXPECT_EQ(names_in(ckdir()), (std::set<std::string>{"latest", "step-00000040", "step-00000050"}));
  EXPECT_TRUE(same(read_checkpoint(*m.latest()), make_checkpoint(5)));
  EXPECT_TRUE(warned_.empty());
}

// A process killed after a save's commit (latest already names the new
// checkpoint) leaves the pruning undone; a finished run never saves again, so
// a resume tidies: the leftovers go and keep_last holds again.
TEST_F(CheckpointManagerTest, TidyFinishesThePruningOfAKilledSave) {
  {
    auto m = manager(3, 0);
    for (int64_t s = 1; s <= 3; ++s) m.save(s * 10, make_checkpoint(s), {});
  }
  fs::create_directories(ckdir() / "step-00000010.del-4242");
  fs::create_directories(ckdir() / "step-00000040.tmp-4242");
  auto m = manager(1, 0);
  EXPECT_EQ(names_in(ckdir()).size(), 6u);  // read only: nothing changed yet
  m.tidy();
  EXPECT_EQ(names_in(ckdir()), (std::set<std::string>{"latest", "step-00000030"}));
  EXPECT_EQ(m.list(), paths({30}));
  EXPECT_TRUE(same(read_checkpoint(*m.latest()), make_checkpoint(3)));
}

// A process killed between a save's `latest` and its `best` (the soak found
// it): `best` still names the old best, which the new one outranks. The
// resume's tidy moves `best` to the new one before it prunes, so at every
// instant `best` names a checkpoint that exists.
TEST_F(CheckpointManagerTest, TidyMovesBestBeforeItPrunesTheOldBest) {
  {
    auto m = manager(3, 1, "eval_loss", "min");
    m.save(40, make_checkpoint(4), 3.99);
    m.save(50, make_checkpoint(5), {});
    m.save(60, make_checkpoint(6), 3.93);
  }
  write_file(ckdir() / "best", "step-00000040\n");  // as the kill left it
  auto m = manager(1, 1, "eval_loss", "min");
  m.tidy();
  EXPECT_EQ(read_file(ckdir() / "best"), "step-00000060\n");
  EXPECT_EQ(names_in(ckdir()), (std::set<std::string>{"best", "latest", "step-00000060"}));
  EXPECT_EQ(m.best(), path(60));
}

// What decides whether a run directory holds a run, without reading anything.
TEST_F(CheckpointManagerTest, HoldsCheckpointCountsWholeAndAsideOnes) {
  EXPECT_FALSE(CheckpointManager::holds_checkpoint(root_.string()));  // no checkpoints/ at all
  fs::create_directories(ckdir() / "step-00000010.tmp-77");
  fs::create_directories(ckdir() / "step-00000020.del-77");
  fs::create_directories(ckdir() / "not-a-step");
  EXPECT_FALSE(CheckpointManager::holds_checkpoint(root_.string()));
  fs::create_directories(ckdir() /
                         "step-00000030.old-77");  // renamed aside: restored on the next write
  EXPECT_TRUE(CheckpointManager::holds_checkpoint(root_.string()));
  fs::remove_all(ckdir() / "step-00000030.old-77");
  fs::create_directories(ckdir() / "step-00000040");
  EXPECT_TRUE(CheckpointManager::holds_checkpoint(root_.string()));
}

TEST_F(CheckpointManagerTest, KeepBestKeepsTheBestAndRecordsTheMetric) {
  auto m = manager(1, 2, "eval/accuracy", "max");
  const double acc[] = {0.5, 0.9, 0.7, 0.9, 0.6, 0.8};
  for (int64_t s = 1; s <= 6; ++s) m.save(s, make_checkpoint(static_cast<uint64_t>(s)), acc[s - 1]);
  // Latest 6 (0.8); best 2 (0.9 first; 4 ties and does not improve); the two best: 2 and 4.
  EXPECT_EQ(m.best(), path(2));
  EXPECT_EQ(m.list(), paths({2, 4, 6}));
  EXPECT_EQ(read_file(ckdir() / "best"), "step-00000002\n");
  const Checkpoint two = read_checkpoint(path(2));
  const json::Value& rec = two.state.at("checkpoint_metric");
  EXPECT_EQ(rec.at("name").as_string(), "eval/accuracy");
  EXPECT_EQ(rec.at("value").as_double(), 0.9);
  // The trainer's own state is kept beside it.
  EXPECT_EQ(two.state.at("step").as_int(), 200);

  // A restart sees the same.
  auto again = manager(1, 2, "eval/accuracy", "max");
  EXPECT_EQ(again.latest(), path(6));
  EXPECT_EQ(again.best(), path(2));
  EXPECT_EQ(again.list(), paths({2, 4, 6}));
  EXPECT_TRUE(warned_.empty());
}

TEST_F(CheckpointManagerTest, MinModeAndNanMetrics) {
  auto m = manager(1, 0, "loss", "min");
  m.save(1, make_checkpoint(1), 2.0);
  m.save(2, make_checkpoint(2), std::nan(""));
  m.save(3, make_checkpoint(3), 1.5);
  m.save(4, make_checkpoint(4), 1.7);
  // A state carried over from a loaded checkpoint does not lend its metric.
  Checkpoint five = make_checkpoint(5);
  five.state = read_checkpoint(path(3)).state;
  five.state["checkpoint_metric"]["value"] = json::Value(0.1);
  m.save(5, five, {});
  EXPECT_EQ(m.best(), path(3));  // kept although keep_best is 0
  EXPECT_EQ(m.list(), paths({3, 5}));
  EXPECT_TRUE(read_checkpoint(path(5)).state.find("checkpoint_metric") == nullptr);
  m.save(6, make_checkpoint(6), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(m.best(), path(3));  // not finite: recorded as null, never best
  EXPECT_TRUE(read_checkpoint(path(6)).state.at("checkpoint_metric").at("value").is_null());
  EXPECT_EQ(manager(1, 0, "loss", "min").best(), path(3));
}

TEST_F(CheckpointManagerTest, BadArguments) {
  expect_error([&] { manager(0, 0); }, {"keep_last", "0"});
  expect_error([&] { manager(1, -1); }, {"keep_best"});
  expect_error([&] { manager(1, 0, "acc", "avg"); }, {"\"avg\"", "\"max\""});
  auto m = manager(1, 0);
  expect_error([&] { m.save(1, make_checkpoint(1), 0.5); }, {"metric"});
  expect_error([&] { m.save(-1, make_checkpoint(1), {}); }, {"-1"});
}

TEST_F(CheckpointManagerTest, FallsBackWhenLatestIsCorrupt) {
  {
    auto m = manager(3, 0);
    for (int64_t s = 1; s <= 3; ++s) m.save(s, make_checkpoint(static_cast<uint64_t>(s)), {});
  }
  const std::string model = read_file(fs::path(path(3)) / "model.safetensors");
  write_file(fs::path(path(3)) / "model.safetensors", model.substr(0, model.size() - 10));
  const auto before = snapshot(root_);
  auto m = manager(3, 0);
  EXPECT_EQ(snapshot(root_), before) << "construction must only read";
  EXPECT_EQ(m.latest(), path(2));
  ASSERT_FALSE(warned_.empty());
  EXPECT_NE(warned_[0].find("step-00000003"), std::string::npos) << warned_[0];
  EXPECT_EQ(m.warnings(), warned_);
  EXPECT_EQ(m.list(), paths({1, 2}));
  // The abandoned step 3 goes with the next save.
  m.save(4, make_checkpoint(4), {});
  EXPECT_FALSE(fs::exists(path(3)));
  EXPECT_EQ(m.list(), paths({1, 2, 4}));
  EXPECT_EQ(names_in(ckdir()),
            (std::set<std::string>{"latest", "step-00000001", "step-00000002", "step-00000004"}));
}

// A flipped byte anywhere in the latest checkpoint makes it the damaged latest
// (which the trainer refuses to resume from) instead of being loaded.
TEST_F(CheckpointManagerTest, FlippedByteMakesTheLatestDamaged) {
  struct Case {
    const char* file;
    std::function<void(const fs::path&)> corrupt;
    std::string names;
  };
  const Case cases[] = {
      {"model.safetensors",
       [](const fs::path& d) { flip_tensor_byte(d / "model.safetensors", "blocks.0.b"); },
       "tensor \"blocks.0.b\""},
      {"optimizer.safetensors",
       [](const fs::path& d) { flip_tensor_byte(d / "optimizer.safetensors", "state.0.step"); },
       "tensor \"state.0.step\""},
      {"state.json", change_state_digit, "state.json"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    fs::remove_all(ckdir());
    {
      auto m = manager(3, 0);
      m.save(1, make_checkpoint(1), {});
      m.save(2, make_checkpoint(2), {});
    }
    c.corrupt(path(2));
    warned_.clear();
    auto m = manager(3, 0);
    EXPECT_EQ(m.latest(), path(1));
    ASSERT_TRUE(m.damaged_latest());
    for (const std::string& part :
         {(fs::path(path(2)) / c.file).string(), c.names, std::string("checksum mismatch")}) {
      EXPECT_NE(m.damaged_latest()->find(part), std::string::npos)
          << "'" << part << "' not in: " << *m.damaged_latest();
    }
    EXPECT_FALSE(warned_.empty());
  }
}

// resolve_checkpoint, the one rule of every command: a checkpoint is never
// used in place of another. A damaged or unnamed latest, and a damaged named
// checkpoint, are errors that name the damage and the run's newest intact
// checkpoint; an intact one resolves (verified) and nothing on disk changes.
TEST_F(CheckpointManagerTest, ResolveNeverUsesAnotherCheckpointInPlaceOfTheNamedOne) {
  const auto setup = [&] {
    fs::remove_all(ckdir());
    auto m = manager(3, 0);
    for (int64_t s = 1; s <= 3; ++s) m.save(s, make_checkpoint(static_cast<uint64_t>(s)), {});
  };
  const std::string run = root_.string(), cks = ckdir().string();
  setup();
  for (const std::string& given : {run, cks, cks + "/latest", path(3)})
    EXPECT_EQ(resolve_checkpoint(given, "test").dir, path(3)) << given;
  EXPECT_EQ(resolve_checkpoint(path(1), "test").dir, path(1));

  const auto expect_refused = [&](const std::string& given, std::vector<std::string> parts) {
    const auto before = snapshot(root_);
    parts.push_back("No other checkpoint is used in its place");
    forge::testing::expect_error([&] { resolve_checkpoint(given, "eval"); }, parts);
    EXPECT_EQ(snapshot(root_), before) << given << ": resolving changed the run";
  };
  // The latest damaged (a flipped tensor byte, a changed state digit): the
  // run, its checkpoints/, latest and the step itself are each refused.
  for (const auto& corrupt : std::vector<std::function<void()>>{
           [&] { flip_tensor_byte(fs::path(path(3)) / "model.safetensors", "blocks.0.b"); },
           [&] { change_state_digit(path(3)); }}) {
    setup();
    corrupt();
    for (const std::string& given : {run, cks, cks + "/latest", path(3)})
      expect_refused(given, {"step-00000003", "damaged", "newest intact one is " + path(2)});
  }
  // The pointer garbled, naming a step that is gone, or missing.
  setup();
  write_file(ckdir() / "latest", "garbage\n");
  expect_refused(run, {cks + "/latest", "newest intact one is " + path(3)});
  write_file(ckdir() / "latest", "step-00000009\n");
  expect_refused(cks + "/latest", {"names step-00000009, which does not exist", path(3)});
  fs::remove(ckdir() / "latest");
  expect_refused(run, {cks + "/latest is missing", path(3)});
  // An older checkpoint named directly, or through `best`, damaged.
  setup();
  flip_tensor_byte(fs::path(path(1)) / "model.safetensors", "blocks.0.b");
  write_file(ckdir() / "best", "step-00000001\n");
  for (const std::string& given : {path(1), cks + "/best"})
    expect_refused(given, {"the checkpoint " + path(1) + " is damaged", "checksum mismatch",
                           "newest intact one is " + path(3)});
}

// An old run's checkpoints load; the manager passes on that they are unverified.
TEST_F(CheckpointManagerTest, WarnsAboutALatestWithoutChecksums) {
  {
    auto m = manager(3, 0);
    m.save(1, make_checkpoint(1), {});
  }
  strip_checksums(path(1));
  auto m = manager(3, 0);
  EXPECT_EQ(m.latest(), path(1));
  EXPECT_FALSE(m.damaged_latest());
  ASSERT_EQ(m.warnings().size(), 1u);
  EXPECT_NE(m.warnings()[0].find(path(1) + ": written without checksums"), std::string::npos)
      << m.warnings()[0];
}

TEST_F(CheckpointManagerTest, FallsBackWhenLatestIsMissingOrGarbage) {
  {
    auto m = manager(3, 0);
    for (int64_t s = 1; s <= 3; ++s) m.save(s, make_checkpoint(static_cast<uint64_t>(s)), {});
  }
  write_file(ckdir() / "latest", "step-00000009\n");
  EXPECT_EQ(manager(3, 0).latest(), path(3));
  EXPECT_NE(warned_.at(0).find("does not exist"), std::string::npos) << warned_[0];
  warned_.clear();
  write_file(ckdir() / "latest", "../../etc\n");
  EXPECT_EQ(manager(3, 0).latest(), path(3));
  EXPECT_FALSE(warned_.empty());
  warned_.clear();
  fs::remove(ckdir() / "latest");
  EXPECT_EQ(manager(3, 0).latest(), path(3));
  EXPECT_FALSE(warned_.empty());
  // Nothing readable at all: no latest.
  for (int64_t s = 1; s <= 3; ++s) fs::remove(fs::path(path(s)) / "state.json");
  EXPECT_FALSE(manager(3, 0).latest());
}

// A pointer holding garbage is quoted escaped in the warning (which goes to
// train.log and terminals), not copied raw.
TEST_F(CheckpointManagerTest, GarbageInAPointerIsQuotedEscaped) {
  {
    auto m = manager(3, 0);
    m.save(1, make_checkpoint(1), {});
  }
  write_file(ckdir() / "latest", "\x01\xff\x1b[31mstep");
  EXPECT_EQ(manager(3, 0).latest(), path(1));
  const auto quoting = [&](const std::string& part) {
    return std::count_if(warned_.begin(), warned_.end(),
                         [&](const std::string& w) { return w.find(part) != std::string::npos; });
  };
  EXPECT_EQ(quoting((ckdir() / "latest").string() + ": holds \"\\x01\\xff\\x1b[31mstep\""), 1)
      << fmt::format("{}", fmt::join(warned_, "\n"));
  // Long garbage is cut; quotes and backslashes cannot end the quotation early.
  warned_.clear();
  write_file(ckdir() / "latest", "\"\\" + std::string(500, 'A'));
  auto m = manager(3, 0);
  EXPECT_EQ(quoting("holds \"\\x22\\x5c" + std::string(56, 'A') + "...\""), 1)
      << fmt::format("{}", fmt::join(warned_, "\n"));
  for (const std::string& w : m.warnings()) {
    EXPECT_LT(w.size(), 300u) << w;
    EXPECT_TRUE(std::all_of(w.begin(), w.end(), [](char c) { return c >= 0x20 && c < 0x7f; }))
        << "a raw control or non-ASCII byte in: " << w;
  }
}

TEST_F(CheckpointManagerTest, CorruptBestIsIgnored) {
  {
    auto m = manager(1, 1, "acc");
    m.save(1, make_checkpoint(1), 0.9);
    m.save(2, make_checkpoint(2), 0.5);
    m.save(3, make_checkpoint(3), 0.7);
  }
  fs::remove(fs::path(path(1)) / "optimizer.safetensors");
  auto m = manager(1, 1, "acc");
  EXPECT_EQ(m.best(), path(3));
  EXPECT_EQ(m.latest(), path(3));
}

// A crash at every step of a save that also prunes: a restart always finds a
// whole latest checkpoint, nothing saved before is lost until the new one is
// committed, and the next save cleans up.
TEST_F(CheckpointManagerTest, CrashAtEveryStepOfASave) {
  const fs::path original = root_ / "original";
  {
    auto m = CheckpointManager(original.string(), 2, 1, "acc", "max");
    m.save(1, make_checkpoint(1), 0.9);
    m.save(2, make_checkpoint(2), 0.1);
    m.save(3, make_checkpoint(3), 0.2);  // prunes nothing: 1 is best, 2 and 3 the last two
  }
  int n = 1;
  int olds = 0, news = 0;
  for (;; ++n) {
    ASSERT_LT(n, 60);
    // Steps 2-5 write the checkpoint's files, crashes CheckpointTest covers; fsyncs are slow.
    if (n >= 2 && n <= 5) continue;
    fs::remove_all(ckdir());
    fs::copy(original / "checkpoints", ckdir(), fs::copy_options::recursive);
    {
      auto m = manager(2, 1, "acc");
      ASSERT_EQ(m.list(), paths({1, 2, 3}));
      fault::arm({.point = "checkpoint", .at = n});
      const std::string msg =
          error_of([&] { m.save(4, make_checkpoint(4), 0.95); }, IfNoError::allow);
      fault::arm({});
      if (msg.empty()) break;
      EXPECT_NE(msg.find("simulated crash"), std::string::npos) << msg;
    }
    SCOPED_TRACE(n);
    auto m = manager(2, 1, "acc");
    ASSERT_TRUE(m.latest());
    const Checkpoint r = read_checkpoint(*m.latest());
    if (*m.latest() == path(3)) {
      EXPECT_EQ(news, 0);
      ++olds;
      EXPECT_EQ(r.state.at("step").as_int(), 300);
      for (int64_t s : {1, 2, 3}) EXPECT_NO_THROW(read_checkpoint(path(s)));
      EXPECT_EQ(m.best(), path(1));
    } else {
      ASSERT_EQ(*m.latest(), path(4));
      ++news;
      EXPECT_EQ(m.best(), path(4));
      EXPECT_EQ(r.state.at("step").as_int(), 400);
      EXPECT_NO_THROW(read_checkpoint(path(3)));
    }
    // The next save works and leaves only whole checkpoints and the pointers.
    m.save(5, make_checkpoint(5), 0.3);
    for (const auto& name : names_in(ckdir())) {
      EXPECT_TRUE(name == "latest" || name == "best" || name.rfind("step-", 0) == 0) << name;
      EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
      EXPECT_EQ(name.find(".del-"), std::string::npos) << name;
    }
    for (const auto& p : m.list()) EXPECT_NO_THROW(read_checkpoint(p)) << p;
  }
  EXPECT_GE(olds, 3);
  EXPECT_GE(news, 3);
  // Steps: the checkpoint (7), latest (3), best (3), pruning 2 (4).
  EXPECT_GE(n - 1, 15);
}

// Runs this test binary again, only CheckpointKillChild, with `env` added to
// a copy of our environment (GoogleTest's own variables left out, so the child
// neither shards nor writes our report); its output goes to `log`. Returns the
// wait status (nullopt, with a failure, when it could not be run).
std::optional<int> run_child(const std::vector<std::string>& env, const fs::path& log) {
  char self[PATH_MAX] = {};
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  EXPECT_GT(len, 0) << "cannot find this test binary through /proc/self/exe";
  std::vector<std::string> vars = env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v = *e;
    if (v.starts_with("GTEST_") || v.starts_with("ATTNFORGE_FAULT=") ||
        v.starts_with("FORGE_TEST_KILL_RUN="))
      continue;
    vars.emplace_back(v);
  }
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=CheckpointKillChild.*";
  char* argv[] = {self, filter.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, self, &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn " << self << ": " << std::strerror(rc);
    return std::nullopt;
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) {
    ADD_FAILURE() << "waitpid: " << std::strerror(errno);
    return std::nullopt;
  }
  return status;
}

// The child of KillAtEveryStepOfASave: saves step 4 into the run it is given,
// under whatever ATTNFORGE_FAULT arms.
TEST(CheckpointKillChild, SavesStep4) {
  const char* run = std::getenv("FORGE_TEST_KILL_RUN");
  if (run == nullptr) {
    GTEST_SKIP()
        << "runs only as the child process of CheckpointManagerTest.KillAtEveryStepOfASave";
  }
  CheckpointManager m(run, 2, 1, "acc", "max");
  m.save(4, make_checkpoint(4), 0.95);
}

// A real SIGKILL at every step of a save, armed through ATTNFORGE_FAULT
// as scripts/soak.sh arms it: a restart always finds a whole latest checkpoint
// (the old one until the commit, the new one after), never a damaged one, and
// a file being written is left half written.
TEST_F(CheckpointManagerTest, KillAtEveryStepOfASave) {
  const fs::path original = root_ / "original";
  {
    auto m = CheckpointManager(original.string(), 2, 1, "acc", "max");
    m.save(1, make_checkpoint(1), 0.9);
    m.save(2, make_checkpoint(2), 0.1);
    m.save(3, make_checkpoint(3), 0.2);
  }
  const fs::path log = root_ / "child.log";
  std::map<std::string, std::vector<std::string>> left;  // file name -> contents left in a temp dir
  int n = 1, olds = 0, news = 0;
  for (;; ++n) {
    ASSERT_LT(n, 60) << "the hook never stopped firing";
    SCOPED_TRACE(n);
    fs::remove_all(ckdir());
    fs::copy(original / "checkpoints", ckdir(), fs::copy_options::recursive);
    const std::optional<int> child =
        run_child({fmt::format("ATTNFORGE_FAULT=checkpoint:{}:kill", n),
                   "FORGE_TEST_KILL_RUN=" + root_.string()},
                  log);
    ASSERT_TRUE(child.has_value());
    const int status = *child;
    if (WIFEXITED(status)) {
      ASSERT_EQ(WEXITSTATUS(status), 0) << read_file(log);
      break;
    }
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status << "\n"
                                                                    << read_file(log);
    for (const auto& e : fs::directory_iterator(ckdir())) {
      if (e.path().filename().string().find(".tmp-") == std::string::npos || !e.is_directory())
        continue;
      for (const auto& f : fs::directory_iterator(e.path()))
        left[f.path().filename().string()].push_back(read_file(f.path()));
    }
    auto m = manager(2, 1, "acc");
    ASSERT_TRUE(m.latest());
    EXPECT_FALSE(m.damaged_latest()) << *m.damaged_latest();
    const Checkpoint r = read_checkpoint(*m.latest());
    if (*m.latest() == path(3)) {
      EXPECT_EQ(news, 0) << "went back to the old checkpoint";
      ++olds;
      EXPECT_TRUE(same_tensors(r.model, make_checkpoint(3).model));
    } else {
      ASSERT_EQ(*m.latest(), path(4));
      ++news;
      EXPECT_TRUE(same_tensors(r.model, make_checkpoint(4).model));
      EXPECT_EQ(r.state.at("step").as_int(), 400);
    }
  }
  // The child that was not killed wrote the whole files; each killed write left its first half.
  for (const char* name : {"model.safetensors", "optimizer.safetensors", "state.json"}) {
    const std::string full = read_file(fs::path(path(4)) / name);
    const std::string half = full.substr(0, full.size() / 2);
    EXPECT_NE(std::find(left[name].begin(), left[name].end(), half), left[name].end())
        << name << " was never left half written";
  }
  EXPECT_GE(olds, 5);
  EXPECT_GE(news, 3);
}

// A hook set wrong fails the save loudly instead of letting it run unkilled.
TEST_F(CheckpointManagerTest, KillHookSetWrongIsAnError) {
  const fs::path log = root_ / "child.log";
  for (const auto& [env, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"ATTNFORGE_FAULT=checkpoint:3x:kill"}, "N must be a whole number, found \"3x\""},
           {{"ATTNFORGE_FAULT=checkpoint:3:explode"}, "unknown action 'explode'"},
           {{"ATTNFORGE_FAULT=chekpoint:3:kill"}, "unknown point 'chekpoint'"},
           {{"ATTNFORGE_FAULT=checkpoint"}, "expected POINT:N[:ACTION[:RANK]]"}}) {
    SCOPED_TRACE(says);
    std::vector<std::string> vars = env;
    vars.push_back("FORGE_TEST_KILL_RUN=" + root_.string());
    const std::optional<int> status = run_child(vars, log);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << "status " << *status;
    EXPECT_NE(read_file(log).find(says), std::string::npos) << read_file(log);
    EXPECT_FALSE(fs::exists(path(4)));
  }
}

}  // namespace
}  // namespace forge::train
