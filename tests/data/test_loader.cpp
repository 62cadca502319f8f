// DataLoader and collate: batches depend only on (seed, epoch, batch) whatever
// the number of workers, every index once per epoch, drop_last, seeking to a
// saved position across an epoch boundary, errors from worker threads, clean
// shutdown while workers are busy, the bounded prefetch queue, and padding
// (inputs, second inputs and next-token targets).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <set>
#include <thread>

#include "data/loader.h"
#include "data/random.h"
#include "tests/data/data_test_util.h"
#include "tests/test_util.h"

namespace forge::data {
namespace {

using namespace forge::testing;

// f32 [C, H, W] images, element k of image i = 1000 i + k; element 0 also
// gets rng->uniform() so that the augmentation stream shows in the batch.
class ImageSet : public CountingDataset {
 public:
  ImageSet(int64_t n, Shape shape = {1, 2, 3}) : CountingDataset(n), shape_(std::move(shape)) {}
  Example get(int64_t i, Rng* rng) const override {
    count_get();
    Example ex;
    ex.input = counting_image(i, shape_);
    if (rng) ex.input.data<float>()[0] += static_cast<float>(rng->uniform());
    ex.label = i % 7;
    return ex;
  }
  int64_t num_classes() const override { return 7; }
  std::string describe() const override { return "test images"; }

 private:
  Shape shape_;
};

// i64 token sequences of length 1 + i % 5, tokens 100 i + k + 1; pairs add a
// second document of length 1 + i % 3. With targets, each example has a
// target as long as input2 (pairs) or input, tokens 100 (i + 70) + k + 1.
class SequenceSet : public Dataset {
 public:
  SequenceSet(int64_t n, bool pairs = false, bool targets = false)
      : n_(n), pairs_(pairs), targets_(targets) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i, Rng*) const override {
    Example ex;
    ex.input = counting_tokens(i, 1 + i % 5);
    if (pairs_) ex.input2 = counting_tokens(i + 50, 1 + i % 3);
    if (targets_) ex.target = counting_tokens(i + 70, pairs_ ? 1 + i % 3 : 1 + i % 5);
    ex.label = i % 2;
    return ex;
  }
  int64_t num_classes() const override { return 2; }
  std::string describe() const override { return "test sequences"; }

 private:
  int64_t n_;
  bool pairs_;
  bool targets_;
};

// Fails on one index, as a corrupt file would.
class ThrowingSet : public ImageSet {
 public:
  ThrowingSet(int64_t n, int64_t bad) : ImageSet(n), bad_(bad) {}
  Example get(int64_t i, Rng* rng) const override {
    FORGE_CHECK(i != bad_, "corrupt file 'img_{}.png': bad CRC", i);
    return ImageSet::get(i, rng);
  }

 private:
  int64_t bad_;
};

// Takes a while per example.
class SlowSet : public ImageSet {
 public:
  using ImageSet::ImageSet;
  Example get(int64_t i, Rng* rng) const override {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return ImageSet::get(i, rng);
  }
};

void expect_same_batch(const Batch& a, const Batch& b) {
  EXPECT_TRUE(same_tensor(a.input, b.input));
  EXPECT_TRUE(same_tensor(a.mask, b.mask));
  EXPECT_TRUE(same_tensor(a.input2, b.input2));
  EXPECT_TRUE(same_tensor(a.mask2, b.mask2));
  EXPECT_TRUE(same_tensor(a.target, b.target));
  EXPECT_TRUE(same_tensor(a.label, b.label));
  EXPECT_TRUE(same_tensor(a.label_mix, b.label_mix));
  EXPECT_EQ(a.mix_lambda, b.mix_lambda);
  EXPECT_EQ(a.size, b.size);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.indices, b.indices);
}

