// MultiHeadAttention and ProjectionBank (see attention.h). The attention itself
// is one fused op per group of heads (ops/attention); this file projects,
// groups heads (the local and the global ones, in head order; or one head at a
// time under C2 checkpointing), and merges. Recurrent decoding lives in
// attention_step.cpp.
#include "nn/attention.h"

#include <cmath>
#include <limits>

#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace forge::nn {

namespace att = ops::attention;

int64_t resolve_head_dim(int64_t dim, int64_t heads, int64_t head_dim, const std::string& dim_name,
                         const std::string& heads_name, const std::string& head_dim_name) {
  if (head_dim > 0) return head_dim;
  FORGE_CHECK(heads > 0 && dim % heads == 0,
              "{} = {} is not divisible by {} = {}; change one of them or set {} (0: {} / {})",
              dim_name, dim, heads_name, heads, head_dim_name, dim_name, heads_name);
  return dim / heads;
}

void AttentionConfig::validate(const std::string& where) const {
  FORGE_CHECK(dim > 0, "{}.dim must be > 0, got {}", where, dim);
  FORGE_CHECK(heads > 0, "{}.heads must be > 0, got {}", where, heads);
  FORGE_CHECK(head_dim >= 0, "{}.head_dim must be >= 0 (0: dim / heads), got {}", where, head_dim);
  resolve_head_dim(dim, heads, head_dim, where + ".dim", where + ".heads", where + ".head_dim");
  FORGE_CHECK(n_local_heads >= 0 && n_local_heads <= heads,
              "{}.n_local_heads must be in [0, heads = {}], got {}", where, heads, n_local_heads);
  FORGE_CHECK(local_window >= 1, "{}.local_window must be >= 1, got {}", where, local_window);
  FORGE_CHECK(!local_rotary || n_local_heads == 0 || resolved_head_dim() % 2 == 0,
              "{}.local_rotary turns pairs of features, so the head dim must be even, got {}",
              where, resolved_head_dim());
  for (auto [name, p] :
       {std::pair{"attn_dropout", attn_dropout}, {"output_dropout", output_dropout}})
    FORGE_CHECK(p >= 0 && p < 1, "{}.{} must be in [0, 1), got {}", where, name, p);
  FORGE_CHECK(dtype == DType::f32 || dtype == DType::f64, "{}.dtype must be f32 or f64, got {}",
              where, dtype_name(dtype));
  if (n_local_heads == heads) return;  // no global head: the global mechanism is unused
  switch (kind) {
    case Mechanism::efficient:
      FORGE_CHECK(bucket_size >= 1, "{}.bucket_size must be >= 1, got {}", where, bucket_size);
      break;
    case Mechanism::taylor_linear:
    case Mechanism::linformer:
      FORGE_CHECK(!causal,
                  "{}: {} has no causal form; use softmax, local, efficient, linear or favor",
                  where, mechanism_name(kind));
      if (kind == Mechanism::linformer) {
        FORGE_CHECK(seq_len > 0, "{}.seq_len (the maximum length E/F project from) must be > 0",
                    where);
        FORGE_CHECK(k > 0, "{}.k must be > 0, got {}", where, k);
      }
      break;
    case Mechanism::favor:
      FORGE_CHECK(nb_features >= 0, "{}.nb_features must be >= 0 (0: d ln d), got {}", where,
                  nb_features);
      FORGE_CHECK(favor_scaling == 0 || favor_scaling == 1,
                  "{}.favor_scaling must be 0 or 1, got {}", where, favor_scaling);
      FORGE_CHECK(feature_redraw_interval >= 0,
                  "{}.feature_redraw_interval must be >= 0 (0: never), got {}", where,
                  feature_redraw_interval);
      break;
    case Mechanism::taylorshift:
      FORGE_CHECK(!causal,
                  "{}: taylorshift has no causal form; use softmax, local, efficient, "
                  "linear or favor",
                  where);
      FORGE_CHECK(ts_a > 0 && ts_c >= ts_b * ts_b / (4 * ts_a),
                  "{}: taylorshift needs a > 0 and c >= b^2 / (4a), got a {} b {} c {}", where,
                  ts_a, ts_b, ts_c);
      FORGE_CHECK(n0 >= -1, "{}.n0 must be -1, 0 or a length, got {}", where, n0);
      break;
    default:
      break;
  }
}

