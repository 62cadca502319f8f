// DataLoader: batches of a Dataset in a seeded order, built by worker threads
// ahead of time, with a position that checkpoints save and restore.
//
// Determinism: epoch e visits the indices in the permutation drawn from
// Rng(Rng::mix({seed, e})) (identity when !shuffle); example i of epoch e is
// built with Rng(Rng::mix({seed, e, i, 1})); the batch transform of batch b of
// epoch e draws from Rng(Rng::mix({seed, e, b, 2})). So a batch depends only on
// (seed, epoch, batch index): any number of workers, and a loader restarted
// at a saved position, yields bit-identical batches.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "data/dataset.h"

namespace forge::data {

struct Batch {
  Tensor input;   // f32 [B, C, H, W] images, or i64 [B, N] tokens padded with pad_id
  Tensor mask;    // sequences: bool [B, N], true = real token; undefined for images
  Tensor input2;  // retrieval: i64 [B, N2] second documents; undefined otherwise
  Tensor mask2;   // bool [B, N2]
  Tensor label;   // i64 [B]
  // Mixup / cutmix: the partner examples' labels and the weight of `label`;
  // the loss is lam * CE(label) + (1 - lam) * CE(label_mix).
  Tensor label_mix;  // i64 [B]; undefined when the batch is not mixed
  double mix_lambda = 1.0;
  int64_t size = 0;    // B
  int64_t tokens = 0;  // real tokens over the batch (sequences), pixels for images
  std::vector<int64_t> indices;  // dataset index of each row
};

// Runs on a collated batch (mixup, cutmix); draws only from `rng`.
using BatchTransform = std::function<void(Batch&, Rng& rng)>;

struct LoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = true;
  bool drop_last = false;
  uint64_t seed = 0;
  int workers = 0;   // threads building batches; 0: built in the caller's thread
  int prefetch = 2;  // batches built ahead of the consumer per worker
  int64_t pad_id = 0;
  int64_t pad_to = 0;     // sequences: 0 pads to the batch's longest; > 0 pads every batch to this length
  bool augment = true;    // false: Dataset::get(i, nullptr) (evaluation)
  BatchTransform transform;  // optional
};

// Where the loader is: the next batch to be returned is batch `batch` of `epoch`.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  bool operator==(const LoaderPosition&) const = default;
};

class DataLoader {
 public:
  DataLoader(DatasetPtr dataset, LoaderOptions options);
  ~DataLoader();  // stops and joins the workers
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t batches_per_epoch() const;
  const Dataset& dataset() const { return *dataset_; }
  const LoaderOptions& options() const { return options_; }

  // Positions the loader at `pos` (drops any prefetched batches).
  void seek(LoaderPosition pos);
  LoaderPosition position() const { return position_; }

  // The batch at position(), then advances; returns false (and moves to batch
  // 0 of the next epoch) when the current epoch has no batch left.
  bool next(Batch& out);

  // The batch (epoch, b) built directly in the caller's thread; what next()
  // returns at that position (tests compare the two).
  Batch build(int64_t epoch, int64_t b) const;

 private:
  // ... implementation state: permutation cache, worker threads, a queue of
  // prefetched batches keyed by (epoch, batch), mutex + condition variables.
  DatasetPtr dataset_;
  LoaderOptions options_;
  LoaderPosition position_;
};

// Collates examples into a batch (padding sequences as `options` says).
Batch collate(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
              const LoaderOptions& options);

}  // namespace forge::data
