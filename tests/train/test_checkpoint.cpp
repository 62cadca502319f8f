// Checkpoints: bit-exact round trips, atomic replacement under a simulated
// crash at every write step (with RENAME_EXCHANGE and with the rename-aside
// fallback), rejection of corrupt checkpoints without touching them. The
// CheckpointManager's: test_checkpoint_manager.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
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

TEST_F(CheckpointTest, RoundTripIsBitExact) {
  const Checkpoint c = make_checkpoint(7);
  const std::string dir = (root_ / "ckpt").string();
  write_checkpoint(dir, c);
  EXPECT_EQ(names_in(dir),
            (std::set<std::string>{"model.safetensors", "optimizer.safetensors", "state.json"}));
  EXPECT_EQ(names_in(root_), std::set<std::string>{"ckpt"});  // no leftovers
  const Checkpoint r = read_checkpoint(dir);
  EXPECT_TRUE(same_tensors(r.model, c.model));
  EXPECT_TRUE(same_tensors(r.optimizer, c.optimizer));
  EXPECT_EQ(r.recipe_yaml, c.recipe_yaml);
  EXPECT_EQ(r.state, c.state);
  EXPECT_EQ(r.state.at("rng").at(0).as_uint(), 0xfedcba9876543210ULL);
  EXPECT_EQ(r.model.at("steps").to_vector<int64_t>()[0], std::numeric_limits<int64_t>::min());
  EXPECT_TRUE(std::signbit(r.model.at("blocks.0.b").to_vector<double>()[0]));

  // The tags a reader of plain safetensors sees.
  const auto model = safetensors::load((fs::path(dir) / "model.safetensors").string());
  EXPECT_EQ(model.metadata.at("format"), kCheckpointFormat);
  EXPECT_EQ(model.metadata.at("recipe"), c.recipe_yaml);
}

TEST_F(CheckpointTest, EmptyOptimizerAndNullState) {
  Checkpoint c = make_checkpoint(1);
  c.optimizer.clear();  // SGD without momentum keeps no state
  c.state = json::Value();
  const std::string dir = (root_ / "ckpt").string();
  write_checkpoint(dir, c);
  const Checkpoint r = read_checkpoint(dir);
  EXPECT_TRUE(r.optimizer.empty());
  EXPECT_TRUE(r.state.is_object());
  EXPECT_EQ(r.state.size(), 0u);
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.at(0);
}

// What the checksums cover, as a plain safetensors reader sees them.
TEST_F(CheckpointTest, EveryFileIsChecksummed) {
  const Checkpoint c = make_checkpoint(3);
  const fs::path dir = root_ / "ckpt";
  write_checkpoint(dir.string(), c);
  const auto model = safetensors::load((dir / "model.safetensors").string());
  const auto optimizer = safetensors::load((dir / "optimizer.safetensors").string());
  EXPECT_TRUE(model.checksummed);
  EXPECT_TRUE(optimizer.checksummed);
  EXPECT_EQ(optimizer.metadata.at("state_json_xxh3_64"),
            safetensors::checksum_hex(read_file(dir / "state.json")));
  EXPECT_EQ(model.metadata.count("state_json_xxh3_64"), 0u);
  EXPECT_TRUE(read_checkpoint(dir.string()).warnings.empty());
}

// The weights file depends on nothing but the weights and the recipe: the
// wall times in state.json (and its checksum) stay out of it.
TEST_F(CheckpointTest, TheModelFileIsTheSameForTheSameWeights) {
  Checkpoint a = make_checkpoint(5), b = make_checkpoint(5);
  a.state["elapsed_s"] = 1.25;
  b.state["elapsed_s"] = 99.5;
  write_checkpoint((root_ / "a").string(), a);
  write_checkpoint((root_ / "b").string(), b);
  EXPECT_EQ(read_file(root_ / "a" / "model.safetensors"),
            read_file(root_ / "b" / "model.safetensors"));
  EXPECT_NE(read_file(root_ / "a" / "state.json"), read_file(root_ / "b" / "state.json"));
}

