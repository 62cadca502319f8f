// Draws keyed by the global batch position (Generator::reserve_rows): under
// data parallelism, shard r of `count` runs an op on rows [r b, (r + 1) b) of
// a global batch of count b rows. For dropout and every attention op with
// dropout, its outputs and input gradients must be exactly those rows of the
// single-process run over the whole batch, and its generator must end where
// that run's does. Per-shard element counts are chosen so that a shard's first
// draw falls inside a Philox block (first % 4 != 0).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/rng.h"
#include "core/threading.h"
#include "ops/attention/attention.h"
#include "ops/nn/functional.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using namespace testing;

// ---- the generator ----

TEST(BatchShardDraws, DefaultShardIsPlainReserve) {
  Generator a(7), b(7);
  EXPECT_EQ(a.batch_shard(), (BatchShard{0, 1}));
  b.reserve(5);
  a.reserve(5);
  const uint64_t off = b.reserve(10);
  EXPECT_EQ(a.reserve_rows(10), (RowDraws{7, off, 0}));
  EXPECT_EQ(a.state(), b.state());
}

TEST(BatchShardDraws, ShardReservesTheGlobalRequest) {
  Generator g(11), global(11);
  g.set_batch_shard({2, 3});
  // 10 local draws of 3 shards: 30 global draws (8 blocks); this shard's are 20 .. 29.
  EXPECT_EQ(g.reserve_rows(10), (RowDraws{11, 0, 20}));
  EXPECT_EQ(g.offset(), 8u);
  EXPECT_EQ(g.reserve_rows(10), (RowDraws{11, 8, 20}));
  global.reserve_rows(30);
  global.reserve_rows(30);
  EXPECT_EQ(g.state(), global.state());
  // Plain requests are not batch-shaped: every shard draws all of them.
  EXPECT_EQ(g.reserve(6), global.reserve(6));
}

TEST(BatchShardDraws, ShardIsNotGeneratorState) {
  Generator g(3);
  g.set_batch_shard({1, 4});
  const GeneratorState before = g.state();
  EXPECT_EQ(before, (GeneratorState{3, 0}));
  g.set_state({9, 12});
  EXPECT_EQ(g.batch_shard(), (BatchShard{1, 4}));
  g.manual_seed(5);
  EXPECT_EQ(g.batch_shard(), (BatchShard{1, 4}));
}

TEST(BatchShardDraws, RejectsAShardOutsideItsCount) {
  Generator g;
  testing::expect_error([&] { g.set_batch_shard({3, 3}); }, {"index < count", "index 3, count 3"});
  testing::expect_error([&] { g.set_batch_shard({0, 0}); }, {"count >= 1"});
  EXPECT_EQ(g.batch_shard(), (BatchShard{0, 1}));
}

// ---- the ops: shards against the global run ----

// An op under test: `batched` are the tensors whose dim 0 is the batch (in
// order; those requiring grad get gradients), `gen` the generator to draw from.
using ShardedOp = std::function<Tensor(const std::vector<Tensor>& batched, Generator& gen)>;

struct RunResult {
  Tensor out;
  std::vector<Tensor> grads;  // of the batched inputs that require grad (else undefined)
  GeneratorState after;
  Tensor next;  // a plain draw made after the op: later requests must agree too
};

// Runs op on rows [r0, r1) of `batched` (moved to `device`) from generator
// state `start` under `shard`, then backward with rows [r0, r1) of `upstream`;
// the results come back on the CPU.
RunResult run_rows(const ShardedOp& op, const std::vector<Tensor>& batched, const Tensor& upstream,
                   int64_t r0, int64_t r1, BatchShard shard, GeneratorState start,
                   Device device = Device::cpu()) {
  std::vector<Tensor> rows;
  for (const Tensor& t : batched) {
    Tensor x = t.detach().slice0(r0, r1).clone().to(device);
    if (t.requires_grad()) x.set_requires_grad(true);
    rows.push_back(x);
  }
  Generator gen;
  gen.set_state(start);
  gen.set_batch_shard(shard);
  RunResult res;
  const Tensor out = op(rows, gen);
  res.after = gen.state();
  res.next = Tensor::rand({5}, DType::f32, &gen);
  autograd::backward({out}, {upstream.slice0(r0, r1).clone().to(device)});
  res.out = out.detach().to(Device::cpu());
  for (const Tensor& x : rows)
    res.grads.push_back(x.requires_grad() ? x.grad().to(Device::cpu()) : Tensor());
  return res;
}

