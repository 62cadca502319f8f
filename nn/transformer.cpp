// Blocks and stacks (see transformer.h): how the residual branches are
// composed, checkpointed (C1/C2) or coupled reversibly, and decoded one token
// at a time.
#include "nn/transformer.h"

#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "autograd/reversible.h"
#include "ops/ops.h"

namespace forge::nn {

namespace {

// Token shift of new tokens x (B, n, D) that continue a sequence whose last
// branch input was prev (B, 1, D) (zeros before the first token): the last n
// rows of shift(cat(prev, x)); prev becomes x's last row. Causal shifts are 0
// or 1, so one previous token is all the shift can reach.
Tensor shift_on(TokenShift& shift, const Tensor& x, Tensor& prev) {
  const int64_t n = x.size(1);
  if (!prev.defined()) prev = Tensor::zeros({x.size(0), 1, x.size(2)}, x.dtype(), x.device());
  Tensor both = shift.forward(ops::cat({prev, x}, 1));
  prev = ops::narrow(x, 1, n - 1, 1);
  return ops::narrow(both, 1, 1, n);
}

}  // namespace

// ---- SublayerNorm ----

SublayerNorm::SublayerNorm(NormKind k, int64_t dim, DType dtype, double eps) : kind(k) {
  switch (k) {
    case NormKind::layer:
      layer_norm =
          register_module("norm", std::make_shared<LayerNorm>(Shape{dim}, eps, true, dtype));
      break;
    case NormKind::scale:
      scale_norm = register_module("norm", std::make_shared<ScaleNorm>(eps, dtype));
      break;
    case NormKind::rezero:
      rezero = register_module("rezero", std::make_shared<ReZero>(dtype));
      break;
  }
}

Tensor SublayerNorm::forward(const Tensor& x) {
  if (layer_norm) return layer_norm->forward(x);
  if (scale_norm) return scale_norm->forward(x);
  return x;
}

Tensor SublayerNorm::scale(const Tensor& branch) {
  return rezero ? rezero->forward(branch) : branch;
}

// ---- Block ----

Block::Block(const BlockConfig& c, int64_t layer, std::shared_ptr<ProjectionBank> bank,
             std::shared_ptr<ProjectionBank> context_bank, Generator* gen)
    : config(c) {
  const int64_t D = c.attention.dim;
  const DType dt = c.attention.dtype;
  const auto make_norm = [&] { return std::make_shared<SublayerNorm>(c.norm, D, dt, c.norm_eps); };
  FORGE_CHECK(!c.post_norm || !c.attend_axially,
              "Block: attend_axially is a pre-norm option (as in linear-attention-transformer)");
  FORGE_CHECK(!c.post_norm || !c.shift_tokens,
              "Block: shift_tokens is a pre-norm option (linear-attention-transformer shifts "
              "each pre-norm branch's normalised input); unset post_norm or shift_tokens");
  FORGE_CHECK(!c.post_norm || c.norm != NormKind::rezero,
              "Block: post-norm with ReZero is not a transformer block; use pre-norm with ReZero");
  FORGE_CHECK(c.drop_path >= 0 && c.drop_path < 1,
              "BlockConfig.drop_path must be in [0, 1), got {}", c.drop_path);
  attn_norm = register_module("attn_norm", make_norm());
  attn = register_module("attn", std::make_shared<MultiHeadAttention>(c.attention, false, 0,
                                                                      std::move(bank), layer, gen));
  if (c.cross_attention) {
    AttentionConfig cross = c.cross;
    cross.dim = D;
    cross.dtype = dt;
    cross_norm = register_module("cross_norm", make_norm());
    cross_attn = register_module(
        "cross_attn", std::make_shared<MultiHeadAttention>(cross, true, c.context_dim,
                                                           std::move(context_bank), layer, gen));
  }
  FeedForwardOptions f = c.ff;
  f.dim = D;
  f.dtype = dt;
  ff_norm = register_module("ff_norm", make_norm());
  ff = register_module("ff", std::make_shared<FeedForward>(f, gen));
  if (c.attend_axially) {
    AttentionConfig folded = c.attention;
    folded.n_local_heads = 0;  // the reference's folded SelfAttention is all global
    axial_norm = register_module("axial_norm", make_norm());
    axial_attn = register_module(
        "axial_attn", std::make_shared<MultiHeadAttention>(folded, false, 0, nullptr, layer, gen));
    axial_ff_norm = register_module("axial_ff_norm", make_norm());
    axial_ff = register_module("axial_ff", std::make_shared<FeedForward>(f, gen));
  }
  if (c.shift_tokens) {
    const std::vector<int64_t> shifts =
        c.token_shifts.empty() ? TokenShift::default_shifts(c.attention.causal) : c.token_shifts;
    for (int64_t s : shifts)
      FORGE_CHECK(!c.attention.causal || s == 0 || s == 1,
                  "BlockConfig.token_shifts: a causal block shifts by 0 or 1 (no look-ahead), got "
                  "{}",
                  s);
    shift = register_module("shift", std::make_shared<TokenShift>(shifts));
  }
}

Tensor Block::self_part(const Tensor& x, const Tensor& mask) {
  Tensor h = attn_norm->forward(x);
  if (shift) h = shift->forward(h, mask);
  return attn_norm->scale(attn->forward(h, mask));
}

Tensor Block::cross_part(const Tensor& x, const Tensor& context, const Tensor& context_mask) {
  return cross_norm->scale(
      cross_attn->forward(cross_norm->forward(x), Tensor(), context, context_mask));
}

Tensor Block::attention_branch(const Tensor& x, const Tensor& mask, const Tensor& context,
                               const Tensor& context_mask) {
  Tensor s = self_part(x, mask);
  return cross_attn ? s + cross_part(x + s, context, context_mask) : s;
}

Tensor Block::ff_branch(const Tensor& x) {
  Tensor h = ff_norm->forward(x);
  if (shift) h = shift->forward(h);  // the reference shifts the feed-forward input unmasked
  return ff_norm->scale(ff->forward(h));
}

Tensor Block::axial_branch(const Tensor& x, const Tensor& mask) {
  // (B, N, D) -> (B, N/w, w, D) -> (B, w, N/w, D) -> (B w, N/w, D): row r of the
  // fold holds positions r, r + w, r + 2w, ...; the mask folds the same way.
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2), w = config.attention.local_window;
  FORGE_CHECK(N % w == 0,
              "Block: attend_axially folds the sequence by local_window = {}, so N must be a "
              "multiple of it; got N = {}",
              w, N);
  auto fold = [&](const Tensor& t, Shape split, Shape merged) {
    return ops::reshape(ops::transpose(ops::reshape(t, split), 1, 2), merged);
  };
  Tensor h = fold(axial_norm->forward(x), {B, N / w, w, D}, {B * w, N / w, D});
  Tensor m = mask.defined() ? fold(mask.to(DType::u8), {B, N / w, w}, {B * w, N / w}) : Tensor();
  Tensor o = axial_attn->forward(h, m);  // (B w, N/w, D)
  return axial_norm->scale(fold(o, {B, w, N / w, D}, {B, N, D}));
}

