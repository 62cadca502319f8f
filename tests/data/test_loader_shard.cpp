// DataLoader shards for data parallelism: for 2, 3 and 4 processes the slices
// of every global batch, concatenated in process order, are bitwise the batch
// of a single process (shuffled and augmented images, mixup, cutmix, sequences
// padded to the batch's longest or to pad_to, with targets and second inputs),
// the partial last batch splits unevenly (down to an empty slice), global_scored
// is the single process's, workers change nothing, a slice builds only the rows
// it depends on, and a batch_size that does not split evenly is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "data/loader.h"
#include "data/mixup.h"
#include "tests/data/data_test_util.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

using namespace forge::testing;

// f32 [C, H, W] images, element k of image i = 1000 i + k, plus rng->uniform()
// on every element so that the augmentation stream shows in the batch.
class ShardImages : public CountingDataset {
 public:
  ShardImages(int64_t n, Shape shape = {2, 3, 4}) : CountingDataset(n), shape_(std::move(shape)) {}
  Example get(int64_t i, Rng* rng) const override {
    count_get();
    Example ex;
    ex.input = counting_image(i, shape_);
    if (rng) {
      float* p = ex.input.data<float>();
      for (int64_t k = 0; k < ex.input.numel(); ++k) p[k] += static_cast<float>(rng->uniform());
    }
    ex.label = i % 5;
    return ex;
  }
  int64_t num_classes() const override { return 5; }
  std::string describe() const override { return "shard test images"; }

 private:
  Shape shape_;
};

// i64 sequences of length 1 + 5i % 7, tokens 100 i + k + 1, the first one
// moved by the augmentation stream; pairs add a second document of length
// 1 + 3i % 4; targets are as long as input2 (pairs) or input.
class ShardSequences : public CountingDataset {
 public:
  ShardSequences(int64_t n, bool pairs, bool targets)
      : CountingDataset(n), pairs_(pairs), targets_(targets) {}
  Example get(int64_t i, Rng* rng) const override {
    count_get();
    Example ex;
    ex.input = counting_tokens(i, 1 + 5 * i % 7);
    if (rng) ex.input.data<int64_t>()[0] += 10000 * rng->randint(9);
    if (pairs_) ex.input2 = counting_tokens(i + 50, 1 + 3 * i % 4);
    if (targets_) ex.target = counting_tokens(i + 70, pairs_ ? 1 + 3 * i % 4 : 1 + 5 * i % 7);
    ex.label = i % 2;
    return ex;
  }
  int64_t num_classes() const override { return 2; }
  std::string describe() const override { return "shard test sequences"; }

 private:
  bool pairs_;
  bool targets_;
};

const std::vector<Tensor Batch::*> kTensors = {&Batch::input,    &Batch::mask,   &Batch::input2,
                                               &Batch::mask2,    &Batch::target, &Batch::label,
                                               &Batch::label_mix};

// The slices of one global batch, in process order, stacked back into one batch.
Batch concat(const std::vector<Batch>& parts) {
  Batch out;
  for (Tensor Batch::*field : kTensors) {
    const Tensor& first = parts[0].*field;
    bool consistent = true;
    for (const Batch& p : parts) {
      const Tensor& t = p.*field;
      consistent = consistent && t.defined() == first.defined();
      if (consistent && t.defined())
        consistent = t.dtype() == first.dtype() && t.dim() == first.dim() &&
                     Shape(t.shape().begin() + 1, t.shape().end()) ==
                         Shape(first.shape().begin() + 1, first.shape().end());
    }
    EXPECT_TRUE(consistent) << "the slices disagree on which tensors they have, or their shapes";
    if (!consistent || !first.defined()) continue;
    Shape shape = first.shape();
    shape[0] = 0;
    for (const Batch& p : parts) shape[0] += (p.*field).size(0);
    Tensor t = Tensor::empty(shape, first.dtype());
    char* dst = static_cast<char*>(t.raw_data());
    for (const Batch& p : parts) {
      const Tensor& part = p.*field;
      if (part.nbytes()) std::memcpy(dst, part.raw_data(), part.nbytes());
      dst += part.nbytes();
    }
    out.*field = t;
  }
  out.mix_lambda = parts[0].mix_lambda;
  for (const Batch& p : parts) {
    EXPECT_EQ(p.mix_lambda, out.mix_lambda);
    out.size += p.size;
    out.tokens += p.tokens;
    out.padded = out.padded || p.padded;
    out.padded2 = out.padded2 || p.padded2;
    out.indices.insert(out.indices.end(), p.indices.begin(), p.indices.end());
  }
  return out;
}

