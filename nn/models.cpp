// The models: config checks, the stack settings each model derives from its
// own fields, forwards, and autoregressive generation.
#include "nn/models.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "autograd/grad_mode.h"
#include "nn/init.h"
#include "ops/attention/attention.h"
#include "ops/ops.h"

namespace forge::nn {
namespace {

bool is_index_dtype(DType t) {
  return t == DType::i64 || t == DType::i32;
}

void check_dropout(double p, const std::string& field) {
  FORGE_CHECK(p >= 0.0 && p < 1.0, "{} must be in [0, 1), got {}", field, p);
}

void check_positive(int64_t value, const std::string& field) {
  FORGE_CHECK(value > 0, "{} must be > 0, got {}", field, value);
}

void check_norm_eps(double eps, const std::string& field) {
  FORGE_CHECK(eps > 0, "{} must be > 0, got {}", field, eps);
}

// The mechanisms with a causal form (ATTENTION.md's table).
bool has_causal_form(Mechanism m) {
  return m == Mechanism::softmax || m == Mechanism::local || m == Mechanism::efficient ||
         m == Mechanism::linear || m == Mechanism::favor;
}

void check_causal(const StackConfig& s, const std::string& where) {
  const auto check = [&](const AttentionConfig& a, const std::string& field) {
    FORGE_CHECK(a.n_local_heads >= a.heads || has_causal_form(a.kind),
                "{}.{}.kind = {} has no causal form; a causal model needs softmax, local, "
                "efficient, linear or favor (or set {}.causal = false)",
                where, field, mechanism_name(a.kind), where);
  };
  check(s.block.attention, "stack.block.attention");
  for (size_t i = 0; i < s.layer_attention.size(); ++i)
    check(s.layer_attention[i], fmt::format("stack.layer_attention[{}]", i));
}

// The model's width, causality and dtype in one attention config; linformer's
// seq_len defaults to the model's longest sequence.
void fill_attention(AttentionConfig& a, int64_t dim, bool causal, DType dtype, int64_t seq_len) {
  a.dim = dim;
  a.causal = causal;
  a.dtype = dtype;
  if (a.kind == Mechanism::linformer && a.seq_len == 0) a.seq_len = seq_len;
}

StackConfig fill_stack(StackConfig s, int64_t dim, bool causal, double norm_eps, DType dtype,
                       int64_t seq_len, const std::string& where) {
  s.block.norm_eps = norm_eps;
  fill_attention(s.block.attention, dim, causal, dtype, seq_len);
  for (auto& a : s.layer_attention) fill_attention(a, dim, causal, dtype, seq_len);
  s.block.ff.dim = dim;
  s.block.ff.dtype = dtype;
  if (s.block.cross_attention) {
    s.block.cross.dim = dim;
    s.block.cross.causal = false;
    s.block.cross.dtype = dtype;
  }
  s.validate(where + ".stack");
  return s;
}

// timm's init_weights_vit_timm on every Linear below `root` except Linformer's
// E/F (Xavier, as linformer-pytorch): weight trunc_normal(std .02), bias 0.
void timm_init_linears(Module& root, const Stack& stack, Generator* gen) {
  std::set<const Linear*> skip;
  if (stack.bank)
    for_each_module<Linear>(*stack.bank, [&](const std::string&, Linear& l) { skip.insert(&l); });
  for_each_module<Linear>(root, [&](const std::string&, Linear& l) {
    if (skip.contains(&l)) return;
    init::trunc_normal_(l.weight, 0.0, 0.02, -2.0, 2.0, gen);
    if (l.bias.defined()) init::zeros_(l.bias);
  });
}

// Positions for n rows of width dim. axial_width: the second axis of the
// default axial shape.
Positions make_positions(PositionalKind kind, int64_t n, int64_t dim, const StackConfig& stack,
                         std::vector<int64_t> axial_shape, int64_t axial_width, DType dtype,
                         Generator* gen, const std::string& where) {
  Positions p;
  p.kind = kind;
  switch (kind) {
    case PositionalKind::none:
      break;
    case PositionalKind::learned:
      p.learned = std::make_shared<AbsolutePositionalEmbedding>(n, dim, 0.02, dtype, gen);
      break;
    case PositionalKind::sinusoidal:
      FORGE_CHECK(dim % 2 == 0, "{}.positional = sinusoidal needs an even dim, got {}", where, dim);
      p.sinusoidal = std::make_shared<FixedPositionalEmbedding>(n, dim, dtype);
      break;
    case PositionalKind::rotary:
    case PositionalKind::rotary_only: {
      const int64_t d = stack.block.attention.resolved_head_dim();
      for (size_t i = 0; i < stack.layer_attention.size(); ++i)
        FORGE_CHECK(stack.layer_attention[i].resolved_head_dim() == d,
                    "{}.positional = {} needs one head dim in every layer: "
                    "stack.block.attention has {}, stack.layer_attention[{}] has {}",
                    where, name_of(kPositionalNames, kind), d, i,
                    stack.layer_attention[i].resolved_head_dim());
      FORGE_CHECK(d % 2 == 0, "{}.positional = {} needs an even head dim, got {}", where,
                  name_of(kPositionalNames, kind), d);
      p.rotary = std::make_shared<RotaryEmbedding>(n, d, dtype);
      if (kind == PositionalKind::rotary_only) break;
      FORGE_CHECK(dim % 2 == 0,
                  "{}.positional = rotary adds sinusoids, so dim must be even, got {}", where, dim);
      p.sinusoidal = std::make_shared<FixedPositionalEmbedding>(n, dim, dtype);
      break;
    }
    case PositionalKind::axial: {
      if (axial_shape.empty()) axial_shape = {(n + axial_width - 1) / axial_width, axial_width};
      int64_t product = 1;
      for (int64_t s : axial_shape) product *= s;
      FORGE_CHECK(product >= n,
                  "{}.axial_shape [{}] covers {} positions, fewer than the {} the model needs",
                  where, fmt::join(axial_shape, ", "), product, n);
      p.axial = std::make_shared<AxialPositionalEmbedding>(dim, axial_shape, dtype, gen);
      break;
    }
  }
  return p;
}

// Registers the set member of `p` through reg(name, module).
template <typename Reg>
void register_positions(const Positions& p, Reg&& reg) {
  if (p.learned) reg("pos_emb", p.learned);
  if (p.sinusoidal) reg("pos_emb", p.sinusoidal);
  if (p.axial) reg("pos_emb", p.axial);
  if (p.rotary) reg("layer_pos_emb", p.rotary);
}

void check_mask(const Tensor& mask, int64_t B, int64_t N, const char* who) {
  if (!mask.defined()) return;
  FORGE_CHECK((mask.dtype() == DType::boolean || mask.dtype() == DType::u8) &&
                  mask.shape() == (Shape{B, N}),
              "{}: expected a mask (B, N) = ({}, {}) of bool or u8, got {} {}", who, B, N,
              shape_str(mask.shape()), dtype_name(mask.dtype()));
}

// mask (B, N) -> bool (B, N + 1) with a real token in front (the CLS token).
Tensor prepend_true(const Tensor& mask) {
  const int64_t B = mask.size(0), N = mask.size(1);
  const auto m = mask.to(DType::u8).to_vector<uint8_t>();
  Tensor out = Tensor::empty({B, N + 1}, DType::boolean);
  bool* o = out.data<bool>();
  for (int64_t b = 0; b < B; ++b) {
    o[b * (N + 1)] = true;
    for (int64_t i = 0; i < N; ++i) o[b * (N + 1) + 1 + i] = m[b * N + i] != 0;
  }
  return out.to(mask.device());
}

// x (B, N, D) -> (B, D): the first token's row.
Tensor first_token(const Tensor& x) {
  return ops::reshape(ops::narrow(x, 1, 0, 1), {x.size(0), x.size(2)});
}

// x (B, N, D) -> (B, D): the mean over the real tokens (all tokens without a mask).
Tensor masked_mean(const Tensor& x, const Tensor& mask) {
  if (!mask.defined()) return ops::mean(x, {1});
  const Tensor m = mask.to(x.dtype()).view({x.size(0), x.size(1), 1});
  return ops::sum(x * m, {1}) / ops::clamp(ops::sum(m, {1}), 1.0);
}

// One token from a row of V logits (see GenerateOptions); u uniform in [0, 1).
int64_t sample_token(const double* logits, int64_t V, const GenerateOptions& o, double u) {
  if (o.greedy) return std::max_element(logits, logits + V) - logits;
  int64_t keep = V;
  if (o.top_k > 0) keep = std::min(keep, o.top_k);
  if (o.filter_thres > 0)
    keep = std::min(keep, std::max<int64_t>(1, static_cast<int64_t>((1.0 - o.filter_thres) *
                                                                    static_cast<double>(V))));
  std::vector<int64_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  if (keep < V) {
    // Ties broken by token id, so the kept set never depends on the sort.
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), [&](int64_t a, int64_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    idx.resize(static_cast<size_t>(keep));
    std::sort(idx.begin(), idx.end());
  }
  double top = -INFINITY;
  for (int64_t i : idx) top = std::max(top, logits[i]);
  std::vector<double> w(idx.size());
  double total = 0;
  for (size_t j = 0; j < idx.size(); ++j) {
    w[j] = std::exp((logits[idx[j]] - top) / o.temperature);
    total += w[j];
  }
  const double target = u * total;
  double cum = 0;
  for (size_t j = 0; j < idx.size(); ++j) {
    cum += w[j];
    if (cum > target) return idx[j];
  }
  return idx.back();
}

// Restores a module's training mode at the end of a scope.
class ModeRestore {
 public:
  explicit ModeRestore(Module& m) : m_(m), training_(m.is_training()) {}
  ~ModeRestore() { m_.train(training_); }
  ModeRestore(const ModeRestore&) = delete;
  ModeRestore& operator=(const ModeRestore&) = delete;

