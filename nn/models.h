// The models of the reference libraries, each an embedding in front of one
// Stack (nn/transformer.h) and a head behind it:
//   ViT                    timm's VisionTransformer (TaylorShift's ViT)
//   SequenceClassifier     tokens or vectors -> classes (TaylorShift's Transformer,
//                          LRA classifiers, the LRA retrieval dual encoder)
//   LanguageModel          PerformerLM / LinearAttentionTransformerLM, with generate
//   EncoderDecoder         PerformerEncDec / the linear-attention-transformer encoder-decoder
//   ImageEfficientAttention  linear-attention-transformer's ImageLinearAttention
//
// Each config carries a StackConfig: the user picks the mechanism and its
// options there (stack.block.attention.kind, .n_local_heads, stack.sharing,
// ...); the model writes the widths, causality, norm_eps and dtype into it from
// its own fields, so they are never set twice. Every training forward calls
// Stack::tick_redraw() once (the favor feature-redraw schedule).
//
// Letters: B batch, N sequence length, D model dim, V vocabulary, C channels,
// H/W image height/width, P prime length, M source length.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/names.h"
#include "nn/embeddings.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/transformer.h"

namespace forge::nn {

// Calls fn(dotted_name, module) for `root` and every module below it that is a
// T, parents before children ("" names the root).
template <typename T, typename Fn>
void for_each_module(Module& root, Fn&& fn, const std::string& prefix = "") {
  if (auto* m = dynamic_cast<T*>(&root)) fn(prefix, *m);
  for (const auto& [name, child] : root.named_children())
    for_each_module<T>(*child, fn, prefix.empty() ? name : prefix + "." + name);
}

// How a classifier reduces the sequence: the CLS token's output, or the mean
// over the real (unmasked) tokens. Mean-pooled models have no CLS token.
enum class Pool { cls, mean };
inline constexpr NameTable<Pool, 2> kPoolNames{"pool", {"cls", "mean"}};

// Positions added to the embedded input (learned, sinusoidal, axial), applied
// to q and k inside every attention layer (rotary_only), or both: rotary is
// performer-pytorch's rotary_position_emb and linear-attention-transformer's
// use_rotary_emb, which add the fixed sinusoids to the input and turn q and k
// in every layer.
enum class PositionalKind { none, learned, sinusoidal, rotary, rotary_only, axial };
inline constexpr NameTable<PositionalKind, 6> kPositionalNames{
    "positional embedding", {"none", "learned", "sinusoidal", "rotary", "rotary_only", "axial"}};

// The positional modules of a sequence model: one of learned, sinusoidal and
// axial (registered as "pos_emb") for those kinds, sinusoidal and rotary
// ("pos_emb", "layer_pos_emb", as performer-pytorch) for rotary, rotary alone
// for rotary_only, none for none.
struct Positions {
  PositionalKind kind = PositionalKind::none;
  std::shared_ptr<AbsolutePositionalEmbedding> learned;
  std::shared_ptr<FixedPositionalEmbedding> sinusoidal;
  std::shared_ptr<AxialPositionalEmbedding> axial;
  std::shared_ptr<RotaryEmbedding> rotary;
  // x (B, n, D) at positions offset.. -> x plus the position rows (rotary_only, none: x).
  Tensor add(const Tensor& x, int64_t offset = 0) const;
};

// ---------------------------------------------------------------------------
// ViT: patches -> [CLS] + learned positions -> pre-norm stack -> pool -> head.
// Initialised as timm: Linear weights trunc_normal(std .02) with zero bias,
// pos_embed trunc_normal(.02), cls_token N(0, 1e-6), LayerNorm 1 / 0; the
// patch projection keeps torch's Conv2d init (timm leaves it so).
struct ViTConfig {
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t channels = 3;
  int64_t classes = 1000;
  int64_t dim = 768;  // D (timm's embed_dim)
  int64_t depth = 12;
  int64_t heads = 12;
  int64_t mlp_ratio = 4;  // feed-forward hidden width = mlp_ratio * D
  Pool pool = Pool::cls;
  double emb_dropout = 0;  // after adding the positions (timm's pos_drop)
  bool qkv_bias = true;
  double norm_eps = 1e-6;  // every LayerNorm of the stack (timm's LayerNorm(eps=1e-6))
  // Mechanism and options; depth, heads, widths, qkv_bias and norm_eps come from above.
  StackConfig stack{};
  DType dtype = DType::f32;

