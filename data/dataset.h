// Dataset: what every data source implements, and the Example it returns.
//
// Shapes: an image example is f32 [C, H, W] (already transformed); a sequence
// example is i64 [N] token ids (N may differ between examples; the loader pads).
// Language models and encoder-decoders also give next-token targets: a
// language model's target pairs with `input` (target[t] follows input[t]), an
// encoder-decoder's with `input2`, the decoder input (input is the source).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/random.h"

namespace forge::data {

struct Example {
  Tensor input;       // f32 [C, H, W] image, or i64 [N] tokens
  Tensor input2;      // retrieval: the second document's tokens i64 [N2]; seq2seq: the
                      // decoder input i64 [N2]; undefined otherwise
  int64_t label = 0;  // class id in [0, num_classes)
  Tensor target{};    // next-token targets, i64 [N] (LM, with input) or [N2] (seq2seq, with
                      // input2); undefined for classification
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example i (0 <= i < size()). Called from several loader threads at once,
  // so it must not mutate shared state. Random augmentation draws only from
  // `rng`, which the loader seeds from (run seed, epoch, i): the result does
  // not depend on the number of workers or on the order of calls. `rng` is
  // null when the caller wants the deterministic (evaluation) view.
  virtual Example get(int64_t i, Rng* rng) const = 0;
  virtual int64_t num_classes() const = 0;
  // The classes' names by id, for people and for checkpoints' model cards;
  // empty when the source has none (its classes are plain numbers).
  virtual std::vector<std::string> class_names() const { return {}; }
  // One line for logs: "Fashion-MNIST train: 60000 images 1x28x28 from /usr/share/...".
  virtual std::string describe() const = 0;
};

using DatasetPtr = std::shared_ptr<const Dataset>;

}  // namespace forge::data