// Checkpoints written before checksums load as they are, with a warning.
TEST_F(CheckpointTest, WrittenWithoutChecksumsLoadsWithAWarning) {
  Checkpoint c = make_checkpoint(4);
  const fs::path dir = root_ / "old";
  write_checkpoint(dir.string(), c);
  strip_checksums(dir);
  ASSERT_FALSE(safetensors::load((dir / "model.safetensors").string()).checksummed);
  const Checkpoint r = read_checkpoint(dir.string());
  EXPECT_TRUE(same(r, c));
  EXPECT_EQ(r.warnings,
            std::vector<std::string>{dir.string() + ": written without checksums (an older "
                                                    "attnforge); its bytes cannot be verified"});
  // An optimizer without tensors carries no checksums either way.
  c.optimizer.clear();
  write_checkpoint(dir.string(), c);
  strip_checksums(dir);
  EXPECT_EQ(read_checkpoint(dir.string()).warnings.size(), 1u);
}

TEST_F(CheckpointTest, OverwriteReplacesTheWholeDirectory) {
  const std::string dir = (root_ / "ckpt").string();
  write_checkpoint(dir, make_checkpoint(1));
  write_file(fs::path(dir) / "stray.txt", "from the old checkpoint");
  const Checkpoint b = make_checkpoint(2);
  write_checkpoint(dir + "/", b);  // a trailing slash names the same directory
  EXPECT_TRUE(same(read_checkpoint(dir), b));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "stray.txt"));
  EXPECT_EQ(names_in(root_), std::set<std::string>{"ckpt"});
}

TEST_F(CheckpointTest, RejectsABadStateBeforeWritingAnything) {
  Checkpoint c = make_checkpoint(1);
  c.state = json::Value(json::Array{json::Value(1)});
  expect_error([&] { write_checkpoint((root_ / "ckpt").string(), c); }, {"JSON object", "array"});
  c.state = json::Value(json::Object{{"loss", json::Value(std::nan(""))}});
  EXPECT_THROW(write_checkpoint((root_ / "ckpt").string(), c), Error);
  EXPECT_TRUE(names_in(root_).empty());
}

// A crash at write step n of a write over an existing checkpoint, for every n:
// `dir` always reads back whole, the old checkpoint until the commit and the
// new one after it; the next write succeeds and leaves no leftovers.
void crash_at_every_step(const fs::path& root, bool exchange) {
  set_checkpoint_rename_exchange(exchange);
  const fs::path dir = root / "ckpt", original = root / "original";
  const Checkpoint a = make_checkpoint(1), b = make_checkpoint(2);
  write_checkpoint(original.string(), a);
  int olds = 0, news = 0, asides = 0;
  std::set<std::string> steps;
  int n = 1;
  for (;; ++n) {
    ASSERT_LT(n, 50) << "the fault never stopped firing";
    fs::remove_all(dir);
    fs::copy(original, dir, fs::copy_options::recursive);
    fault::arm({.point = "checkpoint", .at = n});
    const std::string msg = error_of([&] { write_checkpoint(dir.string(), b); }, IfNoError::allow);
    if (msg.empty()) break;
    EXPECT_NE(msg.find("simulated crash"), std::string::npos) << msg;
    steps.insert(msg.substr(msg.find("simulated crash")));
    if (!fs::exists(dir)) {
      // Only between the two renames of the fallback: the old checkpoint is aside.
      ASSERT_FALSE(exchange) << "step " << n << ": " << msg;
      const fs::path aside = dir.string() + ".old-" + std::to_string(::getpid());
      ASSERT_TRUE(fs::exists(aside)) << "step " << n;
      EXPECT_TRUE(same(read_checkpoint(aside.string()), a));
      expect_error([&] { read_checkpoint(dir.string()); }, {dir.string(), aside.string()});
      ++asides;
      // The next write restores it before building its own.
      fault::arm({.point = "checkpoint", .at = 1});
      EXPECT_THROW(write_checkpoint(dir.string(), make_checkpoint(3)), Error);
      EXPECT_TRUE(same(read_checkpoint(dir.string()), a)) << "step " << n;
      continue;
    }
    const Checkpoint r = read_checkpoint(dir.string());
    if (same(r, a)) {
      EXPECT_EQ(news, 0) << "step " << n << " went back to the old checkpoint";
      ++olds;
    } else {
      EXPECT_TRUE(same(r, b)) << "step " << n << ": neither the old nor the new checkpoint";
      ++news;
    }
  }
  // Every step fired once: create, 3 files, fsync, the commit, cleanup, fsync.
  EXPECT_EQ(static_cast<int>(steps.size()), n - 1);
  EXPECT_GE(n - 1, exchange ? 8 : 9);
  EXPECT_GE(olds, 5);
  EXPECT_GE(news, 2);
  EXPECT_EQ(asides, exchange ? 0 : 1);
  // The write that did not fail succeeded and removed every leftover.
  EXPECT_TRUE(same(read_checkpoint(dir.string()), b));
  EXPECT_EQ(names_in(root), (std::set<std::string>{"ckpt", "original"}));
}

