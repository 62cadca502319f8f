"""An attnforge model in plain PyTorch, exported by `attnforge export CKPT --format pytorch`.

Needs torch only (no attnforge, no safetensors package). In the export directory:

    import model
    m = model.load(".")          # config.json + model.safetensors -> torch.nn.Module, eval mode
    logits = m(x)                # vit: x [B, C, H, W] float, prepared as config["card"]["input"] says
                                 # sequence_classifier: x [B, N] int64 tokens (0 pads), mask [B, N] bool
                                 # language_model: x [B, N] int64 tokens -> [B, N, V] next-token logits
    logits = m(src, tgt)         # encoder_decoder: src [B, M], tgt [B, N] int64 (src_mask [B, M]
                                 # bool optional) -> [B, N, V]

The modules and their parameter names mirror attnforge's (nn/models.cpp,
nn/transformer.cpp, nn/attention.cpp, nn/embeddings.cpp); every attention
mechanism, causal or not, is written from attnforge's docs/ATTENTION.md with
torch operations. This is an inference reference: the mechanisms are computed
directly over the full score matrix (causality and local windows as masks),
not with attnforge's memory-saving kernels, and training-only options
(dropout, checkpointing, FAVOR+ redraws) are left out. A reversible stack is
run forwards as its couplings define it.
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
# q [B, H, N, d], k [B, H, M, d], v [B, H, M, dv], mask [B, M] bool (True = real key) or
# None -> [B, H, N, dv]. causal: query i sees keys j <= i (M == N). Eval (no dropout).

def _key_mask(mask):
    """[B, M] -> [B, 1, M, 1] for masking key rows, or None."""
    return None if mask is None else mask[:, None, :, None]


def _real_keys(k, mask):
    """The number of real keys per batch element, [B, 1, 1, 1]."""
    if mask is None:
        return torch.full((k.shape[0], 1, 1, 1), float(k.shape[2]), dtype=k.dtype, device=k.device)
    return mask.sum(-1).to(k.dtype)[:, None, None, None]


def _unit(x):
    """Rows over their L2 norms."""
    return x / x.norm(dim=-1, keepdim=True)


def _tril(N, device):
    """[N, N] bool: key j <= query i."""
    return torch.ones(N, N, dtype=torch.bool, device=device).tril()


def _masked_softmax(scores, allowed):
    """softmax over the last dim where allowed; rows with nothing allowed give 0."""
    if allowed is None:
        return scores.softmax(-1)
    p = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return p.masked_fill(~allowed.any(-1, keepdim=True), 0.0)


def _linear_causal(pq, pk, v, eps_den, eps_sum):
    # o_i = pq_i (sum_{j<=i} pk_j v_j^T) / (pq_i . (sum_{j<=i} pk_j + eps_sum) + eps_den):
    # the scan of the prefix sums written as a lower-triangular product
    A = (pq @ pk.transpose(-1, -2)) * _tril(pq.shape[2], pq.device)   # [B, H, N, N]
    den = A.sum(-1, keepdim=True) + eps_sum * pq.sum(-1, keepdim=True) + eps_den
    return (A @ v) / den


def softmax_attention(q, k, v, mask, scale=0.0, causal=False):
    # S = scale q k^T (scale 0: d^-1/2), masked (and, causal, later) keys -inf; o = softmax_j(S) v
    scale = scale if scale > 0 else q.shape[-1] ** -0.5
    allowed = None if mask is None else mask[:, None, None, :]       # [B, 1, 1, M]
    if causal:
        tril = _tril(q.shape[2], q.device)
        allowed = tril if allowed is None else allowed & tril
    return _masked_softmax(scale * q @ k.transpose(-1, -2), allowed) @ v


def local_attention(q, k, v, mask, window, look_backward, look_forward, causal=False):
    # query i sees key j when window(j) is in window(i) - look_backward .. window(i) + look_forward
    # (windows of `window` positions; padding N to whole windows adds only masked keys), and
    # j <= i when causal; S = d^-1/2 q k^T over that band; queries that are padding output 0.
    N = q.shape[2]
    lf = look_forward if look_forward >= 0 else (0 if causal else 1)
    win = torch.arange(N, device=q.device) // window
    band = (win[None, :] >= win[:, None] - look_backward) & (win[None, :] <= win[:, None] + lf)
    if causal:
        band = band & _tril(N, q.device)
    allowed = band[None, None]                                        # [1, 1, N, N]
    if mask is not None:
        allowed = allowed & mask[:, None, None, :] & mask[:, None, :, None]
    return _masked_softmax(q.shape[-1] ** -0.5 * q @ k.transpose(-1, -2), allowed) @ v


def efficient_attention(q, k, v, mask, causal=False, bucket_size=64):
    # q' = softmax_d(q) d^-1/2. Non-causal: k' = softmax_j(k) over the real keys, o = q' (k'^T v).
    # Causal: k' = exp(k) (0 on padding); a query of bucket u = i // s sees the keys of the
    # buckets before u (s = 1: j <= i); o_i = q'_i C / max(q'_i . z, 1e-3) over those keys.
    qp = q.softmax(-1) * q.shape[-1] ** -0.5
    km = _key_mask(mask)
    if causal:
        kp = k.exp()
        if km is not None:
            kp, v = kp.masked_fill(~km, 0.0), v.masked_fill(~km, 0.0)
        pos = torch.arange(q.shape[2], device=q.device)
        if bucket_size == 1:
            sees = pos[None, :] <= pos[:, None]
        else:
            sees = pos[None, :] // bucket_size < pos[:, None] // bucket_size
        A = (qp @ kp.transpose(-1, -2)) * sees                        # [B, H, N, N]
        return (A @ v) / A.sum(-1, keepdim=True).clamp(min=1e-3)
    if km is not None:
        k = k.masked_fill(~km, float("-inf"))
        v = v.masked_fill(~km, 0.0)
    kp = torch.nan_to_num(k.softmax(-2), nan=0.0)                     # a column of no real key: 0
    return qp @ (kp.transpose(-1, -2) @ v)


def linear_attention(q, k, v, mask, eps, causal=False):
    # phi = elu + 1, phi(k) = 0 on padding; o = phi(q) (phi(k)^T v) / (phi(q) . sum_j phi(k) + eps),
    # causal: both sums over j <= i
    pq, pk = F.elu(q) + 1, F.elu(k) + 1
    km = _key_mask(mask)
    if km is not None:
        pk = pk.masked_fill(~km, 0.0)
    if causal:
        return _linear_causal(pq, pk, v, eps, 0.0)
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


def favor_attention(q, k, v, mask, W, kernel, causal=False, stabilizer="prefix"):
    # Performer FAVOR+: o = phi(q) (phi(k)^T v) / (phi(q) . sum_j phi(k_j)), phi(k) = 0 on
    # padding; causal: both sums over j <= i, the normaliser's sum + 1e-6 per feature.
    # W [m, d] is the stored projection (None for no_projection).
    km = _key_mask(mask)
    if kernel == "no_projection":
        # phi(q) = softmax_d(q); phi(k) = softmax_j(k) over the real keys (causal: exp(k))
        pq = q.softmax(-1)
        if causal:
            pk = k.exp()
        else:
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
            # (causal with the prefix stabiliser: over the real keys j <= i, for query i)
            r, eps = W.shape[0] ** -0.5, 1e-4
            dq = (q * q).sum(-1, keepdim=True) * c * c / 2
            dk = (k * k).sum(-1, keepdim=True) * c * c / 2
            pq = r * (torch.exp(qp - dq - qp.amax(-1, keepdim=True)) + eps)
            real = kp if km is None else kp.masked_fill(~km, float("-inf"))
            kmax = real.amax(dim=(-1, -2), keepdim=True)              # [B, H, 1, 1]
            kmax = torch.where(torch.isinf(kmax), torch.zeros_like(kmax), kmax)
            if causal and stabilizer == "prefix":
                return _favor_prefix(pq, kp - dk, real.amax(-1).cummax(-1).values, kmax, v, km,
                                     r, eps)
            pk = r * (torch.exp(kp - dk - kmax) + eps)
    if km is not None:
        pk = pk.masked_fill(~km, 0.0)
    if causal:
        return _linear_causal(pq, pk, v, 0.0, 1e-6)
    num = pq @ (pk.transpose(-1, -2) @ v)
    den = pq @ pk.sum(-2).unsqueeze(-1)
    return num / den


def _favor_prefix(pq, kx, M, kmax, v, km, r, eps):
    # Causal FAVOR+ with the prefix stabiliser: query i weighs key j <= i by
    # phi_i(k_j) = r (exp(kx_j - M_i) + eps), kx = k' - diag(k), M_i [B, H, N] the max of k' over
    # the real keys j <= i. Computed as exp(kmax - M_i) exp(kx_j - kmax) in float64, where the
    # factor cannot overflow.
    dt = pq.dtype
    M = torch.where(torch.isinf(M), kmax[..., 0], M).double()        # no real key yet: kmax
    g = torch.exp(kx.double() - kmax.double())                        # [B, H, N, m]
    if km is not None:
        g = g.masked_fill(~km, 0.0)
    p = pq.double()
    real = torch.ones_like(g[..., :1]) if km is None else km.to(g.dtype).expand_as(g[..., :1])
    scale = torch.exp(kmax.double()[..., 0] - M)[..., None]           # [B, H, N, 1]
    A = r * (scale * (p @ g.transpose(-1, -2)) + eps * p.sum(-1, keepdim=True) * real.transpose(-1, -2))
    A = A * _tril(pq.shape[2], pq.device)                             # [B, H, N, N]
    den = A.sum(-1, keepdim=True) + 1e-6 * p.sum(-1, keepdim=True)
    return ((A @ v.double()) / den).to(dt)


def taylorshift_attention(q, k, v, mask, tau, a, b, c, output_normalized):
    # q^ = tau[h] q/|q|, k^ = k/|k|; A = q^ k^^T; T = a A^2 + b A + c over the real keys;
    # o = (T / rowsum T) v, times sqrt(n / d) (n = real keys) when output_normalized.
    # (The direct form; attnforge's efficient form is the same function.)
    A = (tau[None, :, None, None] * _unit(q)) @ _unit(k).transpose(-1, -2)   # [B, H, N, M]
    T = a * A * A + b * A + c
    if mask is not None:
        T = T.masked_fill(~mask[:, None, None, :], 0.0)
    den = T.sum(-1, keepdim=True)
    o = (T / torch.where(den == 0, torch.ones_like(den), den)) @ v
    if output_normalized:
        o = o * torch.sqrt(_real_keys(k, mask) / q.shape[-1])
    return o


# ---- positions turned into q and k ----

def sinusoid_table(n, dim, offset=0):
    """[n, dim] float64: row t (from offset) = cat(sin(t f), cos(t f)), f_i = 10000^(-2i/dim)."""
    f = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) * 2 / dim)
    angle = torch.arange(offset, offset + n, dtype=torch.float64)[:, None] * f[None]
    return torch.cat([angle.sin(), angle.cos()], 1)


def rotate_every_two(x):
    """Each pair (x_2i, x_2i+1) -> (-x_2i+1, x_2i)."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    return torch.stack([-pairs[..., 1], pairs[..., 0]], -1).reshape(x.shape)