// Every batch of `epochs` epochs, in order.
std::vector<Batch> run_epochs(DataLoader& loader, int epochs) {
  std::vector<Batch> out;
  for (int e = 0; e < epochs; ++e) {
    Batch b;
    while (loader.next(b)) out.push_back(std::move(b));
  }
  return out;
}

LoaderOptions options(int64_t batch_size, uint64_t seed, int workers) {
  return {.batch_size = batch_size, .seed = seed, .workers = workers};
}

// Rng keeps the Philox block of its last word for the next three: the words
// are still word counter of the (seed, offset 0) stream, in order, across
// blocks and after set_counter jumps back and forth.
TEST(DataRng, WordsAreThePhiloxStreamInOrder) {
  Rng rng(Rng::mix({5, 17}));
  const uint64_t seed = rng.seed();
  for (uint64_t i = 0; i < 37; ++i) EXPECT_EQ(rng.next_u32(), Generator::word(seed, 0, i)) << i;
  for (uint64_t start : {uint64_t{2}, uint64_t{1000003}, uint64_t{38}, uint64_t{1}}) {
    rng.set_counter(start);
    for (uint64_t i = start; i < start + 9; ++i)
      EXPECT_EQ(rng.next_u32(), Generator::word(seed, 0, i)) << "from " << start << ", word " << i;
  }
}

// Rng::normals gives what as many calls of normal() give (to a float's last
// bit, log and cos coming from vmath), from any counter, and leaves the
// counter where they would.
TEST(DataRng, NormalsAreNormalCallsInBatches) {
  for (uint64_t start : {uint64_t{0}, uint64_t{3}, uint64_t{5}}) {
    Rng a(11), b(11);
    a.set_counter(start);
    b.set_counter(start);
    std::vector<float> got(700);
    a.normals(got.data(), 700);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const auto want = static_cast<float>(b.normal());
      EXPECT_NEAR(got[i], want, 4e-7 * std::max(1.0f, std::abs(want)))
          << "from " << start << ", " << i;
      sum += got[i];
      sq += got[i] * got[i];
    }
    EXPECT_EQ(a.counter(), b.counter());
    EXPECT_NEAR(sum / 700, 0.0, 0.15);
    EXPECT_NEAR(sq / 700, 1.0, 0.15);
  }
}

TEST(DataLoader, SameSeedSameBatchesForAnyNumberOfWorkers) {
  auto data = std::make_shared<ImageSet>(53);
  DataLoader reference(data, options(8, 42, 0));
  const auto expected = run_epochs(reference, 3);
  ASSERT_EQ(expected.size(), 3u * 7u);
  for (int workers : {0, 1, 3}) {
    SCOPED_TRACE(workers);
    DataLoader loader(data, options(8, 42, workers));
    const auto got = run_epochs(loader, 3);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t k = 0; k < got.size(); ++k) expect_same_batch(got[k], expected[k]);
    EXPECT_EQ(loader.position(), (LoaderPosition{3, 0}));
  }
  // build(e, b) is what next() returned there.
  for (int64_t e = 0; e < 3; ++e)
    for (int64_t b = 0; b < 7; ++b) expect_same_batch(reference.build(e, b), expected[e * 7 + b]);
}

TEST(DataLoader, DifferentSeedsAndEpochsGiveDifferentOrders) {
  auto data = std::make_shared<ImageSet>(40);
  DataLoader a(data, options(40, 1, 0)), b(data, options(40, 2, 0));
  const Batch a0 = a.build(0, 0), a1 = a.build(1, 0), b0 = b.build(0, 0);
  EXPECT_NE(a0.indices, b0.indices);
  EXPECT_NE(a0.indices, a1.indices);
  EXPECT_EQ(*a.permutation(1), a1.indices);
  // Old epochs fall out of the permutation cache and are drawn again the same.
  for (int64_t e = 2; e < 10; ++e) a.build(e, 0);
  EXPECT_EQ(a.build(0, 0).indices, a0.indices);
  EXPECT_EQ(*a.permutation(1), a1.indices);
}

