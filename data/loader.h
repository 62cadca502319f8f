// DataLoader: batches of a Dataset in a seeded order, built by worker threads
// ahead of time, with a position that checkpoints save and restore.
//
// Determinism: epoch e visits the indices in the permutation drawn from
// Rng(Rng::mix({seed, e})) (identity when !shuffle; with repeated augmentation
// see LoaderOptions::repeats); example i of epoch e is
// built with Rng(Rng::mix({seed, e, i, 1})); the batch transform of batch b of
// epoch e draws from Rng(Rng::mix({seed, e, b, 2})). So a batch depends only on
// (seed, epoch, batch index): any number of workers, and a loader restarted
// at a saved position, yields bit-identical batches.
//
// Data parallelism: with shard_count processes, batch_size is the global batch
// and process shard_index gets rows [index*b, (index+1)*b), b = B/count, of
// every global batch (of a last batch of B' < B rows: [floor(index*B'/count),
// floor((index+1)*B'/count)), possibly none), bitwise what a single process's
// loader has in those rows (augmentation, mixup/cutmix and padding included),
// with the same draws for the batch transform. A slice is built from the
// rows it depends on: its own (images), its own and its mirror rows (a batch
// transform), or the whole global batch (token sequences padded to the batch's
// longest, or carrying targets: global_scored counts every row's tokens).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "data/dataset.h"

namespace forge::data {

struct Batch {
  Tensor input;   // f32 [B, C, H, W] images, or i64 [B, N] tokens padded with pad_id
  Tensor mask;    // sequences: bool [B, N], true = real token; undefined for images
  Tensor input2;  // retrieval: i64 [B, N2] second documents; seq2seq: decoder inputs
  Tensor mask2;   // bool [B, N2]
  // Sequences: whether mask (mask2) has a false entry, i.e. some row is padded;
  // a model can leave out a mask that hides nothing.
  bool padded = false, padded2 = false;
  // Next-token targets padded like the sequence they pair with: i64 [B, N] with
  // `mask` when the examples have no input2 (language models), i64 [B, N2] with
  // `mask2` when they do (encoder-decoders); pad_id where that mask is false (so
  // a loss must skip positions by the mask: pad_id may be a real token, e.g.
  // byte 0). Undefined when the examples carry no target.
  Tensor target;
  Tensor label;  // i64 [B]
  // Mixup / cutmix: the partner examples' labels and the weight of `label`;
  // the loss is lam * CE(label) + (1 - lam) * CE(label_mix).
  Tensor label_mix;  // i64 [B]; undefined when the batch is not mixed
  double mix_lambda = 1.0;
  int64_t size = 0;              // B
  int64_t tokens = 0;            // real tokens over the batch (sequences), pixels for images
  std::vector<int64_t> indices;  // dataset index of each row
  // The global batch this one is a process's slice of (LoaderOptions::shard_count);
  // without a shard, the batch itself. global_offset: the global row of row 0;
  // global_size: the global batch's rows; global_scored: what the global
  // batch's loss averages over, its rows, or with a target its real target
  // tokens (true entries of mask2 when there is input2, else of mask). A
  // process divides its summed loss by global_scored, so that the sum of the
  // processes' gradients is the global batch's mean.
  // A slice of the last, partial batch may have size 0: its tensors then have
  // leading dimension 0 (evaluation skips such a batch).
  int64_t global_offset = 0;
  int64_t global_size = 0;
  int64_t global_scored = 0;
};

// Runs on a collated batch (mixup, cutmix); draws only from `rng`. Called from
// several worker threads at once, so it must not mutate shared state.
// For data parallelism (LoaderOptions::shard_count > 1) a transform may mix
// row i only with its mirror row B-1-i, and its draws from `rng` must not
// depend on B: a process applies it to a compact batch of its slice and the
// mirror slice, [slice; mirror] of 2b rows (b rows when the slice is its own
// mirror), where row k's partner is row 2b-1-k, and keeps the slice's rows.
// (An unevenly split last batch whose slice overlaps its mirror uses their
// union, a range of rows closed under mirroring; an empty slice, one row.)
using BatchTransform = std::function<void(Batch&, Rng& rng)>;

struct LoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = true;
  bool drop_last = false;
  uint64_t seed = 0;
  int workers = 0;   // threads building batches; 0: built in the caller's thread
  int prefetch = 2;  // batches built ahead of the consumer per worker
  // Workers build no batch past this many epochs (0: no end), so a loader that
  // is read one epoch at a time (evaluation) builds nothing it will not use;
  // next() still moves into the following epoch, and a seek back restarts them.
  int64_t epochs = 0;
  int64_t pad_id = 0;
  int64_t pad_to =
      0;  // sequences: 0 pads to the batch's longest; > 0 pads every batch to this length
  bool augment = true;  // false: Dataset::get(i, nullptr) (evaluation)
  // Repeated augmentation (Hoffer et al. 2020; DeiT, timm's RepeatAugSampler):
  // an epoch visits the first ceil(n / repeats) indices of its shuffled order
  // `repeats` times each, back to back, cut to n examples, so an epoch keeps
  // its length and a global batch holds `repeats` differently augmented copies
  // of each of its images (bar the edges). Copy c > 0 of dataset index i in
  // epoch e is built with Rng(Rng::mix({seed, e, i, 1, c})). 1: off.
  int64_t repeats = 1;
  BatchTransform transform{};  // optional; applied only when `augment`
  // Data parallelism: this process's slice of every batch. batch_size stays the
  // global batch (a multiple of shard_count); batches_per_epoch() and positions
  // count global batches, so a checkpoint resumes with another process count.
  int64_t shard_index = 0, shard_count = 1;
};