// ---- ProjectionBank ----

ProjectionBank::ProjectionBank(LinformerSharing s, int64_t L, int64_t H, int64_t n, int64_t kk,
                               int64_t reduce, DType dtype, Generator* gen)
    : sharing(s), layers(L), heads(H), seq_len(n), k(kk), k_reduce_by_layer(reduce) {
  FORGE_CHECK(L > 0 && H > 0 && n > 0 && kk > 0,
              "ProjectionBank: layers, heads, seq_len and k must be > 0, got {} {} {} {}", L, H, n,
              kk);
  FORGE_CHECK(reduce >= 0, "ProjectionBank: k_reduce_by_layer must be >= 0, got {}", reduce);
  FORGE_CHECK(s != LinformerSharing::layerwise || reduce == 0,
              "ProjectionBank: layerwise sharing uses one matrix for every layer, so "
              "k_reduce_by_layer must be 0 (got {})",
              reduce);
  const int64_t count = s == LinformerSharing::none       ? 2 * L * H
                        : s == LinformerSharing::headwise ? 2 * L
                        : s == LinformerSharing::kv       ? L
                                                          : 1;
  for (int64_t i = 0; i < count; ++i) {
    // Matrix i belongs to layer i / (count / L) (layerwise: layer 0).
    const int64_t layer = s == LinformerSharing::layerwise ? 0 : i / (count / L);
    auto lin = std::make_shared<Linear>(n, k_of_layer(layer), true, dtype, gen);
    init::xavier_normal_(lin->weight, 1.0, gen);
    projections_.push_back(register_module(std::to_string(i), lin));
  }
}

int64_t ProjectionBank::k_of_layer(int64_t layer) const {
  return std::max<int64_t>(k - layer * k_reduce_by_layer, 1);
}

int64_t ProjectionBank::index(int64_t layer, int64_t head, bool is_f) const {
  FORGE_CHECK(layer >= 0 && layer < layers && head >= 0 && head < heads,
              "ProjectionBank: (layer {}, head {}) outside {} layers x {} heads", layer, head,
              layers, heads);
  switch (sharing) {
    case LinformerSharing::none:
      return (layer * heads + head) * 2 + is_f;
    case LinformerSharing::headwise:
      return layer * 2 + is_f;
    case LinformerSharing::kv:
      return layer;
    case LinformerSharing::layerwise:
      return 0;
  }
  return 0;
}

Linear& ProjectionBank::E(int64_t layer, int64_t head) {
  return *projections_[static_cast<size_t>(index(layer, head, false))];
}
Linear& ProjectionBank::F(int64_t layer, int64_t head) {
  return *projections_[static_cast<size_t>(index(layer, head, true))];
}

// ---- MultiHeadAttention ----