int64_t count_true(const Tensor& mask) {
  const bool* m = mask.data<bool>();
  return std::count(m, m + mask.numel(), true);
}

// The slices of `whole` (the single process's batch) concatenate to it, and
// each says where it sits in it.
void expect_slices_of(const std::vector<Batch>& parts, const Batch& whole) {
  const Batch got = concat(parts);
  for (Tensor Batch::*field : kTensors) EXPECT_TRUE(same_tensor(got.*field, whole.*field));
  EXPECT_EQ(got.mix_lambda, whole.mix_lambda);
  EXPECT_EQ(got.size, whole.size);
  EXPECT_EQ(got.tokens, whole.tokens);
  EXPECT_EQ(got.padded, whole.padded);
  EXPECT_EQ(got.padded2, whole.padded2);
  EXPECT_EQ(got.indices, whole.indices);
  EXPECT_EQ(whole.global_offset, 0);
  EXPECT_EQ(whole.global_size, whole.size);
  int64_t offset = 0;
  for (const Batch& p : parts) {
    EXPECT_EQ(p.global_offset, offset);
    EXPECT_EQ(p.global_size, whole.size);
    EXPECT_EQ(p.global_scored, whole.global_scored);
    EXPECT_EQ(p.input.size(0), p.size);
    EXPECT_EQ(static_cast<int64_t>(p.indices.size()), p.size);
    offset += p.size;
  }
}

// For 2, 3 and 4 processes, with 0 and 2 workers: every batch of two epochs,
// split over the processes, against the single process's batch. With workers
// the slices come from next(), without from build(). Returns the number of
// mixed batches seen.
int64_t expect_shards_match(const DatasetPtr& data, const LoaderOptions& options) {
  DataLoader whole(data, options);
  int64_t mixed = 0;
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t b = 0; b < whole.batches_per_epoch(); ++b)
      mixed += whole.build(e, b).label_mix.defined();
  for (int64_t count : {2, 3, 4}) {
    for (int workers : {0, 2}) {
      SCOPED_TRACE(::testing::Message() << count << " processes, " << workers << " workers");
      std::vector<std::unique_ptr<DataLoader>> shards;
      for (int64_t index = 0; index < count; ++index) {
        LoaderOptions o = options;
        o.shard_index = index;
        o.shard_count = count;
        o.workers = workers;
        shards.push_back(std::make_unique<DataLoader>(data, o));
        EXPECT_EQ(shards.back()->batches_per_epoch(), whole.batches_per_epoch());
      }
      for (int64_t e = 0; e < 2; ++e) {
        for (int64_t b = 0; b < whole.batches_per_epoch(); ++b) {
          SCOPED_TRACE(::testing::Message() << "epoch " << e << ", batch " << b);
          std::vector<Batch> parts;
          for (auto& shard : shards) {
            if (workers == 0) {
              parts.push_back(shard->build(e, b));
            } else {
              Batch x;
              EXPECT_TRUE(shard->next(x));
              parts.push_back(std::move(x));
            }
          }
          expect_slices_of(parts, whole.build(e, b));
        }
        Batch end;
        if (workers) {
          for (auto& shard : shards) EXPECT_FALSE(shard->next(end));
        }
      }
    }
  }
  return mixed;
}

LoaderOptions shard_options(int64_t batch_size, uint64_t seed) {
  return LoaderOptions{.batch_size = batch_size, .shuffle = true, .seed = seed, .augment = true};
}

// shard_options with the mixup / cutmix transform of `m`.
LoaderOptions mixed_options(int64_t batch_size, uint64_t seed, const MixupOptions& m) {
  LoaderOptions o = shard_options(batch_size, seed);
  o.transform = make_mixup(m);
  return o;
}