 private:
  Module& m_;
  bool training_;
};

}  // namespace

Tensor Positions::add(const Tensor& x, int64_t offset) const {
  const int64_t n = x.size(1);
  if (learned) return x + learned->forward(n, offset);
  if (sinusoidal) return x + sinusoidal->forward(n, offset);
  if (axial) return x + axial->forward(n, offset);
  return x;
}

// ---- ViT ----

ViTConfig ViTConfig::preset(const std::string& size, int64_t image_size, int64_t patch_size,
                            int64_t classes) {
  ViTConfig c;
  if (size == "Ti") {
    c.dim = 192;
    c.heads = 3;
  } else if (size == "S") {
    c.dim = 384;
    c.heads = 6;
  } else if (size == "B") {
    c.dim = 768;
    c.heads = 12;
  } else {
    FORGE_FAIL("ViTConfig::preset: unknown size '{}'; expected Ti, S or B", size);
  }
  c.depth = 12;
  c.image_size = image_size;
  c.patch_size = patch_size;
  c.classes = classes;
  return c;
}

void ViTConfig::validate() const {
  check_positive(image_size, "ViTConfig.image_size");
  check_positive(patch_size, "ViTConfig.patch_size");
  FORGE_CHECK(image_size % patch_size == 0,
              "ViTConfig.image_size {} is not divisible by ViTConfig.patch_size {}; pick a patch "
              "size that divides the image size",
              image_size, patch_size);
  check_positive(channels, "ViTConfig.channels");
  check_positive(classes, "ViTConfig.classes");
  check_positive(dim, "ViTConfig.dim");
  check_positive(depth, "ViTConfig.depth");
  check_positive(heads, "ViTConfig.heads");
  check_positive(mlp_ratio, "ViTConfig.mlp_ratio");
  resolve_head_dim(dim, heads, stack.block.attention.head_dim, "ViTConfig.dim", "ViTConfig.heads",
                   "ViTConfig.stack.block.attention.head_dim");
  check_dropout(emb_dropout, "ViTConfig.emb_dropout");
  check_norm_eps(norm_eps, "ViTConfig.norm_eps");
}

ViT::ViT(const ViTConfig& c, Generator* gen) : config(c) {
  config.validate();
  const int64_t D = config.dim, side = config.image_size / config.patch_size;
  const bool cls = config.pool == Pool::cls;
  const int64_t tokens = side * side + (cls ? 1 : 0);
  StackConfig s = config.stack;
  s.depth = config.depth;
  s.block.ff.mult = config.mlp_ratio;
  s.block.attention.heads = config.heads;
  s.block.attention.qkv_bias = config.qkv_bias;
  for (auto& a : s.layer_attention) {
    a.heads = config.heads;
    a.qkv_bias = config.qkv_bias;
  }
  config.stack = fill_stack(s, D, false, config.norm_eps, config.dtype, tokens, "ViTConfig");

  patch_embed = register_module(
      "patch_embed", std::make_shared<PatchEmbed>(config.image_size, config.patch_size,
                                                  config.channels, D, config.dtype, gen));
  if (cls) {
    cls_token = Tensor::empty({1, 1, D}, config.dtype);
    init::normal_(cls_token, 0.0, 1e-6, gen);
    register_parameter("cls_token", cls_token);
  }
  pos_embed = Tensor::empty({1, tokens, D}, config.dtype);
  init::trunc_normal_(pos_embed, 0.0, 0.02, -2.0, 2.0, gen);
  register_parameter("pos_embed", pos_embed);
  pos_drop = register_module("pos_drop", std::make_shared<Dropout>(config.emb_dropout));
  transformer = register_module("transformer", std::make_shared<Stack>(config.stack, gen));
  head =
      register_module("head", std::make_shared<Linear>(D, config.classes, true, config.dtype, gen));
  timm_init_linears(*transformer, *transformer, gen);
  timm_init_linears(*head, *transformer, gen);
}

Tensor ViT::forward(const Tensor& images) {
  const int64_t S = config.image_size;
  FORGE_CHECK(images.dim() == 4 && images.size(1) == config.channels && images.size(2) == S &&
                  images.size(3) == S,
              "ViT: expected images (B, {}, {}, {}), got {}; resize them or build the model with "
              "that image_size",
              config.channels, S, S, shape_str(images.shape()));
  Tensor x = patch_embed->forward(images);                   // (B, Np, D)
  if (cls_token.defined()) x = prepend_token(cls_token, x);  // (B, Np + 1, D)
  x = pos_drop->forward(x + pos_embed);
  if (is_training()) transformer->tick_redraw();
  x = transformer->forward(x);
  return head->forward(config.pool == Pool::cls ? first_token(x) : ops::mean(x, {1}));
}

int64_t vit_layer_id(const std::string& name, int64_t depth) {
  const std::string first = name.substr(0, name.find('.'));
  if (first == "patch_embed" || first == "cls_token" || first == "pos_embed") return 0;
  const std::string layers = "transformer.layers.";
  if (name.starts_with(layers)) {
    const size_t end = name.find('.', layers.size());
    const std::string digits = name.substr(layers.size(), end - layers.size());
    FORGE_CHECK(!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos &&
                    std::stoll(digits) < depth,
                "vit_layer_id: '{}' names no block of a depth-{} ViT", name, depth);
    return std::stoll(digits) + 1;
  }
  if (name.starts_with("transformer.norm.")) return depth;
  return depth + 1;
}

int64_t vit_num_layers(int64_t depth) {
  return depth + 2;
}

// ---- SequenceClassifier ----

void SequenceClassifierConfig::validate() const {
  FORGE_CHECK(vocab_size >= 0, "SequenceClassifierConfig.vocab_size must be >= 0, got {}",
              vocab_size);
  if (vocab_size == 0)
    FORGE_CHECK(input_dim > 0,
                "SequenceClassifierConfig.input_dim must be > 0 when vocab_size is 0 (vector "
                "inputs), got {}; set vocab_size for token ids",
                input_dim);
  check_positive(max_len, "SequenceClassifierConfig.max_len");
  check_positive(dim, "SequenceClassifierConfig.dim");
  check_positive(classes, "SequenceClassifierConfig.classes");
  FORGE_CHECK(mlp_dim >= 0, "SequenceClassifierConfig.mlp_dim must be >= 0, got {}", mlp_dim);
  check_dropout(emb_dropout, "SequenceClassifierConfig.emb_dropout");
  check_norm_eps(norm_eps, "SequenceClassifierConfig.norm_eps");
}

SequenceClassifier::SequenceClassifier(const SequenceClassifierConfig& c, Generator* gen)
    : config(c) {
  config.validate();
  const int64_t D = config.dim;
  const bool cls = config.pool == Pool::cls;
  const int64_t n = config.max_len + (cls ? 1 : 0);
  config.stack = fill_stack(config.stack, D, false, config.norm_eps, config.dtype, n,
                            "SequenceClassifierConfig");
  const auto reg = [this](const std::string& name, auto m) { register_module(name, m); };

  if (config.vocab_size > 0)
    token_emb = register_module(
        "token_emb", std::make_shared<Embedding>(config.vocab_size, D, -1, config.dtype, gen));
  else
    input_proj = register_module(
        "input_proj", std::make_shared<Linear>(config.input_dim, D, true, config.dtype, gen));
  if (cls) {
    cls_token = Tensor::empty({1, 1, D}, config.dtype);
    init::normal_(cls_token, 0.0, 1e-6, gen);
    register_parameter("cls_token", cls_token);
  }
  positions = make_positions(config.positional, n, D, config.stack, config.axial_shape, 64,
                             config.dtype, gen, "SequenceClassifierConfig");
  register_positions(positions, reg);
  emb_drop = register_module("emb_drop", std::make_shared<Dropout>(config.emb_dropout));
  transformer = register_module("transformer", std::make_shared<Stack>(config.stack, gen));
  if (positions.rotary) transformer->set_rotary(positions.rotary);
  int64_t head_in = D;
  if (config.dual_encoder) {
    head_in = config.mlp_dim > 0 ? config.mlp_dim : D;
    mlp = register_module("mlp", std::make_shared<Linear>(4 * D, head_in, true, config.dtype, gen));
  }
  head = register_module(
      "head", std::make_shared<Linear>(head_in, config.classes, true, config.dtype, gen));
  // TaylorShift's Transformer is a timm ViT: its blocks and head get timm's init.
  timm_init_linears(*transformer, *transformer, gen);
  if (mlp) timm_init_linears(*mlp, *transformer, gen);
  timm_init_linears(*head, *transformer, gen);
}

Tensor SequenceClassifier::encode(const Tensor& x, const Tensor& mask) {
  Tensor h;
  if (token_emb) {
    FORGE_CHECK(x.dim() == 2 && is_index_dtype(x.dtype()),
                "SequenceClassifier: expected token ids (B, N) of i32/i64 (vocab_size {}), got "
                "{} {}",
                config.vocab_size, shape_str(x.shape()), dtype_name(x.dtype()));
    h = token_emb->forward(x);
  } else {
    FORGE_CHECK(x.dim() == 3 && x.size(2) == config.input_dim,
                "SequenceClassifier: expected vectors (B, N, {}), got {}", config.input_dim,
                shape_str(x.shape()));
    h = input_proj->forward(x);
  }  // (B, N, D)
  const int64_t B = x.size(0), N = x.size(1);
  FORGE_CHECK(N >= 1 && N <= config.max_len,
              "SequenceClassifier: sequence length {} outside [1, max_len = {}]; truncate the "
              "input or build the model with a larger max_len",
              N, config.max_len);
  check_mask(mask, B, N, "SequenceClassifier");
  Tensor m = mask;
  if (cls_token.defined()) {
    h = prepend_token(cls_token, h);  // (B, N + 1, D)
    if (m.defined()) m = prepend_true(m);
  }
  h = transformer->forward(emb_drop->forward(positions.add(h)), m);
  return config.pool == Pool::cls ? first_token(h) : masked_mean(h, m);
}

Tensor SequenceClassifier::forward(const Tensor& x, const Tensor& mask) {
  FORGE_CHECK(!config.dual_encoder,
              "SequenceClassifier: the model is a dual encoder; call forward_pair(a, mask_a, b, "
              "mask_b)");
  if (is_training()) transformer->tick_redraw();
  return head->forward(encode(x, mask));
}

Tensor SequenceClassifier::forward_pair(const Tensor& a, const Tensor& mask_a, const Tensor& b,
                                        const Tensor& mask_b) {
  FORGE_CHECK(config.dual_encoder,
              "SequenceClassifier::forward_pair needs SequenceClassifierConfig.dual_encoder = "
              "true; call forward(x, mask)");
  if (is_training()) transformer->tick_redraw();
  const Tensor u = encode(a, mask_a), v = encode(b, mask_b);   // (B, D) each
  const Tensor features = ops::cat({u, v, u * v, u - v}, -1);  // (B, 4 D)
  return head->forward(ops::relu(mlp->forward(features)));
}

// ---- LanguageModel ----

void LanguageModelConfig::validate(const std::string& where) const {
  check_positive(vocab_size, where + ".vocab_size");
  check_positive(max_len, where + ".max_len");
  check_positive(dim, where + ".dim");
  FORGE_CHECK(emb_dim >= 0, "{}.emb_dim must be >= 0 (0: dim), got {}", where, emb_dim);
  check_dropout(emb_dropout, where + ".emb_dropout");
  check_norm_eps(norm_eps, where + ".norm_eps");
  FORGE_CHECK(!(tie_embedding && return_embeddings),
              "{}: tie_embedding needs the output head, which return_embeddings removes; unset "
              "one of them",
              where);
}

LanguageModel::LanguageModel(const LanguageModelConfig& c, Generator* gen, const std::string& where)
    : config(c) {
  config.validate(where);
  const int64_t D = config.dim, E = config.emb_dim > 0 ? config.emb_dim : D;
  if (config.causal) check_causal(config.stack, where);
  config.stack = fill_stack(config.stack, D, config.causal, config.norm_eps, config.dtype,
                            config.max_len, where);
  const auto reg = [this](const std::string& name, auto m) { register_module(name, m); };

  token_emb = register_module(
      "token_emb", std::make_shared<Embedding>(config.vocab_size, E, -1, config.dtype, gen));
  init::normal_(token_emb->weight, 0.0, 0.02, gen);
  if (E != D)
    project_in =
        register_module("project_in", std::make_shared<Linear>(E, D, true, config.dtype, gen));
  positions = make_positions(config.positional, config.max_len, D, config.stack, config.axial_shape,
                             config.stack.block.attention.local_window, config.dtype, gen, where);
  register_positions(positions, reg);
  emb_drop = register_module("emb_drop", std::make_shared<Dropout>(config.emb_dropout));
  transformer = register_module("transformer", std::make_shared<Stack>(config.stack, gen));
  if (positions.rotary) transformer->set_rotary(positions.rotary);
  if (config.return_embeddings) return;
  if (E != D)
    project_out =
        register_module("project_out", std::make_shared<Linear>(D, E, true, config.dtype, gen));
  to_logits = register_module(
      "to_logits",
      std::make_shared<Linear>(E, config.vocab_size, !config.tie_embedding, config.dtype, gen));
  if (config.tie_embedding) to_logits->weight = token_emb->weight;
}

Tensor LanguageModel::embed(const Tensor& ids, int64_t offset) {
  Tensor h = token_emb->forward(ids);  // (B, n, E)
  if (project_in) h = project_in->forward(h);
  return emb_drop->forward(positions.add(h, offset));
}

Tensor LanguageModel::head(const Tensor& h) {
  return to_logits->forward(project_out ? project_out->forward(h) : h);
}

Tensor LanguageModel::forward(const Tensor& ids, const Tensor& mask, const Tensor& context,
                              const Tensor& context_mask) {
  FORGE_CHECK(ids.dim() == 2 && is_index_dtype(ids.dtype()),
              "LanguageModel: expected ids (B, N) of i32/i64, got {} {}", shape_str(ids.shape()),
              dtype_name(ids.dtype()));
  const int64_t N = ids.size(1);
  FORGE_CHECK(N >= 1 && N <= config.max_len,
              "LanguageModel: sequence length {} outside [1, max_len = {}]; truncate the input or "
              "build the model with a larger max_len",
              N, config.max_len);
  check_mask(mask, ids.size(0), N, "LanguageModel");
  if (is_training()) transformer->tick_redraw();
  const Tensor h = transformer->forward(embed(ids, 0), mask, context, context_mask);  // (B, N, D)
  return to_logits ? head(h) : h;
}

Tensor LanguageModel::generate(const Tensor& prime, int64_t length, const GenerateOptions& o,
                               const Tensor& context, const Tensor& context_mask) {
  FORGE_CHECK(to_logits != nullptr,
              "LanguageModel::generate: the model has no output head (return_embeddings)");
  FORGE_CHECK(prime.dim() == 2 && prime.size(1) >= 1 && is_index_dtype(prime.dtype()),
              "LanguageModel::generate: expected prime (B, P) of i32/i64 with P >= 1, got {} {}",
              shape_str(prime.shape()), dtype_name(prime.dtype()));
  FORGE_CHECK(length >= 0, "LanguageModel::generate: length must be >= 0, got {}", length);
  FORGE_CHECK(o.greedy || o.temperature > 0,
              "GenerateOptions.temperature must be > 0 when sampling, got {}", o.temperature);
  FORGE_CHECK(o.top_k >= 0, "GenerateOptions.top_k must be >= 0 (0: all tokens), got {}", o.top_k);
  FORGE_CHECK(o.filter_thres >= 0 && o.filter_thres < 1,
              "GenerateOptions.filter_thres must be in [0, 1), got {}", o.filter_thres);
  FORGE_CHECK(o.eos >= -1 && o.eos < config.vocab_size,
              "GenerateOptions.eos must be -1 (none) or a token id below {}, got {}",
              config.vocab_size, o.eos);
  const int64_t B = prime.size(0), P = prime.size(1), V = config.vocab_size;
  // The decoding state: on the CPU for every recurrent mechanism; on a GPU,
  // with o.state_on_gpu, for linear, efficient and favor heads (softmax and
  // local heads' caches are host memory: such a model on a GPU recomputes its
  // window each token).
  const bool on_cpu = token_emb->weight.device().is_cpu();
  const bool recurrent = o.use_recurrent_state && transformer->supports_recurrent() &&
                         (on_cpu || (o.state_on_gpu && transformer->recurrent_with_ops()));
  // Positions bound the state's window, unless the model has none.
  const bool bounded = positions.kind != PositionalKind::none;
  const int64_t keep = o.rebase_keep > 0 ? o.rebase_keep : config.max_len / 2;
  FORGE_CHECK(keep >= 1 && keep < config.max_len,
              "GenerateOptions.rebase_keep must be in [1, max_len = {}), got {}", config.max_len,
              keep);

  NoGradGuard no_grad;
  ModeRestore restore(*this);
  eval();
  Generator& g = o.gen ? *o.gen : default_generator();
  // tokens[b] is sequence b, prime first.
  std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(B));
  const auto p = prime.to_vector<int64_t>();
  for (int64_t b = 0; b < B; ++b) tokens[b].assign(p.begin() + b * P, p.begin() + (b + 1) * P);
  // ids (B, n) of positions [start, start + n).
  const auto ids_of = [&](int64_t start, int64_t n) {
    std::vector<int64_t> v;
    v.reserve(static_cast<size_t>(B * n));
    for (int64_t b = 0; b < B; ++b)
      v.insert(v.end(), tokens[b].begin() + start, tokens[b].begin() + start + n);
    return Tensor::from_vector<int64_t>(v, {B, n});
  };
  if (o.stats) *o.stats = GenerateStats{.recurrent = recurrent};
  std::vector<BlockState> states;
  // With the state, tokens [base, cur) are in it at positions 0 .. cur - base - 1;
  // `fresh`: it is empty, and the next step fills it with all of them.
  int64_t base = 0;
  bool fresh = true;

