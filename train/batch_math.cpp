// What a batch is scored on (see batch_math.h).
#include "train/batch_math.h"

#include <vector>

#include "core/error.h"
#include "ops/ops.h"

namespace forge::train {

namespace {

Tensor to_dtype(const Tensor& t, DType dtype) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != dtype ? t.to(dtype) : t;
}

}  // namespace

int64_t count_correct(const Tensor& logits_any_device, const Tensor& labels_any_device) {
  const Tensor logits = logits_any_device.to(Device::cpu());
  const Tensor labels = labels_any_device.to(Device::cpu());
  const int64_t B = logits.size(0), C = logits.size(1);
  const int64_t* y = labels.data<int64_t>();
  int64_t correct = 0;
  FORGE_DISPATCH_FLOAT(logits.dtype(), "count_correct", [&] {
    const scalar_t* p = logits.data<scalar_t>();
    for (int64_t b = 0; b < B; ++b) {
      int64_t best = 0;
      for (int64_t c = 1; c < C; ++c)
        if (p[b * C + c] > p[b * C + best]) best = c;
      correct += best == y[b];
    }
  });
  return correct;
}

data::Batch cast_batch(data::Batch b, DType dtype, Uploader& uploader) {
  b.input = to_dtype(b.input, dtype);
  for (Tensor* t : {&b.input, &b.mask, &b.input2, &b.mask2, &b.target, &b.label, &b.label_mix})
    if (t->defined()) *t = uploader.upload(*t);
  return b;
}

Predictions predictions(const Tensor& out, const data::Batch& b) {
  if (!b.target.defined()) return {out, b.label, b.label_mix, b.mix_lambda};
  Tensor logits = ops::reshape(out, {-1, out.size(-1)});  // (B N, V)
  Tensor labels = ops::reshape(b.target, {-1});           // (B N)
  if (!(b.input2.defined() ? b.padded2 : b.padded)) return {logits, labels, Tensor(), 1.0};
  const Tensor mask = (b.input2.defined() ? b.mask2 : b.mask).to(Device::cpu());
  const bool* m = mask.data<bool>();
  std::vector<int64_t> real;
  for (int64_t i = 0; i < mask.numel(); ++i)
    if (m[i]) real.push_back(i);
  const Tensor index =
      Tensor::from_vector(real, {static_cast<int64_t>(real.size())}).to(out.device());
  return {ops::index_select(logits, 0, index), ops::index_select(labels, 0, index), Tensor(), 1.0};
}

Tensor batch_loss(const Predictions& p, double smoothing) {
  ops::CrossEntropyOptions o;
  o.label_smoothing = smoothing;
  Tensor loss = ops::cross_entropy(p.logits, p.labels, o);
  if (p.labels_mix.defined())
    loss = ops::add(ops::mul(loss, p.mix_lambda),
                    ops::mul(ops::cross_entropy(p.logits, p.labels_mix, o), 1.0 - p.mix_lambda));
  return loss;
}

}  // namespace forge::train