def rotate_half_split(x, offset=0):
    """local-attention's rotary positions: the pair (x_i, x_{i + d/2}) at position t (from
    offset) turns by the angle t f_i, f_i = 10000^(-2i/d). x [..., n, d]."""
    n, d = x.shape[-2], x.shape[-1]
    table = sinusoid_table(n, d, offset).to(x.dtype).to(x.device)
    sin, cos = table[:, :d // 2], table[:, d // 2:]
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class RotaryEmbedding(torch.nn.Module):
    """performer-pytorch's rotary positions (layer_pos_emb): the buffer `emb` [max_len, d]
    (sin | cos) of the sinusoids; the pair (x_2i, x_2i+1) at position t turns by t f_i."""

    def __init__(self, n, head_dim):
        super().__init__()
        self.register_buffer("emb", sinusoid_table(n, head_dim).float())

    def rotate(self, x):                                              # [..., n, d]
        n, half = x.shape[-2], x.shape[-1] // 2
        table = self.emb[:n].to(x.dtype)
        sin = table[:, :half].repeat_interleave(2, -1)                # s0 s0 s1 s1 ...
        cos = table[:, half:].repeat_interleave(2, -1)
        return x * cos + rotate_every_two(x) * sin


# ---- the modules (nn/layers.cpp, nn/attention.cpp, nn/transformer.cpp, nn/models.cpp) ----

class ScaleNorm(torch.nn.Module):
    """x / max(|x|, eps) * g, g [1] (performer-pytorch's ScaleNorm)."""

    def __init__(self, eps):
        super().__init__()
        self.eps = eps
        self.g = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        return x / x.norm(dim=-1, keepdim=True).clamp(min=self.eps) * self.g


class ReZero(torch.nn.Module):
    """branch * g, g [1] (init 0)."""

    def __init__(self):
        super().__init__()
        self.g = torch.nn.Parameter(torch.zeros(1))

    def forward(self, y):
        return y * self.g


class SublayerNorm(torch.nn.Module):
    """attnforge's SublayerNorm: `norm` a LayerNorm (layer) or a ScaleNorm (scale) in front
    of a branch; rezero: no norm, the branch's output times `rezero.g`."""

    def __init__(self, kind, dim, eps):
        super().__init__()
        if kind == "layer":
            self.norm = torch.nn.LayerNorm(dim, eps=eps)
        elif kind == "scale":
            self.norm = ScaleNorm(eps)
        else:
            self.rezero = ReZero()

    def forward(self, x):
        return self.norm(x) if hasattr(self, "norm") else x

    def scale(self, branch):
        return self.rezero(branch) if hasattr(self, "rezero") else branch


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
    """to_q [H d, D], to_k, to_v [H d, Dc] (Dc: the context's width for cross-attention),
    to_out [D, H d]; heads split head-major. `local` heads (first or last, as
    opts["local_heads_at"]) use local attention, the others the layer's mechanism.
    taylorshift: tau [global heads]; favor (not no_projection): the projection_matrix [m, d]
    and calls_since_last_redraw [1] buffers."""

    def __init__(self, kind, dim, heads, head_dim, opts, layer, bank, causal=False,
                 local=0, context_dim=0, cross=False):
        super().__init__()
        self.kind, self.heads, self.head_dim, self.opts, self.layer = kind, heads, head_dim, opts, layer
        self.causal, self.local, self.cross = causal, local, cross
        self.bank = [bank]  # in a list, not a child: the Stack owns it (transformer.projections.I)
        inner = heads * head_dim
        self.to_q = torch.nn.Linear(dim, inner, bias=opts["qkv_bias"])
        self.to_k = torch.nn.Linear(context_dim or dim, inner, bias=opts["qkv_bias"])
        self.to_v = torch.nn.Linear(context_dim or dim, inner, bias=opts["qkv_bias"])
        self.to_out = torch.nn.Linear(inner, dim, bias=opts["out_bias"])
        if heads == local:
            return
        if kind == "taylorshift":
            self.tau = torch.nn.Parameter(torch.ones(heads - local))
        if kind == "favor" and opts["favor_kernel"] != "no_projection":
            m = opts["nb_features"] or int(head_dim * math.log(head_dim))
            self.register_buffer("projection_matrix", torch.zeros(max(m, 1), head_dim))
            self.register_buffer("calls_since_last_redraw", torch.zeros(1, dtype=torch.int64))

    def groups(self):
        """[(h0, h1, is_local)]: the head ranges of one mechanism each, in head order."""
        H, nl = self.heads, self.local
        l0 = 0 if self.opts["local_heads_at"] == "first" else H - nl
        out = [(0, l0, False), (l0, l0 + nl, True), (l0 + nl, H, False)]
        return [g for g in out if g[1] > g[0]]

    def attend(self, q, k, v, mask, h0, h1, is_local):
        o, causal = self.opts, self.causal
        if is_local or self.kind == "local":
            return local_attention(q, k, v, mask, o["local_window"], o["local_look_backward"],
                                   o["local_look_forward"], causal)
        if self.kind == "softmax":
            return softmax_attention(q, k, v, mask, o["scale"], causal)
        if self.kind == "efficient":
            return efficient_attention(q, k, v, mask, causal, o["bucket_size"])
        if self.kind == "linear":
            return linear_attention(q, k, v, mask, o["linear_eps"], causal)
        if self.kind == "taylor_linear":
            return taylor_linear_attention(q, k, v, mask)
        if self.kind == "linformer":
            outs = []
            for h in range(h0, h1):
                E, Fp = self.bank[0].pair(self.layer, h)
                one = slice(h - h0, h - h0 + 1)
                outs.append(linformer_attention(q[:, one], k[:, one], v[:, one], mask,
                                                E.weight, E.bias, Fp.weight, Fp.bias))
            return torch.cat(outs, 1)
        if self.kind == "favor":
            return favor_attention(q, k, v, mask, getattr(self, "projection_matrix", None),
                                   o["favor_kernel"], causal, o["favor_stabilizer"])
        g0 = self.local if self.opts["local_heads_at"] == "first" else 0
        return taylorshift_attention(q, k, v, mask, self.tau[h0 - g0:h1 - g0], o["ts_a"], o["ts_b"],
                                     o["ts_c"], o["output_normalized"])

    def forward(self, x, mask, rotary=None, context=None, context_mask=None):   # x [B, N, D]
        src, key_mask = (context, context_mask) if self.cross else (x, mask)
        d = self.head_dim

        def heads_of(lin, t, h0, h1):                                 # -> [B, h1 - h0, n, d]
            bias = None if lin.bias is None else lin.bias[h0 * d:h1 * d]
            y = F.linear(t, lin.weight[h0 * d:h1 * d], bias)
            return y.reshape(t.shape[0], t.shape[1], h1 - h0, d).transpose(1, 2)

        outs = []
        for h0, h1, is_local in self.groups():
            q, k, v = heads_of(self.to_q, x, h0, h1), heads_of(self.to_k, src, h0, h1), \
                heads_of(self.to_v, src, h0, h1)
            if is_local and self.opts["local_rotary"]:
                # keys at their positions, queries look_forward windows on (the reference's frame)
                lf = self.opts["local_look_forward"]
                lf = lf if lf >= 0 else (0 if self.causal else 1)
                q = rotate_half_split(q, lf * self.opts["local_window"])
                k = rotate_half_split(k)
            elif rotary is not None and not self.cross:
                q, k = rotary.rotate(q), rotary.rotate(k)
            outs.append(self.attend(q, k, v, key_mask, h0, h1, is_local))
        o = torch.cat(outs, 1)                                        # [B, H, N, d]
        return self.to_out(o.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))  # [B, N, D]


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
    """Pre-norm: x + attn(attn_norm(x)) [+ cross(cross_norm(.), context)], then + ff(ff_norm(.));
    post-norm: attn_norm(x + attn(x)) [, cross_norm(. + cross(., context))], ff_norm(. + ff(.)).
    With shifts (pre-norm), each self branch's input is token-shifted (the feed-forward's
    without the mask); ReZero scales each branch by its g."""

    def __init__(self, m, attn, ff, shifts, cross=None):
        super().__init__()
        self.post_norm = m["post_norm"]
        self.attn_norm = SublayerNorm(m["norm"], m["dim"], m["norm_eps"])
        self.attn = attn
        if cross is not None:
            self.cross_norm = SublayerNorm(m["norm"], m["dim"], m["norm_eps"])
            self.cross_attn = cross
        self.ff_norm = SublayerNorm(m["norm"], m["dim"], m["norm_eps"])
        self.ff = ff
        self.shifts = shifts

    def shift(self, x, mask=None):
        return token_shift(x, self.shifts, mask) if self.shifts else x

    def attention_branch(self, x, mask, rotary, context, context_mask):
        s = self.attn_norm.scale(self.attn(self.shift(self.attn_norm(x), mask), mask, rotary))
        if not hasattr(self, "cross_attn"):
            return s
        c = self.cross_attn(self.cross_norm(x + s), None, None, context, context_mask)
        return s + self.cross_norm.scale(c)

    def ff_branch(self, x):
        return self.ff_norm.scale(self.ff(self.shift(self.ff_norm(x))))

    def forward(self, x, mask, rotary=None, context=None, context_mask=None):
        if self.post_norm:
            x = self.attn_norm(x + self.attn(x, mask, rotary))
            if hasattr(self, "cross_attn"):
                x = self.cross_norm(x + self.cross_attn(x, None, None, context, context_mask))
            return self.ff_norm(x + self.ff(x))
        x = x + self.attention_branch(x, mask, rotary, context, context_mask)
        return x + self.ff_branch(x)


