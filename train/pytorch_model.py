"""An attnforge model in plain PyTorch, exported by `attnforge export CKPT --format pytorch`.

Needs torch only (no attnforge, no safetensors package). In the export directory:

    import model
    m = model.load(".")          # config.json + model.safetensors -> torch.nn.Module, eval mode
    logits = m(x)                # vit: x [B, C, H, W] float, prepared as config["card"]["input"] says
                                 # sequence_classifier: x [B, N] int64 tokens (0 pads), mask [B, N] bool

The modules and their parameter names mirror attnforge's (nn/models.cpp,
nn/transformer.cpp, nn/attention.cpp); every attention mechanism is written
from attnforge's docs/ATTENTION.md with torch operations. This is an inference
reference: the mechanisms are computed directly (the local windows as a band
mask over the full score matrix), not with attnforge's memory-saving kernels,
and training-only options (dropout, checkpointing, FAVOR+ redraws) are left out.
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

_DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8,
           "BOOL": torch.bool}


def read_safetensors(path):
    """The tensors of a safetensors file: {name: tensor} (the format: an 8-byte
    little-endian header length, a JSON header, then the data)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        dtype = _DTYPES[t["dtype"]]
        raw = bytearray(data[base + begin:base + end])
        x = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = x.reshape(t["shape"]).clone()
    return out


# ---- the mechanisms (docs/ATTENTION.md) ----
# q, k [B, H, N, d], v [B, H, N, dv], mask [B, N] bool (True = real token) or None
# -> [B, H, N, dv]. Non-causal, eval (no dropout).

def _key_mask(mask):
    """[B, N] -> [B, 1, N, 1] for masking key rows, or None."""
    return None if mask is None else mask[:, None, :, None]


def _real_keys(k, mask):
    """The number of real keys per batch element, [B, 1, 1, 1]."""
    if mask is None:
        return torch.full((k.shape[0], 1, 1, 1), float(k.shape[2]), dtype=k.dtype, device=k.device)
    return mask.sum(-1).to(k.dtype)[:, None, None, None]


def _unit(x):
    """Rows over their L2 norms."""
    return x / x.norm(dim=-1, keepdim=True)


def _masked_softmax(scores, allowed):
    """softmax over the last dim where allowed; rows with nothing allowed give 0."""
    if allowed is None:
        return scores.softmax(-1)
    p = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return p.masked_fill(~allowed.any(-1, keepdim=True), 0.0)


def softmax_attention(q, k, v, mask, scale=0.0):
    # S = scale q k^T (scale 0: d^-1/2), masked keys -inf; o = softmax_j(S) v
    scale = scale if scale > 0 else q.shape[-1] ** -0.5
    allowed = None if mask is None else mask[:, None, None, :]       # [B, 1, 1, N]
    return _masked_softmax(scale * q @ k.transpose(-1, -2), allowed) @ v


def local_attention(q, k, v, mask, window, look_backward, look_forward):
    # query i sees key j when window(j) is in window(i) - look_backward .. window(i) + look_forward
    # (windows of `window` positions; padding N to whole windows adds only masked keys),
    # S = d^-1/2 q k^T over that band; queries that are padding output 0.
    N = q.shape[2]
    lf = 1 if look_forward < 0 else look_forward                      # -1: 1 (non-causal)
    win = torch.arange(N, device=q.device) // window
    band = (win[None, :] >= win[:, None] - look_backward) & (win[None, :] <= win[:, None] + lf)
    allowed = band[None, None]                                        # [1, 1, N, N]
    if mask is not None:
        allowed = allowed & mask[:, None, None, :] & mask[:, None, :, None]
    return _masked_softmax(q.shape[-1] ** -0.5 * q @ k.transpose(-1, -2), allowed) @ v


def efficient_attention(q, k, v, mask):
    # q' = softmax_d(q) d^-1/2; k' = softmax_j(k) over the real keys; o = q' (k'^T v)
    qp = q.softmax(-1) * q.shape[-1] ** -0.5
    km = _key_mask(mask)
    if km is not None:
        k = k.masked_fill(~km, float("-inf"))
        v = v.masked_fill(~km, 0.0)
    kp = torch.nan_to_num(k.softmax(-2), nan=0.0)                     # a column of no real key: 0
    return qp @ (kp.transpose(-1, -2) @ v)


