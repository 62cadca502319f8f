#include "data/loader.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/threading.h"

namespace forge::data {

namespace {

constexpr size_t kPermutationsKept = 4;

// A tensor's dtype and shape as text, for errors.
std::string shape_of(const Tensor& t) {
  return t.defined() ? fmt::format("{} {}", dtype_name(t.dtype()), shape_str(t.shape()))
                     : std::string("undefined");
}

// Stacks same-shape f32 images into [B, ...shape].
Tensor stack_images(const std::vector<Example>& examples, const std::vector<int64_t>& indices) {
  const Shape& first = examples[0].input.shape();
  for (size_t k = 0; k < examples.size(); ++k) {
    const Tensor& x = examples[k].input;
    FORGE_CHECK(x.dtype() == DType::f32 && x.shape() == first && x.device().is_cpu(),
                "collate: example {} (dataset index {}) is {}, but example 0 (dataset index {}) "
                "is f32 {}; images in a batch must share one shape",
                k, indices[k], shape_of(x), indices[0], shape_str(first));
  }
  Shape shape = first;
  shape.insert(shape.begin(), static_cast<int64_t>(examples.size()));
  Tensor out = Tensor::empty(shape, DType::f32);
  const size_t bytes = examples[0].input.nbytes();
  char* dst = static_cast<char*>(out.raw_data());
  for (size_t k = 0; k < examples.size(); ++k)
    if (bytes) std::memcpy(dst + k * bytes, examples[k].input.raw_data(), bytes);
  return out;
}

// Pads i64 [N_k] sequences (example field `field`) into ids [B, N] and, when
// `mask` is given, mask [B, N]; returns the number of real tokens.
int64_t pad_sequences(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
                      Tensor Example::*field, const char* name, const LoaderOptions& options,
                      Tensor& ids, Tensor* mask) {
  const int64_t B = static_cast<int64_t>(examples.size());
  int64_t longest = 0;
  for (size_t k = 0; k < examples.size(); ++k) {
    const Tensor& x = examples[k].*field;
    FORGE_CHECK(x.defined() && x.dtype() == DType::i64 && x.dim() == 1 && x.device().is_cpu(),
                "collate: {} of example {} (dataset index {}) should be i64 [N] tokens, got {}",
                name, k, indices[k], shape_of(x));
    FORGE_CHECK(options.pad_to <= 0 || x.numel() <= options.pad_to,
                "collate: {} of dataset index {} has {} tokens, more than pad_to = {}; raise "
                "pad_to or truncate the sequences",
                name, indices[k], x.numel(), options.pad_to);
    longest = std::max(longest, x.numel());
  }
  const int64_t N = options.pad_to > 0 ? options.pad_to : longest;
  ids = Tensor::empty({B, N}, DType::i64);
  int64_t* id = ids.data<int64_t>();
  std::fill(id, id + B * N, options.pad_id);
  bool* m = nullptr;
  if (mask) {
    *mask = Tensor::zeros({B, N}, DType::boolean);
    m = mask->data<bool>();
  }
  int64_t real = 0;
  for (int64_t k = 0; k < B; ++k) {
    const Tensor& x = examples[static_cast<size_t>(k)].*field;
    const int64_t n = x.numel();
    if (n) std::memcpy(id + k * N, x.raw_data(), static_cast<size_t>(n) * sizeof(int64_t));
    if (m) std::fill(m + k * N, m + k * N + n, true);
    real += n;
  }
  return real;
}

// Whether the examples carry `field`: all of them or none.
bool all_or_none(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
                 Tensor Example::*field, const char* what) {
  const bool present = (examples[0].*field).defined();
  for (size_t k = 0; k < examples.size(); ++k)
    FORGE_CHECK((examples[k].*field).defined() == present,
                "collate: example {} (dataset index {}) {} {} but example 0 (dataset index {}) {}",
                k, indices[k], present ? "lacks" : "has", what, indices[0],
                present ? "has" : "does not");
  return present;
}

// Rows [from, from + n) of a collated tensor [B, ...] (undefined stays undefined).
Tensor take_rows(const Tensor& t, int64_t from, int64_t n) {
  if (!t.defined()) return t;
  Shape shape = t.shape();
  const size_t row = shape[0] ? t.nbytes() / static_cast<size_t>(shape[0]) : 0;
  shape[0] = n;
  Tensor out = Tensor::empty(shape, t.dtype());
  if (n && row)
    std::memcpy(out.raw_data(), static_cast<const char*>(t.raw_data()) + from * row,
                static_cast<size_t>(n) * row);
  return out;
}

int64_t count_true(const Tensor& mask) {
  const bool* m = mask.data<bool>();
  return std::count(m, m + mask.numel(), true);
}

// Rows [from, from + n) of the collated (and transformed) batch `all`: what a
// process keeps of the rows it built. tokens and padded describe those rows.
Batch keep_rows(const Batch& all, int64_t from, int64_t n) {
  Batch out;
  out.input = take_rows(all.input, from, n);
  out.mask = take_rows(all.mask, from, n);
  out.input2 = take_rows(all.input2, from, n);
  out.mask2 = take_rows(all.mask2, from, n);
  out.target = take_rows(all.target, from, n);
  out.label = take_rows(all.label, from, n);
  out.label_mix = take_rows(all.label_mix, from, n);
  out.mix_lambda = all.mix_lambda;
  out.size = n;
  out.indices.assign(all.indices.begin() + from, all.indices.begin() + from + n);
  if (out.mask.defined()) {
    out.tokens = count_true(out.mask);
    out.padded = out.tokens < out.mask.numel();
  } else {
    out.tokens = all.tokens / all.size * n;  // pixels, the same per image
  }
  if (out.mask2.defined()) {
    const int64_t real = count_true(out.mask2);
    out.tokens += real;
    out.padded2 = real < out.mask2.numel();
  }
  return out;
}

}  // namespace

Batch collate(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
              const LoaderOptions& options) {
  FORGE_CHECK(!examples.empty(), "collate: no examples");
  FORGE_CHECK(indices.size() == examples.size(), "collate: {} examples but {} indices",
              examples.size(), indices.size());
  const int64_t B = static_cast<int64_t>(examples.size());
  Batch batch;
  batch.size = B;
  batch.global_size = B;
  batch.global_scored = B;
  batch.indices = indices;
  const Tensor& first = examples[0].input;
  FORGE_CHECK(first.defined() && (first.dtype() == DType::f32 || first.dtype() == DType::i64),
              "collate: example 0 (dataset index {}) should be a f32 image or i64 tokens, got {}",
              indices[0], shape_of(first));
  if (first.dtype() == DType::f32) {
    batch.input = stack_images(examples, indices);
    const int64_t channels = first.dim() == 3 ? first.size(0) : 1;
    batch.tokens = B * (first.numel() / std::max<int64_t>(channels, 1));
  } else {
    batch.tokens = pad_sequences(examples, indices, &Example::input, "input", options, batch.input,
                                 &batch.mask);
    batch.padded = batch.tokens < batch.mask.numel();
    int64_t partner_real = batch.tokens;  // real tokens of the sequence a target pairs with
    const bool pairs = all_or_none(examples, indices, &Example::input2, "a second document");
    if (pairs) {
      const int64_t real = pad_sequences(examples, indices, &Example::input2, "input2", options,
                                         batch.input2, &batch.mask2);
      batch.tokens += real;
      batch.padded2 = real < batch.mask2.numel();
      partner_real = real;
    }
    if (all_or_none(examples, indices, &Example::target, "a target")) {
      // Same lengths as the partner sequence, so the same padded shape and mask.
      Tensor Example::*partner = pairs ? &Example::input2 : &Example::input;
      for (size_t k = 0; k < examples.size(); ++k) {
        const Tensor& t = examples[k].target;
        const int64_t n = (examples[k].*partner).numel();
        FORGE_CHECK(t.numel() == n,
                    "collate: the target of example {} (dataset index {}) has {} tokens but its {} "
                    "has {}; a target pairs with input2 when there is one, else with input",
                    k, indices[k], t.numel(), pairs ? "input2" : "input", n);
      }
      pad_sequences(examples, indices, &Example::target, "target", options, batch.target, nullptr);
      batch.global_scored = partner_real;
    }
  }
  batch.label = Tensor::empty({B}, DType::i64);
  int64_t* label = batch.label.data<int64_t>();
  for (int64_t k = 0; k < B; ++k) label[k] = examples[static_cast<size_t>(k)].label;
  return batch;
}

DataLoader::DataLoader(DatasetPtr dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  FORGE_CHECK(dataset_ != nullptr, "DataLoader: dataset is null");
  FORGE_CHECK(options_.batch_size > 0, "DataLoader: batch_size must be positive, got {}",
              options_.batch_size);
  FORGE_CHECK(options_.workers >= 0, "DataLoader: workers must be >= 0, got {}", options_.workers);
  FORGE_CHECK(options_.prefetch >= 1, "DataLoader: prefetch must be >= 1, got {}",
              options_.prefetch);
  FORGE_CHECK(options_.pad_to >= 0, "DataLoader: pad_to must be >= 0, got {}", options_.pad_to);
  FORGE_CHECK(options_.repeats >= 1, "DataLoader: repeats must be >= 1, got {}", options_.repeats);
  FORGE_CHECK(options_.epochs >= 0, "DataLoader: epochs must be >= 0, got {}", options_.epochs);
  const int64_t count = options_.shard_count;
  FORGE_CHECK(count >= 1, "DataLoader: shard_count must be >= 1 (the number of processes), got {}",
              count);
  FORGE_CHECK(options_.shard_index >= 0 && options_.shard_index < count,
              "DataLoader: shard_index {} is out of range for {} processes; expected 0 <= "
              "shard_index < {}",
              options_.shard_index, count, count);
  FORGE_CHECK(options_.batch_size % count == 0,
              "DataLoader: batch_size {} is not divisible by {} processes: the batch is the global "
              "one, split evenly over the processes; choose a multiple of {}",
              options_.batch_size, count, count);
  const int64_t n = dataset_->size(), bs = options_.batch_size;
  batches_per_epoch_ = options_.drop_last ? n / bs : (n + bs - 1) / bs;
  // An epoch without a batch would leave a training loop spinning without a step.
  FORGE_CHECK(batches_per_epoch_ > 0,
              "DataLoader: the dataset ({}) has {} examples; with batch size {} and drop_last {} "
              "an epoch has no batch. {}",
              dataset_->describe(), n, bs, options_.drop_last,
              n == 0 ? "Check the data source (data.root, the split) and data.limit_train / "
                       "data.limit_eval"
                     : fmt::format("Lower loop.batch_size (loop.eval_batch_size for evaluation) "
                                   "to at most {}, or give more examples (data.limit_train / "
                                   "data.limit_eval; 0: all)",
                                   n));
  capacity_ = std::max<int64_t>(1, int64_t{options_.workers} * options_.prefetch);
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

int64_t DataLoader::batches_per_epoch() const {
  return batches_per_epoch_;
}

std::shared_ptr<const std::vector<int64_t>> DataLoader::permutation(int64_t epoch) const {
  FORGE_CHECK(epoch >= 0, "DataLoader: epoch must be >= 0, got {}", epoch);
  {
    std::lock_guard<std::mutex> lock(perm_mu_);
    if (auto it = perms_.find(epoch); it != perms_.end()) return it->second;
  }
  const auto n = static_cast<size_t>(dataset_->size());
  auto perm = std::make_shared<std::vector<int64_t>>(n);
  std::iota(perm->begin(), perm->end(), int64_t{0});
  if (options_.shuffle) {
    Rng rng(Rng::mix({options_.seed, static_cast<uint64_t>(epoch)}));
    rng.shuffle(*perm);
  }
  if (options_.repeats > 1) {  // position p visits shuffled[p / repeats]
    const auto r = static_cast<size_t>(options_.repeats);
    for (size_t p = n; p-- > 0;) (*perm)[p] = (*perm)[p / r];
  }
  std::lock_guard<std::mutex> lock(perm_mu_);
  std::shared_ptr<const std::vector<int64_t>> kept = perms_.emplace(epoch, perm).first->second;
  // Keep the newest epochs: workers run ahead, never far behind.
  while (perms_.size() > kPermutationsKept) perms_.erase(perms_.begin());
  return kept;
}

Example DataLoader::load(int64_t i, int64_t epoch, int64_t b, int64_t p) const {
  try {
    if (!options_.augment) return dataset_->get(i, nullptr);
    const auto e = static_cast<uint64_t>(epoch), index = static_cast<uint64_t>(i);
    const auto copy = static_cast<uint64_t>(p % options_.repeats);
    Rng rng(copy == 0 ? Rng::mix({options_.seed, e, index, 1})
                      : Rng::mix({options_.seed, e, index, 1, copy}));
    return dataset_->get(i, &rng);
  } catch (const std::exception& err) {
    FORGE_FAIL("DataLoader: loading dataset index {} (epoch {}, batch {}) failed: {}", i, epoch, b,
               err.what());
  }
}

Batch DataLoader::build(int64_t epoch, int64_t b) const {
  FORGE_CHECK(b >= 0 && b < batches_per_epoch_,
              "DataLoader: batch {} out of range; an epoch has {} batches", b, batches_per_epoch_);
  const auto perm = permutation(epoch);
  const int64_t begin = b * options_.batch_size;
  const int64_t B = std::min(dataset_->size(), begin + options_.batch_size) - begin;
  // This process's rows [lo, hi) of the global batch (all of it without a
  // shard); a partial last batch splits unevenly, possibly into no rows.
  const int64_t count = options_.shard_count, index = options_.shard_index;
  const int64_t lo = index * B / count, hi = (index + 1) * B / count;
  const bool transform = options_.augment && options_.transform;

  // The first row says what the examples are; an empty slice builds global
  // row 0 for the shapes of its tensors.
  const int64_t probe = lo < hi ? lo : 0;
  Example probed = load((*perm)[static_cast<size_t>(begin + probe)], epoch, b, begin + probe);
  const bool sequences = probed.input.defined() && probed.input.dtype() == DType::i64;

  // The global rows the slice depends on, in the order they are collated; the
  // slice is rows [keep, keep + hi - lo) of that batch.
  std::vector<int64_t> rows;
  int64_t keep = 0;
  const auto append = [&rows](int64_t from, int64_t to) {
    for (int64_t r = from; r < to; ++r) rows.push_back(r);
  };
  if (sequences && (options_.pad_to == 0 || probed.target.defined())) {
    // Padding to the global batch's longest, and global_scored, need every row.
    append(0, B);
    keep = lo;
  } else if (transform && lo < hi) {
    // Row r is mixed with B-1-r: [slice; mirror] when they are apart (row k's
    // partner is then row 2b-1-k), else their union, a range closed under r -> B-1-r.
    const int64_t mlo = B - hi, mhi = B - lo;
    if (mhi <= lo || hi <= mlo) {
      append(lo, hi);
      append(mlo, mhi);
    } else {
      append(std::min(lo, mlo), std::max(hi, mhi));
      keep = lo - std::min(lo, mlo);
    }
  } else {
    append(probe, lo < hi ? hi : probe + 1);
  }

  std::vector<int64_t> indices;
  std::vector<Example> examples;
  indices.reserve(rows.size());
  examples.reserve(rows.size());
  for (int64_t r : rows) {
    const int64_t i = (*perm)[static_cast<size_t>(begin + r)];
    indices.push_back(i);
    examples.push_back(r == probe ? std::move(probed) : load(i, epoch, b, begin + r));
  }
  Batch batch = collate(examples, indices, options_);
  if (transform) {
    Rng rng(Rng::mix({options_.seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(b), 2}));
    options_.transform(batch, rng);
  }
  if (lo == 0 && hi == B) return batch;  // the whole global batch, built in order

  // Counted over every row: a target means all of them were built.
  const int64_t scored = batch.target.defined() ? batch.global_scored : B;
  Batch slice = keep_rows(batch, keep, hi - lo);
  slice.global_offset = lo;
  slice.global_size = B;
  slice.global_scored = scored;
  return slice;
}

Batch DataLoader::build_linear(int64_t g) const {
  return build(g / batches_per_epoch_, g % batches_per_epoch_);
}

void DataLoader::start_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    restart_at(position_.epoch * batches_per_epoch_ + position_.batch);
  }
  threads_.reserve(static_cast<size_t>(options_.workers));
  for (int w = 0; w < options_.workers; ++w) threads_.emplace_back([this] { worker_loop(); });
}