TEST(DataLoader, EveryIndexExactlyOncePerEpochAndTheLastBatchIsKept) {
  auto data = std::make_shared<ImageSet>(103);
  DataLoader loader(data, options(10, 7, 2));
  EXPECT_EQ(loader.batches_per_epoch(), 11);
  std::vector<int64_t> all(103);
  std::iota(all.begin(), all.end(), 0);
  std::set<std::vector<int64_t>> orders;
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> seen;
    Batch b;
    int64_t count = 0;
    while (loader.next(b)) {
      EXPECT_EQ(b.size, ++count == 11 ? 3 : 10);
      EXPECT_EQ(b.input.shape(), (Shape{b.size, 1, 2, 3}));
      EXPECT_EQ(b.tokens, b.size * 6);  // pixels: H * W per image
      const auto labels = b.label.to_vector<int64_t>();
      for (int64_t r = 0; r < b.size; ++r) {
        const int64_t i = b.indices[static_cast<size_t>(r)];
        EXPECT_EQ(labels[static_cast<size_t>(r)], i % 7);
        EXPECT_EQ(b.input.data<float>()[r * 6 + 1], 1000.0f * static_cast<float>(i) + 1);
      }
      seen.insert(seen.end(), b.indices.begin(), b.indices.end());
    }
    EXPECT_EQ(count, 11);
    orders.insert(seen);
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, all);
  }
  EXPECT_EQ(orders.size(), 3u);
}

TEST(DataLoader, DropLastDropsThePartialBatch) {
  auto data = std::make_shared<ImageSet>(103);
  LoaderOptions o = options(10, 7, 1);
  o.drop_last = true;
  DataLoader loader(data, o);
  EXPECT_EQ(loader.batches_per_epoch(), 10);
  const auto batches = run_epochs(loader, 1);
  ASSERT_EQ(batches.size(), 10u);
  for (const auto& b : batches) EXPECT_EQ(b.size, 10);
}

// An epoch without a batch left the trainer spinning ("0 batches per epoch"):
// the loader refuses it, naming the dataset, its size, the batch size, drop_last
// and the recipe keys to change.
TEST(DataLoader, RefusesADatasetThatGivesNoBatch) {
  auto data = std::make_shared<ImageSet>(103);
  LoaderOptions o = options(200, 7, 1);
  o.drop_last = true;
  expect_error([&] { DataLoader(data, o); },
               {"test images", "103 examples", "batch size 200", "drop_last true",
                "loop.batch_size", "at most 103", "data.limit_train"});
  o.batch_size = 103;  // exactly one batch
  EXPECT_EQ(DataLoader(data, o).batches_per_epoch(), 1);
  o.batch_size = 200;  // without drop_last the short batch is kept
  o.drop_last = false;
  EXPECT_EQ(DataLoader(data, o).batches_per_epoch(), 1);

  auto empty = std::make_shared<ImageSet>(0);
  expect_error([&] { DataLoader(empty, o); },
               {"test images", "0 examples", "batch size 200", "drop_last false", "data source"});
}

TEST(DataLoader, WithoutShuffleTheOrderIsTheIdentity) {
  auto data = std::make_shared<ImageSet>(12);
  LoaderOptions o = options(5, 3, 0);
  o.shuffle = false;
  DataLoader loader(data, o);
  EXPECT_EQ(loader.build(4, 1).indices, (std::vector<int64_t>{5, 6, 7, 8, 9}));
  EXPECT_EQ(loader.build(0, 2).indices, (std::vector<int64_t>{10, 11}));
}

TEST(DataLoader, NextReportsTheEndOfEachEpoch) {
  auto data = std::make_shared<ImageSet>(6);
  DataLoader loader(data, options(4, 0, 0));
  Batch b;
  EXPECT_TRUE(loader.next(b));
  EXPECT_TRUE(loader.next(b));
  EXPECT_EQ(loader.position(), (LoaderPosition{0, 2}));
  EXPECT_FALSE(loader.next(b));
  EXPECT_EQ(loader.position(), (LoaderPosition{1, 0}));
  EXPECT_TRUE(loader.next(b));
}