def linear_attention(q, k, v, mask, eps):
    # phi = elu + 1, phi(k) = 0 on padding; o = phi(q) (phi(k)^T v) / (phi(q) . sum_j phi(k) + eps)
    pq, pk = F.elu(q) + 1, F.elu(k) + 1
    km = _key_mask(mask)
    if km is not None:
        pk = pk.masked_fill(~km, 0.0)
    num = pq @ (pk.transpose(-1, -2) @ v)                             # [B, H, N, dv]
    den = pq @ pk.sum(-2).unsqueeze(-1)                               # [B, H, N, 1]
    return num / (den + eps)


def taylor_linear_attention(q, k, v, mask, eps=1e-6):
    # q' = q/|q|, k' = k/|k| (0 on padding), n = real keys;
    # o = (sum_j v_j + q' (k'^T v)) / (n + q' . (sum_j k'_j + eps))
    qn, kn = _unit(q), _unit(k)
    km = _key_mask(mask)
    if km is not None:
        kn = kn.masked_fill(~km, 0.0)
        v = v.masked_fill(~km, 0.0)
    num = v.sum(-2, keepdim=True) + qn @ (kn.transpose(-1, -2) @ v)    # [B, H, N, dv]
    den = _real_keys(k, mask) + qn @ (kn.sum(-2) + eps).unsqueeze(-1)  # [B, H, N, 1]
    return num / den


def linformer_attention(q, k, v, mask, E, bE, Fw, bF):
    # E, F [kdim, seq_len] (first M columns used), bE, bF [kdim]; k, v zeroed on padding;
    # K = E k + bE, V = F v + bF [B, H, kdim, d]; o = softmax(q K^T / sqrt(d)) V
    M = k.shape[2]
    km = _key_mask(mask)
    if km is not None:
        k, v = k.masked_fill(~km, 0.0), v.masked_fill(~km, 0.0)
    K = E[:, :M] @ k + bE[:, None]
    V = Fw[:, :M] @ v + bF[:, None]
    return (q @ K.transpose(-1, -2) * q.shape[-1] ** -0.5).softmax(-1) @ V


def favor_attention(q, k, v, mask, W, kernel):
    # Performer FAVOR+, non-causal: o = phi(q) (phi(k)^T v) / (phi(q) . sum_j phi(k_j)),
    # phi(k) = 0 on padding. W [m, d] is the stored projection (None for no_projection).
    km = _key_mask(mask)
    if kernel == "no_projection":
        # phi(q) = softmax_d(q), phi(k) = softmax_j(k) over the real keys
        pq = q.softmax(-1)
        if km is not None:
            k = k.masked_fill(~km, float("-inf"))
        pk = torch.nan_to_num(k.softmax(-2), nan=0.0)
    else:
        c = q.shape[-1] ** -0.25
        qp, kp = (c * q) @ W.t(), (c * k) @ W.t()                     # [B, H, N, m]
        if kernel == "relu":
            # phi(x) = relu((c x) W^T) + 1e-3
            pq, pk = F.relu(qp) + 1e-3, F.relu(kp) + 1e-3
        else:
            # phi(x) = m^-1/2 (exp(x' - |x|^2 c^2 / 2 - stabiliser) + 1e-4); the query's
            # stabiliser is its row max, the keys' the max over every real key and feature
            r, eps = W.shape[0] ** -0.5, 1e-4
            dq = (q * q).sum(-1, keepdim=True) * c * c / 2
            dk = (k * k).sum(-1, keepdim=True) * c * c / 2
            pq = r * (torch.exp(qp - dq - qp.amax(-1, keepdim=True)) + eps)
            real = kp if km is None else kp.masked_fill(~km, float("-inf"))
            kmax = real.amax(dim=(-1, -2), keepdim=True)              # [B, H, 1, 1]
            kmax = torch.where(torch.isinf(kmax), torch.zeros_like(kmax), kmax)
            pk = r * (torch.exp(kp - dk - kmax) + eps)
        if km is not None:
            pk = pk.masked_fill(~km, 0.0)
    num = pq @ (pk.transpose(-1, -2) @ v)
    den = pq @ pk.sum(-2).unsqueeze(-1)
    return num / den