MultiHeadAttention::MultiHeadAttention(const AttentionConfig& c, bool is_cross, int64_t context_dim,
                                       std::shared_ptr<ProjectionBank> bank, int64_t layer_index,
                                       Generator* gen)
    : config(c), cross(is_cross), layer(layer_index), bank_(std::move(bank)) {
  config.validate(is_cross ? "cross-attention" : "attention");
  FORGE_CHECK(!is_cross || !config.causal,
              "MultiHeadAttention: cross-attention cannot be causal (queries and context have "
              "different positions)");
  FORGE_CHECK(!is_cross || config.n_local_heads == 0,
              "MultiHeadAttention: local heads need self-attention (n_local_heads = {})",
              config.n_local_heads);
  const int64_t D = config.dim, H = config.heads, d = config.resolved_head_dim();
  const int64_t Dc = context_dim > 0 ? context_dim : D;
  const int64_t global = H - config.n_local_heads;
  to_q = register_module("to_q",
                         std::make_shared<Linear>(D, H * d, config.qkv_bias, config.dtype, gen));
  to_k = register_module("to_k",
                         std::make_shared<Linear>(Dc, H * d, config.qkv_bias, config.dtype, gen));
  to_v = register_module("to_v",
                         std::make_shared<Linear>(Dc, H * d, config.qkv_bias, config.dtype, gen));
  to_out = register_module("to_out",
                           std::make_shared<Linear>(H * d, D, config.out_bias, config.dtype, gen));
  out_dropout = register_module("dropout", std::make_shared<Dropout>(config.output_dropout));
  if (global == 0) return;
  if (config.kind == Mechanism::linformer) {
    FORGE_CHECK(bank_ != nullptr,
                "MultiHeadAttention: linformer needs a ProjectionBank (built by the Stack)");
    FORGE_CHECK(bank_->seq_len == config.seq_len,
                "MultiHeadAttention: the ProjectionBank projects from {} positions but "
                "attention.seq_len is {}",
                bank_->seq_len, config.seq_len);
  }
  if (config.kind == Mechanism::taylorshift) {
    tau = Tensor::ones({global}, config.dtype);
    register_parameter("tau", tau);
  }
  if (config.kind == Mechanism::favor && config.favor_kernel != att::FavorKernel::no_projection) {
    const int64_t m = config.nb_features > 0
                          ? config.nb_features
                          : static_cast<int64_t>(static_cast<double>(d) * std::log(double(d)));
    projection_matrix = att::gaussian_orthogonal_random_matrix(
        std::max<int64_t>(m, 1), d, config.favor_scaling, config.dtype, gen);
    register_buffer("projection_matrix", projection_matrix);
    calls_since_last_redraw = Tensor::zeros({1}, DType::i64);
    register_buffer("calls_since_last_redraw", calls_since_last_redraw);
  }
}

void MultiHeadAttention::redraw_projection() {
  if (!projection_matrix.defined()) return;
  Tensor fresh = att::gaussian_orthogonal_random_matrix(
      projection_matrix.size(0), projection_matrix.size(1), config.favor_scaling,
      projection_matrix.dtype(), generator());
  projection_matrix.copy_from(fresh);  // in place: the state dict keeps pointing at it
}

void MultiHeadAttention::tick_redraw() {
  if (!projection_matrix.defined() || !is_training() || projections_fixed_ ||
      config.feature_redraw_interval == 0)
    return;
  // The counter is a buffer (it travels in checkpoints) and may sit on a GPU.
  const auto calls = calls_since_last_redraw.item<int64_t>();
  if (calls >= config.feature_redraw_interval) {
    redraw_projection();
    calls_since_last_redraw.fill(0);
    return;
  }
  calls_since_last_redraw.fill(static_cast<double>(calls + 1));
}