// `local` equals rows [r0, r1) of `global`: bit for bit when tol is 0, else
// within tol.
void expect_same_rows(const Tensor& global, int64_t r0, int64_t r1, const Tensor& local,
                      const std::string& what, double tol) {
  ASSERT_TRUE(global.defined() && local.defined()) << what;
  const Tensor rows = global.slice0(r0, r1).clone();
  ASSERT_EQ(rows.shape(), local.shape()) << what;
  ASSERT_EQ(rows.dtype(), local.dtype()) << what;
  if (tol > 0) {
    EXPECT_LE(max_abs_diff(rows, local), tol)
        << what << ": rows [" << r0 << ", " << r1 << ") of the global run";
    return;
  }
  EXPECT_EQ(std::memcmp(rows.raw_data(), local.raw_data(), local.nbytes()), 0)
      << what << ": not bitwise equal to rows [" << r0 << ", " << r1
      << ") of the global run (max |diff| " << max_abs_diff(rows, local) << ")";
}

// For each shard r of `count`: op on rows [r b, (r + 1) b) (on `device`)
// equals the global CPU run's rows, outputs, gradients and generator alike;
// bit for bit when tol is 0 (the CPU), else within tol (a GPU, whose sums
// round differently).
void expect_shards_match_global(const ShardedOp& op, const std::vector<Tensor>& batched,
                                int64_t count, uint64_t seed, Device device = Device::cpu(),
                                double tol = 0) {
  const int64_t B = batched.front().size(0), b = B / count;
  ASSERT_EQ(b * count, B);
  Generator start(seed);
  start.reserve(3);  // start mid-stream, as a training run does
  const GeneratorState s0 = start.state();
  // A fixed upstream gradient, the shape of the output.
  Tensor probe;
  {
    Generator g;
    g.set_state(s0);
    std::vector<Tensor> plain;
    for (const Tensor& t : batched) plain.push_back(t.detach());
    probe = op(plain, g);
  }
  Tensor upstream = leaf64(probe.shape(), seed + 100).detach().to(probe.dtype());
  const RunResult global = run_rows(op, batched, upstream, 0, B, {0, 1}, s0);
  ASSERT_NE(global.after, s0) << "the op drew nothing: the test tests nothing";
  for (int64_t r = 0; r < count; ++r) {
    SCOPED_TRACE("shard " + std::to_string(r) + " of " + std::to_string(count));
    const RunResult shard =
        run_rows(op, batched, upstream, r * b, (r + 1) * b,
                 {static_cast<uint64_t>(r), static_cast<uint64_t>(count)}, s0, device);
    expect_same_rows(global.out, r * b, (r + 1) * b, shard.out, "output", tol);
    for (size_t i = 0; i < batched.size(); ++i) {
      if (!batched[i].requires_grad()) continue;
      expect_same_rows(global.grads[i], r * b, (r + 1) * b, shard.grads[i],
                       "gradient of input " + std::to_string(i), tol);
    }
    EXPECT_EQ(shard.after, global.after);
    EXPECT_EQ(shard.next.to_vector<float>(), global.next.to_vector<float>());
  }
}

