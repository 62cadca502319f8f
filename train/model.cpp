// Recipe -> model (see model.h).
#include "train/model.h"

#include <unistd.h>

#include <cmath>

#include "core/device.h"
#include "core/error.h"
#include "core/names.h"
#include "nn/models.h"
#include "ops/blas_core.h"
#include "ops/ops.h"

namespace forge::train {

namespace {

// model.attention.* -> the mechanism options shared by every layer.
nn::AttentionConfig attention_config(const Recipe& r, const std::string& kind,
                                     int64_t local_heads) {
  nn::AttentionConfig a;
  a.kind = nn::mechanism_from_name(kind);
  a.heads = r.integer("model.heads");
  a.head_dim = r.integer("model.head_dim");
  a.qkv_bias = r.boolean("model.qkv_bias");
  a.out_bias = r.boolean("model.out_bias");
  a.attn_dropout = r.number("model.attention.dropout");
  a.output_dropout = r.number("model.dropout");
  a.scale = r.number("model.attention.scale");
  a.n_local_heads = local_heads;
  a.local_heads_at =
      enum_from_name(nn::kLocalHeadsAtNames, r.string("model.attention.local_heads_at"));
  a.local_rotary = r.boolean("model.attention.local_rotary");
  a.local_window = r.integer("model.attention.local_window");
  a.local_look_backward = r.integer("model.attention.local_look_backward");
  a.local_look_forward = r.integer("model.attention.local_look_forward");
  a.bucket_size = r.integer("model.attention.bucket_size");
  a.linear_eps = r.number("model.attention.linear_eps");
  a.nb_features = r.integer("model.attention.nb_features");
  a.favor_kernel = enum_from_name(ops::attention::kFavorKernelNames,
                                  r.string("model.attention.favor_kernel"));
  a.favor_stabilizer = enum_from_name(ops::attention::kFavorStabilizerNames,
                                      r.string("model.attention.favor_stabilizer"));
  a.favor_scaling = static_cast<int>(r.integer("model.attention.favor_scaling"));
  a.feature_redraw_interval = r.integer("model.attention.feature_redraw_interval");
  a.k = r.integer("model.attention.k");
  a.ts_a = r.number("model.attention.ts_a");
  a.ts_b = r.number("model.attention.ts_b");
  a.ts_c = r.number("model.attention.ts_c");
  a.n0 = r.integer("model.attention.n0");
  a.output_normalized = r.boolean("model.attention.output_normalized");
  return a;
}

nn::StackConfig stack_config(const Recipe& r) {
  const int64_t depth = r.integer("model.depth");
  const int64_t heads = r.integer("model.heads");
  nn::StackConfig s;
  s.depth = depth;
  const int64_t local_heads = r.integer("model.attention.local_heads");
  FORGE_CHECK(local_heads <= heads,
              "recipe: model.attention.local_heads = {} exceeds model.heads = {}", local_heads,
              heads);
  s.block.attention = attention_config(r, r.string("model.attention.kind"), local_heads);
  const auto kinds = r.string_list("model.attention.per_layer");
  const auto locals = r.int_list("model.attention.per_layer_local_heads");
  FORGE_CHECK(kinds.empty() || static_cast<int64_t>(kinds.size()) == depth,
              "recipe: model.attention.per_layer has {} entries but model.depth is {}; give one "
              "mechanism per layer or leave it empty",
              kinds.size(), depth);
  FORGE_CHECK(locals.empty() || static_cast<int64_t>(locals.size()) == depth,
              "recipe: model.attention.per_layer_local_heads has {} entries but model.depth is {}",
              locals.size(), depth);
  if (!kinds.empty() || !locals.empty()) {
    for (int64_t l = 0; l < depth; ++l) {
      const size_t i = static_cast<size_t>(l);
      const int64_t nl = locals.empty() ? local_heads : locals[i];
      FORGE_CHECK(nl <= heads,
                  "recipe: model.attention.per_layer_local_heads[{}] = {} exceeds model.heads = {}",
                  l, nl, heads);
      s.layer_attention.push_back(
          attention_config(r, kinds.empty() ? r.string("model.attention.kind") : kinds[i], nl));
    }
  }
  s.block.ff.mult = r.integer("model.mlp_ratio");
  s.block.ff.hidden = r.integer("model.mlp_dim");
  s.block.ff.activation =
      r.string("model.activation") == "gelu" ? nn::Activation::gelu : nn::Activation::relu;
  s.block.ff.glu = r.boolean("model.glu");
  s.block.ff.dropout = r.number("model.dropout");
  s.block.ff.chunks = r.integer("model.ff_chunks");
  s.block.norm = enum_from_name(nn::kNormNames, r.string("model.norm"));
  s.block.post_norm = r.boolean("model.post_norm");
  s.block.shift_tokens = r.boolean("model.shift_tokens");
  s.block.token_shifts = r.int_list("model.token_shifts");
  s.block.attend_axially = r.boolean("model.attend_axially");
  s.drop_path = r.number("model.drop_path");
  s.checkpoint = enum_from_name(nn::kCheckpointLevelNames, r.string("model.checkpoint"));
  s.reversible = r.boolean("model.reversible");
  s.reversible_output =
      enum_from_name(nn::kReversibleOutputNames, r.string("model.reversible_output"));
  s.sharing = enum_from_name(nn::kSharingNames, r.string("model.attention.sharing"));
  s.k_reduce_by_layer = r.integer("model.attention.k_reduce_by_layer");
  s.final_norm = r.boolean("model.final_norm");
  s.final_norm_kind = enum_from_name(nn::kFinalNormKindNames, r.string("model.final_norm_kind"));
  return s;
}

// The recipe's per-head width (model.head_dim, 0: dim / heads), checked.
int64_t head_dim_of(const Recipe& r) {
  return nn::resolve_head_dim(r.integer("model.dim"), r.integer("model.heads"),
                              r.integer("model.head_dim"), "recipe: model.dim", "model.heads",
                              "model.head_dim");
}

// The maps every capturing attention layer stored during one forward.
std::vector<Tensor> collect_maps(nn::Stack& stack, const std::function<void()>& run) {
  auto layers = stack.attention_layers();
  for (auto& a : layers) a->capture_maps = true;
  struct Reset {
    std::vector<std::shared_ptr<nn::MultiHeadAttention>>& layers;
    ~Reset() {
      for (auto& a : layers) {
        a->capture_maps = false;
        a->captured_maps = Tensor();
      }
    }
  } reset{layers};
  run();
  std::vector<Tensor> maps;
  for (auto& a : layers) maps.push_back(a->captured_maps);
  return maps;
}

// A task over one model of type M, built from its config: M owns the
// parameters, the task says how a batch reaches it.
template <typename M>
class ModelTask : public TaskModel {
 public:
  template <typename Config>
  ModelTask(const Config& c, Generator* gen) : model_(std::make_shared<M>(c, gen)) {}
  nn::Module& module() override { return *model_; }

