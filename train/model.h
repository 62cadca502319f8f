// The model of a recipe, built from the `model.*` keys with the sizes the data
// decides (classes, channels, vocabulary, lengths) filled in: a ViT or a
// SequenceClassifier (one encoder, or a dual encoder for document pairs) for
// classification; a LanguageModel for next-token prediction; an
// EncoderDecoder for sequence-to-sequence.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/rng.h"
#include "data/loader.h"
#include "nn/module.h"
#include "train/recipe.h"

namespace forge::nn {
class LanguageModel;
class EncoderDecoder;
}  // namespace forge::nn

namespace forge::train {

// What the data asks of the model: a class per example, or the next token of
// a sequence (language models) or of a decoder's input (sequence-to-sequence).
enum class Task { classification, language_model, seq2seq };
const char* task_name(Task t);

// What the data tells the model.
struct DataShape {
  Task task = Task::classification;
  int64_t classes = 0;
  bool images = true;
  int64_t channels = 0, image_size = 0;              // images
  int64_t vocab_size = 0, max_length = 0;            // sequences (seq2seq: the source)
  bool pairs = false;                                // examples are document pairs
  int64_t target_vocab_size = 0, target_length = 0;  // seq2seq: the decoder's
  bool byte_tokens = false;  // language models on bytes: bits per byte = loss / ln 2
};

class TaskModel {
 public:
  virtual ~TaskModel() = default;
  virtual nn::Module& module() = 0;
  // Logits of a batch: (B, classes) for classification (images, tokens + mask,
  // or pairs); (B, N, V) over batch.target's positions for the other tasks.
  virtual Tensor forward(const data::Batch& batch) = 0;
  // The attention maps of the first example of `batch` for each layer
  // (layer -> (H, N, M) probabilities; undefined for heads without maps).
  virtual std::vector<Tensor> attention_maps(const data::Batch& batch) = 0;
  // The generative model behind a next-token task (null for the others).
  virtual nn::LanguageModel* language_model() { return nullptr; }
  virtual nn::EncoderDecoder* encoder_decoder() { return nullptr; }
};

// Where and in what types a recipe runs (its device and precision keys).
struct Placement {
  Device device = Device::cpu();
  DType dtype = DType::f32;     // parameters, activations, gradients, optimizer state
  DType autocast = DType::f32;  // bf16 / f16: the GEMMs' type under autocast; f32: off
  bool loss_scaling = false;    // fp16: dynamic loss scaling
  std::string note;             // said in the log when a request was adapted
};

// Throws when the recipe asks for a GPU that is not there. The process of
// local rank r on its host (data parallelism) takes GPU r % (GPUs visible).
Placement placement(const Recipe& recipe, int local_rank = 0);

// The parameters build_model makes, at least, computed from the recipe alone
// (the blocks' projections and feed-forward, the embeddings and the head), in
// double: a mistyped size overflows 64-bit integers.
double parameter_lower_bound(const Recipe& recipe, const DataShape& shape);

// Refuses, naming the size keys, a model whose parameters (a lower bound
// from the recipe, before anything is allocated) at `bytes_per_parameter`
// exceed this machine's memory; `use` says for what ("training it: weights,
// gradients and AdamW's moments"). build_model checks its weights.
void check_model_fits_memory(const Recipe& recipe, const DataShape& shape,
                             double bytes_per_parameter, const char* use);

// Builds the model with parameters drawn from `gen` and in `dtype`; errors
// name the recipe key at fault.
std::unique_ptr<TaskModel> build_model(const Recipe& recipe, const DataShape& shape, DType dtype,
                                       Generator* gen);

// A model built as build_model does, placed on `place`'s device, with trained
// `weights` (a checkpoint's state dict) loaded strictly; an error names
// `where` (e.g. "eval: runs/x/checkpoints/step-00000100") and the tensors
// that do not fit.
std::unique_ptr<TaskModel> build_trained_model(const Recipe& recipe, const DataShape& shape,
                                               const Placement& place,
                                               const std::map<std::string, Tensor>& weights,
                                               const std::string& where);

// Writes into `recipe` the sizes build_model takes from the data or from the
// model's defaults when their keys are 0 (classes, channels, vocabulary and
// lengths; head_dim, mlp_dim, norm_eps; an encoder-decoder's depths), so the
// recipe a run keeps says what was built. Call it after build_model has
// checked the recipe against `shape`.
void resolve_sizes(Recipe& recipe, const DataShape& shape);

}  // namespace forge::train