  std::vector<bool> done(static_cast<size_t>(B), false);
  int64_t cur = P;  // current length
  for (int64_t i = 0; i < length; ++i) {
    // Past max_len positions the state is rebuilt from the last `keep` tokens,
    // which take positions 0 .. keep - 1 (one forward's worth of work every
    // max_len - keep tokens).
    if (recurrent && bounded && cur - base > config.max_len) {
      base = cur - keep;
      fresh = true;
      if (o.stats) ++o.stats->rebuilds;
    }
    if (recurrent && fresh) states = transformer->initial_state();
    // The hidden states (B, n, D) of positions [start, cur): with the state,
    // every token it does not hold yet (the prime, or the kept tokens after a
    // rebuild), then only the newest; without, the last max_len tokens afresh.
    const int64_t start =
        recurrent ? (fresh ? base : cur - 1) : std::max<int64_t>(0, cur - config.max_len);
    fresh = false;
    const int64_t n = cur - start;
    const Tensor x = embed(ids_of(start, n), recurrent ? start - base : 0);
    const Tensor h = recurrent ? transformer->step(x, states, context, context_mask)
                               : transformer->forward(x, Tensor(), context, context_mask);
    const Tensor last = head(ops::narrow(h, 1, n - 1, 1));  // (B, 1, V)
    if (o.on_logits) o.on_logits(last.view({B, V}));
    const auto logits = last.to_vector<double>();
    std::vector<double> u(static_cast<size_t>(B), 0.0);
    if (!o.greedy) u = Tensor::rand({B}, DType::f64, &g).to_vector<double>();
    bool all_done = o.eos >= 0;
    std::vector<int64_t> drawn(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      int64_t next = sample_token(logits.data() + b * V, V, o, u[b]);
      if (done[b]) next = o.eos;
      if (o.eos >= 0 && next == o.eos) done[b] = true;
      all_done = all_done && done[b];
      tokens[b].push_back(next);
      drawn[static_cast<size_t>(b)] = next;
    }
    if (o.on_token) o.on_token(drawn);
    ++cur;
    if (all_done) break;
  }
  return ids_of(0, cur);
}

