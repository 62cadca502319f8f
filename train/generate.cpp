// Generation from a checkpoint (see generate.h).
#include "train/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "data/seq2seq.h"
#include "nn/models.h"
#include "ops/autocast.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/model.h"
#include "train/outputs.h"

namespace forge::train {

namespace fs = std::filesystem;

namespace {

// How the data source writes tokens as text.
struct Codec {
  std::string kind;  // data.dataset
  int64_t vocab = 0;

  std::vector<int64_t> encode(const std::string& text, const char* what) const {
    std::vector<int64_t> ids;
    if (kind == "copy") {
      std::istringstream in(text);
      std::string word;
      while (in >> word) {
        size_t used = 0;
        int64_t id = -1;
        try {
          id = std::stoll(word, &used);
        } catch (const std::exception&) {
        }
        FORGE_CHECK(used == word.size() && id >= 0 && id < vocab,
                    "generate: {} '{}': the copy task's tokens are integers in [0, {}) separated "
                    "by spaces",
                    what, word, vocab);
        ids.push_back(id);
      }
      return ids;
    }
    const int64_t offset = kind == "seq2seq_tsv" ? data::kSeq2SeqByteOffset : 0;
    for (unsigned char c : text) ids.push_back(int64_t{c} + offset);
    return ids;
  }

  std::string decode(int64_t id, bool first) const {
    if (kind == "copy") return fmt::format("{}{}", first ? "" : " ", id);
    if (kind == "seq2seq_tsv")
      return id >= data::kSeq2SeqByteOffset
                 ? std::string(1, static_cast<char>(id - data::kSeq2SeqByteOffset))
                 : std::string();
    return std::string(1, static_cast<char>(id));
  }
};

}  // namespace

GenerateResult generate(const GenerateRequest& q,
                        const std::function<void(std::string_view)>& emit) {
  GenerateResult result;
  if (!q.logits_file.empty()) check_output_file(q.logits_file, "generate --logits", q.overwrite);
  result.checkpoint = resolve_checkpoint(q.checkpoint, "generate").dir;
  const Checkpoint c = read_checkpoint(result.checkpoint);
  Recipe r = Recipe::from_yaml(c.recipe_yaml, result.checkpoint + "/model.safetensors (recipe)");
  for (const std::string& s : q.overrides) r.set(s);
  const std::string& type = r.string("model.type");
  FORGE_CHECK(type == "language_model" || type == "encoder_decoder",
              "generate: {} holds a {} model; generation needs a language_model or an "
              "encoder_decoder",
              result.checkpoint, type);
  const Placement place = placement(r);
  const DataShape shape = next_token_shape(r);
  std::unique_ptr<TaskModel> task =
      build_trained_model(r, shape, place, c.model, "generate: " + result.checkpoint);

  const Codec codec{r.string("data.dataset"),
                    shape.task == Task::seq2seq ? shape.target_vocab_size : shape.vocab_size};
  std::vector<int64_t> prime = codec.encode(q.prompt, "--prompt");
  if (shape.task == Task::seq2seq) prime.insert(prime.begin(), data::kSeq2SeqStart);
  FORGE_CHECK(!prime.empty(),
              "generate: give a prompt (--prompt or --prompt-file): a language "
              "model continues a text");
  result.prompt_tokens = static_cast<int64_t>(prime.size());

  Generator draws(q.seed);
  nn::GenerateOptions o;
  o.temperature = q.temperature;
  o.top_k = q.top_k;
  o.filter_thres = q.filter_thres;
  o.greedy = q.greedy;
  o.eos = q.eos != -2 ? q.eos : codec.kind == "seq2seq_tsv" ? data::kSeq2SeqEnd : -1;
  o.gen = &draws;
  // The decoding state, rebuilt from the last half of the positions when they
  // are full; exact_window: the references' window recomputed per token.
  const int64_t positions = shape.task == Task::seq2seq
                                ? std::max(shape.target_length, r.integer("model.target_max_len"))
                                : std::max(shape.max_length, r.integer("model.max_len"));
  o.use_recurrent_state = !q.exact_window;
  nn::GenerateStats stats;
  o.stats = &stats;
  result.positions = positions;
  // --logits: one line per draw, written when the generation is done.
  std::vector<int64_t> src, context = prime;
  std::string lines, pending;
  if (!q.logits_file.empty())
    o.on_logits = [&](const Tensor& logits) {
      pending = fmt::format("{{{}\"context\": [{}], \"logits\": [{:.9g}]",
                            src.empty() ? "" : fmt::format("\"source\": [{}], ", fmt::join(src, ", ")),
                            fmt::join(context, ", "),
                            fmt::join(logits.to(Device::cpu()).to(DType::f64).to_vector<double>(), ", "));
    };
  o.on_token = [&](const std::vector<int64_t>& next) {
    if (!pending.empty()) {  // --logits only
      lines += pending + fmt::format(", \"next\": {}}}\n", next[0]);
      pending.clear();
      context.push_back(next[0]);
    }
    if (next[0] == o.eos) return;
    emit(codec.decode(next[0], result.generated == 0));
    ++result.generated;
  };

  const auto t0 = std::chrono::steady_clock::now();
  ops::AutocastGuard autocast(place.autocast);
  const Tensor ids = Tensor::from_vector<int64_t>(prime, {1, static_cast<int64_t>(prime.size())});
  if (nn::LanguageModel* lm = task->language_model()) {
    lm->generate(ids.to(place.device), q.length, o);
  } else {
    const Codec source_codec{codec.kind, shape.vocab_size};
    src = source_codec.encode(q.source, "--source");
    FORGE_CHECK(!src.empty(), "generate: an encoder-decoder needs --source (the encoder's input)");
    const int64_t encoder_positions = std::max(shape.max_length, r.integer("model.max_len"));
    FORGE_CHECK(static_cast<int64_t>(src.size()) <= encoder_positions,
                "generate: --source has {} tokens, more than the encoder's {} positions",
                src.size(), encoder_positions);
    const Tensor s = Tensor::from_vector<int64_t>(src, {1, static_cast<int64_t>(src.size())});
    task->encoder_decoder()->generate(s.to(place.device), ids.to(place.device), q.length, o);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!q.logits_file.empty()) io::write_file_atomic(q.logits_file, lines);
  result.recurrent = stats.recurrent;
  result.rebuilds = stats.rebuilds;
  if (!stats.recurrent)
    result.why = q.exact_window ? "--exact-window"
                 : place.device.is_cuda()
                     ? "on a GPU the decoding state is off until its GPU test has run "
                       "(docs/GPU.md)"
                     : "a block of this model cannot decode a token at a time";
  return result;
}

std::string GenerateResult::how() const {
  if (!recurrent)
    return fmt::format("the last {} tokens recomputed for every token: {}", positions, why);
  if (rebuilds == 0) return "decoding state";
  return fmt::format(
      "decoding state, rebuilt {} time{} from the last {} tokens when the model's {} positions "
      "were full (--exact-window: the references' sliding window, slower)",
      rebuilds, rebuilds == 1 ? "" : "s", positions / 2, positions);
}

}  // namespace forge::train