Tensor Block::axial_ff_branch(const Tensor& x) {
  return axial_ff_norm->scale(axial_ff->forward(axial_ff_norm->forward(x)));
}

Tensor Block::drop_branch(const Tensor& branch) {
  return drop_path(branch, config.drop_path, is_training(), generator());
}

Tensor Block::forward(const Tensor& x, const Tensor& mask, const Tensor& context,
                      const Tensor& context_mask, CheckpointLevel level) {
  FORGE_CHECK(!cross_attn || context.defined(),
              "Block: this block has cross-attention and needs a context (B, M, Dc)");
  // C1/C2: each branch keeps only its inputs and is recomputed in backward.
  const bool ckpt = level != CheckpointLevel::C0 && autograd::grad_enabled();
  const std::vector<Tensor> params = ckpt ? parameters() : std::vector<Tensor>{};
  auto run = [&](const autograd::TensorFn& fn, const std::vector<Tensor>& in) {
    return ckpt ? autograd::checkpoint(fn, in, generator(), params)[0] : fn(in)[0];
  };
  // The branches capture by value: under checkpointing they run again in backward,
  // drop path included, so the replay draws the forward's mask.
  auto self_fn = [this, mask](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    return {drop_branch(config.post_norm ? attn->forward(in[0], mask) : self_part(in[0], mask))};
  };
  auto cross_fn = [this, context_mask](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    return {drop_branch(config.post_norm ? cross_attn->forward(in[0], Tensor(), in[1], context_mask)
                                         : cross_part(in[0], in[1], context_mask))};
  };
  auto ff_fn = [this](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    return {drop_branch(config.post_norm ? ff->forward(in[0]) : ff_branch(in[0]))};
  };
  auto axial_fn = [this, mask](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    return {drop_branch(axial_branch(in[0], mask))};
  };
  auto axial_ff_fn = [this](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    return {drop_branch(axial_ff_branch(in[0]))};
  };
  Tensor h = x;
  if (config.post_norm) {  // x = norm(x + f(x)) per branch
    h = attn_norm->forward(h + run(self_fn, {h}));
    if (cross_attn) h = cross_norm->forward(h + run(cross_fn, {h, context}));
    return ff_norm->forward(h + run(ff_fn, {h}));
  }
  h = h + run(self_fn, {h});
  if (cross_attn) h = h + run(cross_fn, {h, context});
  h = h + run(ff_fn, {h});
  if (axial_attn) {
    h = h + run(axial_fn, {h});
    h = h + run(axial_ff_fn, {h});
  }
  return h;
}

