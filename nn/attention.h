// Multi-head attention over any mechanism of ATTENTION.md, configured by one
// AttentionConfig, and the ProjectionBank that owns Linformer's E/F matrices
// so that sharing across heads and layers is decided in one place.
//
// Shapes: x (B, N, D) -> q, k, v (B, H, N, d) -> attention (B, H, N, d) ->
// merged (B, N, H*d) -> out (B, N, D). The head dim d is independent of D.
// Cross-attention reads keys and values from a context (B, M, Dc).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/names.h"
#include "nn/embeddings.h"
#include "nn/layers.h"
#include "ops/attention/attention.h"

namespace forge::nn {

enum class Mechanism {
  softmax,
  local,
  efficient,
  linear,
  taylor_linear,
  linformer,
  favor,
  taylorshift
};
// The mechanisms' names (recipes' model.attention.kind; core/names.h).
inline constexpr NameTable<Mechanism, 8> kMechanismNames{
    "attention mechanism",
    {"softmax", "local", "efficient", "linear", "taylor_linear", "linformer", "favor",
     "taylorshift"}};
inline const char* mechanism_name(Mechanism m) { return name_of(kMechanismNames, m); }
// Throws, listing the valid names.
inline Mechanism mechanism_from_name(const std::string& name) {
  return enum_from_name(kMechanismNames, name);
}

// Linformer E/F sharing (linformer-pytorch's parameter_sharing): per head per
// layer, one pair per layer (headwise), one matrix per layer used as E and F
// (kv), one matrix for the whole model (layerwise).
enum class LinformerSharing { none, headwise, kv, layerwise };
inline constexpr NameTable<LinformerSharing, 4> kSharingNames{
    "linformer sharing", {"none", "headwise", "kv", "layerwise"}};

// Where a layer's n_local_heads local heads sit among its H heads: first
// (linear-attention-transformer's split_at_index) or last (performer-pytorch's
// Attention, which splits t[:, :global_heads] and t[:, global_heads:]).
enum class LocalHeadsAt { first, last };
inline constexpr NameTable<LocalHeadsAt, 2> kLocalHeadsAtNames{"local heads position",
                                                               {"first", "last"}};

// The per-head width d: head_dim, or dim / heads when head_dim is 0, which
// heads must then divide. The one place that rule is written and checked: the
// error names the three values as the caller calls them (`dim`, `heads`,
// `head_dim`: "model.dim", "ViTConfig.heads", ...).
int64_t resolve_head_dim(int64_t dim, int64_t heads, int64_t head_dim, const std::string& dim_name,
                         const std::string& heads_name, const std::string& head_dim_name);

struct AttentionConfig {
  Mechanism kind = Mechanism::softmax;
  int64_t dim = 0;       // D: input and output width
  int64_t heads = 8;     // H
  int64_t head_dim = 0;  // d; 0: D / H
  bool causal = false;
  bool qkv_bias = false;      // biases on the q, k, v projections
  bool out_bias = true;       // a bias on the output projection (performer-pytorch's attn_out_bias)
  double attn_dropout = 0;    // inside attention (softmax, local, linformer probabilities)
  double output_dropout = 0;  // after the output projection
  double scale = 0;           // softmax score scale; 0: d^-1/2

  // n_local_heads heads use `local` attention, the others `kind`; the local
  // heads are the first or the last ones (local_heads_at).
  int64_t n_local_heads = 0;
  LocalHeadsAt local_heads_at = LocalHeadsAt::first;
  int64_t local_window = 128;  // w
  int64_t local_look_backward = 1;
  int64_t local_look_forward = -1;  // -1: 0 when causal, else 1
  // true (performer-pytorch's LocalAttention with rel_pos_emb_config): the
  // local heads turn q and k by local-attention's rotary relative positions,
  // not by the model's layer rotary (which then turns the global heads only).
  // Halves pair up: (x_i, x_{i + d/2}) at position t turns by t f_i, f_i =
  // 10000^(-2i/d); keys sit at their positions j, queries at i + look_forward w
  // (the reference's window frame has the query's window last in its band, so
  // every score depends on j - i - look_forward w). false: the local heads
  // share the layer rotary, if any, with the global heads
  // (linear-attention-transformer).
  bool local_rotary = false;

  int64_t bucket_size = 64;  // efficient, causal: the blind-spot bucket (1 = none)
  double linear_eps = 1e-6;  // linear

  // favor
  int64_t nb_features = 0;  // m; 0: int(d ln d)
  ops::attention::FavorKernel favor_kernel = ops::attention::FavorKernel::softmax;
  ops::attention::FavorStabilizer favor_stabilizer = ops::attention::FavorStabilizer::prefix;
  int favor_scaling = 0;                   // 0: row norms of Gaussian vectors, 1: sqrt(d)
  int64_t feature_redraw_interval = 1000;  // training forwards between redraws; 0: never