// The CPU attention backwards choose how to split their work from B * H and
// the thread count, and differently split sums may round differently. One
// thread keeps the global and the shard runs on the same path, so the
// comparison tests the draws alone.
class OneThread {
 public:
  OneThread() : saved_(num_threads()) { set_num_threads(1); }
  ~OneThread() { set_num_threads(saved_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_;
};

// A [B, M] bool key padding mask with the last (b % 3) keys of batch b padded.
Tensor padding_mask(int64_t B, int64_t M) {
  Tensor m = Tensor::ones({B, M}, DType::boolean);
  bool* p = m.data<bool>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = M - b % 3; j < M; ++j) p[b * M + j] = false;
  return m;
}

TEST(BatchShardDraws, Dropout) {
  const ShardedOp op = [](const std::vector<Tensor>& in, Generator& gen) {
    return ops::dropout(in[0], 0.4, true, &gen);
  };
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    // 15 draws per row: shard r's first draw is 15 b r.
    expect_shards_match_global(op, {uniform({4, 3, 5}, 1, dtype)}, 2, 21);
    expect_shards_match_global(op, {uniform({4, 3, 5}, 2, dtype)}, 4, 22);
    expect_shards_match_global(op, {uniform({6, 3, 5}, 3, dtype)}, 3, 23);
  }
}

TEST(BatchShardDraws, SoftmaxAttention) {
  const OneThread one_thread;
  // q [B, 2, 5, 3], k [B, 2, 7, 3], v [B, 2, 7, 4]: 70 draws per batch row.
  const ShardedOp masked = [](const std::vector<Tensor>& in, Generator& gen) {
    ops::attention::SoftmaxOptions o;
    o.dropout = 0.3;
    o.gen = &gen;
    return ops::attention::softmax(in[0], in[1], in[2], in[3], o);
  };
  for (int64_t B : {4, 6}) {
    const std::vector<Tensor> in = {uniform({B, 2, 5, 3}, 31), uniform({B, 2, 7, 3}, 32),
                                    uniform({B, 2, 7, 4}, 33), padding_mask(B, 7)};
    for (int64_t count : {2, 3}) {
      if (B % count == 0) expect_shards_match_global(masked, in, count, 34);
    }
  }
  const ShardedOp causal = [](const std::vector<Tensor>& in, Generator& gen) {
    ops::attention::SoftmaxOptions o;
    o.causal = true;
    o.dropout = 0.25;
    o.gen = &gen;
    return ops::attention::softmax(in[0], in[1], in[2], Tensor(), o);
  };
  expect_shards_match_global(
      causal, {uniform({4, 2, 6, 3}, 35), uniform({4, 2, 6, 3}, 36), uniform({4, 2, 6, 2}, 37)}, 4,
      38);
}

TEST(BatchShardDraws, LocalAttention) {
  const OneThread one_thread;
  // N = 7, window 3, one window back and forward: a band of 9, 126 draws per batch row.
  const auto make = [](bool causal) -> ShardedOp {
    return [causal](const std::vector<Tensor>& in, Generator& gen) {
      ops::attention::LocalOptions o{.window = 3, .causal = causal, .dropout = 0.3, .gen = &gen};
      return ops::attention::local(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor(), o);
    };
  };
  const std::vector<Tensor> in4 = {uniform({4, 2, 7, 3}, 41), uniform({4, 2, 7, 3}, 42),
                                   uniform({4, 2, 7, 4}, 43), padding_mask(4, 7)};
  expect_shards_match_global(make(false), in4, 2, 44);
  expect_shards_match_global(make(true), in4, 4, 45);
  const std::vector<Tensor> in6 = {uniform({6, 2, 7, 3}, 46), uniform({6, 2, 7, 3}, 47),
                                   uniform({6, 2, 7, 4}, 48)};
  expect_shards_match_global(make(false), in6, 3, 49);
}