TEST_F(CheckpointTest, CrashAtEveryWriteStepWithRenameExchange) {
  crash_at_every_step(root_, true);
}

TEST_F(CheckpointTest, CrashAtEveryWriteStepWithRenameAside) {
  crash_at_every_step(root_, false);
}

TEST_F(CheckpointTest, CrashDuringAFileWriteLeavesATruncatedTempFile) {
  const fs::path dir = root_ / "ckpt";
  const Checkpoint a = make_checkpoint(1), b = make_checkpoint(2);
  write_checkpoint(dir.string(), a);
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  // Find the step that writes model.safetensors.
  bool found = false;
  for (int n = 1; n < 10 && !found; ++n) {
    fault::arm({.point = "checkpoint", .at = n});
    const std::string msg = error_of([&] { write_checkpoint(dir.string(), b); }, IfNoError::allow);
    ASSERT_FALSE(msg.empty());
    found = msg.find("write model.safetensors") != std::string::npos;
  }
  ASSERT_TRUE(found);
  const fs::path half = tmp / "model.safetensors";
  ASSERT_TRUE(fs::exists(half));
  const std::string half_bytes = read_file(half);
  expect_error([&] { read_checkpoint(tmp.string()); }, {"model.safetensors"});
  EXPECT_TRUE(same(read_checkpoint(dir.string()), a));

  // A leftover a kill left (a temp directory with a file cut short) is removed
  // by the next write, which succeeds.
  write_file(tmp / "state.json", "{\"step\": 1");
  write_checkpoint(dir.string(), b);
  EXPECT_TRUE(same(read_checkpoint(dir.string()), b));
  EXPECT_EQ(names_in(root_), std::set<std::string>{"ckpt"});
  // What the crash left was the first half of the file this write made whole.
  const std::string full = read_file(dir / "model.safetensors");
  EXPECT_EQ(half_bytes, full.substr(0, full.size() / 2));
}

// Corrupts a copy of a good checkpoint with `corrupt`, then checks that reading
// it fails naming `file` (and each of `parts`) and changes no byte on disk.
class CorruptCheckpoint : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    good_ = root_ / "good";
    write_checkpoint(good_.string(), make_checkpoint(5));
  }
  template <typename F>
  void expect_rejected(F&& corrupt, const std::string& file, std::vector<std::string> parts = {}) {
    const fs::path dir = root_ / fmt::format("bad{}", count_++);
    fs::copy(good_, dir, fs::copy_options::recursive);
    corrupt(dir);
    const auto before = snapshot(dir);
    const auto listing = names_in(root_);
    parts.push_back((dir / file).string());
    expect_error([&] { read_checkpoint(dir.string()); }, parts);
    EXPECT_EQ(snapshot(dir), before) << "reading changed the files";
    EXPECT_EQ(names_in(root_), listing) << "reading created or removed something";
  }
  fs::path good_;
  int count_ = 0;
};