// 27 examples in batches of 12 end with 3 rows (4 processes: 0, 1, 1, 1;
// 2 processes: 1, 2); 31 end with 7 (3 processes: 2, 2, 3).
TEST(DataLoaderShard, AugmentedImagesSplitIntoTheSingleProcessBatch) {
  for (int64_t n : {27, 31, 48}) {
    SCOPED_TRACE(n);
    expect_shards_match(std::make_shared<ShardImages>(n), shard_options(12, 3));
  }
}

TEST(DataLoaderShard, MixupPairsRowsAcrossProcesses) {
  for (int64_t n : {27, 31}) {
    SCOPED_TRACE(n);
    const LoaderOptions o = mixed_options(12, 5, {.mixup_alpha = 1.0});
    EXPECT_GT(expect_shards_match(std::make_shared<ShardImages>(n), o), 0);
  }
}

TEST(DataLoaderShard, CutmixPairsRowsAcrossProcesses) {
  for (int64_t n : {27, 31}) {
    SCOPED_TRACE(n);
    const LoaderOptions o = mixed_options(12, 7, {.cutmix_alpha = 1.0});
    EXPECT_GT(expect_shards_match(std::make_shared<ShardImages>(n, Shape{3, 8, 8}), o), 0);
  }
}

TEST(DataLoaderShard, MixupOrCutmixSometimesUnmixed) {
  const LoaderOptions o =
      mixed_options(12, 11, {.mixup_alpha = 0.8, .cutmix_alpha = 1.0, .prob = 0.6});
  expect_shards_match(std::make_shared<ShardImages>(31), o);
}

TEST(DataLoaderShard, SequencesPadToTheGlobalBatchsLongest) {
  for (bool pairs : {false, true}) {
    for (bool targets : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "pairs " << pairs << ", targets " << targets);
      expect_shards_match(std::make_shared<ShardSequences>(31, pairs, targets),
                          shard_options(12, 13));
    }
  }
}

TEST(DataLoaderShard, SequencesPaddedToPadTo) {
  for (bool pairs : {false, true}) {
    for (bool targets : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "pairs " << pairs << ", targets " << targets);
      LoaderOptions o = shard_options(12, 17);
      o.pad_to = 9;
      expect_shards_match(std::make_shared<ShardSequences>(27, pairs, targets), o);
    }
  }
}

TEST(DataLoaderShard, GlobalScoredCountsTheGlobalBatchsTargetTokens) {
  auto lm = std::make_shared<ShardSequences>(27, false, true);
  auto s2s = std::make_shared<ShardSequences>(27, true, true);
  auto cls = std::make_shared<ShardSequences>(27, true, false);
  const LoaderOptions o = shard_options(12, 19);
  const Batch a = DataLoader(lm, o).build(0, 1), b = DataLoader(s2s, o).build(0, 1);
  const Batch c = DataLoader(cls, o).build(0, 2);
  EXPECT_EQ(a.global_scored, count_true(a.mask));
  EXPECT_EQ(b.global_scored, count_true(b.mask2));
  EXPECT_EQ(c.global_scored, 3);
  EXPECT_EQ(DataLoader(std::make_shared<ShardImages>(27), o).build(0, 2).global_scored, 3);
  LoaderOptions sharded = o;
  sharded.shard_count = 4;
  sharded.shard_index = 3;
  const Batch part = DataLoader(lm, sharded).build(0, 1);
  EXPECT_EQ(part.size, 3);
  EXPECT_EQ(part.global_scored, a.global_scored);
  EXPECT_EQ(part.tokens, count_true(part.mask));
}