// attention_branch and ff_branch of new tokens, continuing from `state`.
Tensor Block::attention_step(const Tensor& x, BlockState& state, const Tensor& context,
                             const Tensor& context_mask) {
  Tensor h = attn_norm->forward(x);
  if (shift) h = shift_on(*shift, h, state.prev_attn_in);
  Tensor s = attn_norm->scale(attn->step(h, state.attn));
  return cross_attn ? s + cross_part(x + s, context, context_mask) : s;
}

Tensor Block::ff_step(const Tensor& x, BlockState& state) {
  Tensor h = ff_norm->forward(x);
  if (shift) h = shift_on(*shift, h, state.prev_ff_in);
  return ff_norm->scale(ff->forward(h));
}

Tensor Block::step(const Tensor& x, BlockState& state, const Tensor& context,
                   const Tensor& context_mask) {
  FORGE_CHECK(!config.post_norm, "Block::step: recurrent decoding is for pre-norm blocks");
  Tensor y = x + attention_step(x, state, context, context_mask);
  return y + ff_step(y, state);
}

// ---- Stack ----

void StackConfig::validate(const std::string& where) const {
  FORGE_CHECK(depth > 0, "{}.depth must be > 0, got {}", where, depth);
  FORGE_CHECK(layer_attention.empty() || static_cast<int64_t>(layer_attention.size()) == depth,
              "{}.layer_attention must be empty or hold one config per layer ({}), got {}", where,
              depth, layer_attention.size());
  FORGE_CHECK(!reversible || !block.post_norm,
              "{}: reversible layers need pre-norm blocks (post_norm is set)", where);
  FORGE_CHECK(!reversible || checkpoint == CheckpointLevel::C0,
              "{}: reversible layers store no activations already; checkpoint must be C0", where);
  FORGE_CHECK(k_reduce_by_layer >= 0, "{}.k_reduce_by_layer must be >= 0, got {}", where,
              k_reduce_by_layer);
  FORGE_CHECK(block.norm_eps > 0, "{}.block.norm_eps must be > 0, got {}", where, block.norm_eps);
  FORGE_CHECK(drop_path >= 0 && drop_path < 1, "{}.drop_path must be in [0, 1), got {}", where,
              drop_path);
  FORGE_CHECK(block.drop_path == 0,
              "{}.block.drop_path is {}; set {}.drop_path instead (the Stack gives block l of "
              "depth L the rate drop_path * l / (L - 1))",
              where, block.drop_path, where);
}