  // The standard sizes "Ti", "S", "B": D 192 / 384 / 768, depth 12, heads 3 / 6 / 12.
  static ViTConfig preset(const std::string& size, int64_t image_size = 224,
                          int64_t patch_size = 16, int64_t classes = 1000);
  void validate() const;
};

class ViT : public Module {
 public:
  explicit ViT(const ViTConfig& config, Generator* gen = nullptr);
  // images (B, C, image_size, image_size) -> logits (B, classes).
  Tensor forward(const Tensor& images);

  Stack& stack() { return *transformer; }
  void fix_projections(bool fixed = true) { transformer->fix_projections(fixed); }
  void set_n0(int64_t n0) { transformer->set_n0(n0); }

  ViTConfig config;
  std::shared_ptr<PatchEmbed> patch_embed;  // "patch_embed"
  Tensor cls_token;                         // (1, 1, D); undefined with Pool::mean
  Tensor pos_embed;                         // (1, Np [+ 1], D)
  std::shared_ptr<Dropout> pos_drop;
  std::shared_ptr<Stack> transformer;  // "transformer" (final norm included)
  std::shared_ptr<Linear> head;        // (D -> classes)
};

// ViT layer ids for layer-wise lr decay (optim::param_groups_layer_decay), as
// timm numbers VisionTransformer.group_matcher(coarse=False) in
// group_with_matcher: stem (patch_embed, cls_token, pos_embed) 0; block i
// (transformer.layers.i) i + 1; the final norm (transformer.norm) depth, with
// the last block (timm's `norm` ordinal ends in MATCH_PREV_GROUP, which joins
// the group before it); everything else (the head, a Linformer projection
// bank) depth + 1 (timm maps unmatched names to the largest ordinal).
int64_t vit_layer_id(const std::string& name, int64_t depth);
int64_t vit_num_layers(int64_t depth);  // depth + 2: the ids above

// ---------------------------------------------------------------------------
// SequenceClassifier: token ids or vectors -> [CLS] + positions -> stack ->
// pool -> head. With dual_encoder (LRA retrieval) both documents go through
// the same encoder to u, v (B, D) and an MLP classifies [u, v, u*v, u-v].
struct SequenceClassifierConfig {
  int64_t vocab_size = 0;  // > 0: ids (B, N) through an Embedding; 0: vectors (B, N, input_dim)
  int64_t input_dim = 0;   // the vector width when vocab_size == 0
  int64_t max_len = 512;   // the longest N accepted (the CLS token not counted)
  int64_t dim = 256;       // D
  int64_t classes = 2;
  Pool pool = Pool::cls;
  PositionalKind positional = PositionalKind::learned;
  std::vector<int64_t> axial_shape{};  // axial: product >= positions; empty: (ceil(n / 64), 64)
  double emb_dropout = 0;
  bool dual_encoder = false;
  int64_t mlp_dim = 0;  // dual encoder: hidden width of the MLP head; 0: D
  // Every norm of the stack: TaylorShift's Transformer is a timm ViT (eps 1e-6).
  double norm_eps = 1e-6;
  StackConfig stack{};  // mechanism and options; dims, norm_eps and dtype come from above
  DType dtype = DType::f32;

  void validate() const;
};

class SequenceClassifier : public Module {
 public:
  explicit SequenceClassifier(const SequenceClassifierConfig& config, Generator* gen = nullptr);
  // x: ids (B, N) i32/i64 or vectors (B, N, input_dim), any N <= max_len;
  // mask (B, N) bool/u8, true = real token. -> logits (B, classes).
  Tensor forward(const Tensor& x, const Tensor& mask = Tensor());
  // The pooled encoding (B, D).
  Tensor encode(const Tensor& x, const Tensor& mask = Tensor());
  // Dual encoder: documents a (B, Na), b (B, Nb) -> logits (B, classes).
  Tensor forward_pair(const Tensor& a, const Tensor& mask_a, const Tensor& b, const Tensor& mask_b);

  Stack& stack() { return *transformer; }
  void fix_projections(bool fixed = true) { transformer->fix_projections(fixed); }
  void set_n0(int64_t n0) { transformer->set_n0(n0); }