// Where the loader is: the next batch to be returned is batch `batch` of `epoch`.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  bool operator==(const LoaderPosition&) const = default;
};

class DataLoader {
 public:
  // Throws, naming the dataset, its size, the batch size and drop_last, when
  // an epoch would have no batch (an empty dataset, or drop_last with fewer
  // examples than batch_size); and when batch_size is not a multiple of
  // shard_count or shard_index is not in [0, shard_count).
  DataLoader(DatasetPtr dataset, LoaderOptions options);
  ~DataLoader();  // stops and joins the workers (a batch being built is finished first)
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t batches_per_epoch() const;
  const Dataset& dataset() const { return *dataset_; }
  const LoaderOptions& options() const { return options_; }

  // Positions the loader at `pos` (drops any prefetched batches); pos.batch
  // may be batches_per_epoch() (the end of that epoch).
  void seek(LoaderPosition pos);
  LoaderPosition position() const { return position_; }

  // The batch at position(), then advances; returns false (and moves to batch
  // 0 of the next epoch) when the current epoch has no batch left. An error
  // while building the batch (in a worker or here) is thrown from here, with
  // the dataset index it came from; the position stays at that batch.
  bool next(Batch& out);

  // The batch (epoch, b) built directly in the caller's thread; what next()
  // returns at that position (tests compare the two). With a shard, this
  // process's slice of it.
  Batch build(int64_t epoch, int64_t b) const;

  // The order in which epoch `epoch` visits the dataset (dataset size entries;
  // with repeats > 1, each index `repeats` times in a row).
  std::shared_ptr<const std::vector<int64_t>> permutation(int64_t epoch) const;

 private:
  // A prefetched batch, or the error building it threw.
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  Batch build_linear(int64_t g) const;  // batch g of the stream epoch 0, 1, ... back to back
  // Dataset index i at position p of epoch `epoch`'s order, as batch b uses it.
  Example load(int64_t i, int64_t epoch, int64_t b, int64_t p) const;
  void start_workers();
  void worker_loop();
  void restart_at(int64_t g);  // under mu_: drops prefetched work, next claim is g

  DatasetPtr dataset_;
  LoaderOptions options_;
  LoaderPosition position_;
  int64_t batches_per_epoch_ = 0;

  // Permutations of the epochs in use (a few, shared with the workers).
  mutable std::mutex perm_mu_;
  mutable std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> perms_;

  // Workers claim linear batch indices in order, at most `capacity_` ahead of
  // the consumer, and file their results in `ready_`; the consumer takes them
  // in order. A seek bumps `generation_` so that stale results are dropped.
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_;   // workers wait for room or a stop
  std::condition_variable ready_cv_;  // the consumer waits for its batch
  std::map<int64_t, Slot> ready_;
  int64_t next_claim_ = 0;  // the next linear batch a worker builds
  int64_t consumer_ = 0;    // the linear batch the consumer takes next
  int64_t capacity_ = 1;    // workers * prefetch
  uint64_t generation_ = 0;
  bool stop_ = false;
};

// Collates examples into a batch (padding sequences as `options` says): f32
// images of one shape [C, H, W] are stacked into [B, C, H, W]; i64 [N] token
// sequences are padded with pad_id to [B, max N] (or [B, pad_to]) with a bool
// mask; input2 likewise, and target to the shape of the sequence it pairs with
// (input2 if present, else input), whose length it must have. Every example
// must have input2 (target) if example 0 does, and none otherwise. Errors name
// the dataset index (from `indices`) of the odd example. The batch is its own
// global batch (global_offset 0, global_size B).
Batch collate(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
              const LoaderOptions& options);

}  // namespace forge::data