MultiHeadAttention::Projected MultiHeadAttention::project(const Tensor& x, const Tensor& mask,
                                                          const Tensor& context,
                                                          const Tensor& context_mask,
                                                          int64_t offset, int64_t h0, int64_t h1) {
  FORGE_CHECK(x.dim() == 3 && x.size(2) == config.dim,
              "MultiHeadAttention: expected x (B, N, {}), got {}", config.dim,
              shape_str(x.shape()));
  FORGE_CHECK(!cross || context.defined(),
              "MultiHeadAttention: cross-attention needs a context (B, M, Dc)");
  FORGE_CHECK(cross || !context.defined(), "MultiHeadAttention: self-attention takes no context");
  const Tensor& src = cross ? context : x;
  FORGE_CHECK(src.dim() == 3 && src.size(0) == x.size(0) && src.size(2) == to_k->in_features,
              "MultiHeadAttention: expected context (B = {}, M, {}), got {}", x.size(0),
              to_k->in_features, shape_str(src.shape()));
  const int64_t d = config.resolved_head_dim(), Hg = h1 - h0;
  // The heads [h0, h1) are rows [h0 d, h1 d) of the fused projections.
  auto heads_of = [&](const Linear& lin, const Tensor& in) {
    const bool all = h0 == 0 && h1 == config.heads;
    Tensor w = all ? lin.weight : ops::narrow(lin.weight, 0, h0 * d, Hg * d);
    Tensor b = !lin.bias.defined() ? Tensor()
               : all               ? lin.bias
                                   : ops::narrow(lin.bias, 0, h0 * d, Hg * d);
    Tensor t = ops::linear(in, w, b);                      // (B, n, Hg d)
    t = ops::reshape(t, {in.size(0), in.size(1), Hg, d});  // (B, n, Hg, d)
    return ops::transpose(t, 1, 2);                        // (B, Hg, n, d)
  };
  Projected p{heads_of(*to_q, x), heads_of(*to_k, src), heads_of(*to_v, src),
              cross ? context_mask : mask};
  if (config.local_rotary && is_local(h0)) {
    p.q = rotate_half_split(p.q, offset + config.resolved_look_forward() * config.local_window);
    p.k = rotate_half_split(p.k, offset);
  } else if (rotary_ && !cross) {
    p.q = rotary_->rotate(p.q, offset);
    p.k = rotary_->rotate(p.k, offset);
  }
  return p;
}

Tensor MultiHeadAttention::attend(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& key_mask, int64_t h0, int64_t h1) {
  const AttentionConfig& c = config;
  const double p_attn = is_training() ? c.attn_dropout : 0.0;
  Generator* gen = generator();
  const att::LocalOptions local{.window = c.local_window,
                                .look_backward = c.local_look_backward,
                                .look_forward = c.local_look_forward,
                                .causal = c.causal,
                                .dropout = p_attn,
                                .gen = gen};
  if (is_local(h0)) return att::local(q, k, v, key_mask, local);
  switch (c.kind) {
    case Mechanism::softmax:
      return att::softmax(q, k, v, key_mask,
                          {.scale = c.scale, .causal = c.causal, .dropout = p_attn, .gen = gen});
    case Mechanism::local:
      return att::local(q, k, v, key_mask, local);
    case Mechanism::efficient: {
      const int64_t N = q.size(2), s = c.bucket_size;
      if (!c.causal || N % s == 0)
        return att::efficient(q, k, v, key_mask, {.causal = c.causal, .bucket_size = s});
      // Causal with a ragged end: pad to whole buckets with masked positions at
      // the end (they come after every real query, so nothing real sees them).
      const int64_t pad = s - N % s;
      const Tensor real = key_mask.defined() ? key_mask.to(DType::u8)
                                             : Tensor::ones({q.size(0), N}, DType::u8, q.device());
      Tensor padded_mask = ops::pad(real, {0, pad});
      Tensor o = att::efficient(ops::pad(q, {0, 0, 0, pad}), ops::pad(k, {0, 0, 0, pad}),
                                ops::pad(v, {0, 0, 0, pad}), padded_mask,
                                {.causal = true, .bucket_size = s});
      return ops::narrow(o, 2, 0, N);
    }
    case Mechanism::linear:
      return att::linear(q, k, v, key_mask, {.causal = c.causal, .eps = c.linear_eps});
    case Mechanism::taylor_linear:
      return att::taylor_linear(q, k, v, key_mask);
    case Mechanism::linformer: {
      // One call per group of heads that share E and F.
      const bool per_head = bank_->sharing == LinformerSharing::none;
      std::vector<Tensor> outs;
      for (int64_t h = h0; h < h1; h += per_head ? 1 : h1 - h0) {
        const int64_t n = per_head ? 1 : h1 - h0;
        Linear& E = bank_->E(layer, h);
        Linear& F = bank_->F(layer, h);
        auto part = [&](const Tensor& t) {
          return n == h1 - h0 ? t : ops::narrow(t, 1, h - h0, n);
        };
        outs.push_back(att::linformer(part(q), part(k), part(v), E.weight, F.weight, E.bias, F.bias,
                                      key_mask, {.dropout = p_attn, .gen = gen}));
      }
      return outs.size() == 1 ? outs[0] : ops::cat(outs, 1);
    }
    case Mechanism::favor:
      return att::favor(
          q, k, v, projection_matrix, key_mask,
          {.kernel = c.favor_kernel, .causal = c.causal, .stabilizer = c.favor_stabilizer});
    case Mechanism::taylorshift: {
      const int64_t g0 = c.global_begin();
      Tensor t = h1 - h0 == tau.size(0) ? tau : ops::narrow(tau, 0, h0 - g0, h1 - h0);
      return att::taylorshift(q, k, v, t, key_mask,
                              {.a = c.ts_a,
                               .b = c.ts_b,
                               .c = c.ts_c,
                               .n0 = c.n0,
                               .output_normalized = c.output_normalized});
    }
  }
  FORGE_FAIL("MultiHeadAttention: unhandled mechanism");
}