  SequenceClassifierConfig config;
  std::shared_ptr<Embedding> token_emb;  // vocab_size > 0
  std::shared_ptr<Linear> input_proj;    // vocab_size == 0: (input_dim -> D)
  Tensor cls_token;                      // (1, 1, D) with Pool::cls
  Positions positions;
  std::shared_ptr<Dropout> emb_drop;
  std::shared_ptr<Stack> transformer;
  std::shared_ptr<Linear> mlp;   // dual encoder: (4 D -> mlp_dim), then ReLU
  std::shared_ptr<Linear> head;  // (D or mlp_dim -> classes)
};

// ---------------------------------------------------------------------------
// LanguageModel: ids -> token embedding [-> project_in] + positions -> stack
// -> [project_out ->] logits. Factorized (emb_dim < dim): token_emb (V, emb_dim),
// project_in (emb_dim -> D), project_out (D -> emb_dim), to_logits (emb_dim -> V).
// Tied: to_logits.weight is token_emb.weight (no output bias), one parameter.
// token_emb ~ N(0, .02) as performer-pytorch; the rest as torch.nn defaults.
// The stack ends in its final norm, a LayerNorm even after ScaleNorm or ReZero
// blocks (stack.final_norm_kind = layer, as PerformerLM's self.norm).
struct LanguageModelConfig {
  int64_t vocab_size = 256;  // V
  int64_t max_len = 1024;    // positions available
  int64_t dim = 512;         // D
  int64_t emb_dim = 0;       // token embedding width; 0: D
  bool tie_embedding = false;
  bool causal = true;  // false: bidirectional (MLM-style)
  PositionalKind positional = PositionalKind::learned;
  std::vector<int64_t> axial_shape{};  // axial: product >= max_len; empty: (ceil(max_len / w), w)
                                     // with w = stack.block.attention.local_window
  double emb_dropout = 0;
  // No output head: forward returns the final hidden states (B, N, D) (the
  // encoder of an EncoderDecoder; linear-attention-transformer's return_embeddings).
  bool return_embeddings = false;
  // Every norm of the stack: torch.nn.LayerNorm's default, as both references.
  double norm_eps = 1e-5;
  // Mechanism and options; dims, causality, norm_eps and dtype come from above.
  StackConfig stack{};
  DType dtype = DType::f32;

  // `where` names the config in errors ("EncoderDecoderConfig.decoder.max_len ...").
  void validate(const std::string& where = "LanguageModelConfig") const;
};

// What a generate call did, for its caller to report.
struct GenerateStats {
  bool recurrent = false;  // the decoding state was used (else the window was recomputed per token)
  int64_t rebuilds = 0;    // times the state was rebuilt past max_len positions
};

struct GenerateOptions {
  double temperature = 1.0;
  int64_t top_k = 0;                // keep the k most likely tokens; 0: the full distribution
  double filter_thres = 0;          // > 0: keep the top (1 - thres) fraction (performer's top_k)
  int64_t eos = -1;                 // >= 0: a sequence ends at this token; all ended: stop early
  bool greedy = false;              // argmax instead of sampling
  bool use_recurrent_state = true;  // O(1) per token when the stack supports it
  // With the state, past max_len positions (a model with positions): the state
  // is rebuilt from the last rebase_keep tokens (0: max_len / 2), which then
  // take positions 0 .. rebase_keep - 1, so each token sees between rebase_keep
  // and max_len tokens. use_recurrent_state = false is the references' sliding
  // window instead: the last max_len tokens recomputed for every token.
  int64_t rebase_keep = 0;
  // On a GPU, keep the recurrent state of linear, efficient and favor heads on
  // the device (Stack::recurrent_with_ops) instead of recomputing the window
  // for every token. Off until its GPU test has run (docs/GPU.md).
  bool state_on_gpu = false;
  Generator* gen = nullptr;         // sampling draws (the default generator when null)
  // Called after each step with the token drawn for each sequence (B), e.g.
  // to stream text as it is produced.
  std::function<void(const std::vector<int64_t>& next)> on_token{};
  // Called before each draw with the logits (B, V) it draws from (before
  // temperature and filtering), e.g. to compare them with a forward.
  std::function<void(const Tensor& logits)> on_logits{};
  GenerateStats* stats = nullptr;  // filled in when given
};

class LanguageModel : public Module {
 public:
  explicit LanguageModel(const LanguageModelConfig& config, Generator* gen = nullptr,
                         const std::string& where = "LanguageModelConfig");
  // ids (B, N) i32/i64, N <= max_len; mask (B, N) true = real token; context
  // (B, M, Dc) and context_mask (B, M) feed cross-attention blocks.
  // -> logits (B, N, V) (return_embeddings: hidden states (B, N, D)).
  Tensor forward(const Tensor& ids, const Tensor& mask = Tensor(), const Tensor& context = Tensor(),
                 const Tensor& context_mask = Tensor());
  // prime (B, P) -> (B, P + generated) i64, generated <= length. Eval mode and
  // no grad inside (the previous mode is restored). Incremental when
  // o.use_recurrent_state and the stack supports_recurrent(): the prime in one
  // Stack::step, then each token into the state (O(1) per token for the linear
  // mechanisms, a KV cache for softmax and local heads; CPU models only), the
  // state rebuilt from the last o.rebase_keep tokens whenever max_len positions
  // are full; otherwise the full forward over the last max_len tokens for every
  // new token (the references' loop).
  Tensor generate(const Tensor& prime, int64_t length, const GenerateOptions& o = {},
                  const Tensor& context = Tensor(), const Tensor& context_mask = Tensor());