TEST(BatchShardDraws, LinformerAttention) {
  const OneThread one_thread;
  // kdim 3: q [B, 2, 5, 3] gives 30 draws per batch row. E, F and their biases
  // are shared by every row (every shard holds all of them).
  const Tensor E = leaf64({3, 8}, 51, -0.3, 0.3).detach(),
               F = leaf64({3, 8}, 52, -0.3, 0.3).detach();
  const Tensor bE = leaf64({3}, 53).detach(), bF = leaf64({3}, 54).detach();
  const ShardedOp op = [&](const std::vector<Tensor>& in, Generator& gen) {
    ops::attention::LinformerOptions o;
    o.dropout = 0.35;
    o.gen = &gen;
    return ops::attention::linformer(in[0], in[1], in[2], E, F, bE, bF, in[3], o);
  };
  for (int64_t B : {4, 6}) {
    const std::vector<Tensor> in = {uniform({B, 2, 5, 3}, 55), uniform({B, 2, 6, 3}, 56),
                                    uniform({B, 2, 6, 4}, 57), padding_mask(B, 6)};
    for (int64_t count : {2, 3}) {
      if (B % count == 0) expect_shards_match_global(op, in, count, 58);
    }
  }
}

// ---- the CUDA kernels: a GPU shard against the CPU global run ----

// The kernels add the shard's first draw before splitting draws into Philox
// blocks; a GPU shard must drop exactly what the CPU global run drops. Dropout
// is bitwise; the attention kernels in f64 agree to rounding, far below the
// size of one entry dropped differently.
TEST(BatchShardDraws, CudaShardsMatchTheCpuGlobalRun) {
  FORGE_REQUIRE_CUDA();
  const OneThread one_thread;
  const Device gpu = Device::cuda(0);
  const ShardedOp drop = [](const std::vector<Tensor>& in, Generator& gen) {
    return ops::dropout(in[0], 0.4, true, &gen);
  };
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    expect_shards_match_global(drop, {uniform({6, 3, 5}, 61, dtype)}, 3, 62, gpu);
    // Many Philox blocks per shard, first % 4 == 2.
    expect_shards_match_global(drop, {uniform({6, 37, 13}, 63, dtype)}, 3, 64, gpu);
  }
  const double tol = 1e-9;
  const ShardedOp softmax = [](const std::vector<Tensor>& in, Generator& gen) {
    ops::attention::SoftmaxOptions o;
    o.dropout = 0.3;
    o.gen = &gen;
    return ops::attention::softmax(in[0], in[1], in[2], in[3], o);
  };
  expect_shards_match_global(softmax,
                             {uniform({6, 2, 5, 3}, 65), uniform({6, 2, 7, 3}, 66),
                              uniform({6, 2, 7, 4}, 67), padding_mask(6, 7)},
                             3, 68, gpu, tol);
  const ShardedOp local = [](const std::vector<Tensor>& in, Generator& gen) {
    ops::attention::LocalOptions o;
    o.window = 3;
    o.dropout = 0.3;
    o.gen = &gen;
    return ops::attention::local(in[0], in[1], in[2], in[3], o);
  };
  expect_shards_match_global(local,
                             {uniform({6, 2, 7, 3}, 69), uniform({6, 2, 7, 3}, 70),
                              uniform({6, 2, 7, 4}, 71), padding_mask(6, 7)},
                             3, 72, gpu, tol);
  const Tensor E = leaf64({3, 8}, 73, -0.3, 0.3).detach().to(gpu),
               F = leaf64({3, 8}, 74, -0.3, 0.3).detach().to(gpu);
  const Tensor E_cpu = E.to(Device::cpu()), F_cpu = F.to(Device::cpu());
  const ShardedOp linformer = [&](const std::vector<Tensor>& in, Generator& gen) {
    ops::attention::LinformerOptions o;
    o.dropout = 0.35;
    o.gen = &gen;
    const bool on_gpu = in[0].device().is_cuda();
    return ops::attention::linformer(in[0], in[1], in[2], on_gpu ? E : E_cpu, on_gpu ? F : F_cpu,
                                     Tensor(), Tensor(), in[3], o);
  };
  expect_shards_match_global(linformer,
                             {uniform({6, 2, 5, 3}, 75), uniform({6, 2, 6, 3}, 76),
                              uniform({6, 2, 6, 4}, 77), padding_mask(6, 6)},
                             3, 78, gpu, tol);
}

}  // namespace
}  // namespace forge
