// LoaderOptions::epochs: the workers of a loader read one epoch at a time
// (evaluation) build that epoch's batches and nothing past it, next() still
// gives the following epoch (built in the caller's thread), and a seek back to
// the start builds the epoch again.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "data/loader.h"
#include "tests/data/data_test_util.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

// Image i is f32 [1, 2, 2] filled with i.
class CountingImages : public testing::CountingDataset {
 public:
  using CountingDataset::CountingDataset;
  Example get(int64_t i, Rng*) const override {
    count_get();
    Example ex;
    ex.input = Tensor::full({1, 2, 2}, static_cast<double>(i));
    ex.label = i % 2;
    return ex;
  }
  int64_t num_classes() const override { return 2; }
  std::string describe() const override { return "counting images"; }
};

TEST(LoaderEpochs, WorkersBuildOneEpochAndNothingPastIt) {
  auto data = std::make_shared<CountingImages>(20);
  LoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  o.augment = false;
  o.workers = 2;
  o.prefetch = 8;  // room for far more than an epoch
  o.epochs = 1;
  DataLoader loader(data, o);
  for (int round = 0; round < 2; ++round) {
    loader.seek({0, 0});
    int64_t batches = 0;
    for (Batch b; loader.next(b);) {
      EXPECT_EQ(b.input.to_vector<float>(), loader.build(0, batches).input.to_vector<float>());
      ++batches;
    }
    EXPECT_EQ(batches, 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // Each round: 20 examples by the workers, 20 by the comparisons above.
    EXPECT_EQ(data->gets(), 40 * (round + 1)) << "the workers built past the epoch";
  }
  // The next epoch is still there, built in the caller's thread.
  Batch b;
  ASSERT_TRUE(loader.next(b));
  EXPECT_EQ(b.input.to_vector<float>(), loader.build(1, 0).input.to_vector<float>());
}

TEST(LoaderEpochs, NegativeEpochsAreRefused) {
  LoaderOptions o;
  o.epochs = -1;
  forge::testing::expect_error([&] { DataLoader loader(std::make_shared<CountingImages>(4), o); },
                               {"epochs must be >= 0"});
}

}  // namespace
}  // namespace forge::data