TEST(DataLoader, SeekToASavedPositionReproducesTheUninterruptedRun) {
  auto data = std::make_shared<ImageSet>(29);
  for (int workers : {0, 2}) {
    SCOPED_TRACE(workers);
    DataLoader uninterrupted(data, options(4, 11, workers));  // 8 batches per epoch
    Batch b;
    for (int k = 0; k < 6; ++k) ASSERT_TRUE(uninterrupted.next(b));
    const LoaderPosition saved = uninterrupted.position();
    EXPECT_EQ(saved, (LoaderPosition{0, 6}));
    // The rest of epoch 0, the epoch end, and into epoch 1.
    std::vector<Batch> expected;
    std::vector<bool> flags;
    for (int k = 0; k < 6; ++k) {
      Batch x;
      flags.push_back(uninterrupted.next(x));
      expected.push_back(std::move(x));
    }
    EXPECT_EQ(flags, (std::vector<bool>{true, true, false, true, true, true}));

    for (int restart_workers : {0, 3}) {
      DataLoader resumed(data, options(4, 11, restart_workers));
      resumed.seek(saved);
      for (size_t k = 0; k < flags.size(); ++k) {
        Batch x;
        ASSERT_EQ(resumed.next(x), flags[k]);
        if (flags[k]) expect_same_batch(x, expected[k]);
      }
    }
    // Seeking back on a running loader drops what it had prefetched.
    uninterrupted.seek(saved);
    for (size_t k = 0; k < flags.size(); ++k) {
      Batch x;
      ASSERT_EQ(uninterrupted.next(x), flags[k]);
      if (flags[k]) expect_same_batch(x, expected[k]);
    }
    uninterrupted.seek({5, 8});  // the end of epoch 5
    EXPECT_FALSE(uninterrupted.next(b));
    ASSERT_TRUE(uninterrupted.next(b));
    expect_same_batch(b, uninterrupted.build(6, 0));
  }
  DataLoader loader(data, options(4, 11, 0));
  expect_error([&] { loader.seek({0, 9}); }, {"batch 9", "8 batches"});
  expect_error([&] { loader.build(0, 8); }, {"batch 8", "8 batches"});
}

TEST(DataLoader, ExampleAndTransformStreamsAreSeededAsDocumented) {
  auto data = std::make_shared<ImageSet>(10);
  LoaderOptions o = options(3, 99, 2);
  o.transform = [](Batch& batch, Rng& rng) { batch.mix_lambda = rng.uniform(); };
  DataLoader loader(data, o);
  Batch b;
  ASSERT_TRUE(loader.next(b));
  ASSERT_TRUE(loader.next(b));  // epoch 0, batch 1
  EXPECT_EQ(b.mix_lambda, Rng(Rng::mix({99, 0, 1, 2})).uniform());
  for (int64_t r = 0; r < b.size; ++r) {
    const int64_t i = b.indices[static_cast<size_t>(r)];
    const float expected =
        static_cast<float>(1000 * i) +
        static_cast<float>(Rng(Rng::mix({99, 0, static_cast<uint64_t>(i), 1})).uniform());
    EXPECT_EQ(b.input.data<float>()[r * 6], expected);
  }

  o.augment = false;  // evaluation: get(i, nullptr), no transform
  DataLoader eval(data, o);
  const Batch e = eval.build(0, 1);
  EXPECT_EQ(e.mix_lambda, 1.0);
  for (int64_t r = 0; r < e.size; ++r)
    EXPECT_EQ(e.input.data<float>()[r * 6],
              static_cast<float>(1000 * e.indices[static_cast<size_t>(r)]));
}