def taylorshift_attention(q, k, v, mask, tau, a, b, c, output_normalized):
    # q^ = tau[h] q/|q|, k^ = k/|k|; A = q^ k^^T; T = a A^2 + b A + c over the real keys;
    # o = (T / rowsum T) v, times sqrt(n / d) (n = real keys) when output_normalized.
    # (The direct form; attnforge's efficient form is the same function.)
    A = (tau[None, :, None, None] * _unit(q)) @ _unit(k).transpose(-1, -2)   # [B, H, N, N]
    T = a * A * A + b * A + c
    if mask is not None:
        T = T.masked_fill(~mask[:, None, None, :], 0.0)
    den = T.sum(-1, keepdim=True)
    o = (T / torch.where(den == 0, torch.ones_like(den), den)) @ v
    if output_normalized:
        o = o * torch.sqrt(_real_keys(k, mask) / q.shape[-1])
    return o


# ---- the modules (nn/layers.cpp, nn/attention.cpp, nn/transformer.cpp, nn/models.cpp) ----

class SublayerNorm(torch.nn.Module):
    """attnforge's SublayerNorm with norm = layer: a LayerNorm named `norm`."""

    def __init__(self, dim, eps):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim, eps=eps)

    def forward(self, x):
        return self.norm(x)


class FeedForward(torch.nn.Module):
    """w1 -> act (GELU exact or ReLU; GLU: act(first half) * second half) -> w2."""

    def __init__(self, dim, hidden, activation, glu):
        super().__init__()
        self.act = F.gelu if activation == "gelu" else F.relu
        self.glu = glu
        self.w1 = torch.nn.Linear(dim, 2 * hidden if glu else hidden)
        self.w2 = torch.nn.Linear(hidden, dim)

    def forward(self, x):                                             # [B, N, D]
        h = self.w1(x)
        if self.glu:
            h, gate = h.chunk(2, dim=-1)
            h = self.act(h) * gate
        else:
            h = self.act(h)
        return self.w2(h)


class ProjectionBank(torch.nn.ModuleList):
    """Linformer's E/F, Linear(seq_len -> k_l) modules "0", "1", ... with
    k_l = max(k - l k_reduce_by_layer, 1); E of (layer l, head h) is module
    (l H + h) 2 and F the next (sharing none), 2l and 2l + 1 (headwise), l for
    both (kv), 0 for both (layerwise)."""

    def __init__(self, sharing, layers, heads, seq_len, k, k_reduce_by_layer):
        count = {"none": 2 * layers * heads, "headwise": 2 * layers, "kv": layers,
                 "layerwise": 1}[sharing]
        layer_of = lambda i: 0 if sharing == "layerwise" else i // (count // layers)
        super().__init__(torch.nn.Linear(seq_len, max(k - layer_of(i) * k_reduce_by_layer, 1))
                         for i in range(count))
        self.sharing, self.heads = sharing, heads

    def pair(self, layer, head):
        """(E, F) of (layer, head)."""
        index = lambda is_f: {"none": (layer * self.heads + head) * 2 + is_f,
                              "headwise": layer * 2 + is_f, "kv": layer, "layerwise": 0}[self.sharing]
        return self[index(0)], self[index(1)]


class MultiHeadAttention(torch.nn.Module):
    """to_q, to_k, to_v [H d, D], to_out [D, H d]; heads split head-major; one
    mechanism per layer. taylorshift: tau [H]; favor (not no_projection): the
    projection_matrix [m, d] and calls_since_last_redraw [1] buffers."""

    def __init__(self, kind, dim, heads, head_dim, opts, layer, bank):
        super().__init__()
        self.kind, self.heads, self.head_dim, self.opts, self.layer = kind, heads, head_dim, opts, layer
        self.bank = [bank]  # in a list, not a child: the Stack owns it (transformer.projections.I)
        inner = heads * head_dim
        self.to_q = torch.nn.Linear(dim, inner, bias=opts["qkv_bias"])
        self.to_k = torch.nn.Linear(dim, inner, bias=opts["qkv_bias"])
        self.to_v = torch.nn.Linear(dim, inner, bias=opts["qkv_bias"])
        self.to_out = torch.nn.Linear(inner, dim, bias=opts["out_bias"])
        if kind == "taylorshift":
            self.tau = torch.nn.Parameter(torch.ones(heads))
        if kind == "favor" and opts["favor_kernel"] != "no_projection":
            m = opts["nb_features"] or int(head_dim * math.log(head_dim))
            self.register_buffer("projection_matrix", torch.zeros(max(m, 1), head_dim))
            self.register_buffer("calls_since_last_redraw", torch.zeros(1, dtype=torch.int64))

    def attend(self, q, k, v, mask):
        o = self.opts
        if self.kind == "softmax":
            return softmax_attention(q, k, v, mask, o["scale"])
        if self.kind == "local":
            return local_attention(q, k, v, mask, o["local_window"], o["local_look_backward"],
                                   o["local_look_forward"])
        if self.kind == "efficient":
            return efficient_attention(q, k, v, mask)
        if self.kind == "linear":
            return linear_attention(q, k, v, mask, o["linear_eps"])
        if self.kind == "taylor_linear":
            return taylor_linear_attention(q, k, v, mask)
        if self.kind == "linformer":
            outs = []
            for h in range(self.heads):
                E, Fp = self.bank[0].pair(self.layer, h)
                one = slice(h, h + 1)
                outs.append(linformer_attention(q[:, one], k[:, one], v[:, one], mask,
                                                E.weight, E.bias, Fp.weight, Fp.bias))
            return torch.cat(outs, 1)
        if self.kind == "favor":
            return favor_attention(q, k, v, mask, getattr(self, "projection_matrix", None),
                                   o["favor_kernel"])
        return taylorshift_attention(q, k, v, mask, self.tau, o["ts_a"], o["ts_b"], o["ts_c"],
                                     o["output_normalized"])

    def forward(self, x, mask):                                       # x [B, N, D]
        B, N, _ = x.shape
        split = lambda t: t.reshape(B, N, self.heads, self.head_dim).transpose(1, 2)  # [B, H, N, d]
        o = self.attend(split(self.to_q(x)), split(self.to_k(x)), split(self.to_v(x)), mask)
        return self.to_out(o.transpose(1, 2).reshape(B, N, -1))       # [B, N, D]