// ---- EncoderDecoder ----

void EncoderDecoderConfig::validate() const {
  encoder.validate("EncoderDecoderConfig.encoder");
  decoder.validate("EncoderDecoderConfig.decoder");
}

EncoderDecoder::EncoderDecoder(const EncoderDecoderConfig& c, Generator* gen) : config(c) {
  LanguageModelConfig& enc = config.encoder;
  enc.causal = false;
  enc.return_embeddings = true;
  enc.dtype = config.dtype;
  LanguageModelConfig& dec = config.decoder;
  dec.causal = true;
  dec.return_embeddings = false;
  dec.dtype = config.dtype;
  dec.stack.block.cross_attention = true;
  dec.stack.block.context_dim = enc.dim;
  AttentionConfig& cross = dec.stack.block.cross;
  if (cross.kind == Mechanism::linformer && cross.seq_len == 0) cross.seq_len = enc.max_len;
  config.validate();
  encoder = register_module(
      "encoder", std::make_shared<LanguageModel>(enc, gen, "EncoderDecoderConfig.encoder"));
  decoder = register_module(
      "decoder", std::make_shared<LanguageModel>(dec, gen, "EncoderDecoderConfig.decoder"));
}

Tensor EncoderDecoder::encode(const Tensor& src, const Tensor& src_mask) {
  return encoder->forward(src, src_mask);
}