TEST(DataLoader, AnErrorInAWorkerSurfacesFromNext) {
  auto data = std::make_shared<ThrowingSet>(40, 37);
  for (int workers : {0, 1, 3}) {
    SCOPED_TRACE(workers);
    LoaderOptions o = options(4, 5, workers);
    o.shuffle = false;
    DataLoader loader(data, o);
    Batch b;
    for (int k = 0; k < 9; ++k) ASSERT_TRUE(loader.next(b));
    for (int attempt = 0; attempt < 2; ++attempt) {  // the position stays at the failing batch
      expect_error([&] { loader.next(b); },
                   {"corrupt file 'img_37.png': bad CRC", "dataset index 37", "batch 9"});
      EXPECT_EQ(loader.position(), (LoaderPosition{0, 9}));
    }
    loader.seek({1, 0});
    ASSERT_TRUE(loader.next(b));
    EXPECT_EQ(b.indices, (std::vector<int64_t>{0, 1, 2, 3}));
  }
}

TEST(DataLoader, DestructionWhileWorkersAreBusyDoesNotHang) {
  auto data = std::make_shared<SlowSet>(400);
  const auto start = std::chrono::steady_clock::now();
  {
    LoaderOptions o = options(8, 0, 3);
    o.prefetch = 4;
    DataLoader loader(data, o);
    Batch b;
    ASSERT_TRUE(loader.next(b));  // workers are now filling 12 slots, 16 ms a batch
  }
  { DataLoader never_started(data, options(8, 0, 2)); }
  {
    DataLoader loader(data, options(8, 0, 2));
    Batch b;
    ASSERT_TRUE(loader.next(b));
    loader.seek({3, 2});
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 2.0);
}

TEST(DataLoader, WorkersStayWithinThePrefetchBound) {
  auto data = std::make_shared<ImageSet>(1000);
  LoaderOptions o = options(10, 0, 2);
  o.prefetch = 1;  // room for 2 batches beyond the consumer's
  DataLoader loader(data, o);
  Batch b;
  ASSERT_TRUE(loader.next(b));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // Batch 0 (consumed) plus batches 1 and 2.
  EXPECT_EQ(data->gets(), 30);
}