Tensor MultiHeadAttention::merge(const Tensor& o) {
  // (B, H, N, d) -> (B, N, H d) -> (B, N, D)
  Tensor t = ops::transpose(o, 1, 2);
  t = ops::reshape(t, {t.size(0), t.size(1), -1});
  return out_dropout->forward(to_out->forward(t));
}

Tensor MultiHeadAttention::forward(const Tensor& x, const Tensor& mask, const Tensor& context,
                                   const Tensor& context_mask) {
  if (capture_maps && has_attention_maps())
    captured_maps = attention_maps(x, mask, context, context_mask);
  // Head groups of one mechanism each, in head order (the local heads first or
  // last); under C2 one head per group, each group checkpointed on its own.
  std::vector<std::pair<int64_t, int64_t>> groups;
  const int64_t nl = config.n_local_heads, H = config.heads, l0 = config.local_begin();
  // Attention dropout draws by element index within one op call, so heads are
  // always called one at a time when it is on: then C2's per-head calls draw
  // exactly the masks of C0 and C1.
  const bool per_head = checkpoint_heads_ && autograd::grad_enabled();
  const bool dropout = is_training() && config.attn_dropout > 0;
  if (per_head || dropout) {
    for (int64_t h = 0; h < H; ++h) groups.emplace_back(h, h + 1);
  } else {
    if (l0 > 0) groups.emplace_back(0, l0);  // global heads before the local ones
    if (nl > 0) groups.emplace_back(l0, l0 + nl);
    if (l0 + nl < H) groups.emplace_back(l0 + nl, H);
  }
  const std::vector<Tensor> params = per_head ? parameters() : std::vector<Tensor>{};
  std::vector<Tensor> outs;
  for (auto [h0, h1] : groups) {
    // By value: under checkpointing this runs again during backward.
    auto group = [this, mask, context_mask, h0 = h0,
                  h1 = h1](const std::vector<Tensor>& in) -> std::vector<Tensor> {
      Projected p = project(in[0], mask, in.size() > 1 ? in[1] : Tensor(), context_mask, 0, h0, h1);
      return {attend(p.q, p.k, p.v, p.key_mask, h0, h1)};
    };
    // The head's projections and attention are recomputed in backward; only x
    // (and the context) are kept, and one head's intermediates exist at a time.
    const std::vector<Tensor> in = context.defined() ? std::vector{x, context} : std::vector{x};
    outs.push_back(per_head ? autograd::checkpoint(group, in, generator(), params)[0]
                            : group(in)[0]);
  }
  return merge(outs.size() == 1 ? outs[0] : ops::cat(outs, 1));
}

bool MultiHeadAttention::has_attention_maps() const {
  return config.n_local_heads == config.heads || config.kind == Mechanism::softmax ||
         config.kind == Mechanism::local || config.kind == Mechanism::linformer ||
         config.kind == Mechanism::taylorshift;
}