class Stack(torch.nn.Module):
    """projections (Linformer's bank, when a layer is linformer), context_projections (the
    cross-attention's), layers.L, and the final norm `norm` (pre-norm stacks with final_norm).
    Reversible: x1 = x2 = x; per block y1 = x1 + attention_branch(x2), y2 = x2 + ff_branch(y1);
    then y1 + y2 (sum) or their mean, then the final norm."""

    def __init__(self, m, depth, seq_len, causal=False, context_dim=0, context_len=0):
        super().__init__()
        a = m["attention"]
        dim, heads = m["dim"], m["heads"]
        kinds = a["per_layer"] or [a["kind"]] * depth
        locals_ = a["per_layer_local_heads"] or [a["local_heads"]] * depth
        opts = dict(a, qkv_bias=m["qkv_bias"], out_bias=m["out_bias"])
        bank = context_bank = None
        if any(k == "linformer" and n < heads for k, n in zip(kinds, locals_)):
            bank = ProjectionBank(a["sharing"], depth, heads, seq_len, a["k"], a["k_reduce_by_layer"])
            self.projections = bank                                   # transformer.projections.I
        if context_dim and a["kind"] == "linformer":
            context_bank = ProjectionBank(a["sharing"], depth, heads, context_len, a["k"],
                                          a["k_reduce_by_layer"])
            self.context_projections = context_bank
        shifts = []
        if m["shift_tokens"]:
            shifts = m["token_shifts"] or ([1, 0] if causal else [1, 0, -1])
        self.layers = torch.nn.ModuleList(
            Block(m, MultiHeadAttention(kinds[l], dim, heads, m["head_dim"], opts, l, bank, causal,
                                        locals_[l]),
                  FeedForward(dim, m["mlp_dim"], m["activation"], m["glu"]), shifts,
                  MultiHeadAttention(a["kind"], dim, heads, m["head_dim"], opts, l, context_bank,
                                     False, 0, context_dim, True) if context_dim else None)
            for l in range(depth))
        self.reversible, self.mean = m["reversible"], m["reversible_output"] == "mean"
        if m["final_norm"] and not m["post_norm"]:
            scale = m["final_norm_kind"] == "block" and m["norm"] == "scale"
            self.norm = SublayerNorm("scale" if scale else "layer", dim, m["norm_eps"])

    def forward(self, x, mask=None, rotary=None, context=None, context_mask=None):   # [B, N, D]
        if self.reversible:
            x1 = x2 = x
            for block in self.layers:
                x1 = x1 + block.attention_branch(x2, mask, rotary, context, context_mask)
                x2 = x2 + block.ff_branch(x1)
            x = (x1 + x2) * 0.5 if self.mean else x1 + x2
        else:
            for block in self.layers:
                x = block(x, mask, rotary, context, context_mask)
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
        self.transformer = Stack(m, m["depth"], tokens)
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
        self.register_buffer("emb", sinusoid_table(n, dim).float())

    def forward(self, n):
        return self.emb[:n]