def token_shift(x, shifts, mask=None):                               # [B, N, D]
    """linear-attention-transformer's token shift: the features split into
    len(shifts) segments of D // len(shifts) (the rest unshifted), segment s
    moved shifts[s] positions along the sequence with zeros shifted in; a
    padded token (mask False) passes zeros."""
    per = x.shape[-1] // len(shifts)
    parts = []
    for s, shift in enumerate(shifts):
        part = x[..., s * per:(s + 1) * per]
        if shift != 0:
            if mask is not None:
                part = part.masked_fill(~mask[..., None], 0)
            part = F.pad(part, (0, 0, shift, -shift))
        parts.append(part)
    parts.append(x[..., len(shifts) * per:])
    return torch.cat(parts, -1)


class Block(torch.nn.Module):
    """Pre-norm: x + attn(attn_norm(x)), then + ff(ff_norm(.)); post-norm:
    attn_norm(x + attn(x)), then ff_norm(. + ff(.)). With shifts, each branch's
    input is token-shifted (the feed-forward's without the mask)."""

    def __init__(self, dim, eps, post_norm, attn, ff, shifts):
        super().__init__()
        self.post_norm = post_norm
        self.attn_norm = SublayerNorm(dim, eps)
        self.attn = attn
        self.ff_norm = SublayerNorm(dim, eps)
        self.ff = ff
        self.shifts = shifts

    def shift(self, x, mask=None):
        return token_shift(x, self.shifts, mask) if self.shifts else x

    def forward(self, x, mask):
        if self.post_norm:
            x = self.attn_norm(x + self.attn(self.shift(x, mask), mask))
            return self.ff_norm(x + self.ff(self.shift(x)))
        x = x + self.attn(self.shift(self.attn_norm(x), mask), mask)
        return x + self.ff(self.shift(self.ff_norm(x)))


class Stack(torch.nn.Module):
    """projections (Linformer's bank, when a layer is linformer), layers.L, and
    the final norm `norm` (pre-norm stacks with final_norm)."""

    def __init__(self, m, seq_len):
        super().__init__()
        a = m["attention"]
        dim, depth, heads = m["dim"], m["depth"], m["heads"]
        kinds = a["per_layer"] or [a["kind"]] * depth
        opts = dict(a, qkv_bias=m["qkv_bias"], out_bias=m["out_bias"])
        bank = None
        if "linformer" in kinds:
            bank = ProjectionBank(a["sharing"], depth, heads, seq_len, a["k"], a["k_reduce_by_layer"])
            self.projections = bank                                   # transformer.projections.I
        shifts = (m["token_shifts"] or [1, 0, -1]) if m["shift_tokens"] else []
        self.layers = torch.nn.ModuleList(
            Block(dim, m["norm_eps"], m["post_norm"],
                  MultiHeadAttention(kinds[l], dim, heads, m["head_dim"], opts, l, bank),
                  FeedForward(dim, m["mlp_dim"], m["activation"], m["glu"]), shifts)
            for l in range(depth))
        if m["final_norm"] and not m["post_norm"]:
            self.norm = SublayerNorm(dim, m["norm_eps"])

    def forward(self, x, mask=None):                                  # [B, N, D]
        for block in self.layers:
            x = block(x, mask)
        return self.norm(x) if hasattr(self, "norm") else x


