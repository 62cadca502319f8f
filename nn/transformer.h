// Transformer blocks and the Stack that runs them plain (C0), checkpointed per
// sublayer (C1), per sublayer and per head (C2), or reversibly (RevNet).
//
// A block is three residual branches on x (B, N, D):
//   pre-norm:  x = x + attn(norm(x));  [x = x + cross(norm(x), ctx)];  x = x + ff(norm(x))
//   post-norm: x = norm(x + attn(x));  ...                              (linformer-pytorch)
// with ReZero replacing norm(.) by the identity and scaling each branch by a
// learned g (init 0). Token shifting (linear-attention-transformer) shifts
// feature segments of each branch's input along the sequence. Every norm of a
// stack, the final one included, uses BlockConfig::norm_eps.
//
// Stochastic depth (timm's Block: x = x + drop_path(attn(norm(x))), ...)
// drops each branch's output per sample before the residual add (post-norm:
// x = norm(x + drop_path(f(x)))), in training only. The drop sits inside the
// function that C1/C2 checkpoint and that a reversible coupling replays, so the
// recomputation redraws the forward's mask from the same generator position.
#pragma once

#include <memory>
#include <vector>

#include "core/names.h"
#include "nn/attention.h"
#include "nn/drop_path.h"
#include "nn/layers.h"
#include "nn/norms.h"

namespace forge::nn {

enum class NormKind { layer, scale, rezero };
inline constexpr NameTable<NormKind, 3> kNormNames{"norm", {"layer", "scale", "rezero"}};

enum class CheckpointLevel { C0, C1, C2 };
inline constexpr NameTable<CheckpointLevel, 3> kCheckpointLevelNames{"checkpoint level",
                                                                     {"C0", "C1", "C2"}};

// What a reversible stack returns from its two halves (y1, y2): their sum
// (performer-pytorch) or their mean (linear-attention-transformer).
enum class ReversibleOutput { sum, mean };
inline constexpr NameTable<ReversibleOutput, 2> kReversibleOutputNames{"reversible output",
                                                                       {"sum", "mean"}};

// The norm after the last block: a LayerNorm whatever the blocks use
// (performer-pytorch and linear-attention-transformer, whose models end in
// nn.LayerNorm with ScaleNorm or ReZero blocks too), or the blocks' own kind
// (ScaleNorm after ScaleNorm blocks; LayerNorm after LayerNorm or ReZero blocks).
enum class FinalNormKind { layer, block };
inline constexpr NameTable<FinalNormKind, 2> kFinalNormKindNames{"final norm kind",
                                                                 {"layer", "block"}};

struct BlockConfig {
  AttentionConfig attention{};  // self-attention; attention.dim is D
  FeedForwardOptions ff{};      // ff.dim is set to D
  bool cross_attention = false;
  // cross-attention (non-causal; kind, heads, linformer seq_len / k, ...)
  AttentionConfig cross{};
  int64_t context_dim = 0;  // 0: D
  NormKind norm = NormKind::layer;
  // eps of every LayerNorm (added to the variance) and ScaleNorm (the floor of
  // the norm) of the stack, the final norm included. The models write their
  // own norm_eps here (timm's ViT 1e-6, PyTorch's default 1e-5).
  double norm_eps = 1e-5;
  bool post_norm = false;
  bool shift_tokens = false;
  // The shift of each feature segment (TokenShift); empty: linear-attention-
  // transformer's (1, 0) when causal, (1, 0, -1) otherwise. performer-pytorch's
  // are (0, 1) and (-1, 0, 1). Causal blocks take shifts of 0 and 1 only.
  std::vector<int64_t> token_shifts{};
  // linear-attention-transformer's attend_axially: after the block, a second
  // pair of branches whose attention runs on the sequence folded by
  // attention.local_window (positions i = r mod w form sequence r, so each
  // attends with stride w), followed by its own feed-forward.
  bool attend_axially = false;
  // Stochastic depth rate of each of this block's branches, in [0, 1). In a
  // Stack leave it 0: the Stack writes each block's rate from StackConfig::drop_path.
  double drop_path = 0;
};

// The normalisation in front of (pre-norm) or after (post-norm) a branch.
class SublayerNorm : public Module {
 public:
  SublayerNorm(NormKind kind, int64_t dim, DType dtype, double eps);
  Tensor forward(const Tensor& x);     // ReZero: identity
  Tensor scale(const Tensor& branch);  // ReZero: branch * g; otherwise branch

  NormKind kind;
  std::shared_ptr<LayerNorm> layer_norm;
  std::shared_ptr<ScaleNorm> scale_norm;
  std::shared_ptr<ReZero> rezero;
};

// One block's recurrent decoding state (see Stack::step).
struct BlockState {
  AttentionState attn;
  Tensor prev_attn_in, prev_ff_in;  // token shift: the previous token's branch inputs (B, 1, D)
};

class Block : public Module {
 public:
  // `bank` / `context_bank`: the Stack's Linformer E/F for self- and
  // cross-attention (null when that attention is not linformer).
  Block(const BlockConfig& config, int64_t layer, std::shared_ptr<ProjectionBank> bank = nullptr,
        std::shared_ptr<ProjectionBank> context_bank = nullptr, Generator* gen = nullptr);