class AxialEmbedding(torch.nn.Module):
    """Summed axial positions: `weights.i` [1, 1.., s_i, 1.., D] with axis i at dim 1 + i;
    position p is the sum of the rows of p's row-major coordinates."""

    def __init__(self, shape, dim):
        super().__init__()
        self.dim = dim
        self.weights = torch.nn.ParameterList()
        for i, s in enumerate(shape):
            size = [1] * (len(shape) + 2)
            size[1 + i], size[-1] = s, dim
            self.weights.append(torch.nn.Parameter(torch.zeros(size)))

    def forward(self, n):
        total = sum(self.weights[i] for i in range(len(self.weights)))
        return total.reshape(-1, self.dim)[:n]


def positions(m, n, axial_width):
    """(pos_emb module or None, layer_pos_emb RotaryEmbedding or None) of model.positional."""
    kind, D = m["positional"], m["dim"]
    if kind == "learned":
        return Embedding(n, D), None
    if kind == "sinusoidal":
        return SinusoidalEmbedding(n, D), None
    if kind == "axial":
        shape = m["axial_shape"] or [(n + axial_width - 1) // axial_width, axial_width]
        return AxialEmbedding(shape, D), None
    if kind in ("rotary", "rotary_only"):
        rotary = RotaryEmbedding(n, m["head_dim"])
        return (SinusoidalEmbedding(n, D) if kind == "rotary" else None), rotary
    return None, None


class SequenceClassifier(torch.nn.Module):
    """token_emb, cls_token (pool cls), pos_emb and layer_pos_emb (model.positional), transformer,
    head."""

    def __init__(self, m):
        super().__init__()
        D = m["dim"]
        self.pool = m["pool"]
        n = m["max_len"] + (self.pool == "cls")
        self.token_emb = torch.nn.Embedding(m["vocab_size"], D)
        if self.pool == "cls":
            self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, D))
        pos, rotary = positions(m, n, 64)
        if pos is not None:
            self.pos_emb = pos
        if rotary is not None:
            self.layer_pos_emb = rotary
        self.transformer = Stack(m, m["depth"], n)
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
        h = self.transformer(h, mask, getattr(self, "layer_pos_emb", None))
        if self.pool == "cls":
            pooled = h[:, 0]
        elif mask is None:
            pooled = h.mean(1)
        else:  # the mean over the real tokens
            w = mask.to(h.dtype)[..., None]
            pooled = (h * w).sum(1) / w.sum(1).clamp(min=1.0)
        return self.head(pooled)                                      # [B, classes]