TEST_F(CorruptCheckpoint, TruncatedSafetensorsAtSeveralSizes) {
  const std::string model = read_file(good_ / "model.safetensors");
  uint64_t header = 0;
  std::memcpy(&header, model.data(), 8);
  for (const size_t size : std::vector<size_t>{0, 5, 8, 9, 8 + header / 2, 8 + header - 1,
                                               8 + header, 8 + header + 3, model.size() - 1}) {
    SCOPED_TRACE(size);
    expect_rejected(
        [&](const fs::path& d) { write_file(d / "model.safetensors", model.substr(0, size)); },
        "model.safetensors");
  }
  const std::string optimizer = read_file(good_ / "optimizer.safetensors");
  for (const size_t size : std::vector<size_t>{3, optimizer.size() / 2, optimizer.size() - 8}) {
    SCOPED_TRACE(size);
    expect_rejected(
        [&](const fs::path& d) {
          write_file(d / "optimizer.safetensors", optimizer.substr(0, size));
        },
        "optimizer.safetensors");
  }
}

TEST_F(CorruptCheckpoint, FlippedHeaderBytes) {
  const std::string model = read_file(good_ / "model.safetensors");
  uint64_t header = 0;
  std::memcpy(&header, model.data(), 8);
  const size_t close = model.rfind('}', 8 + header);
  // The header length (moved by 8 bytes, or far past the end), the opening
  // brace ('{' -> '['), the closing brace, and a quote ending a name.
  for (const auto& [pos, mask] : std::vector<std::pair<size_t, char>>{
           {0, 0x08}, {5, 0x01}, {8, 0x20}, {close, 0x20}, {model.find("\":", 8), 0x01}}) {
    SCOPED_TRACE(pos);
    std::string bad = model;
    bad[pos] = static_cast<char>(bad[pos] ^ mask);
    expect_rejected([&](const fs::path& d) { write_file(d / "model.safetensors", bad); },
                    "model.safetensors");
  }
}

TEST_F(CorruptCheckpoint, MissingOrBadStateJson) {
  expect_rejected([](const fs::path& d) { fs::remove(d / "state.json"); }, "state.json",
                  {"missing"});
  expect_rejected([](const fs::path& d) { write_file(d / "state.json", "{\"step\": 12, \"ep"); },
                  "state.json", {"invalid JSON"});
  expect_rejected([](const fs::path& d) { write_file(d / "state.json", "\x89PNG garbage"); },
                  "state.json");
  expect_rejected([](const fs::path& d) { write_file(d / "state.json", "[1, 2]"); }, "state.json",
                  {"expected a JSON object"});
}

TEST_F(CorruptCheckpoint, MissingSafetensors) {
  expect_rejected([](const fs::path& d) { fs::remove(d / "model.safetensors"); },
                  "model.safetensors", {"missing"});
  expect_rejected([](const fs::path& d) { fs::remove(d / "optimizer.safetensors"); },
                  "optimizer.safetensors", {"missing"});
}

// Format 2 carries the model card in model.safetensors' __metadata__; a
// format-1 checkpoint (no card) still reads, with no card.
TEST_F(CorruptCheckpoint, TheCardTravelsAndFormatOneStillReads) {
  Checkpoint c = make_checkpoint(6);
  c.card["task"] = "classification";
  c.card["classes"] = json::Value(json::Array{json::Value("cat"), json::Value("dog")});
  const fs::path dir = root_ / "card";
  write_checkpoint(dir.string(), c);
  const Checkpoint back = read_checkpoint(dir.string());
  EXPECT_EQ(json::dump(back.card), json::dump(c.card));
  EXPECT_EQ(safetensors::load((dir / "model.safetensors").string()).metadata.at("format"),
            "attnforge-checkpoint-2");
  safetensors::save((dir / "model.safetensors").string(), c.model,
                    {{"format", "attnforge-checkpoint-1"}, {"recipe", c.recipe_yaml}});
  const Checkpoint old = read_checkpoint(dir.string());
  EXPECT_TRUE(old.card.is_null());
  EXPECT_EQ(old.recipe_yaml, c.recipe_yaml);
}