  // The residual branches without their residual: f(x) = attention part
  // (self, then cross on x + self), g(x) = feed-forward part. Pre-norm only.
  Tensor attention_branch(const Tensor& x, const Tensor& mask, const Tensor& context,
                          const Tensor& context_mask);
  Tensor ff_branch(const Tensor& x);
  // branch (B, N, D) -> drop_path(branch) at config.drop_path, in training
  // mode, drawing from generator(): what forward and the reversible couplings
  // apply to each branch's output.
  Tensor drop_branch(const Tensor& branch);
  // The whole block; `level` C1/C2 checkpoints each branch.
  Tensor forward(const Tensor& x, const Tensor& mask = Tensor(), const Tensor& context = Tensor(),
                 const Tensor& context_mask = Tensor(),
                 CheckpointLevel level = CheckpointLevel::C0);
  // Decoding (see Stack::step): the block, or each branch, on new tokens x
  // (B, n, D), continuing from `state`.
  Tensor step(const Tensor& x, BlockState& state, const Tensor& context = Tensor(),
              const Tensor& context_mask = Tensor());
  Tensor attention_step(const Tensor& x, BlockState& state, const Tensor& context,
                        const Tensor& context_mask);
  Tensor ff_step(const Tensor& x, BlockState& state);

  BlockConfig config;
  std::shared_ptr<MultiHeadAttention> attn, cross_attn;
  std::shared_ptr<FeedForward> ff;
  std::shared_ptr<SublayerNorm> attn_norm, cross_norm, ff_norm;
  std::shared_ptr<TokenShift> shift;  // null without shift_tokens
  // attend_axially: the folded attention and its feed-forward (else null).
  std::shared_ptr<MultiHeadAttention> axial_attn;
  std::shared_ptr<FeedForward> axial_ff;
  std::shared_ptr<SublayerNorm> axial_norm, axial_ff_norm;
  // x (B, N, D) -> axial_attn over the folded sequence -> (B, N, D).
  Tensor axial_branch(const Tensor& x, const Tensor& mask);
  Tensor axial_ff_branch(const Tensor& x);

 private:
  Tensor self_part(const Tensor& x, const Tensor& mask);
  Tensor cross_part(const Tensor& x, const Tensor& context, const Tensor& context_mask);
};

struct StackConfig {
  int64_t depth = 1;
  BlockConfig block{};
  // Optional per-layer self-attention configs (size depth) overriding
  // block.attention: a mechanism (and local-head mix) per layer.
  std::vector<AttentionConfig> layer_attention{};
  CheckpointLevel checkpoint = CheckpointLevel::C0;
  bool reversible = false;  // pre-norm only; checkpoint levels do not apply
  ReversibleOutput reversible_output = ReversibleOutput::sum;
  LinformerSharing sharing = LinformerSharing::none;
  int64_t k_reduce_by_layer = 0;
  bool final_norm = true;  // a norm after the last block (pre-norm stacks)
  FinalNormKind final_norm_kind = FinalNormKind::layer;
  // Stochastic depth: the largest rate, in [0, 1). Block l of depth L drops at
  // drop_path * l / (L - 1) (timm's torch.linspace(0, drop_path, depth)); a
  // single block at 0.
  double drop_path = 0;
  // Throws a forge::Error naming the first bad field (the Stack fills derived
  // fields such as ff.dim and the per-layer widths itself).
  void validate(const std::string& where = "StackConfig") const;
};

// depth blocks over x (B, N, D) -> (B, N, D). Reversible: the input is
// duplicated into (x1, x2), blocks couple y1 = x1 + f(x2), y2 = x2 + g(y1)
// as one autograd node that stores no block activation, and the output is
// y1 + y2, or (y1 + y2) / 2 with ReversibleOutput::mean (then the final norm).
// With drop path f and g end in it: f = drop_branch(attention_branch), g =
// drop_branch(ff_branch) (one mask over self + cross-attention; the axial pair
// is a coupling of its own), so backward's x2 = y2 - g(y1) replays g's mask.
class Stack : public Module {
 public:
  explicit Stack(const StackConfig& config, Generator* gen = nullptr);
  Tensor forward(const Tensor& x, const Tensor& mask = Tensor(), const Tensor& context = Tensor(),
                 const Tensor& context_mask = Tensor());

  // Incremental decoding (causal pre-norm stacks, reversible or not, whose
  // every layer supports_recurrent()): x (B, n, D) at positions
  // states[0].attn.pos.. -> (B, n, D), those rows of forward over the whole
  // prefix. n > 1 (a prompt) only from the initial state; then one token at a time.
  // Decoding is inference: it applies no drop path.
  bool supports_recurrent() const;
  // Whether that state can live on a GPU: every layer's heads linear,
  // efficient or favor (MultiHeadAttention::recurrent_with_ops).
  bool recurrent_with_ops() const;
  std::vector<BlockState> initial_state() const { return std::vector<BlockState>(blocks.size()); }
  Tensor step(const Tensor& x, std::vector<BlockState>& states, const Tensor& context = Tensor(),
              const Tensor& context_mask = Tensor());

  // Once per training forward (favor feature redraw schedule).
  void tick_redraw();
  void fix_projections(bool fixed = true);
  void set_n0(int64_t n0);
  void set_rotary(std::shared_ptr<RotaryEmbedding> rotary);
  std::vector<std::shared_ptr<MultiHeadAttention>> attention_layers() const;

  StackConfig config;
  std::shared_ptr<ModuleList<Block>> layers;   // "layers.0", "layers.1", ...
  std::vector<std::shared_ptr<Block>> blocks;  // the same blocks
  std::shared_ptr<ProjectionBank> bank;        // "projections" (linformer layers only)
  std::shared_ptr<ProjectionBank>
      context_bank;                    // "context_projections" (linformer cross-attention)
  std::shared_ptr<SublayerNorm> norm;  // "norm" (final_norm, pre-norm)
};

}  // namespace forge::nn