Tensor MultiHeadAttention::attention_maps(const Tensor& x, const Tensor& mask,
                                          const Tensor& context, const Tensor& context_mask) {
  FORGE_CHECK(has_attention_maps(),
              "MultiHeadAttention: {} has no explicit attention map (maps exist for softmax, "
              "local, linformer and taylorshift heads)",
              mechanism_name(config.kind));
  NoGradGuard no_grad;
  const AttentionConfig& c = config;
  const int64_t H = c.heads, nl = c.n_local_heads, d = c.resolved_head_dim();
  const Tensor& key_mask = cross ? context_mask : mask;
  const int64_t B = x.size(0), N = x.size(1), M = cross ? context.size(1) : N;
  // blocked[b, i, j] (B, 1, N, M): a padded key, a later key (causal), or for
  // local heads a key outside the band of windows.
  auto blocked = [&](bool band) {
    std::vector<uint8_t> a(static_cast<size_t>(B * N * M));
    const Tensor km = key_mask.defined() ? key_mask.to(Device::cpu()).to(DType::u8) : Tensor();
    const int64_t w = c.local_window, lb = c.local_look_backward, lf = c.resolved_look_forward();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < M; ++j) {
          bool ok = !km.defined() || km.data<uint8_t>()[b * M + j];
          if (c.causal && j > i) ok = false;
          // local: the band of windows, and padded queries see nothing (their row is 0)
          if (band && (j / w < i / w - lb || j / w > i / w + lf)) ok = false;
          if (band && km.defined() && !km.data<uint8_t>()[b * M + i]) ok = false;
          a[static_cast<size_t>((b * N + i) * M + j)] = !ok;
        }
    return Tensor::from_vector(a, {B, 1, N, M}).to(x.device());
  };
  // The two masks every head uses, built once (local heads: band; others: global).
  const Tensor off_band = nl > 0 || c.kind == Mechanism::local ? blocked(true) : Tensor();
  const Tensor off_global = nl < H && c.kind != Mechanism::linformer ? blocked(false) : Tensor();
  std::vector<Tensor> maps;
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(d));
  for (int64_t h = 0; h < H; ++h) {
    const Projected p = project(x, mask, context, context_mask, 0, h, h + 1);
    const Tensor &q = p.q, &k = p.k;  // (B, 1, N|M, d)
    const Mechanism kind = is_local(h) ? Mechanism::local : c.kind;
    if (kind == Mechanism::linformer) {
      // K = E k + bE over the first M columns of E (B, 1, k, d); P = softmax(q K^T / sqrt d).
      Linear& E = bank_->E(layer, h);
      Tensor kz =
          key_mask.defined() ? ops::mul(k, ops::reshape(key_mask.to(k.dtype()), {B, 1, M, 1})) : k;
      Tensor K = ops::matmul(ops::narrow(E.weight, 1, 0, M), kz) + ops::reshape(E.bias, {-1, 1});
      maps.push_back(ops::softmax(ops::matmul(q, K, false, true) * (1.0 / std::sqrt(double(d)))));
      continue;
    }
    const Tensor& off = kind == Mechanism::local ? off_band : off_global;
    if (kind == Mechanism::taylorshift) {
      // T = a A^2 + b A + c with A = tau q^ k^T on unit rows; P = T / rowsum over real keys.
      auto unit = [](const Tensor& t) {
        return t / ops::sqrt(ops::sum(ops::square(t), {-1}, true));
      };
      Tensor A =
          ops::matmul(unit(q) * ops::narrow(tau, 0, h - c.global_begin(), 1), unit(k), false, true);
      Tensor T = ops::masked_fill(c.ts_a * ops::square(A) + c.ts_b * A + c.ts_c, off, 0.0);
      maps.push_back(T / ops::sum(T, {-1}, true));
      continue;
    }
    Tensor S = ops::masked_fill(ops::matmul(q, k, false, true) * scale, off,
                                -std::numeric_limits<double>::infinity());
    maps.push_back(ops::masked_fill(ops::softmax(S), off, 0.0));  // fully masked rows: 0
  }
  return ops::cat(maps, 1);
}

}  // namespace forge::nn