class PatchEmbed(torch.nn.Module):
    """proj: Conv2d(C, D, p, stride p); [B, C, S, S] -> [B, (S/p)^2, D], patches row-major."""

    def __init__(self, channels, dim, patch):
        super().__init__()
        self.proj = torch.nn.Conv2d(channels, dim, patch, stride=patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class ViT(torch.nn.Module):
    """patch_embed, cls_token [1, 1, D] (pool cls), pos_embed [1, T, D], transformer, head."""

    def __init__(self, m):
        super().__init__()
        D, side = m["dim"], m["image_size"] // m["patch_size"]
        self.pool = m["pool"]
        tokens = side * side + (self.pool == "cls")
        self.patch_embed = PatchEmbed(m["channels"], D, m["patch_size"])
        if self.pool == "cls":
            self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = torch.nn.Parameter(torch.zeros(1, tokens, D))
        self.transformer = Stack(m, tokens)
        self.head = torch.nn.Linear(D, m["classes"])

    def forward(self, images):                                        # [B, C, S, S]
        x = self.patch_embed(images)                                  # [B, Np, D]
        if self.pool == "cls":
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1)
        x = self.transformer(x + self.pos_embed)
        return self.head(x[:, 0] if self.pool == "cls" else x.mean(1))  # [B, classes]


class Embedding(torch.nn.Module):
    """A learned table `emb` (AbsolutePositionalEmbedding: pos_emb.emb.weight)."""

    def __init__(self, n, dim):
        super().__init__()
        self.emb = torch.nn.Embedding(n, dim)

    def forward(self, n):
        return self.emb.weight[:n]


class SinusoidalEmbedding(torch.nn.Module):
    """The fixed table `emb` [n, D] (a buffer): row t = cat(sin(t f), cos(t f)), f_i = 10000^(-2i/D)."""

    def __init__(self, n, dim):
        super().__init__()
        f = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) * 2 / dim)
        angle = torch.arange(n, dtype=torch.float64)[:, None] * f[None]
        self.register_buffer("emb", torch.cat([angle.sin(), angle.cos()], 1).float())

    def forward(self, n):
        return self.emb[:n]


class SequenceClassifier(torch.nn.Module):
    """token_emb, cls_token (pool cls), pos_emb (learned / sinusoidal), transformer, head."""

    def __init__(self, m):
        super().__init__()
        D = m["dim"]
        self.pool = m["pool"]
        n = m["max_len"] + (self.pool == "cls")
        self.token_emb = torch.nn.Embedding(m["vocab_size"], D)
        if self.pool == "cls":
            self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, D))
        if m["positional"] == "learned":
            self.pos_emb = Embedding(n, D)
        elif m["positional"] == "sinusoidal":
            self.pos_emb = SinusoidalEmbedding(n, D)
        self.transformer = Stack(m, n)
        self.head = torch.nn.Linear(D, m["classes"])

    def forward(self, tokens, mask=None):                             # [B, N] int64, [B, N] bool
        h = self.token_emb(tokens)                                    # [B, N, D]
        if mask is not None:
            mask = mask.bool()
        if self.pool == "cls":
            h = torch.cat([self.cls_token.expand(h.shape[0], -1, -1), h], 1)
            if mask is not None:
                mask = torch.cat([torch.ones_like(mask[:, :1]), mask], 1)
        if hasattr(self, "pos_emb"):
            h = h + self.pos_emb(h.shape[1])
        h = self.transformer(h, mask)
        if self.pool == "cls":
            pooled = h[:, 0]
        elif mask is None:
            pooled = h.mean(1)
        else:  # the mean over the real tokens
            w = mask.to(h.dtype)[..., None]
            pooled = (h * w).sum(1) / w.sum(1).clamp(min=1.0)
        return self.head(pooled)                                      # [B, classes]


# ---- config checks ----

_KINDS = ("softmax", "local", "efficient", "linear", "taylor_linear", "linformer", "favor",
          "taylorshift")
