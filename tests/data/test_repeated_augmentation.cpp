// Repeated augmentation (LoaderOptions::repeats, timm's RepeatAugSampler):
// an epoch keeps its length, visits the first ceil(n / r) indices of its
// shuffled order r times in a row, builds each copy from its own stream (copy 0
// from the stream it has without repeats), and splits over 2 and 3 processes
// into slices that together are the single process's batches, with any number
// of workers.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "data/loader.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

// Image i is one f32 [1, 1, 2] picture: (i, first uniform of its stream).
class StreamImages : public Dataset {
 public:
  explicit StreamImages(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i, Rng* rng) const override {
    Example ex;
    ex.input = Tensor::from_vector(
        std::vector<float>{static_cast<float>(i), rng ? static_cast<float>(rng->uniform()) : -1.0f},
        {1, 1, 2});
    ex.label = i % 3;
    return ex;
  }
  int64_t num_classes() const override { return 3; }
  std::string describe() const override { return "stream images"; }

 private:
  int64_t n_;
};

LoaderOptions options(int64_t repeats, int64_t batch = 6) {
  return {.batch_size = batch, .seed = 11, .repeats = repeats};
}

// Rows of a batch as (dataset index, augmentation draw).
std::vector<std::pair<int64_t, float>> rows(const Batch& b) {
  std::vector<std::pair<int64_t, float>> out;
  const float* p = b.input.data<float>();
  for (int64_t r = 0; r < b.size; ++r)
    out.emplace_back(static_cast<int64_t>(p[2 * r]), p[2 * r + 1]);
  return out;
}

TEST(RepeatedAugmentation, EpochKeepsItsLengthAndRepeatsEachIndexInARow) {
  const int64_t n = 20;
  auto data = std::make_shared<StreamImages>(n);
  DataLoader plain(data, options(1)), repeated(data, options(3));
  EXPECT_EQ(repeated.batches_per_epoch(), plain.batches_per_epoch());
  for (int64_t epoch : {0, 1}) {
    const auto shuffled = plain.permutation(epoch);
    const auto order = repeated.permutation(epoch);
    ASSERT_EQ(order->size(), static_cast<size_t>(n));
    for (size_t p = 0; p < order->size(); ++p) EXPECT_EQ((*order)[p], (*shuffled)[p / 3]) << p;
    // ceil(20 / 3) = 7 distinct images: 6 three times, the 7th twice (cut at n).
    std::map<int64_t, int> count;
    for (int64_t i : *order) ++count[i];
    EXPECT_EQ(count.size(), 7u);
    EXPECT_EQ(count[(*shuffled)[6]], 2);
  }
}

TEST(RepeatedAugmentation, EachCopyHasItsOwnStreamAndCopyZeroKeepsTheUsualOne) {
  auto data = std::make_shared<StreamImages>(12);
  const LoaderOptions o = options(3);
  DataLoader loader(data, o);
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    const auto got = rows(loader.build(0, b));
    for (size_t r = 0; r < got.size(); ++r) {
      const int64_t p = b * o.batch_size + static_cast<int64_t>(r);
      const auto copy = static_cast<uint64_t>(p % 3);
      const auto i = static_cast<uint64_t>(got[r].first);
      Rng expected(copy == 0 ? Rng::mix({o.seed, 0, i, 1}) : Rng::mix({o.seed, 0, i, 1, copy}));
      EXPECT_EQ(got[r].second, static_cast<float>(expected.uniform())) << "row " << p;
    }
    // The copies of one image differ in their augmentation.
    std::set<float> draws;
    for (const auto& [i, u] : got) draws.insert(u);
    EXPECT_EQ(draws.size(), got.size());
  }
}

TEST(RepeatedAugmentation, ShardsTogetherAreTheSingleProcessBatchWithAnyWorkers) {
  const int64_t n = 40;
  auto data = std::make_shared<StreamImages>(n);
  DataLoader single(data, options(3, 12));
  for (int64_t count : {2, 3}) {
    std::vector<std::unique_ptr<DataLoader>> shards;
    for (int64_t k = 0; k < count; ++k) {
      LoaderOptions o = options(3, 12);
      o.shard_index = k;
      o.shard_count = count;
      o.workers = static_cast<int>(k % 2) * 2;
      shards.push_back(std::make_unique<DataLoader>(data, o));
    }
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      for (int64_t b = 0; b < single.batches_per_epoch(); ++b) {
        const auto whole = rows(single.build(epoch, b));
        std::vector<std::pair<int64_t, float>> joined;
        for (auto& s : shards) {
          Batch part;
          ASSERT_TRUE(s->next(part));
          const auto r = rows(part);
          joined.insert(joined.end(), r.begin(), r.end());
        }
        EXPECT_EQ(joined, whole) << count << " shards, epoch " << epoch << " batch " << b;
      }
      for (auto& s : shards) {
        Batch end;
        EXPECT_FALSE(s->next(end));
      }
    }
  }
}

TEST(RepeatedAugmentation, RepeatsBelowOneAreRefused) {
  forge::testing::expect_error(
      [] { DataLoader loader(std::make_shared<StreamImages>(4), options(0)); },
      {"repeats must be >= 1"});
}

}  // namespace
}  // namespace forge::data