TEST(Collate, PadsSequencesAndMasksTheRealTokens) {
  auto data = std::make_shared<SequenceSet>(10);
  LoaderOptions o = options(3, 0, 0);
  o.shuffle = false;
  o.pad_id = -1;
  DataLoader loader(data, o);
  const Batch b = loader.build(0, 1);  // indices 3, 4, 5: lengths 4, 5, 1
  ASSERT_EQ(b.input.shape(), (Shape{3, 5}));
  EXPECT_EQ(b.input.dtype(), DType::i64);
  EXPECT_EQ(b.mask.dtype(), DType::boolean);
  EXPECT_EQ(
      b.input.to_vector<int64_t>(),
      (std::vector<int64_t>{301, 302, 303, 304, -1, 401, 402, 403, 404, 405, 501, -1, -1, -1, -1}));
  EXPECT_EQ(b.mask.to_vector<uint8_t>(),
            (std::vector<uint8_t>{1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(b.tokens, 10);
  EXPECT_EQ(b.label.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_FALSE(b.input2.defined());
  EXPECT_FALSE(b.mask2.defined());

  o.pad_to = 7;
  DataLoader fixed(data, o);
  const Batch f = fixed.build(0, 0);  // lengths 1, 2, 3
  ASSERT_EQ(f.input.shape(), (Shape{3, 7}));
  EXPECT_EQ(f.input.to_vector<int64_t>()[7 + 1], 102);
  EXPECT_EQ(f.input.to_vector<int64_t>()[7 + 2], -1);
  EXPECT_EQ(f.mask.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 0, 0, 0, 0, 0,  //
                                                               1, 1, 0, 0, 0, 0, 0,  //
                                                               1, 1, 1, 0, 0, 0, 0}));
}

TEST(Collate, PadToRejectsALongerExampleNamingIt) {
  auto data = std::make_shared<SequenceSet>(10);
  LoaderOptions o = options(5, 0, 0);
  o.shuffle = false;
  o.pad_to = 3;
  DataLoader loader(data, o);
  expect_error([&] { loader.build(0, 0); }, {"dataset index 3", "4 tokens", "pad_to = 3"});
}

TEST(Collate, PairsGetSecondInputsAndMasks) {
  auto data = std::make_shared<SequenceSet>(6, true);
  LoaderOptions o = options(3, 0, 0);
  o.shuffle = false;
  DataLoader loader(data, o);
  const Batch b = loader.build(0, 0);  // input lengths 1, 2, 3; input2 lengths 1, 2, 3
  ASSERT_EQ(b.input2.shape(), (Shape{3, 3}));
  EXPECT_EQ(b.input2.to_vector<int64_t>(),
            (std::vector<int64_t>{5001, 0, 0, 5101, 5102, 0, 5201, 5202, 5203}));
  EXPECT_EQ(b.mask2.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 0, 1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(b.tokens, 12);

  std::vector<Example> mixed = {data->get(0, nullptr), SequenceSet(1).get(0, nullptr)};
  expect_error([&] { collate(mixed, {0, 8}, o); }, {"dataset index 8", "lacks a second document"});
}

// A language model's targets take input's padded shape, an encoder-decoder's
// take input2's; pad_id where the paired mask is false; pad_to alike.
TEST(Collate, TargetsArePaddedLikeTheSequenceTheyPairWith) {
  LoaderOptions o = options(3, 0, 0);
  o.shuffle = false;
  o.pad_id = -1;
  DataLoader lm(std::make_shared<SequenceSet>(10, false, true), o);
  const Batch b = lm.build(0, 1);  // indices 3, 4, 5: lengths 4, 5, 1
  ASSERT_EQ(b.target.shape(), (Shape{3, 5}));
  EXPECT_EQ(b.target.dtype(), DType::i64);
  EXPECT_EQ(b.target.to_vector<int64_t>(),
            (std::vector<int64_t>{7301, 7302, 7303, 7304, -1, 7401, 7402, 7403, 7404, 7405, 7501,
                                  -1, -1, -1, -1}));
  EXPECT_EQ(b.tokens, 10);  // targets are not counted as input tokens
  EXPECT_FALSE(b.input2.defined());

  DataLoader pairs(std::make_shared<SequenceSet>(10, true, true), o);
  const Batch p = pairs.build(0, 0);  // input lengths 1, 2, 3; input2 and target 1, 2, 3
  ASSERT_EQ(p.target.shape(), p.input2.shape());
  EXPECT_EQ(p.target.to_vector<int64_t>(),
            (std::vector<int64_t>{7001, -1, -1, 7101, 7102, -1, 7201, 7202, 7203}));
  const Batch p1 = pairs.build(0, 1);  // input lengths 4, 5, 1; input2 and target 1, 2, 3
  ASSERT_EQ(p1.target.shape(), (Shape{3, 3}));
  ASSERT_EQ(p1.input.shape(), (Shape{3, 5}));
  const auto m2 = p1.mask2.to_vector<uint8_t>();
  const auto t = p1.target.to_vector<int64_t>();
  for (size_t k = 0; k < t.size(); ++k) EXPECT_EQ(t[k] == -1, m2[k] == 0) << k;

  o.pad_to = 6;
  DataLoader fixed(std::make_shared<SequenceSet>(10, false, true), o);
  const Batch f = fixed.build(0, 0);  // lengths 1, 2, 3
  ASSERT_EQ(f.target.shape(), (Shape{3, 6}));
  EXPECT_EQ(f.target.to_vector<int64_t>(), (std::vector<int64_t>{7001, -1, -1, -1, -1, -1,    //
                                                                 7101, 7102, -1, -1, -1, -1,  //
                                                                 7201, 7202, 7203, -1, -1, -1}));

  // Without targets the batch has none.
  EXPECT_FALSE(DataLoader(std::make_shared<SequenceSet>(10), o).build(0, 0).target.defined());
}

// padded / padded2 say whether a mask hides anything (models leave a full mask out).
TEST(Collate, PaddedSaysWhetherAMaskHidesAnything) {
  LoaderOptions o;
  const SequenceSet set(10, true, true);
  std::vector<Example> same = {set.get(2, nullptr), set.get(2, nullptr)};
  Batch b = collate(same, {2, 2}, o);
  EXPECT_FALSE(b.padded);
  EXPECT_FALSE(b.padded2);
  std::vector<Example> mixed = {set.get(1, nullptr), set.get(2, nullptr)};
  b = collate(mixed, {1, 2}, o);
  EXPECT_TRUE(b.padded);
  EXPECT_TRUE(b.padded2);
  o.pad_to = 8;  // every row padded past its length
  b = collate(same, {2, 2}, o);
  EXPECT_TRUE(b.padded);
}

TEST(Collate, TargetsMustBeOnEveryExampleAndMatchTheirSequence) {
  const LoaderOptions o;
  std::vector<Example> ex = {SequenceSet(3, false, true).get(2, nullptr),
                             SequenceSet(3).get(1, nullptr)};
  expect_error([&] { collate(ex, {2, 9}, o); }, {"dataset index 9", "lacks a target"});
  ex[1] = SequenceSet(3, false, true).get(1, nullptr);
  ex[1].target = counting_tokens(0, 4);  // input has 2 tokens
  expect_error(
      [&] {
        collate(ex, {2, 9}, o);
      },
      {"target of example 1 (dataset index 9) has 4 tokens", "its input has 2"});
  ex = {SequenceSet(3, true, true).get(2, nullptr)};
  ex[0].target = counting_tokens(0, 1);  // input2 has 3 tokens
  expect_error([&] { collate(ex, {2}, o); }, {"dataset index 2", "its input2 has 3"});
  ex[0].target = Tensor::zeros({3}, DType::f32);
  expect_error([&] { collate(ex, {2}, o); }, {"target of example 0", "i64 [N]", "f32"});
}

TEST(Collate, ImagesOfDifferentShapesAreAnErrorNamingBoth) {
  std::vector<Example> ex = {ImageSet(1, {1, 2, 3}).get(0, nullptr),
                             ImageSet(1, {1, 3, 2}).get(0, nullptr)};
  expect_error(
      [&] {
        collate(ex, {12, 30}, LoaderOptions{});
      },
      {"dataset index 30", "[1, 3, 2]", "dataset index 12", "[1, 2, 3]"});
  ex[1] = SequenceSet(1).get(0, nullptr);
  expect_error([&] { collate(ex, {12, 30}, LoaderOptions{}); }, {"dataset index 30", "i64"});
}

TEST(Collate, StacksABatchOfFashionMnistSizedImagesQuickly) {
  ImageSet data(256, {1, 28, 28});
  std::vector<Example> ex;
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < 256; ++i) {
    ex.push_back(data.get(i, nullptr));
    idx.push_back(i);
  }
  double best = 1e9;
  Batch b;
  for (int rep = 0; rep < 10; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    b = collate(ex, idx, LoaderOptions{});
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  ASSERT_EQ(b.input.shape(), (Shape{256, 1, 28, 28}));
  EXPECT_EQ(b.input.data<float>()[255 * 784 + 783], 255000.0f + 783);
  EXPECT_EQ(b.tokens, 256 * 784);
  RecordProperty("collate_256_images_us", static_cast<int>(best * 1e6));
  EXPECT_LT(best, 0.02) << "collating 256 28x28 images took " << best * 1e3 << " ms";
}

}  // namespace
}  // namespace forge::data