Tensor EncoderDecoder::forward(const Tensor& src, const Tensor& tgt, const Tensor& src_mask,
                               const Tensor& tgt_mask) {
  const Tensor context = encode(src, src_mask);  // (B, M, De)
  return decoder->forward(tgt, tgt_mask, context, src_mask);
}

Tensor EncoderDecoder::generate(const Tensor& src, const Tensor& start, int64_t length,
                                const GenerateOptions& o, const Tensor& src_mask) {
  NoGradGuard no_grad;
  ModeRestore restore(*this);
  eval();
  const Tensor context = encode(src, src_mask);
  return decoder->generate(start, length, o, context, src_mask);
}

void EncoderDecoder::fix_projections(bool fixed) {
  encoder->fix_projections(fixed);
  decoder->fix_projections(fixed);
}

void EncoderDecoder::set_n0(int64_t n0) {
  encoder->set_n0(n0);
  decoder->set_n0(n0);
}

// ---- ImageEfficientAttention ----

void ImageEfficientAttentionConfig::validate() const {
  check_positive(channels, "ImageEfficientAttentionConfig.channels");
  check_positive(heads, "ImageEfficientAttentionConfig.heads");
  check_positive(key_dim, "ImageEfficientAttentionConfig.key_dim");
  check_positive(value_dim, "ImageEfficientAttentionConfig.value_dim");
}

