#include "autograd/reversible.h"

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/threading.h"

namespace forge::autograd {

namespace {

// a + sign * b for same-shaped tensors, unrecorded: the coupling's own
// arithmetic (autograd sits below ops). sign is +-1, so the product is exact
// and the result equals ops::add / ops::sub bit for bit.
Tensor add_signed(const Tensor& a, double sign, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  FORGE_DISPATCH_FLOAT(a.dtype(), "reversible_sequence", [&] {
    const scalar_t* x = a.data<scalar_t>();
    const scalar_t* y = b.data<scalar_t>();
    scalar_t* o = out.data<scalar_t>();
    const auto s = static_cast<scalar_t>(sign);
    parallel_for(a.numel(), 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) o[i] = x[i] + s * y[i];
    });
  });
  return out;
}

// fn(x, context), checked to be of x's shape and dtype so that it can be added to the other half.
Tensor apply(const CouplingFn& fn, const char* name, size_t block, const Tensor& x,
             const std::vector<Tensor>& context) {
  Tensor out = fn(x, context);
  FORGE_CHECK(out.defined() && out.shape() == x.shape() && out.dtype() == x.dtype(),
              "reversible_sequence: block {}'s {} returned {} {}, expected {} {} (its input's); "
              "f and g must keep the shape and dtype",
              block, name, out.defined() ? dtype_name(out.dtype()) : "an undefined tensor",
              out.defined() ? shape_str(out.shape()) : "", dtype_name(x.dtype()),
              shape_str(x.shape()));
  return out;
}

struct HalfBackward {
  Tensor x;           // the half's input, rebuilt from its output
  Tensor grad_other;  // d(loss)/d(fn's argument) through fn; undefined if fn ignores it
};

// In the forward this half was out = x + fn(other), fn drawing from `rng` at
// `start`. Rebuilds x = out - fn(other) and back-propagates grad_out through a
// replay of fn, which accumulates into fn's parameters and the context copies.
HalfBackward half_backward(const CouplingFn& fn, Generator& rng, GeneratorState start,
                           const Tensor& other, const Tensor& out, const Tensor& grad_out,
                           const std::vector<Tensor>& context) {
  Tensor z = other.detach().set_requires_grad(true);
  rng.set_state(start);
  Tensor fz;
  {
    GradModeGuard enable(true);
    fz = fn(z, context);
  }
  Tensor x = add_signed(out, -1, fz);
  if (fz.requires_grad()) backward({fz}, {grad_out});
  return {x, z.grad()};
}

}  // namespace

std::vector<Tensor> reversible_sequence(const std::vector<Coupling>& blocks, const Tensor& x1,
                                        const Tensor& x2, const std::vector<Tensor>& context,
                                        Generator* gen) {
  FORGE_CHECK(x1.shape() == x2.shape() && x1.dtype() == x2.dtype(),
              "reversible_sequence: x1 is {} {} but x2 is {} {}; split the input into two equal "
              "halves",
              dtype_name(x1.dtype()), shape_str(x1.shape()), dtype_name(x2.dtype()),
              shape_str(x2.shape()));
  Generator& rng = gen ? *gen : default_generator();

  // x1, x2, y1, y2 are (same shape). starts[2k] and starts[2k + 1]: the
  // generator before block k's f and before its g.
  std::vector<GeneratorState> starts;
  Tensor y1 = x1, y2 = x2;
  {
    NoGradGuard no_grad;
    for (size_t k = 0; k < blocks.size(); ++k) {
      starts.push_back(rng.state());
      y1 = add_signed(y1, 1, apply(blocks[k].f, "f", k, y2, context));
      starts.push_back(rng.state());
      y2 = add_signed(y2, 1, apply(blocks[k].g, "g", k, y1, context));
    }
  }
  std::vector<Tensor> outputs = {y1.detach(), y2.detach()};

  std::vector<Tensor> inputs = {x1, x2};
  inputs.insert(inputs.end(), context.begin(), context.end());
  for (const Coupling& b : blocks) inputs.insert(inputs.end(), b.params.begin(), b.params.end());
  if (!needs_grad(inputs)) return outputs;
  for (const Coupling& b : blocks) {
    for (const Tensor& p : b.params) {
      FORGE_CHECK(!p.defined() || p.is_leaf(),
                  "reversible_sequence: a declared parameter (shape {}) is the output of an op; "
                  "pass tensors computed with recording as context instead",
                  shape_str(p.shape()));
    }
  }

  // Saved: the final outputs, the context (detached, remembering which need a
  // gradient) and the generator positions; nothing from inside the blocks.
  std::vector<Tensor> saved_context;
  std::vector<bool> wants;
  for (const Tensor& c : context) {
    saved_context.push_back(c.defined() ? c.detach() : Tensor());
    wants.push_back(c.defined() && c.requires_grad());
  }
  const size_t n_params = inputs.size() - 2 - context.size();
  record("reversible_sequence", inputs, outputs,
         [blocks, &rng, starts, saved_y1 = y1.detach(), saved_y2 = y2.detach(), saved_context,
          wants, n_params](const std::vector<Tensor>& grads) {
           const GeneratorState now = rng.state();
           // Fresh leaves per backward, so a rerun (retain_graph) starts their sums at zero.
           std::vector<Tensor> ctx;
           for (size_t i = 0; i < saved_context.size(); ++i) {
             Tensor c = saved_context[i].defined() ? saved_context[i].detach() : Tensor();
             if (wants[i]) c.set_requires_grad(true);
             ctx.push_back(c);
           }
           // Walk the blocks from the last: (y1, y2) and their gradients (dy1, dy2)
           // start as the block's outputs and end as its inputs. The engine passes
           // zeros for an output the loss did not use.
           Tensor y1 = saved_y1, y2 = saved_y2, dy1 = grads[0], dy2 = grads[1];
           for (size_t k = blocks.size(); k-- > 0;) {
             // Forward: y2 = x2 + g(y1). Now x2 = y2 - g(y1), dy1 += dy2 g'(y1).
             HalfBackward gh = half_backward(blocks[k].g, rng, starts[2 * k + 1], y1, y2, dy2, ctx);
             y2 = gh.x;
             if (gh.grad_other.defined()) dy1 = accumulate(dy1, gh.grad_other);
             // Forward: y1 = x1 + f(x2). Now x1 = y1 - f(x2), dx2 = dy2 + dy1 f'(x2), dx1 = dy1.
             HalfBackward fh = half_backward(blocks[k].f, rng, starts[2 * k], y2, y1, dy1, ctx);
             y1 = fh.x;
             if (fh.grad_other.defined()) dy2 = accumulate(dy2, fh.grad_other);
           }
           rng.set_state(now);
           // Parameters got their gradients from the replays; their edges carry none.
           std::vector<Tensor> input_grads = {dy1, dy2};
           for (size_t i = 0; i < ctx.size(); ++i) {
             input_grads.push_back(wants[i] ? ctx[i].grad() : Tensor());
           }
           input_grads.resize(input_grads.size() + n_params);
           return input_grads;
         });
  return outputs;
}

}  // namespace forge::autograd
