// The recipe schema: every key a recipe may hold, with its type, default,
// range and one line of documentation. The Markdown reference
// (docs/RECIPES.md) and --dump-config are generated from this table.
#include <cmath>
#include <map>

#include "core/error.h"
#include "nn/models.h"
#include "optim/schedule.h"
#include "train/recipe.h"

namespace forge::train {

namespace {

using json::Value;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct SchemaBuilder {
  std::vector<KeySpec> keys;
  std::string section;

  void integer(const std::string& name, int64_t def, double lo, double hi, std::string doc) {
    keys.push_back({section + name, KeyType::integer, Value(def), std::move(doc), lo, hi, {}});
  }
  void number(const std::string& name, double def, double lo, double hi, std::string doc) {
    keys.push_back({section + name, KeyType::number, Value(def), std::move(doc), lo, hi, {}});
  }
  void boolean(const std::string& name, bool def, std::string doc) {
    keys.push_back({section + name, KeyType::boolean, Value(def), std::move(doc), -kInf, kInf, {}});
  }
  void string(const std::string& name, std::string def, std::string doc) {
    keys.push_back({section + name, KeyType::string, Value(def), std::move(doc), -kInf, kInf, {}});
  }
  void choice(const std::string& name, std::string def, std::vector<std::string> choices,
              std::string doc) {
    keys.push_back({section + name, KeyType::choice, Value(def), std::move(doc), -kInf, kInf,
                    std::move(choices)});
  }
  void int_list(const std::string& name, double lo, double hi, std::string doc) {
    keys.push_back({section + name, KeyType::int_list, Value(json::Array{}), std::move(doc), lo, hi, {}});
  }
  void number_list(const std::string& name, std::vector<double> def, std::string doc) {
    json::Array a;
    for (double d : def) a.push_back(Value(d));
    keys.push_back({section + name, KeyType::number_list, Value(a), std::move(doc), -kInf, kInf, {}});
  }
  void string_list(const std::string& name, std::vector<std::string> choices, std::string doc) {
    keys.push_back({section + name, KeyType::string_list, Value(json::Array{}), std::move(doc), -kInf,
                    kInf, std::move(choices)});
  }
};

// The choices of keys that name an enum are that enum's name table (core/names.h).
const std::vector<std::string> kMechanisms = names_of(nn::kMechanismNames);

std::vector<KeySpec> build_schema() {
  SchemaBuilder s;
  s.section = "";
  s.string("name", "run", "Name of the run; the default output directory is runs/<name>-<N> (N: one more than the largest number there, from 1).");
  s.integer("seed", 0, 0, kInf, "Seed of every random stream (initialisation, dropout, data order, augmentation).");
  s.choice("device", "cpu", {"cpu", "cuda", "auto"}, "Where to train: cpu, cuda (the first GPU; an error when none is visible) or auto (the GPU when one is visible, else the CPU). Every attention mechanism has CUDA kernels (docs/GPU.md says which have run on a GPU).");
  s.choice("precision", "fp32", {"fp32", "fp64", "bf16", "fp16"}, "fp32 / fp64: parameter and activation type. bf16 / fp16: mixed precision: f32 master weights and optimizer state, GEMMs and the patch convolution in bf16 / f16 with f32 accumulation (on a GPU also softmax and local attention); fp16 adds dynamic loss scaling. On the CPU: bf16 where the CPU has AVX512-BF16 or AMX (an error elsewhere), softmax and local attention in bf16 from 128 keys per tile, the other mechanisms in f32; fp16 runs as fp32 (logged).");
  s.boolean("allow_tf32", false, "On the GPU, let f32 GEMMs use TF32 tensor cores (10-bit mantissa products, f32 accumulation): faster, less exact.");
  s.integer("threads", 0, 0, 4096,
            "CPU threads for BLAS and our kernels; 0: every core, shared evenly by the processes "
            "of a job on one host.");

  s.section = "model.";
  s.choice(
      "type", "vit", {"vit", "sequence_classifier", "language_model", "encoder_decoder"},
      "vit: image classification; sequence_classifier: token sequences (LRA tasks; a dual encoder "
      "for retrieval); language_model: next-token prediction (performer-pytorch's PerformerLM, "
      "linear-attention-transformer's LinearAttentionTransformerLM; data.dataset lm_text); "
      "encoder_decoder: sequence-to-sequence (PerformerEncDec; data.dataset copy or seq2seq_tsv).");
  s.integer("dim", 192, 1, kInf, "Model width D.");
  s.integer("depth", 12, 1, 1024, "Number of transformer blocks.");
  s.integer("heads", 3, 1, 1024, "Attention heads H.");
  s.integer("head_dim", 0, 0, kInf, "Per-head width d; 0: dim / heads.");
  s.integer("mlp_dim", 0, 0, kInf, "Feed-forward hidden width; 0: mlp_ratio * dim.");
  s.integer("mlp_ratio", 4, 1, 64, "Feed-forward hidden width as a multiple of dim (when mlp_dim is 0).");
  s.choice("activation", "gelu", {"gelu", "relu"}, "Feed-forward activation.");
  s.boolean("glu", false, "Gated feed-forward (GEGLU / ReGLU).");
  s.integer("ff_chunks", 1, 1, kInf, "Run the feed-forward over the rows in this many pieces (memory).");
  s.number("dropout", 0.0, 0, 0.99, "Dropout after the feed-forward activation and after the attention output projection.");
  s.number("emb_dropout", 0.0, 0, 0.99, "Dropout on the embeddings (after adding positions).");
  s.number("drop_path", 0.0, 0, 0.99,
           "Stochastic depth (timm's drop_path_rate): each residual branch's output is dropped "
           "per sample with a rate rising linearly from 0 at the first block to this at the last, "
           "the kept ones scaled by 1 / (1 - rate); training only. Works with checkpoint levels "
           "and reversible stacks.");
  s.choice("pool", "cls", names_of(nn::kPoolNames), "Classifier input: the CLS token or the mean over real tokens.");
  s.choice("norm", "layer", names_of(nn::kNormNames), "Normalisation of each branch.");
  s.boolean("post_norm", false, "Post-norm blocks (the original Transformer) instead of pre-norm.");
  s.boolean("final_norm", true, "A norm after the last block (pre-norm stacks).");
  s.choice(
      "final_norm_kind", "layer", names_of(nn::kFinalNormKindNames),
      "The final norm: a LayerNorm whatever the blocks use (performer-pytorch, "
      "linear-attention-transformer), or the blocks' own kind (ScaleNorm after ScaleNorm blocks).");
  s.number(
      "norm_eps", 0.0, 0, 1,
      "Epsilon of every norm of the stack; 0: the model's default (vit and sequence_classifier "
      "1e-6 as timm, language_model and encoder_decoder 1e-5 as PyTorch).");
  s.boolean("shift_tokens", false, "Token shift in front of each branch (linear-attention-transformer).");
  s.int_list("token_shifts", -kInf, kInf,
             "Token shift: how far each feature segment moves along the sequence; empty: (1, 0) "
             "when causal, (1, 0, -1) otherwise (linear-attention-transformer); performer-pytorch: "
             "[0, 1] and [-1, 0, 1]. Causal models: 0 or 1.");
  s.boolean("attend_axially", false, "After each block, attention over the sequence folded by attention.local_window (linear-attention-transformer).");
  s.boolean("qkv_bias", true, "Biases on the query, key and value projections.");
  s.boolean("out_bias", true,
            "A bias on the attention output projection (performer-pytorch: attn_out_bias, false by "
            "default).");
  s.choice("checkpoint", "C0", names_of(nn::kCheckpointLevelNames), "Gradient checkpointing: C0 none, C1 each branch, C2 each branch and each head.");
  s.boolean("reversible", false, "Reversible blocks (RevNet couplings; activation memory flat in depth).");
  s.choice("reversible_output", "sum", names_of(nn::kReversibleOutputNames),
           "Reversible stacks: the output is the sum of the two halves (performer-pytorch) or "
           "their mean (linear-attention-transformer).");
  s.integer("image_size", 28, 1, kInf, "vit: input image side (images are square).");
  s.integer("patch_size", 4, 1, kInf, "vit: patch side; image_size must be a multiple.");
  s.integer("channels", 0, 0, 4, "vit: image channels; 0: from the data.");
  s.integer("classes", 0, 0, kInf, "Output classes; 0: from the data.");
  s.integer("vocab_size", 0, 0, kInf,
            "Sequence models: token vocabulary (encoder_decoder: the source's); 0: from the data.");
  s.integer("max_len", 0, 0, kInf,
            "Sequence models: longest sequence, the positions available (encoder_decoder: the "
            "source's); 0: from the data (data.max_length, data.seq_len).");
  s.choice("positional", "learned", names_of(nn::kPositionalNames),
           "Sequence models: position encoding. rotary: fixed sinusoids added to the input and "
           "rotary q, k in every layer (performer-pytorch's rotary_position_emb, "
           "linear-attention-transformer's use_rotary_emb); rotary_only: the rotation alone.");
  s.int_list(
      "axial_shape", 1, kInf,
      "Sequence models, axial positions: the factor shape (product >= positions); empty: (ceil(n / "
      "w), w) with w = 64 (classifier) or attention.local_window (language model).");
  s.boolean("causal", true,
            "language_model: causal (each token sees those before it); false: bidirectional.");
  s.integer("emb_dim", 0, 0, kInf,
            "language_model / encoder_decoder: token embedding width, factorised through a "
            "projection to dim when smaller (ALBERT style); 0: dim.");
  s.boolean("tie_embedding", false,
            "language_model / encoder_decoder: the output projection reuses the token embedding "
            "matrix (tied weights, no output bias).");
  s.integer("encoder_depth", 0, 0, 1024, "encoder_decoder: encoder blocks; 0: depth.");
  s.integer("decoder_depth", 0, 0, 1024, "encoder_decoder: decoder blocks; 0: depth.");
  s.integer("target_vocab_size", 0, 0, kInf,
            "encoder_decoder: the decoder's vocabulary; 0: from the data.");
  s.integer("target_max_len", 0, 0, kInf,
            "encoder_decoder: the decoder's longest sequence; 0: from the data.");
  s.boolean("dual_encoder", false, "sequence_classifier: two documents through one encoder, classified from [u, v, u*v, u-v] (LRA retrieval).");
  s.integer("mlp_head_dim", 0, 0, kInf, "dual encoder: hidden width of the classifier MLP; 0: dim.");

  s.string("init_from", "",
           "Fine-tuning: start from these weights instead of a random initialisation: a "
           "checkpoint (a run directory, RUN/checkpoints/best, a step directory) or a .safetensors "
           "state dict with attnforge's or timm's ViT names. Tensors of another shape: the ViT "
           "position embedding is interpolated to this image size, a head for other classes "
           "starts fresh; the log reports what was missing, ignored or resized.");

  s.section = "model.attention.";
  s.choice("kind", "softmax", kMechanisms, "Attention mechanism of every layer (see docs/ATTENTION.md).");
  s.string_list("per_layer", kMechanisms, "Optional mechanism per layer (length depth); overrides kind layer by layer.");
  s.integer("local_heads", 0, 0, 1024,
            "local_heads heads of each layer use local attention, the others kind.");
  s.choice("local_heads_at", "first", names_of(nn::kLocalHeadsAtNames),
           "Where the local heads sit among the heads: first (linear-attention-transformer) or "
           "last (performer-pytorch).");
  s.boolean("local_rotary", false,
            "Local heads apply the local-attention package's rotary relative positions inside "
            "their windows, and a rotary model's layer rotation turns the other heads only "
            "(performer-pytorch's local heads).");
  s.int_list("per_layer_local_heads", 0, 1024, "Optional local_heads per layer (length depth).");
  s.number("dropout", 0.0, 0, 0.99, "Dropout on the attention probabilities (softmax, local, linformer).");
  s.number("scale", 0.0, 0, kInf, "Softmax score scale; 0: head_dim^-1/2.");
  s.integer("local_window", 128, 1, kInf, "local: window size w.");
  s.integer("local_look_backward", 1, 0, kInf, "local: windows looked at behind.");
  s.integer("local_look_forward", -1, -1, kInf, "local: windows looked at ahead; -1: 1 (0 when causal).");
  s.integer("bucket_size", 64, 1, kInf, "efficient, causal: blind-spot bucket.");
  s.number("linear_eps", 1e-6, 0, kInf, "linear: normaliser epsilon.");
  s.integer("nb_features", 0, 0, kInf, "favor: random features m; 0: int(d ln d).");
  s.choice("favor_kernel", "softmax", names_of(ops::attention::kFavorKernelNames), "favor: feature map.");
  s.choice("favor_stabilizer", "prefix", names_of(ops::attention::kFavorStabilizerNames), "favor, causal softmax kernel: stabiliser.");
  s.integer("favor_scaling", 0, 0, 1, "favor: 0 row norms of Gaussian vectors, 1 sqrt(d).");
  s.integer("feature_redraw_interval", 1000, 0, kInf, "favor: training steps between redraws of the projection; 0: never.");
  s.integer("k", 256, 1, kInf, "linformer: projected length k.");
  s.choice("sharing", "none", names_of(nn::kSharingNames), "linformer: E/F parameter sharing.");
  s.integer("k_reduce_by_layer", 0, 0, kInf, "linformer: k shrinks by this much per layer.");
  s.number("ts_a", 0.5, -kInf, kInf, "taylorshift: coefficient a of a x^2 + b x + c.");
  s.number("ts_b", 1.0, -kInf, kInf, "taylorshift: coefficient b.");
  s.number("ts_c", 1.0, -kInf, kInf, "taylorshift: coefficient c.");
  s.integer("n0", 0, -1, kInf, "taylorshift: direct below this length, efficient from it; 0: d^2 + d + 1; -1: always efficient.");
  s.boolean("output_normalized", false, "taylorshift: normalise the output as the paper's section 3.3.");
  s.choice("backend", "tiled", {"tiled", "mma", "cudnn"},
           "GPU attention kernels: tiled (the kernels that have run on a GPU), mma (the "
           "tensor-core kernels: softmax, local and linformer in bf16 / fp16 with head_dim 64 or "
           "128 and no attention dropout; linear, efficient and taylor_linear non-causal in bf16 "
           "/ fp16 with feature and value dims of 64 or 128; other cases tiled) or cudnn (cuDNN's "
           "fused attention for softmax where it takes the case: no mask, band, causality or "
           "dropout; else as mma). mma and cudnn have not yet run on a GPU (docs/GPU.md). The CPU "
           "ignores it.");

  s.section = "data.";
  s.choice("dataset", "fashion_mnist",
           {"fashion_mnist", "image_folder", "listops", "text", "retrieval", "pixels", "pathfinder",
            "lm_text", "copy", "seq2seq_tsv"},
           "The data source (see docs/USER_GUIDE.md, Data).");
  s.string(
      "root", "",
      "Where the data lives (docs/USER_GUIDE.md, Data, gives each source's layout; "
      "`attnforge data` prepares LRA's). Fashion-MNIST: empty reads "
      "/usr/share/datasets/fashion-mnist; every other source refuses to start without it "
      "(unless data.synthetic). "
      "lm_text: a file or a folder of files; seq2seq_tsv: a folder of <split>.tsv[.gz].");
  s.boolean("synthetic", false,
            "listops, pathfinder, image_folder (and pixels of an image_folder): train on "
            "generated stand-in data (made once into the data cache; generate_* keys) instead of "
            "data.root. A smoke test, not the task: the log says so at warning level at the "
            "start and the end of the run.");
  s.choice("pixel_source", "fashion_mnist", {"fashion_mnist", "image_folder"}, "pixels (LRA Image): the image source read as grayscale pixel sequences.");
  s.string("train_split", "train",
           "Split used for training (file or folder name, see the source; lm_text: train, valid or "
           "test).");
  s.string("eval_split", "test", "Split used for periodic evaluation and the best checkpoint.");
  s.integer("max_length", 0, 0, kInf, "Sequences: truncate to this many tokens; 0: the source's default (ListOps 2000, text 4000).");
  s.boolean("pad_to_max", false, "Sequences: pad every batch to max_length (fixed shapes) instead of the batch's longest.");
  s.integer("limit_train", 0, 0, kInf, "Use only the first N training examples; 0: all.");
  s.integer("limit_eval", 0, 0, kInf, "Use only the first N evaluation examples; 0: all.");
  s.integer("workers", 2, 0, 64, "Threads building batches ahead of the training loop.");
  s.integer("prefetch", 2, 1, 64, "Batches each worker builds ahead.");
  s.integer("max_image_pixels", 67108864, 1, kInf, "Image files (image_folder, pathfinder): refuse an image whose header declares more pixels (width * height) than this, before decoding it; guards against damaged or hostile files.");
  s.boolean("normalize", true, "Images: normalise with mean / std.");
  s.number_list("mean", {}, "Images: per-channel mean; empty: the source's default.");
  s.number_list("std", {}, "Images: per-channel std; empty: the source's default.");
  s.integer("random_crop_padding", 0, 0, 64, "Fashion-MNIST: random crop after zero padding by this much (training only).");
  s.boolean("hflip", false, "Fashion-MNIST: random horizontal flips (training only).");
  s.number("train_scale_min", 0.08, 0.001, 1, "image_folder: random-resized-crop smallest area fraction.");
  s.number("hflip_prob", 0.5, 0, 1, "image_folder: horizontal flip probability (training).");
  s.number("crop_pct", 0.875, 0.1, 1, "image_folder, evaluation: resize to image_size / crop_pct, then center crop.");
  s.choice("interpolation", "bilinear", {"bilinear", "bicubic"},
           "image_folder: the resampling filter of the random resized crop and of evaluation's "
           "resize (antialiased as PIL's; DeiT and timm train and evaluate with bicubic).");
  s.string("auto_augment", "",
           "image_folder, training: RandAugment as timm's config string, e.g. "
           "rand-m9-mstd0.5-inc1 (DeiT): m magnitude (0..10), n ops per image (2), mstd "
           "magnitude noise, mmax its clip (10), inc1 the increasing-magnitude op set, p each "
           "op's probability (0.5); empty: off.");
  s.number_list("color_jitter", {},
                "image_folder, training: torchvision's ColorJitter as [brightness, contrast, "
                "saturation] or [brightness, contrast, saturation, hue], or one value for the "
                "first three, applied in a random order after RandAugment; empty: off (timm "
                "leaves it off when auto_augment is on).");
  s.number("erasing_prob", 0.0, 0, 1,
           "image_folder, training: timm's RandomErasing probability after normalisation "
           "(DeiT: 0.25); 0: off.");
  s.choice("erasing_mode", "pixel", {"pixel", "rand", "const"},
           "Random erasing's fill: per-pixel normal noise, one normal value per channel, or "
           "zeros.");
  s.integer("erasing_count", 1, 1, 64,
            "Random erasing: boxes per erased image (timm's recount; more than 1: a count "
            "uniform in [1, this]).");
  s.integer("repeated_augmentation", 1, 1, 64,
            "Repeated augmentation (DeiT: 3): each epoch takes the first 1/r of its shuffled "
            "order and repeats each image r times in a row with different augmentations, so an "
            "epoch keeps its length (timm's RepeatAugSampler); batches are split over processes "
            "as any other; 1: off.");
  s.boolean("scaled_jpeg_decode", true,
            "image_folder: decode a JPEG at 1/2, 1/4 or 1/8 size with libjpeg-turbo's scaled "
            "IDCT when the crop is resized down by at least twice that anyway (much faster on "
            "large photos); false: always decode at full size.");
  s.integer("generate_classes", 4, 2, 1000,
            "image_folder with data.synthetic: classes of the generated pictures (JPEGs of "
            "coloured shapes on noise, 48 to 96 pixels a side, generate_train / generate_eval "
            "of them split over the classes).");
  s.number("mixup_alpha", 0.0, 0, kInf, "Mixup Beta(alpha, alpha); 0: off.");
  s.number("cutmix_alpha", 0.0, 0, kInf, "CutMix Beta(alpha, alpha); 0: off.");
  s.number("mix_prob", 1.0, 0, 1, "Probability that a batch is mixed.");
  s.number("mix_switch_prob", 0.5, 0, 1, "With both on: probability of CutMix instead of Mixup.");
  s.integer("generate_train", 96000, 1, kInf,
            "listops / pathfinder with data.synthetic, copy: generated training examples (an epoch).");
  s.integer("generate_eval", 2000, 1, kInf,
            "listops / pathfinder with data.synthetic, copy: generated evaluation examples (each of val "
            "and test).");
  s.integer("seq_len", 1024, 1, kInf,
            "lm_text: tokens (bytes) per window; a window holds seq_len + 1 bytes, the inputs and "
            "their next bytes.");
  s.int_list("split_bytes", 0, kInf,
             "lm_text: where train, valid and test end, in bytes of the corpus; empty: 90000000, "
             "95000000, 100000000 (enwik8). An end past the corpus is cut to it.");
  s.number_list("split_fractions", {},
                "lm_text: where train, valid and test end, as fractions of the corpus (e.g. [0.9, "
                "0.95, 1.0]); replaces split_bytes.");
  s.string_list("include", {},
                "lm_text, a folder: read the files whose name matches one of these patterns "
                "(fnmatch, e.g. \"*.txt\"); empty: every file.");
  s.string_list("exclude", {},
                "lm_text, a folder: leave out the files whose name matches one of these patterns.");
  s.integer("copy_length", 32, 1, kInf,
            "copy: source length M (the target is the start token, then the source twice).");
  s.integer("copy_vocab", 18, 3, kInf,
            "copy: vocabulary V (0 pad, 1 start, source tokens in [2, V)).");
  s.integer("max_target_length", 0, 0, kInf,
            "seq2seq_tsv: target tokens kept (the end token included); 0: 1024. data.max_length "
            "bounds the source (0: 1024).");
  s.integer("generate_min_length", 500, 1, kInf, "listops generator: lengths strictly above this.");
  s.integer("generate_max_length", 2000, 2, kInf, "listops generator: lengths strictly below this.");

  s.section = "optimizer.";
  s.choice("name", "adamw", {"sgd", "adam", "adamw", "lamb"}, "The optimizer.");
  s.number("lr", 1e-3, 0, kInf, "Base learning rate (the schedule multiplies it).");
  s.number("weight_decay", 0.05, 0, kInf, "Weight decay (decoupled for adamw and lamb, L2 for sgd and adam).");
  s.boolean("no_decay_on_norms_biases", true, "No weight decay on biases, norm gains, embeddings and tokens.");
  s.number("beta1", 0.9, 0, 0.999999, "adam / adamw / lamb: first moment decay.");
  s.number("beta2", 0.999, 0, 0.999999, "adam / adamw / lamb: second moment decay.");
  s.number("eps", 1e-8, 0, 1, "adam / adamw / lamb: denominator epsilon.");
  s.number("momentum", 0.9, 0, 1, "sgd: momentum.");
  s.boolean("nesterov", false, "sgd: Nesterov momentum.");
  s.number("clip_grad_norm", 0.0, 0, kInf, "Clip the global gradient norm to this; 0: off.");
  s.number("layer_decay", 1.0, 0.01, 1,
           "vit: layer-wise learning-rate decay for fine-tuning (timm's layer_decay, BEiT / MAE): "
           "the head's lr is the schedule's, each layer below it is scaled by this once more "
           "(the last block with the final norm, ..., block 0, then the patch embedding, class "
           "token and positions: scale^(depth + 1) there); 1: off.");
  s.string_list("freeze", {}, "Parameters left out of the optimizer: name prefixes, e.g. [transformer.projections] keeps Linformer's E/F at their random init.");

  s.section = "schedule.";
  s.choice("kind", "cosine", names_of(optim::kScheduleNames), "Learning-rate schedule (rsqrt: LRA's constant * linear_warmup * rsqrt_decay).");
  s.integer("warmup_steps", 0, 0, kInf, "Linear warmup steps (one longer than the run: cut to it, except rsqrt; a warning says so).");
  s.number("warmup_epochs", 0.0, 0, kInf, "Warmup in epochs (used when warmup_steps is 0).");
  s.number("min_lr_ratio", 0.0, 0, 1, "cosine / linear_decay: final lr as a fraction of the base.");
  s.integer("step_size", 1000, 1, kInf, "step: steps between decays.");
  s.number("gamma", 0.1, 0, 1, "step: decay factor.");

  s.section = "loop.";
  s.integer("epochs", 1, 0, kInf, "Training epochs (used when steps is 0).");
  s.integer("steps", 0, 0, kInf, "Optimizer steps; 0: epochs * (batches per epoch / accumulation).");
  s.integer("batch_size", 128, 1, kInf, "Examples per micro-batch.");
  s.integer("accumulation", 1, 1, 4096, "Micro-batches per optimizer step (gradient accumulation).");
  s.integer("eval_batch_size", 0, 0, kInf, "Evaluation batch size; 0: batch_size.");
  s.integer("eval_every", 0, 0, kInf, "Optimizer steps between evaluations; 0: at the end of each epoch.");
  s.integer("log_every", 50, 1, kInf, "Optimizer steps between train metric records.");
  s.number("label_smoothing", 0.0, 0, 0.99, "Cross-entropy label smoothing.");
  s.boolean("check_nan", false, "Name the first op whose output is not finite (slower); also --check-nan.");

  s.section = "ema.";
  s.number("decay", 0.0, 0, 0.999999999,
           "An exponential moving average of the weights (timm's ModelEmaV3), updated after every "
           "optimizer step as ema = decay ema + (1 - decay) weights, evaluated beside the raw "
           "weights (eval/ema_accuracy), saved in checkpoints (optimizer.safetensors, as "
           "ema.<name>) and resumed exactly; 0: off. DeiT's code: 0.99996.");
  s.boolean("warmup", false,
            "EMA warm-up: the decay at update t is min(decay, 1 - (1 + t)^(-2/3)) (timm's "
            "use_warmup), so early averages follow the weights.");
  s.boolean("select_best", false,
            "Choose the best checkpoint by the EMA weights' evaluation accuracy instead of the raw "
            "weights'.");

  s.section = "checkpoint.";
  s.integer("every", 0, 0, kInf, "Optimizer steps between checkpoints; 0: at each evaluation.");
  s.integer("keep_last", 2, 1, kInf, "Checkpoints kept besides the best.");
  s.boolean("keep_best", true, "Keep the checkpoint with the best evaluation accuracy.");

  s.section = "distributed.";
  s.choice("backend", "auto", {"auto", "mpi", "nccl"},
           "Under mpirun (docs/DISTRIBUTED.md): how gradients are averaged over the processes. "
           "auto: NCCL when training on a GPU, MPI on the CPU; mpi on a GPU goes through host "
           "copies. Without mpirun there is one process and this section is not used.");
  s.number("bucket_mb", 25, 0.001, 4096,
           "Gradient bucket size in MiB: each bucket's all-reduce starts as soon as its last "
           "gradient is final, during the backward.");
  s.number("timeout_s", 600, 1, kInf,
           "Seconds a process waits in a collective (an all-reduce, a barrier) for the others "
           "before it stops the job with an error naming the wait.");

  s.section = "output.";
  s.string("dir", "", "Run directory; empty: runs/<name>-<N> (N: one more than the largest number there, from 1).");
  s.boolean("attention_maps", false, "At the end, write attention-map images (PNG) of one evaluation example for each layer and head (softmax, local, linformer, taylorshift heads).");
  return s.keys;
}

}  // namespace

const std::vector<KeySpec>& recipe_schema() {
  static const std::vector<KeySpec> schema = build_schema();
  return schema;
}

const KeySpec* find_key(const std::string& path) {
  static const std::map<std::string, const KeySpec*> index = [] {
    std::map<std::string, const KeySpec*> m;
    for (const KeySpec& k : recipe_schema()) m[k.path] = &k;
    return m;
  }();
  auto it = index.find(path);
  return it == index.end() ? nullptr : it->second;
}

}  // namespace forge::train