ImageEfficientAttention::ImageEfficientAttention(const ImageEfficientAttentionConfig& c,
                                                 Generator* gen)
    : config(c) {
  config.validate();
  const int64_t C = config.channels, H = config.heads;
  const DType t = config.dtype;
  to_q = register_module("to_q", std::make_shared<Linear>(C, H * config.key_dim, true, t, gen));
  to_k = register_module("to_k", std::make_shared<Linear>(C, H * config.key_dim, true, t, gen));
  to_v = register_module("to_v", std::make_shared<Linear>(C, H * config.value_dim, true, t, gen));
  to_out =
      register_module("to_out", std::make_shared<Linear>(H * config.value_dim, C, true, t, gen));
}

Tensor ImageEfficientAttention::forward(const Tensor& x) {
  FORGE_CHECK(x.dim() == 4 && x.size(1) == config.channels,
              "ImageEfficientAttention: expected x (B, {}, H, W), got {}", config.channels,
              shape_str(x.shape()));
  const int64_t B = x.size(0), C = x.size(1), Hi = x.size(2), Wi = x.size(3), n = Hi * Wi;
  const int64_t heads = config.heads, dk = config.key_dim, dv = config.value_dim;
  const Tensor pixels = ops::reshape(ops::permute(x, {0, 2, 3, 1}), {B, n, C});  // (B, HW, C)
  // (B, HW, heads * d) -> (B, heads, HW, d): channel h * d + i is feature i of head h.
  const auto split = [&](const Tensor& t, int64_t d) {
    return ops::permute(ops::reshape(t, {B, n, heads, d}), {0, 2, 1, 3});
  };
  const double scale = std::pow(static_cast<double>(dk), -0.25);
  const Tensor q = split(to_q->forward(pixels), dk) * scale;
  const Tensor k = split(to_k->forward(pixels), dk) * scale;
  const Tensor v = split(to_v->forward(pixels), dv);
  // The op scales the query softmax by dk^-1/2, which the reference does not.
  const Tensor o = ops::attention::efficient(q, k, v) * std::sqrt(static_cast<double>(dk));
  const Tensor merged = ops::reshape(ops::permute(o, {0, 2, 1, 3}), {B, n, heads * dv});
  const Tensor out = to_out->forward(merged);  // (B, HW, C)
  return ops::permute(ops::reshape(out, {B, Hi, Wi, C}), {0, 3, 1, 2});
}

}  // namespace forge::nn
