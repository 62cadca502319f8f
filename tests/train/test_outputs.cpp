// The output rule of every command (train/outputs.h): never into a
// checkpoint (its directory, a run's checkpoints/, through a symbolic link),
// never over an existing file or directory unless told to, and a refusal
// that names what is there and the ways forward.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/test_util.h"
#include "train/outputs.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using namespace forge::testing;

// run/checkpoints/{latest, step-00000002/{model.safetensors, state.json}}
fs::path make_run(const fs::path& root) {
  const fs::path ck = root / "run" / "checkpoints" / "step-00000002";
  fs::create_directories(ck);
  write_file(ck / "model.safetensors", "weights");
  write_file(ck / "state.json", "{}");
  write_file(root / "run" / "checkpoints" / "latest", "step-00000002\n");
  return root / "run";
}

TEST(Outputs, CheckpointAreasAreFoundFromAnyPathInsideThem) {
  const testing::TempDir tmp;
  const fs::path run = make_run(tmp.path());
  const fs::path ck = run / "checkpoints" / "step-00000002";
  EXPECT_EQ(checkpoint_area_of((ck / "model.safetensors").string()), ck.string());
  EXPECT_EQ(checkpoint_area_of((ck / "new" / "deeper.json").string()), ck.string());
  EXPECT_EQ(checkpoint_area_of(ck.string()), ck.string());
  EXPECT_EQ(checkpoint_area_of((run / "checkpoints" / "latest").string()),
            (run / "checkpoints").string());
  EXPECT_EQ(checkpoint_area_of((run / "checkpoints" / "x").string()),
            (run / "checkpoints").string());
  fs::create_directory_symlink(ck, tmp.path() / "link");
  EXPECT_EQ(checkpoint_area_of((tmp.path() / "link" / "state.json").string()), ck.string());
  EXPECT_FALSE(checkpoint_area_of((run / "eval.json").string()));
  EXPECT_FALSE(checkpoint_area_of(run.string()));
  EXPECT_FALSE(checkpoint_area_of((tmp.path() / "elsewhere" / "checkpoints").string()));
}

TEST(Outputs, FilesAreNeverWrittenIntoACheckpointNorOverWhatExistsUnlessTold) {
  const testing::TempDir tmp;
  const fs::path run = make_run(tmp.path());
  const std::string inside = (run / "checkpoints" / "step-00000002" / "model.safetensors").string();
  for (bool overwrite : {false, true})
    expect_error([&] { check_output_file(inside, "eval --out", overwrite); },
                 {"eval --out", inside, "inside the checkpoint directory", "no command writes"});
  const std::string taken = tmp.file("taken.json");
  write_file(taken, "12345");
  expect_error(
      [&] { check_output_file(taken, "predict --out", false); },
      {taken, "exists (a file of 5 bytes)", "nothing was written", "new path", "--overwrite"});
  check_output_file(taken, "predict --out", true);
  check_output_file(tmp.file("new.json"), "predict --out", false);
  expect_error([&] { check_output_file(tmp.str(), "eval --out", true); },
               {"exists and is a directory, not a file"});
  // Directories: the same, and an existing one only with overwrite.
  expect_error(
      [&] {
        check_output_dir((run / "checkpoints" / "maps").string(), "attention-maps --out", true);
      },
      {"inside the checkpoint directory"});
  expect_error([&] { check_output_dir(tmp.str(), "attention-maps --out", false); },
               {"exists (a directory)", "--overwrite"});
  check_output_dir(tmp.str(), "attention-maps --out", true);
  expect_error([&] { check_output_dir(taken, "attention-maps --out", true); }, {"not a directory"});
  EXPECT_EQ(testing::read_file(taken), "12345");
}

}  // namespace
}  // namespace forge::train