void DataLoader::restart_at(int64_t g) {
  ++generation_;
  ready_.clear();
  next_claim_ = g;
  consumer_ = g;
}

void DataLoader::worker_loop() {
  // Serial inside a worker: an OpenMP region started from this thread would get
  // a thread team of its own, and its spinning threads would take the cores
  // from the training step's team.
  set_num_threads(1);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const int64_t end = options_.epochs > 0 ? options_.epochs * batches_per_epoch_ : INT64_MAX;
    work_cv_.wait(
        lock, [&] { return stop_ || (next_claim_ < consumer_ + capacity_ && next_claim_ < end); });
    if (stop_) return;
    const int64_t g = next_claim_++;
    const uint64_t generation = generation_;
    lock.unlock();
    Slot slot;
    try {
      slot.batch = build_linear(g);
    } catch (...) {
      slot.error = std::current_exception();
    }
    lock.lock();
    if (generation != generation_) continue;  // a seek made this batch stale
    ready_.emplace(g, std::move(slot));
    ready_cv_.notify_all();
  }
}

void DataLoader::seek(LoaderPosition pos) {
  FORGE_CHECK(pos.epoch >= 0 && pos.batch >= 0 && pos.batch <= batches_per_epoch_,
              "DataLoader::seek: position (epoch {}, batch {}) out of range; an epoch has {} "
              "batches",
              pos.epoch, pos.batch, batches_per_epoch_);
  if (pos == position_) return;
  position_ = pos;
  if (threads_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    restart_at(pos.epoch * batches_per_epoch_ + pos.batch);
  }
  work_cv_.notify_all();
}

bool DataLoader::next(Batch& out) {
  if (position_.batch >= batches_per_epoch_) {
    position_ = {position_.epoch + 1, 0};
    return false;
  }
  // Past options_.epochs the workers build nothing: such a batch is built here.
  const bool past_end = options_.epochs > 0 && position_.epoch >= options_.epochs;
  if (options_.workers == 0 || past_end) {
    out = build(position_.epoch, position_.batch);
  } else {
    if (threads_.empty()) start_workers();
    const int64_t g = position_.epoch * batches_per_epoch_ + position_.batch;
    Slot slot;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_cv_.wait(lock, [&] { return ready_.count(g) > 0; });
      auto it = ready_.find(g);
      slot = std::move(it->second);
      ready_.erase(it);
      if (slot.error) {
        restart_at(g);  // a retry builds this batch again
      } else {
        consumer_ = g + 1;
      }
    }
    work_cv_.notify_all();
    if (slot.error) std::rethrow_exception(slot.error);
    out = std::move(slot.batch);
  }
  ++position_.batch;
  return true;
}

}  // namespace forge::data
