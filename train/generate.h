// Generation from a checkpoint of a language model or an encoder-decoder (a
// recipe whose data.dataset is lm_text, copy or seq2seq_tsv), as the command
// `attnforge generate` runs it.
//
// Tokens and text, by data source:
//   lm_text      prompt and output are bytes (token = byte)
//   seq2seq_tsv  source and prompt are bytes (token = byte + 3); the decoder
//                starts with the start token 1 and, unless told otherwise, stops
//                at the end token 2
//   copy         source and prompt are token ids written as integers separated
//                by spaces; the decoder starts with the start token 1
// One sequence is generated (batch 1); the model's decoding state makes each
// token O(1) for the causal linear mechanisms, a KV cache for softmax and local
// heads (nn::LanguageModel::generate). Past the model's positions
// (model.max_len) the state is rebuilt from the last half of them, so a long
// generation runs at the speed of a short one; exact_window instead recomputes
// the last max_len tokens for every token, as the references' generate loops do.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace forge::train {

struct GenerateRequest {
  std::string checkpoint;              // a checkpoint directory, or a run directory (its latest)
  std::vector<std::string> overrides;  // KEY=VALUE recipe overrides (device, threads, ...)
  std::string prompt;    // the language model's prime; after the start token for a decoder
  std::string source;    // encoder-decoder: the encoder's input
  int64_t length = 256;  // new tokens at most
  double temperature = 1.0;
  int64_t top_k = 0;        // 0: every token
  double filter_thres = 0;  // > 0: keep the top (1 - thres) fraction (performer's top_k)
  bool greedy = false;      // argmax instead of sampling
  int64_t eos = -2;         // -2: the data's end token (seq2seq_tsv: 2; else none); -1: none
  uint64_t seed = 0;        // of the sampling draws
  bool exact_window = false;  // the references' sliding window, recomputed per token
  // When set, a JSON line per draw is written here at the end: {"source": the
  // encoder's tokens (encoder-decoders), "context": the tokens before the draw
  // (prime included), "logits": the V logits drawn from (before temperature
  // and filtering), "next": the token drawn}. An existing file is refused
  // unless overwrite.
  std::string logits_file;
  bool overwrite = false;
};

struct GenerateResult {
  std::string checkpoint;  // the directory read
  int64_t prompt_tokens = 0, generated = 0;
  double seconds = 0;  // generation alone (the model built and loaded before)
  // Whether the model's decoding state was used, and how often it was rebuilt
  // past its `positions`; without it each token re-runs the model over the
  // last `positions` tokens, and `why` says why.
  bool recurrent = true;
  int64_t rebuilds = 0;
  int64_t positions = 0;
  std::string why;
  // How the tokens were made, for the summary line.
  std::string how() const;
};

// Loads the checkpoint, encodes the prompt (and source), and generates,
// passing each new token's text to `emit` as soon as it is drawn (the end
// token is not emitted). Errors name the checkpoint, or the bad prompt.
GenerateResult generate(const GenerateRequest& request,
                        const std::function<void(std::string_view)>& emit);

}  // namespace forge::train