namespace {

// A bank for the linformer layers among `configs` (null when there are none);
// they must agree on heads and seq_len, since the bank is one table.
std::shared_ptr<ProjectionBank> make_bank(const std::vector<AttentionConfig>& configs,
                                          const StackConfig& sc, const char* what, Generator* gen) {
  const AttentionConfig* first = nullptr;
  for (const AttentionConfig& c : configs) {
    if (c.kind != Mechanism::linformer || c.n_local_heads == c.heads) continue;
    if (!first) first = &c;
    FORGE_CHECK(c.heads == first->heads && c.seq_len == first->seq_len && c.k == first->k,
                "Stack: every linformer {} layer must have the same heads, seq_len and k (one "
                "ProjectionBank), got heads {} / {}, seq_len {} / {}, k {} / {}",
                what, first->heads, c.heads, first->seq_len, c.seq_len, first->k, c.k);
  }
  if (!first) return nullptr;
  return std::make_shared<ProjectionBank>(sc.sharing, sc.depth, first->heads, first->seq_len,
                                          first->k, sc.k_reduce_by_layer, first->dtype, gen);
}

}  // namespace

Stack::Stack(const StackConfig& c, Generator* gen) : config(c) {
  config.validate();
  std::vector<AttentionConfig> self(static_cast<size_t>(c.depth), c.block.attention);
  for (size_t l = 0; l < c.layer_attention.size(); ++l) {
    self[l] = c.layer_attention[l];
    self[l].dim = c.block.attention.dim;
    self[l].dtype = c.block.attention.dtype;
  }
  bank = make_bank(self, c, "self-attention", gen);
  if (bank) register_module("projections", bank);
  if (c.block.cross_attention) {
    AttentionConfig cross = c.block.cross;
    cross.dim = c.block.attention.dim;
    cross.dtype = c.block.attention.dtype;
    context_bank = make_bank({cross}, c, "cross-attention", gen);
    if (context_bank) register_module("context_projections", context_bank);
  }
  layers = register_module("layers", std::make_shared<ModuleList<Block>>());
  for (int64_t l = 0; l < c.depth; ++l) {
    BlockConfig bc = c.block;
    bc.attention = self[static_cast<size_t>(l)];
    bc.drop_path =
        c.depth > 1 ? c.drop_path * static_cast<double>(l) / static_cast<double>(c.depth - 1) : 0.0;
    auto block = layers->push_back(std::make_shared<Block>(bc, l, bank, context_bank, gen));
    if (c.checkpoint == CheckpointLevel::C2) {
      block->attn->set_checkpoint_heads(true);
      if (block->cross_attn) block->cross_attn->set_checkpoint_heads(true);
    }
    blocks.push_back(block);
  }
  if (c.final_norm && !c.block.post_norm) {
    const bool scale = c.final_norm_kind == FinalNormKind::block && c.block.norm == NormKind::scale;
    norm = register_module(
        "norm", std::make_shared<SublayerNorm>(scale ? NormKind::scale : NormKind::layer,
                                               c.block.attention.dim, c.block.attention.dtype,
                                               c.block.norm_eps));
  }
}