 protected:
  std::shared_ptr<M> model_;
};

class VitTask : public ModelTask<nn::ViT> {
 public:
  using ModelTask::ModelTask;
  Tensor forward(const data::Batch& batch) override { return model_->forward(batch.input); }
  std::vector<Tensor> attention_maps(const data::Batch& batch) override {
    const Tensor one = ops::narrow(batch.input, 0, 0, 1);
    return collect_maps(model_->stack(), [&] { model_->forward(one); });
  }
};

class SequenceTask : public ModelTask<nn::SequenceClassifier> {
 public:
  using ModelTask::ModelTask;
  Tensor forward(const data::Batch& b) override {
    if (model_->config.dual_encoder) {
      FORGE_CHECK(b.input2.defined(),
                  "model.dual_encoder is true but the data has single documents; use "
                  "data.dataset: retrieval (document pairs) or turn model.dual_encoder off");
      return model_->forward_pair(b.input, b.mask, b.input2, b.mask2);
    }
    FORGE_CHECK(!b.input2.defined(),
                "the data has document pairs (data.dataset: retrieval) but model.dual_encoder is "
                "false; set model.dual_encoder: true");
    return model_->forward(b.input, b.mask);
  }
  std::vector<Tensor> attention_maps(const data::Batch& b) override {
    const Tensor x = ops::narrow(b.input, 0, 0, 1);
    const Tensor m = b.mask.defined() ? ops::narrow(b.mask, 0, 0, 1) : Tensor();
    return collect_maps(model_->stack(), [&] { model_->encode(x, m); });
  }
};

// The input's mask when some position is padding, else undefined (a full mask
// only costs time; causal models never need it: padding only ends rows).
Tensor mask_if_padded(const data::Batch& b) {
  return b.padded ? b.mask : Tensor();
}

class LanguageModelTask : public ModelTask<nn::LanguageModel> {
 public:
  using ModelTask::ModelTask;
  Tensor forward(const data::Batch& b) override {
    return model_->forward(b.input, model_->config.causal ? Tensor() : mask_if_padded(b));
  }
  std::vector<Tensor> attention_maps(const data::Batch& b) override {
    const Tensor x = ops::narrow(b.input, 0, 0, 1);
    return collect_maps(model_->stack(), [&] { model_->forward(x); });
  }
  nn::LanguageModel* language_model() override { return model_.get(); }
};

class EncoderDecoderTask : public ModelTask<nn::EncoderDecoder> {
 public:
  using ModelTask::ModelTask;
  Tensor forward(const data::Batch& b) override {
    FORGE_CHECK(b.input2.defined() && b.target.defined(),
                "model.type encoder_decoder needs source / target pairs (data.dataset copy or "
                "seq2seq_tsv)");
    return model_->forward(b.input, b.input2, mask_if_padded(b));
  }
  // The decoder's self-attention maps (the encoder's and the cross-attention's
  // are not drawn).
  std::vector<Tensor> attention_maps(const data::Batch& b) override {
    const Tensor src = ops::narrow(b.input, 0, 0, 1), tgt = ops::narrow(b.input2, 0, 0, 1);
    const Tensor m = b.padded ? ops::narrow(b.mask, 0, 0, 1) : Tensor();
    return collect_maps(model_->decoder_stack(), [&] { model_->forward(src, tgt, m); });
  }
  nn::EncoderDecoder* encoder_decoder() override { return model_.get(); }
};

// model.* -> one LanguageModel config (the encoder or decoder of an
// encoder-decoder share every key but their depth, vocabulary and length).
nn::LanguageModelConfig language_model_config(const Recipe& r, int64_t vocab_size, int64_t max_len,
                                              int64_t depth, DType dtype) {
  nn::LanguageModelConfig c;
  c.vocab_size = vocab_size;
  c.max_len = max_len;
  c.dim = r.integer("model.dim");
  c.emb_dim = r.integer("model.emb_dim");
  FORGE_CHECK(c.emb_dim <= c.dim,
              "recipe: model.emb_dim = {} is wider than model.dim = {}; a factorised embedding is "
              "narrower (or 0: dim)",
              c.emb_dim, c.dim);
  c.tie_embedding = r.boolean("model.tie_embedding");
  c.causal = r.boolean("model.causal");
  c.positional = enum_from_name(nn::kPositionalNames, r.string("model.positional"));
  c.axial_shape = r.int_list("model.axial_shape");
  c.emb_dropout = r.number("model.emb_dropout");
  c.stack = stack_config(r);
  c.stack.depth = depth;
  if (r.number("model.norm_eps") > 0) c.norm_eps = r.number("model.norm_eps");
  c.dtype = dtype;
  return c;
}

// The model's size key, or the data's when the key is 0; a key below what the
// data needs is an error naming both.
int64_t size_from(const Recipe& r, const char* key, int64_t data, const char* what) {
  const int64_t v = r.integer(key) > 0 ? r.integer(key) : data;
  FORGE_CHECK(
      v >= data,
      "recipe: {} = {} is smaller than the data's {} ({}); raise it or set it to 0 (from the data)",
      key, v, what, data);
  return v;
}

}  // namespace

// The parameters build_model makes, at least, from the recipe alone: each
// block's q, k, v and output projections and its feed-forward (a decoder's
// cross-attention too), the embeddings and the head. Biases, norms and the
// mechanisms' own tensors are left out: a lower bound, in double (the sizes
// a mistyped key gives overflow 64-bit integers).
double parameter_lower_bound(const Recipe& r, const DataShape& shape) {
  const auto key = [&](const char* k) { return static_cast<double>(r.integer(k)); };
  const auto data_or = [&](const char* k, int64_t data) {
    return r.integer(k) > 0 ? key(k) : static_cast<double>(data);
  };
  const double D = key("model.dim");
  const double inner = r.integer("model.head_dim") > 0 ? key("model.heads") * key("model.head_dim") : D;
  const double hidden =
      r.integer("model.mlp_dim") > 0 ? key("model.mlp_dim") : key("model.mlp_ratio") * D;
  const double block = 4 * D * inner + (r.boolean("model.glu") ? 3 : 2) * D * hidden;
  const std::string& type = r.string("model.type");
  const auto depth_or = [&](const char* k) { return r.integer(k) > 0 ? key(k) : key("model.depth"); };
  if (type == "encoder_decoder") {
    const double src = data_or("model.vocab_size", shape.vocab_size);
    const double tgt = data_or("model.target_vocab_size", shape.target_vocab_size);
    return depth_or("model.encoder_depth") * block +
           depth_or("model.decoder_depth") * (block + 4 * D * inner) + (src + 2 * tgt) * D;
  }
  // Learned positions: one row per position.
  const auto positions = [&](double len) {
    return r.string("model.positional") == "learned" ? len * D : 0.0;
  };
  if (type == "language_model") {
    const double vocab = data_or("model.vocab_size", shape.vocab_size);
    return key("model.depth") * block + (r.boolean("model.tie_embedding") ? 1 : 2) * vocab * D +
           positions(data_or("model.max_len", shape.max_length));
  }
  const double classes = data_or("model.classes", shape.classes);
  if (type == "vit") {
    const double p = key("model.patch_size"), channels = data_or("model.channels", shape.channels);
    const double patches = std::pow(key("model.image_size") / p, 2);
    return key("model.depth") * block + (channels * p * p + patches + 1 + classes) * D;
  }
  // A dual encoder classifies [u, v, u*v, u-v] through an MLP.
  const double mlp = r.integer("model.mlp_head_dim") > 0 ? key("model.mlp_head_dim") : D;
  const double head = r.boolean("model.dual_encoder") ? 4 * D * mlp + mlp * classes : classes * D;
  return key("model.depth") * block + data_or("model.vocab_size", shape.vocab_size) * D + head +
         positions(data_or("model.max_len", shape.max_length));
}

Placement placement(const Recipe& r, int local_rank) {
  Placement p;
  const std::string& device = r.string("device");
  const int gpus = cuda_device_count();
  if (device == "cuda") {
    FORGE_CHECK(gpus > 0,
                "recipe: device: cuda, but {}; use device: auto (the GPU when there is one) or cpu",
                cuda_built() ? "no CUDA device is visible on this machine"
                             : "this build has no CUDA backend (nvcc was not found when it was "
                               "configured)");
    p.device = Device::cuda(local_rank % gpus);
  } else if (device == "auto" && gpus > 0) {
    p.device = Device::cuda(local_rank % gpus);
  }
  const std::string& precision = r.string("precision");
  if (precision == "fp64") p.dtype = DType::f64;
  if (precision == "bf16" || precision == "fp16") {
    if (p.device.is_cuda()) {
      p.autocast = precision == "bf16" ? DType::bf16 : DType::f16;
      p.loss_scaling = precision == "fp16";
    } else if (precision == "bf16") {
      // bf16 GEMMs on the CPU (oneDNN): only where the CPU multiplies bf16 itself.
      const blas::CpuFeatures f = blas::cpu_features();
      FORGE_CHECK(f.bf16(),
                  "recipe: precision: bf16 on the CPU needs AVX512-BF16 or AMX, and this CPU has "
                  "neither ({}); use precision: fp32 here, or bf16 on a GPU",
                  f.avx ? blas::describe(f) : "no AVX");
      p.autocast = DType::bf16;
    } else {
      p.note =
          "precision fp16 is mixed precision on a GPU; on the CPU this run is fp32 (bf16 is "
          "the CPU's mixed precision)";
    }
  }
  return p;
}

constexpr NameTable<Task, 3> kTaskNames{
    "task", {"classification", "language modelling", "sequence-to-sequence"}};

const char* task_name(Task t) { return name_of(kTaskNames, t); }

std::unique_ptr<TaskModel> build_model(const Recipe& r, const DataShape& shape, DType dtype,
                                       Generator* gen) {
  head_dim_of(r);
  check_model_fits_memory(r, shape, dtype == DType::f64 ? 8 : 4, "building its weights");
  const std::string& type = r.string("model.type");
  const Task wants = type == "language_model"    ? Task::language_model
                     : type == "encoder_decoder" ? Task::seq2seq
                                                 : Task::classification;
  FORGE_CHECK(shape.task == wants,
              "recipe: model.type {} is for {}, but data.dataset {} gives {} data; use {}", type,
              task_name(wants), r.string("data.dataset"), task_name(shape.task),
              shape.task == Task::language_model ? "model.type: language_model"
              : shape.task == Task::seq2seq      ? "model.type: encoder_decoder"
                                                 : "model.type: vit or sequence_classifier");
  if (wants == Task::language_model) {
    const int64_t vocab = size_from(r, "model.vocab_size", shape.vocab_size, "vocabulary");
    const int64_t max_len = size_from(r, "model.max_len", shape.max_length, "sequence length");
    return std::make_unique<LanguageModelTask>(
        language_model_config(r, vocab, max_len, r.integer("model.depth"), dtype), gen);
  }
  if (wants == Task::seq2seq) {
    nn::EncoderDecoderConfig c;
    const int64_t enc_depth = r.integer("model.encoder_depth") > 0
                                  ? r.integer("model.encoder_depth")
                                  : r.integer("model.depth");
    const int64_t dec_depth = r.integer("model.decoder_depth") > 0
                                  ? r.integer("model.decoder_depth")
                                  : r.integer("model.depth");
    c.encoder = language_model_config(
        r, size_from(r, "model.vocab_size", shape.vocab_size, "source vocabulary"),
        size_from(r, "model.max_len", shape.max_length, "source length"), enc_depth, dtype);
    c.decoder = language_model_config(
        r, size_from(r, "model.target_vocab_size", shape.target_vocab_size, "target vocabulary"),
        size_from(r, "model.target_max_len", shape.target_length, "target length"), dec_depth,
        dtype);
    // The decoder's attention to the encoder: the same mechanism and options,
    // never causal, no local heads (performer-pytorch's cross-attending layers).
    c.decoder.stack.block.cross = attention_config(r, r.string("model.attention.kind"), 0);
    c.dtype = dtype;
    return std::make_unique<EncoderDecoderTask>(c, gen);
  }
  const int64_t classes =
      r.integer("model.classes") > 0 ? r.integer("model.classes") : shape.classes;
  FORGE_CHECK(classes >= shape.classes,
              "recipe: model.classes = {} but the data has {} classes; set it to 0 (from the data) "
              "or at least {}",
              classes, shape.classes, shape.classes);
  if (type == "vit") {
    FORGE_CHECK(shape.images,
                "recipe: model.type vit needs images, but data.dataset gives token sequences; use "
                "model.type: sequence_classifier");
    nn::ViTConfig c;
    c.image_size = r.integer("model.image_size");
    const std::string& root = r.string("data.root");
    FORGE_CHECK(c.image_size == shape.image_size,
                "recipe: model.image_size = {} but the images of data.dataset {} ({}) are {}x{}; "
                "set model.image_size: {}",
                c.image_size, r.string("data.dataset"),
                root.empty() ? std::string("data.root unset: the source's default location")
                             : "data.root '" + root + "'",
                shape.image_size, shape.image_size, shape.image_size);
    c.patch_size = r.integer("model.patch_size");
    FORGE_CHECK(c.image_size % c.patch_size == 0,
                "recipe: model.patch_size = {} does not divide model.image_size = {}", c.patch_size,
                c.image_size);
    c.channels = r.integer("model.channels") > 0 ? r.integer("model.channels") : shape.channels;
    FORGE_CHECK(c.channels == shape.channels,
                "recipe: model.channels = {} but the data's images have {} channels", c.channels,
                shape.channels);
    c.classes = classes;
    c.dim = r.integer("model.dim");
    c.depth = r.integer("model.depth");
    c.heads = r.integer("model.heads");
    c.mlp_ratio = r.integer("model.mlp_ratio");
    c.pool = enum_from_name(nn::kPoolNames, r.string("model.pool"));
    c.emb_dropout = r.number("model.emb_dropout");
    c.qkv_bias = r.boolean("model.qkv_bias");
    if (r.number("model.norm_eps") > 0) c.norm_eps = r.number("model.norm_eps");
    c.stack = stack_config(r);
    c.dtype = dtype;
    return std::make_unique<VitTask>(c, gen);
  }
  FORGE_CHECK(!shape.images,
              "recipe: model.type sequence_classifier needs token sequences, but data.dataset "
              "gives images; use data.dataset: pixels for images as pixel sequences, or "
              "model.type: vit");
  nn::SequenceClassifierConfig c;
  c.vocab_size =
      r.integer("model.vocab_size") > 0 ? r.integer("model.vocab_size") : shape.vocab_size;
  FORGE_CHECK(c.vocab_size >= shape.vocab_size,
              "recipe: model.vocab_size = {} is smaller than the data's vocabulary ({})",
              c.vocab_size, shape.vocab_size);
  c.max_len = r.integer("model.max_len") > 0 ? r.integer("model.max_len") : shape.max_length;
  FORGE_CHECK(c.max_len >= shape.max_length,
              "recipe: model.max_len = {} is shorter than the data's sequences (up to {} tokens); "
              "raise it or lower data.max_length",
              c.max_len, shape.max_length);
  c.dim = r.integer("model.dim");
  c.classes = classes;
  c.pool = enum_from_name(nn::kPoolNames, r.string("model.pool"));
  c.positional = enum_from_name(nn::kPositionalNames, r.string("model.positional"));
  c.axial_shape = r.int_list("model.axial_shape");
  c.emb_dropout = r.number("model.emb_dropout");
  c.dual_encoder = r.boolean("model.dual_encoder");
  c.mlp_dim = r.integer("model.mlp_head_dim");
  if (r.number("model.norm_eps") > 0) c.norm_eps = r.number("model.norm_eps");
  c.stack = stack_config(r);
  c.dtype = dtype;
  return std::make_unique<SequenceTask>(c, gen);
}

void check_model_fits_memory(const Recipe& r, const DataShape& shape, double bytes_per_parameter,
                             const char* use) {
  const double params = parameter_lower_bound(r, shape);
  const double need = params * bytes_per_parameter;
  const double have = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                      static_cast<double>(::sysconf(_SC_PAGESIZE));
  if (have > 0 && need > have)
    FORGE_FAIL(
        "recipe: the model has at least {:.3g} parameters (model.dim = {}, model.depth = {}, "
        "model.heads = {}, model.mlp_ratio = {}, model.mlp_dim = {}, model.head_dim = {}); {} "
        "needs at least {:.3g} GB, more than this machine's {:.3g} GB of memory. Shrink the "
        "model (most often model.dim or model.depth)",
        params, r.integer("model.dim"), r.integer("model.depth"), r.integer("model.heads"),
        r.integer("model.mlp_ratio"), r.integer("model.mlp_dim"), r.integer("model.head_dim"), use,
        need / 1e9, have / 1e9);
}

std::unique_ptr<TaskModel> build_trained_model(const Recipe& r, const DataShape& shape,
                                               const Placement& place,
                                               const std::map<std::string, Tensor>& weights,
                                               const std::string& where) {
  Generator init(static_cast<uint64_t>(r.integer("seed")));  // overwritten by the weights
  std::unique_ptr<TaskModel> task = build_model(r, shape, place.dtype, &init);
  task->module().to(place.device);
  try {
    task->module().load_state_dict(weights);
  } catch (const Error& e) {
    FORGE_FAIL("{}: the weights do not fit the recipe's model: {}", where, message_of(e));
  }
  return task;
}

void resolve_sizes(Recipe& r, const DataShape& shape) {
  // A key at 0 ("from the data" / "the default") becomes the value the model
  // was built with; a key already set stays.
  const auto fill = [&](const char* key, int64_t v) {
    if (r.integer(key) == 0 && v > 0) r.set(fmt::format("{}={}", key, v));
  };
  const std::string& type = r.string("model.type");
  const int64_t dim = r.integer("model.dim");
  fill("model.head_dim", head_dim_of(r));
  fill("model.mlp_dim", r.integer("model.mlp_ratio") * dim);
  double eps = nn::LanguageModelConfig{}.norm_eps;
  if (type == "vit") eps = nn::ViTConfig{}.norm_eps;
  if (type == "sequence_classifier") eps = nn::SequenceClassifierConfig{}.norm_eps;
  if (r.number("model.norm_eps") == 0) r.set(fmt::format("model.norm_eps={}", eps));
  if (type == "vit" || type == "sequence_classifier") fill("model.classes", shape.classes);
  if (type == "vit") fill("model.channels", shape.channels);
  if (type != "vit") {
    fill("model.vocab_size", shape.vocab_size);
    fill("model.max_len", shape.max_length);
  }
  if (type == "encoder_decoder") {
    fill("model.target_vocab_size", shape.target_vocab_size);
    fill("model.target_max_len", shape.target_length);
    fill("model.encoder_depth", r.integer("model.depth"));
    fill("model.decoder_depth", r.integer("model.depth"));
  }
}

}  // namespace forge::train
