// An exponential moving average of a model's weights, as timm's ModelEmaV3.
// It holds a copy of every parameter and buffer of the model; update() moves
// each parameter copy towards the model's, ema = lerp(ema, model, 1 - d), i.e.
// ema * d + model * (1 - d), with d = decay(step). Buffers are copied from
// the model at each update, not averaged (timm's exclude_buffers): ours are
// state such as a Performer's random projection, which an average would turn
// into a matrix the model never used.
//
// The arithmetic runs in each parameter's dtype on its device (plain ops,
// outside autograd), so a GPU model's average stays on the GPU; build the EMA
// after moving the model (as an optimizer). Tied tensors are kept once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"

namespace forge::optim {

struct EmaOptions {
  double decay = 0.9998;  // the decay once warmed up, in [0, 1]
  double min_decay = 0;   // warmup's floor
  // Warmup (crowsonkb's, via timm): d = 1 - (1 + s / warmup_gamma)^-warmup_power,
  // clamped to [min_decay, decay]. gamma 1, power 2/3 reaches 0.999 at 31.6k
  // updates; power 3/4 at 10k.
  bool warmup = false;
  double warmup_gamma = 1;
  double warmup_power = 2.0 / 3.0;
  int64_t update_after_step = 0;  // updates up to this step copy the model
};

class ModelEma {
 public:
  // Starts as a copy of the model's current values.
  explicit ModelEma(const nn::Module& model, const EmaOptions& options = {});

  // timm's get_decay: s = max(0, step - update_after_step - 1); 0 (a plain copy)
  // when s = 0; with warmup the clamped warmup curve at s; otherwise `decay`.
  double decay(int64_t step) const;
  // Parameters: ema = lerp(ema, model, 1 - decay(step)); buffers: copied. The
  // model must have this EMA's names, shapes and dtypes (else a forge::Error).
  void update(const nn::Module& model, int64_t step);

  // Every name of the model's state_dict (tied tensors under each name), as
  // CPU copies.
  std::map<std::string, Tensor> state_dict() const;
  // Strict: a missing, unexpected or wrongly shaped / typed entry throws a
  // forge::Error listing all of them, and nothing changes.
  void load_state_dict(const std::map<std::string, Tensor>& state);

  // Exchanges the model's values with the EMA's, in place: evaluate with the
  // average between two calls (the second puts the model's own values back).
  // Leave the optimizer alone while swapped: it would step the average.
  void swap_into(nn::Module& model);

  const EmaOptions& options() const { return options_; }

 private:
  struct Entry {
    std::string name;  // the model's first name for the tensor
    bool average;      // a parameter (else a buffer, copied)
    Tensor value;      // on the model's device, in its dtype
  };
  // For each of this EMA's entries, the model's tensor under the entry's name,
  // after checking the model's names, shapes and dtypes against the EMA's.
  std::vector<Tensor> model_tensors(const nn::Module& model, const char* where) const;

  EmaOptions options_;
  std::vector<Entry> entries_;           // one per distinct tensor
  std::map<std::string, size_t> index_;  // every state_dict name -> its entry
};

}  // namespace forge::optim