Tensor Stack::forward(const Tensor& x, const Tensor& mask, const Tensor& context,
                      const Tensor& context_mask) {
  Tensor h = x;
  if (config.reversible) {
    // (x1, x2) = (x, x); f = the attention branch, g = the feed-forward branch,
    // each ending in its drop path (replayed in backward from the same position).
    std::vector<autograd::Coupling> couplings;
    for (const auto& b : blocks) {
      Block* blk = b.get();
      couplings.push_back(
          {[blk, mask, context_mask](const Tensor& in, const std::vector<Tensor>& ctx) {
             return blk->drop_branch(
                 blk->attention_branch(in, mask, ctx.empty() ? Tensor() : ctx[0], context_mask));
           },
           [blk](const Tensor& in, const std::vector<Tensor>&) {
             return blk->drop_branch(blk->ff_branch(in));
           },
           blk->parameters()});
      if (blk->axial_attn)  // the folded pair is a coupling of its own, as in the reference
        couplings.push_back({[blk, mask](const Tensor& in, const std::vector<Tensor>&) {
                               return blk->drop_branch(blk->axial_branch(in, mask));
                             },
                             [blk](const Tensor& in, const std::vector<Tensor>&) {
                               return blk->drop_branch(blk->axial_ff_branch(in));
                             },
                             blk->parameters()});
    }
    const std::vector<Tensor> ctx =
        context.defined() ? std::vector{context} : std::vector<Tensor>{};
    std::vector<Tensor> y = autograd::reversible_sequence(couplings, h, h, ctx, generator());
    h = y[0] + y[1];
    if (config.reversible_output == ReversibleOutput::mean) h = h * 0.5;
  } else {
    for (const auto& b : blocks) h = b->forward(h, mask, context, context_mask, config.checkpoint);
  }
  return norm ? norm->forward(h) : h;
}

bool Stack::supports_recurrent() const {
  for (const auto& b : blocks)
    if (b->config.post_norm || b->axial_attn || !b->attn->supports_recurrent()) return false;
  return true;
}

bool Stack::recurrent_with_ops() const {
  if (!supports_recurrent()) return false;
  for (const auto& b : blocks)
    if (!b->attn->recurrent_with_ops()) return false;
  return true;
}

Tensor Stack::step(const Tensor& x, std::vector<BlockState>& states, const Tensor& context,
                   const Tensor& context_mask) {
  FORGE_CHECK(supports_recurrent(),
              "Stack::step: decoding needs pre-norm blocks without attend_axially whose "
              "self-attention supports_recurrent() (causal softmax, local, linear, efficient or "
              "favor)");
  FORGE_CHECK(states.size() == blocks.size(), "Stack::step: {} states for {} blocks", states.size(),
              blocks.size());
  NoGradGuard no_grad;
  Tensor h = x;
  if (config.reversible) {  // forward's couplings: y1 = x1 + f(x2), y2 = x2 + g(y1)
    Tensor x1 = h, x2 = h;
    for (size_t l = 0; l < blocks.size(); ++l) {
      x1 = x1 + blocks[l]->attention_step(x2, states[l], context, context_mask);
      x2 = x2 + blocks[l]->ff_step(x1, states[l]);
    }
    h = x1 + x2;
    if (config.reversible_output == ReversibleOutput::mean) h = h * 0.5;
  } else {
    for (size_t l = 0; l < blocks.size(); ++l)
      h = blocks[l]->step(h, states[l], context, context_mask);
  }
  return norm ? norm->forward(h) : h;
}

std::vector<std::shared_ptr<MultiHeadAttention>> Stack::attention_layers() const {
  std::vector<std::shared_ptr<MultiHeadAttention>> out;
  for (const auto& b : blocks) {
    out.push_back(b->attn);
    if (b->cross_attn) out.push_back(b->cross_attn);
    if (b->axial_attn) out.push_back(b->axial_attn);
  }
  return out;
}

void Stack::tick_redraw() {
  for (auto& a : attention_layers()) a->tick_redraw();
}
void Stack::fix_projections(bool fixed) {
  for (auto& a : attention_layers()) a->fix_projections(fixed);
}
void Stack::set_n0(int64_t n0) {
  for (auto& a : attention_layers()) a->set_n0(n0);
}
void Stack::set_rotary(std::shared_ptr<RotaryEmbedding> rotary) {
  for (auto& b : blocks) b->attn->set_rotary(rotary);
}

}  // namespace forge::nn
