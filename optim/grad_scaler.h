// Dynamic loss scaling for f16 training, with the semantics of PyTorch's
// torch.amp.GradScaler. Small f16 gradients underflow to zero; multiplying the
// loss by a large scale before backward keeps them representable, and the
// grads are divided by the same scale before the optimizer sees them. The
// scale adapts: an overflow (an inf or NaN grad) skips the step and halves it,
// and growth_interval finite steps in a row double it.
//
// One training step, in this order (clipping needs the true, unscaled grads):
//   backward(scaler.scale(loss));        grads are `scale` times too large
//   scaler.unscale(optimizer);           grads / scale; non-finite grads noted
//   clip_grad_norm(params, max_norm);    optional (optim/clip.h)
//   scaler.step(optimizer);              optimizer.step() unless non-finite
//   scaler.update();                     backoff or growth of the scale
//   optimizer.zero_grad();
// unscale may be left out: step unscales when it has not been done. With
// several optimizers, each is unscaled and stepped, then update() is called
// once; any overflow among them backs the scale off.
//
// Unscaling replaces each grad by a new tensor (grad * (1 / scale), 1 / scale
// rounded to the grad's dtype, as PyTorch's f32 inv_scale; exact while the scale
// is a power of two) through set_grad, never writing a grad in place, as
// clip_grad_norm does. GPU grads are unscaled on their device with the
// non-finite check there, and one flag per device is read back. CPU grads must
// be f32 or f64; GPU grads may also be bf16 or f16.
//
// A disabled scaler is a pass-through: scale returns the loss, unscale does
// nothing, step always steps, update does nothing and get_scale is 1.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace forge::optim {

struct GradScalerOptions {
  double init_scale = 65536;       // finite, > 0
  double growth_factor = 2;        // finite, > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // > 0: finite steps in a row before growth
  bool enabled = true;
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  bool enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  // loss * scale, recorded by autograd (a differentiable multiply). The loss
  // should be f32: the scale (65536 at first) overflows f16.
  Tensor scale(const Tensor& loss) const;

  // Divides every grad of the optimizer's parameters by the scale; returns
  // whether all of them are finite (checked before and after the division).
  // Once per optimizer between update() calls, and before its step().
  bool unscale(Optimizer& optimizer);

  // Unscales if unscale(optimizer) was not called since the last update();
  // then calls optimizer.step() and returns true, or, when a grad was not
  // finite, skips the step and returns false. Once per optimizer between
  // update() calls.
  bool step(Optimizer& optimizer);

  // After the steps of an iteration: on an overflow the scale is multiplied by
  // backoff_factor and the growth count restarts; otherwise the count grows
  // and, reaching growth_interval, the scale is multiplied by growth_factor
  // (unless that would not be finite) and the count restarts. Needs an
  // unscale() or step() since the last update().
  void update();

  double get_scale() const { return options_.enabled ? scale_ : 1.0; }
  int64_t growth_tracker() const { return growth_tracker_; }  // finite steps in a row

  // For checkpoints: {"scale", "growth_tracker"}. set_state is strict: both
  // keys and no other, a finite scale > 0 and a whole growth_tracker in
  // [0, growth_interval); any problem throws a forge::Error naming all of
  // them, and nothing changes.
  std::map<std::string, double> state() const;
  void set_state(const std::map<std::string, double>& state);

 private:
  enum class Stage { ready, unscaled, stepped };
  struct OptimizerState {
    Stage stage = Stage::ready;
    bool found_inf = false;
  };

  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  // Per optimizer (keyed by address, never dereferenced) since the last update().
  std::map<const Optimizer*, OptimizerState> optimizers_;
};

}  // namespace forge::optim