class LanguageModel(torch.nn.Module):
    """PerformerLM / LinearAttentionTransformerLM: token_emb [V, E] (E = emb_dim or D),
    project_in / project_out (E < D), pos_emb and layer_pos_emb (rotary), transformer,
    to_logits (E -> V; tied: token_emb's weight, no bias). The encoder of an encoder-decoder
    has no head (return_embeddings)."""

    def __init__(self, m, vocab, n, depth, causal, head=True, context_dim=0, context_len=0):
        super().__init__()
        D = m["dim"]
        E = m["emb_dim"] or D
        self.tied = m["tie_embedding"]
        self.token_emb = torch.nn.Embedding(vocab, E)
        if E != D:
            self.project_in = torch.nn.Linear(E, D)
        pos, rotary = positions(m, n, m["attention"]["local_window"])
        if pos is not None:
            self.pos_emb = pos
        if rotary is not None:
            self.layer_pos_emb = rotary
        self.transformer = Stack(m, depth, n, causal, context_dim, context_len)
        if not head:
            return
        if E != D:
            self.project_out = torch.nn.Linear(D, E)
        self.to_logits = torch.nn.Linear(E, vocab, bias=not self.tied)
        if self.tied:
            self.to_logits.weight = self.token_emb.weight             # one parameter, two names

    def forward(self, tokens, mask=None, context=None, context_mask=None):   # [B, N] int64
        h = self.token_emb(tokens)                                    # [B, N, E]
        if hasattr(self, "project_in"):
            h = self.project_in(h)
        if hasattr(self, "pos_emb"):
            h = h + self.pos_emb(h.shape[1])
        if mask is not None:
            mask = mask.bool()
        h = self.transformer(h, mask, getattr(self, "layer_pos_emb", None), context, context_mask)
        if hasattr(self, "project_out"):
            h = self.project_out(h)
        return self.to_logits(h) if hasattr(self, "to_logits") else h  # [B, N, V]