  // linformer: E/F map the sequence (length seq_len, the maximum) to k rows
  int64_t seq_len = 0;
  int64_t k = 256;

  // taylorshift
  double ts_a = 0.5, ts_b = 1.0, ts_c = 1.0;
  int64_t n0 = 0;  // 0: d^2 + d + 1; -1: always efficient
  bool output_normalized = false;

  DType dtype = DType::f32;

  int64_t resolved_head_dim() const {
    return resolve_head_dim(dim, heads, head_dim, "dim", "heads", "head_dim");
  }
  int64_t resolved_look_forward() const {
    return local_look_forward >= 0 ? local_look_forward : (causal ? 0 : 1);
  }
  // The local heads are [local_begin(), local_begin() + n_local_heads).
  int64_t local_begin() const {
    return local_heads_at == LocalHeadsAt::first ? 0 : heads - n_local_heads;
  }
  // The first global head; the global heads are contiguous.
  int64_t global_begin() const { return local_heads_at == LocalHeadsAt::first ? n_local_heads : 0; }
  // Throws a forge::Error naming the first bad field.
  void validate(const std::string& where = "AttentionConfig") const;
};

// Owns every E/F Linear(seq_len -> k_l) of a model's Linformer layers (weight
// [k_l, seq_len] Xavier-normal, bias [k_l]) and hands the right pair to each
// (layer, head). k_l = max(k - layer * k_reduce_by_layer, 1).
class ProjectionBank : public Module {
 public:
  ProjectionBank(LinformerSharing sharing, int64_t layers, int64_t heads, int64_t seq_len,
                 int64_t k, int64_t k_reduce_by_layer = 0, DType dtype = DType::f32,
                 Generator* gen = nullptr);
  Linear& E(int64_t layer, int64_t head);
  Linear& F(int64_t layer, int64_t head);
  int64_t k_of_layer(int64_t layer) const;
  int64_t distinct() const { return static_cast<int64_t>(projections_.size()); }

  LinformerSharing sharing;
  int64_t layers, heads, seq_len, k, k_reduce_by_layer;

 private:
  int64_t index(int64_t layer, int64_t head, bool is_f) const;
  std::vector<std::shared_ptr<Linear>> projections_;  // registered as "0", "1", ...
};

// Keys and values (B, h, C, d) kept for heads that attend over past tokens;
// key j sits in row j % C. softmax keeps every key (C doubles when full, so it
// never wraps); local keeps C = (look_backward + 1) w rows, the widest band a
// causal query sees (its own window and look_backward windows behind).
struct KVCache {
  Tensor k, v;
};

// Decoding state of one causal self-attention layer (see
// MultiHeadAttention::step): a KVCache for softmax and local heads, O(F dv)
// running sums per head for the linear mechanisms (linear, efficient, favor).
// Hg is the number of global (non-local) heads.
struct AttentionState {
  int64_t pos = 0;   // tokens consumed so far
  KVCache kv;        // the global heads when they are softmax or local
  KVCache local_kv;  // the local heads of a layer that mixes local and global heads
  Tensor S, z;       // [B, Hg, F, d], [B, Hg, F]: sums over the keys seen (F = feature count)
  Tensor S_bucket, z_bucket;  // efficient with buckets: the current bucket's sums
  Tensor k_max;               // favor prefix stabiliser: running max [B, Hg]
  Tensor v_sum;               // favor softmax kernel: sum of v [B, Hg, d]
  Tensor count;               // favor softmax kernel: keys seen (for the eps term)
  // The linear-family sums updated with tensor ops on their own device (set
  // for inputs on a GPU, where the host loops cannot run; tests set it on
  // the CPU to compare the two): MultiHeadAttention::recurrent_with_ops().
  bool with_ops = false;
};

class MultiHeadAttention : public Module {
 public:
  // `bank` and `layer` are needed for linformer (the bank is registered by the
  // owner of the stack, not here). Cross-attention takes keys and values from a
  // context of width context_dim (0: D).
  MultiHeadAttention(const AttentionConfig& config, bool cross = false, int64_t context_dim = 0,
                     std::shared_ptr<ProjectionBank> bank = nullptr, int64_t layer = 0,
                     Generator* gen = nullptr);

  // x (B, N, D); mask (B, N) true = real token (keys of self-attention);
  // context (B, M, Dc) and context_mask (B, M) for cross-attention.
  Tensor forward(const Tensor& x, const Tensor& mask = Tensor(), const Tensor& context = Tensor(),
                 const Tensor& context_mask = Tensor());