# model.* keys: what this file rebuilds (None: any value), or "ignored" (training only, or
# used only by options refused here / by other model types).
_MODEL_KEYS = {
    "type": ("vit", "sequence_classifier"), "dim": None, "depth": None, "heads": None,
    "head_dim": None, "mlp_dim": None, "mlp_ratio": None, "activation": ("gelu", "relu"),
    "glu": None, "pool": ("cls", "mean"), "norm": ("layer",), "post_norm": None,
    "final_norm": None, "final_norm_kind": ("layer", "block"),  # block = layer when norm is layer
    "norm_eps": None, "shift_tokens": None, "attend_axially": (False,), "qkv_bias": None,
    "out_bias": None, "reversible": (False,), "image_size": None, "patch_size": None,
    "channels": None, "classes": None, "vocab_size": None, "max_len": None,
    "positional": ("learned", "sinusoidal", "none"), "dual_encoder": (False,),
    "ff_chunks": "ignored", "dropout": "ignored", "emb_dropout": "ignored", "drop_path": "ignored",
    "checkpoint": "ignored", "init_from": "ignored", "token_shifts": None,
    "reversible_output": "ignored", "axial_shape": "ignored", "causal": "ignored",
    "emb_dim": "ignored", "tie_embedding": "ignored", "encoder_depth": "ignored",
    "decoder_depth": "ignored", "target_vocab_size": "ignored", "target_max_len": "ignored",
    "mlp_head_dim": "ignored",
}
_ATTENTION_KEYS = {
    "kind": _KINDS, "per_layer": None, "local_heads": (0,), "per_layer_local_heads": None,
    "scale": None, "local_window": None, "local_look_backward": None, "local_look_forward": None,
    "linear_eps": None, "nb_features": None, "favor_kernel": ("softmax", "relu", "no_projection"),
    "k": None, "sharing": ("none", "headwise", "kv", "layerwise"), "k_reduce_by_layer": None,
    "ts_a": None, "ts_b": None, "ts_c": None, "output_normalized": None,
    "local_heads_at": "ignored", "local_rotary": "ignored",  # local heads only (refused)
    "dropout": "ignored", "bucket_size": "ignored", "favor_stabilizer": "ignored",  # causal only
    "favor_scaling": "ignored", "feature_redraw_interval": "ignored", "n0": "ignored",
    "backend": "ignored",  # which GPU kernels compute the same function
}


def _check(config):
    """ValueError naming the first model.* key whose value this file does not rebuild."""
    m = config["model"]
    for table, keys, prefix in ((_MODEL_KEYS, m, "model."),
                                (_ATTENTION_KEYS, m["attention"], "model.attention.")):
        for key, value in keys.items():
            if key == "attention" and prefix == "model.":
                continue
            if key not in table:
                raise ValueError(f"{prefix}{key} = {value!r}: a key this model.py does not know, "
                                 "so it cannot tell whether it changes the model (add it to the "
                                 "tables in train/pytorch_model.py)")
            allowed = table[key]
            if allowed not in (None, "ignored") and value not in allowed:
                raise ValueError(f"{prefix}{key} = {value!r} is not rebuilt by this model.py "
                                 f"(it rebuilds {', '.join(map(str, allowed))})")
    a = m["attention"]
    if any(n != 0 for n in a["per_layer_local_heads"]):
        raise ValueError(f"model.attention.per_layer_local_heads = {a['per_layer_local_heads']} "
                         "is not rebuilt by this model.py (local heads are not)")
    for kind in a["per_layer"]:
        if kind not in _KINDS:
            raise ValueError(f"model.attention.per_layer: unknown mechanism {kind!r}")
    if a["per_layer"] and len(a["per_layer"]) != m["depth"]:
        raise ValueError(f"model.attention.per_layer has {len(a['per_layer'])} entries for "
                         f"depth {m['depth']}")
    if m["type"] == "sequence_classifier" and m["vocab_size"] <= 0:
        raise ValueError("model.vocab_size = 0: vector inputs are not rebuilt by this model.py")


def build(config):
    """The torch.nn.Module that config.json describes."""
    _check(config)
    m = config["model"]
    return ViT(m) if m["type"] == "vit" else SequenceClassifier(m)


def load(directory="."):
    """config.json and model.safetensors of an export directory -> the model, in eval mode."""
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    model = build(config)
    model.load_state_dict(read_safetensors(os.path.join(directory, "model.safetensors")), strict=True)
    return model.eval()