class EncoderDecoder(torch.nn.Module):
    """PerformerEncDec: `encoder` (bidirectional, no head) and `decoder` (causal, its blocks
    cross-attending to the encoder's output with the source mask)."""

    def __init__(self, m):
        super().__init__()
        self.encoder = LanguageModel(m, m["vocab_size"], m["max_len"], m["encoder_depth"], False,
                                     head=False)
        self.decoder = LanguageModel(m, m["target_vocab_size"], m["target_max_len"],
                                     m["decoder_depth"], True, True, m["dim"], m["max_len"])

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):       # [B, M], [B, N] int64
        if src_mask is not None:
            src_mask = src_mask.bool()
        context = self.encoder(src, src_mask)                         # [B, M, D]
        return self.decoder(tgt, tgt_mask, context, src_mask)         # [B, N, V]


# ---- config checks ----

_KINDS = ("softmax", "local", "efficient", "linear", "taylor_linear", "linformer", "favor",
          "taylorshift")
_TYPES = ("vit", "sequence_classifier", "language_model", "encoder_decoder")
# model.* keys: what this file rebuilds (None: any value), or "ignored" (training only, or
# used only by options refused here / by other model types).
_MODEL_KEYS = {
    "type": _TYPES, "dim": None, "depth": None, "heads": None,
    "head_dim": None, "mlp_dim": None, "mlp_ratio": None, "activation": ("gelu", "relu"),
    "glu": None, "pool": ("cls", "mean"), "norm": ("layer", "scale", "rezero"), "post_norm": None,
    "final_norm": None, "final_norm_kind": ("layer", "block"), "norm_eps": None,
    "shift_tokens": None, "attend_axially": (False,), "qkv_bias": None, "out_bias": None,
    "reversible": None, "reversible_output": ("sum", "mean"), "image_size": None,
    "patch_size": None, "channels": None, "classes": None, "vocab_size": None, "max_len": None,
    "positional": ("learned", "sinusoidal", "none", "rotary", "rotary_only", "axial"),
    "dual_encoder": (False,), "axial_shape": None, "causal": None, "emb_dim": None,
    "tie_embedding": None, "encoder_depth": None, "decoder_depth": None,
    "target_vocab_size": None, "target_max_len": None, "token_shifts": None,
    "ff_chunks": "ignored", "dropout": "ignored", "emb_dropout": "ignored", "drop_path": "ignored",
    "checkpoint": "ignored", "init_from": "ignored", "mlp_head_dim": "ignored",
}
_ATTENTION_KEYS = {
    "kind": _KINDS, "per_layer": None, "local_heads": None, "per_layer_local_heads": None,
    "local_heads_at": ("first", "last"), "local_rotary": None, "scale": None,
    "local_window": None, "local_look_backward": None, "local_look_forward": None,
    "bucket_size": None, "linear_eps": None, "nb_features": None,
    "favor_kernel": ("softmax", "relu", "no_projection"), "favor_stabilizer": ("prefix", "global"),
    "k": None, "sharing": ("none", "headwise", "kv", "layerwise"), "k_reduce_by_layer": None,
    "ts_a": None, "ts_b": None, "ts_c": None, "output_normalized": None,
    "dropout": "ignored", "favor_scaling": "ignored",  # favor_scaling: W is stored
    "feature_redraw_interval": "ignored", "n0": "ignored",  # training; the same function
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
    for kind in a["per_layer"]:
        if kind not in _KINDS:
            raise ValueError(f"model.attention.per_layer: unknown mechanism {kind!r}")
    for key in ("per_layer", "per_layer_local_heads"):
        depths = {m["depth"], m["encoder_depth"], m["decoder_depth"]} - {0}
        if a[key] and len(a[key]) not in depths:
            raise ValueError(f"model.attention.{key} has {len(a[key])} entries for depth "
                             f"{m['depth']}")
    if m["type"] == "sequence_classifier" and m["vocab_size"] <= 0:
        raise ValueError("model.vocab_size = 0: vector inputs are not rebuilt by this model.py")


def build(config):
    """The torch.nn.Module that config.json describes."""
    _check(config)
    m = config["model"]
    if m["type"] == "vit":
        return ViT(m)
    if m["type"] == "sequence_classifier":
        return SequenceClassifier(m)
    if m["type"] == "language_model":
        return LanguageModel(m, m["vocab_size"], m["max_len"], m["depth"], m["causal"])
    return EncoderDecoder(m)


def load(directory="."):
    """config.json and model.safetensors of an export directory -> the model, in eval mode."""
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    model = build(config)
    model.load_state_dict(read_safetensors(os.path.join(directory, "model.safetensors")), strict=True)
    return model.eval()