  // Per-head attention probabilities (B, H, N, M) (linformer: (B, H, N, k)),
  // computed naively without gradient, for the visualizer. Only for mechanisms
  // that have an explicit map: softmax, local, linformer, taylorshift.
  Tensor attention_maps(const Tensor& x, const Tensor& mask = Tensor(),
                        const Tensor& context = Tensor(), const Tensor& context_mask = Tensor());
  bool has_attention_maps() const;
  // When set, every forward also stores attention_maps of its input in
  // captured_maps (the visualizer runs one example through the whole model).
  bool capture_maps = false;
  Tensor captured_maps;

  // Causal decoding: x (B, n, D) at positions state.pos.. -> (B, n, D), those
  // rows of forward over the whole prefix, consumed into `state`. One token
  // (n = 1) attends to the state: O(1) for linear, efficient and favor heads,
  // O(keys kept) for softmax and local heads. A prompt (n > 1) runs the
  // forward's op and must come first (state.pos = 0). supports_recurrent():
  // causal self-attention of those mechanisms (favor's softmax kernel with the
  // prefix stabiliser), local heads mixed in or not.
  bool supports_recurrent() const;
  // Whether step() can keep its state on a GPU: linear, efficient and favor
  // heads (sums updated with tensor ops); softmax and local heads' key /
  // value caches are host memory.
  bool recurrent_with_ops() const;
  Tensor step(const Tensor& x, AttentionState& state);

  // favor: draw a new W from the module's generator. tick_redraw() counts one
  // training forward and redraws when feature_redraw_interval are due (unless
  // fixed), as performer-pytorch's ProjectionUpdater; models call it once per
  // forward, outside any checkpointed region, so recomputation never redraws.
  void redraw_projection();
  void tick_redraw();
  void fix_projections(bool fixed = true) { projections_fixed_ = fixed; }
  // taylorshift: the direct/efficient switch point (see AttentionConfig::n0).
  void set_n0(int64_t n0) { config.n0 = n0; }
  // C2: compute each head's attention under autograd::checkpoint.
  void set_checkpoint_heads(bool on) { checkpoint_heads_ = on; }
  // Rotary position embedding applied to q and k (owned by the model), of
  // every head but the local ones with local_rotary.
  void set_rotary(std::shared_ptr<RotaryEmbedding> rotary) { rotary_ = std::move(rotary); }

  AttentionConfig config;
  bool cross;
  int64_t layer;
  std::shared_ptr<Linear> to_q, to_k, to_v, to_out;
  std::shared_ptr<Dropout> out_dropout;
  Tensor tau;                      // taylorshift [H - n_local], global heads in order
  Tensor projection_matrix;        // favor [m, d] (buffer)
  Tensor calls_since_last_redraw;  // favor: i64 scalar buffer

 private:
  struct Projected {
    Tensor q, k, v;  // (B, H, N, d), (B, H, M, d), (B, H, M, d)
    Tensor key_mask;
  };
  // q, k, v of heads [h0, h1), all local or all global (rotary applied at
  // positions offset..).
  Projected project(const Tensor& x, const Tensor& mask, const Tensor& context,
                    const Tensor& context_mask, int64_t offset, int64_t h0, int64_t h1);
  // Heads [h0, h1), all of one mechanism, on (B, h1 - h0, ., d) tensors.
  Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_mask,
                int64_t h0, int64_t h1);
  Tensor merge(const Tensor& o);  // (B, H, N, d) -> (B, N, D)
  // step's halves for heads [h0, h1) of one mechanism: add k, v (B, h, n, d)
  // of positions pos.. to the state; attend q (B, h, 1, d) of position pos
  // (its own key absorbed) to the state -> (B, h, 1, d).
  void absorb(const Tensor& k, const Tensor& v, int64_t pos, int64_t h0, AttentionState& st);
  Tensor read(const Tensor& q, int64_t pos, int64_t h0, AttentionState& st);
  // The same for the linear-family heads with tensor ops (AttentionState::with_ops).
  void absorb_with_ops(const Tensor& k, const Tensor& v, int64_t pos, AttentionState& st);
  Tensor read_with_ops(const Tensor& q, AttentionState& st);
  // phi of rows x (B, h, n, d) -> (B, h, n, F) for linear, efficient keys,
  // favor relu / no_projection keys and queries (not favor's softmax kernel).
  Tensor features_with_ops(const Tensor& x, bool query) const;

  bool is_local(int64_t h) const {
    return h >= config.local_begin() && h < config.local_begin() + config.n_local_heads;
  }

  std::shared_ptr<ProjectionBank> bank_;
  std::shared_ptr<RotaryEmbedding> rotary_;
  bool projections_fixed_ = false;
  bool checkpoint_heads_ = false;
};

}  // namespace forge::nn