  Stack& stack() { return *transformer; }
  void fix_projections(bool fixed = true) { transformer->fix_projections(fixed); }
  void set_n0(int64_t n0) { transformer->set_n0(n0); }

  LanguageModelConfig config;
  std::shared_ptr<Embedding> token_emb;             // (V, emb_dim)
  std::shared_ptr<Linear> project_in, project_out;  // factorized only
  Positions positions;
  std::shared_ptr<Dropout> emb_drop;
  std::shared_ptr<Stack> transformer;
  std::shared_ptr<Linear> to_logits;  // (emb_dim -> V); null with return_embeddings

 private:
  Tensor embed(const Tensor& ids, int64_t offset);  // (B, n) -> (B, n, D)
  Tensor head(const Tensor& h);                     // (B, n, D) -> (B, n, V)
};

// ---------------------------------------------------------------------------
// EncoderDecoder: a bidirectional encoder (a LanguageModel with
// return_embeddings) and a causal decoder whose blocks cross-attend to the
// encoder output with the source mask. The model sets encoder.causal = false,
// encoder.return_embeddings = true, decoder.causal = true,
// decoder.stack.block.cross_attention = true, its context_dim = encoder.dim,
// and both dtypes; linformer settings of the encoder self-attention go in
// encoder.stack.block.attention, those of the decoder's context attention in
// decoder.stack.block.cross (seq_len: the source max_len when 0).
struct EncoderDecoderConfig {
  LanguageModelConfig encoder{};
  LanguageModelConfig decoder{};
  DType dtype = DType::f32;

  void validate() const;
};

class EncoderDecoder : public Module {
 public:
  explicit EncoderDecoder(const EncoderDecoderConfig& config, Generator* gen = nullptr);
  // src (B, M) -> (B, M, De).
  Tensor encode(const Tensor& src, const Tensor& src_mask = Tensor());
  // src (B, M), tgt (B, Nt) -> logits (B, Nt, V).
  Tensor forward(const Tensor& src, const Tensor& tgt, const Tensor& src_mask = Tensor(),
                 const Tensor& tgt_mask = Tensor());
  // start (B, P) decoder prime -> (B, P + generated), as LanguageModel::generate.
  Tensor generate(const Tensor& src, const Tensor& start, int64_t length,
                  const GenerateOptions& o = {}, const Tensor& src_mask = Tensor());

  Stack& encoder_stack() { return encoder->stack(); }
  Stack& decoder_stack() { return decoder->stack(); }
  void fix_projections(bool fixed = true);
  void set_n0(int64_t n0);

  EncoderDecoderConfig config;
  std::shared_ptr<LanguageModel> encoder, decoder;  // "encoder", "decoder"
};

// ---------------------------------------------------------------------------
// ImageEfficientAttention (linear-attention-transformer's ImageLinearAttention):
// 1x1 convolutions to q, k (key_dim per head) and v (value_dim per head),
// efficient attention over all H*W pixels, a 1x1 convolution back to C.
// The convolutions are Linear layers over the channels of each pixel (weight
// (out, in) where torch's Conv2d has (out, in, 1, 1)); q and k are scaled by
// key_dim^-1/4 before the softmaxes, as the reference.
struct ImageEfficientAttentionConfig {
  int64_t channels = 0;  // C
  int64_t heads = 8;
  int64_t key_dim = 64;
  int64_t value_dim = 64;
  DType dtype = DType::f32;

  void validate() const;
};

class ImageEfficientAttention : public Module {
 public:
  explicit ImageEfficientAttention(const ImageEfficientAttentionConfig& config,
                                   Generator* gen = nullptr);
  // x (B, C, H, W) -> (B, C, H, W).
  Tensor forward(const Tensor& x);

  ImageEfficientAttentionConfig config;
  std::shared_ptr<Linear> to_q, to_k, to_v, to_out;
};

}  // namespace forge::nn