TEST_F(CorruptCheckpoint, WrongOrMissingTags) {
  const Checkpoint c = make_checkpoint(5);
  expect_rejected(
      [&](const fs::path& d) {
        safetensors::save((d / "model.safetensors").string(), c.model,
                          {{"format", "attnforge-checkpoint-0"}, {"recipe", c.recipe_yaml}});
      },
      "model.safetensors", {"attnforge-checkpoint-0", kCheckpointFormat});
  // A format from a newer attnforge is named as such, not as damage.
  expect_rejected(
      [&](const fs::path& d) {
        safetensors::save((d / "model.safetensors").string(), c.model,
                          {{"format", "attnforge-checkpoint-9"}, {"recipe", c.recipe_yaml}});
      },
      "model.safetensors", {"checkpoint format 9", "newer attnforge", "formats 1 to 2", "upgrade"});
  expect_rejected(
      [&](const fs::path& d) {
        safetensors::save((d / "model.safetensors").string(), c.model, {{"recipe", "x"}});
      },
      "model.safetensors", {"no \"format\""});
  expect_rejected(
      [&](const fs::path& d) {
        safetensors::save((d / "model.safetensors").string(), c.model,
                          {{"format", kCheckpointFormat}});
      },
      "model.safetensors", {"recipe"});
  expect_rejected(
      [&](const fs::path& d) {
        safetensors::save((d / "optimizer.safetensors").string(), c.optimizer, {{"format", "pt"}});
      },
      "optimizer.safetensors", {"\"pt\""});
}

TEST_F(CorruptCheckpoint, FlippedTensorAndStateBytes) {
  expect_rejected(
      [](const fs::path& d) { flip_tensor_byte(d / "model.safetensors", "blocks.0.w"); },
      "model.safetensors", {"tensor \"blocks.0.w\"", "checksum mismatch", "corrupt"});
  expect_rejected([](const fs::path& d) { flip_tensor_byte(d / "model.safetensors", "steps"); },
                  "model.safetensors", {"tensor \"steps\"", "checksum mismatch"});
  expect_rejected(
      [](const fs::path& d) {
        flip_tensor_byte(d / "optimizer.safetensors", "state.0.exp_avg_sq");
      },
      "optimizer.safetensors", {"tensor \"state.0.exp_avg_sq\"", "checksum mismatch"});
  const std::string recorded = safetensors::checksum_hex(read_file(good_ / "state.json"));
  expect_rejected([](const fs::path& d) { change_state_digit(d); }, "state.json",
                  {"checksum mismatch", "optimizer.safetensors", recorded, "corrupt"});
}

TEST_F(CorruptCheckpoint, ChecksumsOnSomeFilesOnly) {
  expect_rejected(
      [](const fs::path& d) { strip_metadata(d / "optimizer.safetensors", "xxh3_64:"); },
      "optimizer.safetensors", {"carry none", "model.safetensors"});
  expect_rejected([](const fs::path& d) { strip_metadata(d / "model.safetensors", "xxh3_64:"); },
                  "model.safetensors", {"carry none"});
  expect_rejected(
      [](const fs::path& d) { strip_metadata(d / "optimizer.safetensors", "state_json_xxh3_64"); },
      "state.json", {"carry none"});
  // Files from an old checkpoint beside those of a new one.
  expect_rejected(
      [](const fs::path& d) {
        strip_metadata(d / "optimizer.safetensors", "xxh3_64:");
        strip_metadata(d / "optimizer.safetensors", "state_json_xxh3_64");
      },
      "optimizer.safetensors", {"model.safetensors carry checksums"});
}

TEST_F(CheckpointTest, MissingDirectory) {
  expect_error([&] { read_checkpoint((root_ / "nowhere").string()); },
               {(root_ / "nowhere").string(), "not found"});
}

}  // namespace
}  // namespace forge::train