TEST(DataLoaderShard, APartialLastBatchMayLeaveAProcessNoRows) {
  LoaderOptions o = mixed_options(12, 23, {.mixup_alpha = 1.0});
  o.shard_count = 4;
  auto images = std::make_shared<ShardImages>(27);
  const Batch whole = DataLoader(images, shard_options(12, 23)).build(1, 2);
  ASSERT_EQ(whole.size, 3);
  const Batch empty = DataLoader(images, o).build(1, 2);
  EXPECT_EQ(empty.size, 0);
  EXPECT_TRUE(empty.indices.empty());
  EXPECT_EQ(empty.tokens, 0);
  EXPECT_EQ(empty.input.shape(), (Shape{0, 2, 3, 4}));
  EXPECT_EQ(empty.label.shape(), (Shape{0}));
  EXPECT_EQ(empty.global_offset, 0);
  EXPECT_EQ(empty.global_size, 3);
  EXPECT_EQ(empty.global_scored, 3);
  if (empty.label_mix.defined()) {
    EXPECT_EQ(empty.label_mix.shape(), (Shape{0}));
  }

  LoaderOptions so = shard_options(12, 23);
  so.shard_count = 4;
  auto sequences = std::make_shared<ShardSequences>(27, true, true);
  const Batch whole_seq = DataLoader(sequences, shard_options(12, 23)).build(0, 2);
  const Batch empty_seq = DataLoader(sequences, so).build(0, 2);
  EXPECT_EQ(empty_seq.size, 0);
  EXPECT_EQ(empty_seq.input.shape(), (Shape{0, whole_seq.input.size(1)}));
  EXPECT_EQ(empty_seq.mask2.shape(), (Shape{0, whole_seq.mask2.size(1)}));
  EXPECT_EQ(empty_seq.target.shape(), (Shape{0, whole_seq.target.size(1)}));
  EXPECT_FALSE(empty_seq.padded || empty_seq.padded2);
  EXPECT_EQ(empty_seq.global_scored, whole_seq.global_scored);
}

TEST(DataLoaderShard, ASliceBuildsOnlyTheRowsItDependsOn) {
  LoaderOptions o = shard_options(12, 29);
  o.shard_count = 4;
  o.shard_index = 1;
  {
    auto images = std::make_shared<ShardImages>(48);
    DataLoader(images, o).build(0, 0);
    EXPECT_EQ(images->gets(), 3);  // the slice
  }
  {
    LoaderOptions mixed = o;
    mixed.transform = make_mixup({.cutmix_alpha = 1.0});
    auto images = std::make_shared<ShardImages>(48);
    DataLoader(images, mixed).build(0, 0);
    EXPECT_EQ(images->gets(), 6);  // the slice and its mirror
    mixed.shard_count = 3;         // the middle process is its own mirror
    auto middle = std::make_shared<ShardImages>(48);
    DataLoader(middle, mixed).build(0, 0);
    EXPECT_EQ(middle->gets(), 4);
  }
  {
    auto sequences = std::make_shared<ShardSequences>(48, false, false);
    DataLoader(sequences, o).build(0, 0);
    EXPECT_EQ(sequences->gets(), 12);  // padded to the global batch's longest
    LoaderOptions fixed = o;
    fixed.pad_to = 8;
    auto fixed_sequences = std::make_shared<ShardSequences>(48, false, false);
    DataLoader(fixed_sequences, fixed).build(0, 0);
    EXPECT_EQ(fixed_sequences->gets(), 3);
  }
}

TEST(DataLoaderShard, OneProcessIsTheWholeBatch) {
  auto data = std::make_shared<ShardSequences>(27, false, true);
  const Batch b = DataLoader(data, shard_options(12, 31)).build(0, 0);
  EXPECT_EQ(b.global_offset, 0);
  EXPECT_EQ(b.global_size, 12);
  EXPECT_EQ(b.global_scored, count_true(b.mask));
}

TEST(DataLoaderShard, RefusesABatchThatDoesNotSplitEvenly) {
  auto data = std::make_shared<ShardImages>(60);
  LoaderOptions o = shard_options(30, 0);
  o.shard_count = 4;
  expect_error([&] { DataLoader(data, o); },
               {"batch_size 30 is not divisible by 4 processes", "choose a multiple of 4"});
  o.batch_size = 32;
  o.shard_index = 4;
  expect_error([&] { DataLoader(data, o); }, {"shard_index 4", "4 processes"});
  o.shard_index = -1;
  expect_error([&] { DataLoader(data, o); }, {"shard_index -1"});
  o.shard_index = 0;
  o.shard_count = 0;
  expect_error([&] { DataLoader(data, o); }, {"shard_count must be >= 1", "got 0"});
}

}  // namespace
}  // namespace forge::data
