#!/usr/bin/python3
"""The attention benchmark's PyTorch side: each mechanism as its reference
library computes it in eager PyTorch (see mechanisms()), on the shapes of
bench/attention.cpp (B = 1, H = 8, d = 64, f32), run against our
bench_attention in the same run. `--check` compares each form's output with
ours (what makes the timings a comparison of the same function).

Every configuration runs in a fresh process (ours and torch's alike); each
reports its peak-RSS growth over one forward+backward, measured the same way
(VmHWM after a reset through /proc/self/clear_refs). Prints a Markdown table of times and
the ratios torch / ours (time: > 1 means we are faster) and ours / torch
(memory: < 1 means we use less).

    /usr/bin/python3 bench/torch_attention.py --ours build/bench/bench_attention \
        [--ns 1024,4096,16384] [--mechanisms softmax/plain,linear/plain,...] [--threads 2]

Needs Debian's python3-torch (CPU).
"""
import argparse
import math
import os
import subprocess
import sys
import time

B, H, D = 1, 8, 64
LINFORMER_K = 256
FAVOR_M = int(D * math.log(D))


def mechanisms(torch):
    """Each mechanism as its reference library computes it in PyTorch (what a
    user of that library runs), written here from the libraries' code:
    performer-pytorch (FastAttention: softmax_kernel / generalized_kernel,
    linear_attention, causal_linear_attention_noncuda, which the CPU uses),
    linear-attention-transformer (linear_attn, causal_linear_attn), the
    local-attention package (LocalAttention.forward), linformer-pytorch and
    TaylorShift (TaylorShiftAttention); plain softmax(q k^T / sqrt(d)) v; and
    for elu+1 (Katharopoulos et al.) fq (fk^T v) / (fq . sum fk + eps).
    Taylor linear has no reference library: its composite follows
    ATTENTION.md."""
    F = torch.nn.functional
    einsum = torch.einsum

    def softmax_attn(q, k, v, causal=False):
        s = q @ k.transpose(-1, -2) * D ** -0.5
        if causal:
            n = q.shape[-2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return s.softmax(-1) @ v

    def look_around(x, backward, forward, pad_value):
        # local-attention's look_around: windows [w - backward, w + forward] side by side.
        dims = (x.dim() - 2) * (0, 0)
        padded = F.pad(x, (*dims, backward, forward), value=pad_value)
        return padded.unfold(1, forward + backward + 1, 1).movedim(-1, 2).flatten(2, 3)

    def local_attn(q, k, v, w, causal=False):
        # local-attention's LocalAttention(window_size=w, causal, look_backward=1,
        # look_forward=0 if causal else 1).forward (no rotary: dim not given).
        b, h, n, d = q.shape
        q, k, v = (t.reshape(b * h, n, d) for t in (q, k, v))
        lb, lf, pad = 1, 0 if causal else 1, -1
        windows = n // w
        b_t = torch.arange(n, device=q.device).reshape(1, windows, w)
        bq, bk, bv = (t.reshape(b * h, windows, w, d) for t in (q, k, v))
        bq = bq * d ** -0.5
        bk, bv = look_around(bk, lb, lf, pad), look_around(bv, lb, lf, pad)
        bq_t = b_t.unsqueeze(-1)
        bq_k = look_around(b_t, lb, lf, pad).unsqueeze(-2)
        pad_mask = bq_k == pad
        sim = einsum("b h i e, b h j e -> b h i j", bq, bk)
        mask_value = -torch.finfo(sim.dtype).max
        if causal:
            sim = sim.masked_fill(bq_t < bq_k, mask_value)
        sim = sim.masked_fill(pad_mask, mask_value)
        out = einsum("b h i j, b h j e -> b h i e", sim.softmax(-1), bv)
        return out.reshape(b, h, n, d)

    def efficient_attn(q, k, v):
        # linear-attention-transformer's linear_attn.
        q = q.softmax(dim=-1)
        k = k.softmax(dim=-2)
        q = q * q.shape[-1] ** -0.5
        context = einsum("bhnd,bhne->bhde", k, v)
        return einsum("bhnd,bhde->bhne", q, context)

    def efficient_causal(q, k, v, bucket=64, eps=1e-3):
        # linear-attention-transformer's causal_linear_attn (bucket_size 64).
        b, h, n, e = q.shape
        q = q.softmax(dim=-1)
        k = torch.exp(k).clone()
        q = q * e ** -0.5
        bq, bk, bv = (t.reshape(b, h, -1, bucket, e) for t in (q, k, v))
        bk_cumsum = bk.sum(dim=-2).cumsum(dim=-2)
        context = einsum("bhund,bhune->bhude", bk, bv).cumsum(dim=-3)
        context = F.pad(context, (0, 0, 0, 0, 1, 0), value=0.0)[:, :, :-1]
        bk_cumsum = F.pad(bk_cumsum, (0, 0, 1, 0), value=0.0)[:, :, :-1]
        d_inv = 1.0 / einsum("bhud,bhund->bhun", bk_cumsum, bq).clamp(min=eps)
        return einsum("bhund,bhude,bhun->bhune", bq, context, d_inv).reshape(b, h, n, e)

    def performer_linear(q, k, v):
        # performer-pytorch's linear_attention (non-causal).
        k_cumsum = k.sum(dim=-2)
        d_inv = 1.0 / einsum("...nd,...d->...n", q, k_cumsum.type_as(q))
        context = einsum("...nd,...ne->...de", k, v)
        return einsum("...de,...nd,...n->...ne", context, q, d_inv)

    def performer_causal(q, k, v, chunks=128, eps=1e-6):
        # performer-pytorch's causal_linear_attention_noncuda (what it runs
        # without fast_transformers' CUDA kernel): `chunks` chunks along N.
        last_k_cumsum, last_context_cumsum, outs = 0, 0, []
        for qc, kc, vc in zip(*(t.chunk(chunks, dim=-2) for t in (q, k, v))):
            k_cumsum = last_k_cumsum + kc.cumsum(dim=-2)
            d_inv = 1.0 / einsum("...nd,...nd->...n", qc, k_cumsum.type_as(qc) + eps)
            context = einsum("...nd,...ne->...nde", kc, vc)
            context_cumsum = last_context_cumsum + context.cumsum(dim=-3)
            outs.append(einsum("...nde,...nd,...n->...ne", context_cumsum, qc, d_inv))
            last_k_cumsum, last_context_cumsum = k_cumsum[:, :, -1:], context_cumsum[:, :, -1:]
        return torch.cat(outs, dim=-2)

    def linear_attn(q, k, v, eps=1e-6):
        # elu+1 (Katharopoulos et al.): fq (fk^T v) / (fq . sum_n fk + eps).
        fq, fk = F.elu(q) + 1, F.elu(k) + 1
        return fq @ (fk.transpose(-1, -2) @ v) / (fq @ fk.sum(-2).unsqueeze(-1) + eps)

    def linear_causal(q, k, v):
        # elu+1 features through performer-pytorch's causal path.
        return performer_causal(F.elu(q) + 1, F.elu(k) + 1, v)

    def taylor_linear(q, k, v, eps=1e-6):
        n = k.shape[-2]
        qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        num = v.sum(-2, keepdim=True) + qn @ (kn.transpose(-1, -2) @ v)
        den = n + qn @ (kn.sum(-2) + eps).unsqueeze(-1)
        return num / den

    def linformer(q, k, v, E, Fm, bE, bF):
        # linformer-pytorch's LinearAttentionHead: E, F as nn.Linear(n, k) on
        # the sequence axis, then softmax attention over the k projected keys.
        K = (k.transpose(-1, -2) @ E.t() + bE).transpose(-1, -2)
        V = (v.transpose(-1, -2) @ Fm.t() + bF).transpose(-1, -2)
        return (q @ K.transpose(-1, -2) / math.sqrt(D)).softmax(-1) @ V

    def softmax_kernel(data, W, is_query, eps=1e-4):
        # performer-pytorch's softmax_kernel.
        b, h = data.shape[:2]
        normalizer = data.shape[-1] ** -0.25
        ratio = W.shape[0] ** -0.5
        projection = W.expand(b, h, *W.shape).type_as(data)
        dash = einsum("...id,...jd->...ij", normalizer * data, projection)
        diag = ((data ** 2).sum(dim=-1) / 2.0 * normalizer ** 2).unsqueeze(dim=-1)
        if is_query:
            return ratio * (torch.exp(dash - diag - torch.amax(dash, dim=-1, keepdim=True).detach()) + eps)
        return ratio * (torch.exp(dash - diag - torch.amax(dash, dim=(-1, -2), keepdim=True).detach()) + eps)

    def relu_kernel(data, W, eps=1e-3):
        # performer-pytorch's generalized_kernel with its default ReLU.
        b, h = data.shape[:2]
        projection = W.expand(b, h, *W.shape).type_as(data)
        dash = einsum("...id,...jd->...ij", data.shape[-1] ** -0.25 * data, projection)
        return F.relu(dash) + eps

    def favor(q, k, v, W):
        return performer_linear(softmax_kernel(q, W, True), softmax_kernel(k, W, False), v)

    def favor_causal(q, k, v, W):
        return performer_causal(softmax_kernel(q, W, True), softmax_kernel(k, W, False), v)

    def favor_relu(q, k, v, W):
        return performer_linear(relu_kernel(q, W), relu_kernel(k, W), v)

    def box(a, b):
        return (a.unsqueeze(-1) * b.unsqueeze(-2)).view(list(a.shape)[:-1] + [-1])

    def taylorshift_efficient(q, k, v, tau, a=0.5, b=1.0, c=1.0):
        # TaylorShiftAttention._efficient_attention (normalize_input, not output_normalized).
        B_, H_, N, d = q.shape
        scale = d ** 0.25
        v = torch.cat([torch.ones(*v.shape[:-1], 1, device=v.device, dtype=v.dtype), v], dim=-1)
        q = F.normalize(q, dim=-1) * (scale * tau.reshape(1, -1, 1, 1))
        k = F.normalize(k, dim=-1) * scale
        v = v / N
        kv_mod = box(k, k).transpose(-1, -2) @ v
        y = (a * box(q, q) @ kv_mod + (scale ** 2 * b) * q @ (k.transpose(-1, -2) @ v)
             + (scale ** 4 * c) * v.sum(-2).view(B_, H_, 1, d + 1))
        return y[..., 1:] / y[..., :1]

    def taylorshift_direct(q, k, v, tau, a=0.5, b=1.0, c=1.0):
        # TaylorShiftAttention._direct_attention (normalize_input).
        q = F.normalize(q, dim=-1) * tau.reshape(1, -1, 1, 1)
        k = F.normalize(k, dim=-1)
        attn = q @ k.transpose(-2, -1)
        attn_max = attn.abs().max(dim=-1).values.view(*attn.shape[:-1], 1)
        max_val = a * attn_max.square() + b * attn_max + c
        attn = a * (attn / max_val.sqrt()).square() + b * (attn / max_val) + c / max_val
        attn = attn / attn.sum(-1).view(*attn.shape[:-1], 1)
        return attn @ v

    return {
        "softmax/plain": lambda x: softmax_attn(x["q"], x["k"], x["v"]),
        "softmax/causal": lambda x: softmax_attn(x["q"], x["k"], x["v"], causal=True),
        "local/w64": lambda x: local_attn(x["q"], x["k"], x["v"], 64),
        "local/w64+causal": lambda x: local_attn(x["q"], x["k"], x["v"], 64, causal=True),
        "local/w256": lambda x: local_attn(x["q"], x["k"], x["v"], 256),
        "local/w256+causal": lambda x: local_attn(x["q"], x["k"], x["v"], 256, causal=True),
        "efficient/plain": lambda x: efficient_attn(x["q"], x["k"], x["v"]),
        "efficient/causal+buckets64": lambda x: efficient_causal(x["q"], x["k"], x["v"]),
        "linear/plain": lambda x: linear_attn(x["q"], x["k"], x["v"]),
        "linear/causal": lambda x: linear_causal(x["q"], x["k"], x["v"]),
        "taylor_linear/self": lambda x: taylor_linear(x["q"], x["k"], x["v"]),
        "linformer/full": lambda x: linformer(x["q"], x["k"], x["v"], x["E"], x["F"], x["bE"], x["bF"]),
        "favor/softmax": lambda x: favor(x["q"], x["k"], x["v"], x["W"]),
        "favor/softmax+causal": lambda x: favor_causal(x["q"], x["k"], x["v"], x["W"]),
        "favor/relu": lambda x: favor_relu(x["q"], x["k"], x["v"], x["W"]),
        "taylorshift/efficient": lambda x: taylorshift_efficient(x["q"], x["k"], x["v"], x["tau"]),
        "taylorshift/direct": lambda x: taylorshift_direct(x["q"], x["k"], x["v"], x["tau"]),
    }


def proc_status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def reset_peak_rss_kib():
    """Resets the peak-RSS mark (VmHWM) to the current RSS; returns that RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return proc_status_kib("VmRSS")


QUADRATIC = {"softmax/plain", "softmax/causal", "taylorshift/direct"}


def torch_one(name, n, threads):
    """Runs one configuration in this (fresh) process; prints fwd_ms,fwdbwd_ms,rss_growth_kib."""
    import torch
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1234)
    leaf = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).requires_grad_()
    xavier = math.sqrt(2.0 / (LINFORMER_K + n))
    x = {"q": leaf(B, H, n, D), "k": leaf(B, H, n, D), "v": leaf(B, H, n, D),
         "E": leaf(LINFORMER_K, n, scale=xavier), "F": leaf(LINFORMER_K, n, scale=xavier),
         "bE": leaf(LINFORMER_K, scale=0.0), "bF": leaf(LINFORMER_K, scale=0.0),
         "W": torch.randn(FAVOR_M, D, generator=g), "tau": torch.ones(H, requires_grad=True)}
    fn = mechanisms(torch)[name]
    rss0 = reset_peak_rss_kib()

    def fwdbwd():
        for t in x.values():
            t.grad = None
        fn(x).sum().backward()

    fwdbwd()  # warm-up and memory
    rss = proc_status_kib("VmHWM") - rss0

    def median(f, budget=1.0):
        ts, start = [], time.perf_counter()
        while len(ts) < 3 or (time.perf_counter() - start < budget and len(ts) < 50):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return sorted(ts)[len(ts) // 2] * 1e3

    fb = median(fwdbwd)
    with torch.no_grad():
        f = median(lambda: fn(x))
    print(f"{f:.3f},{fb:.3f},{rss}")


def run_capture(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return None, (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return p.stdout.strip().splitlines()[-1], None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", default="build/bench/bench_attention")
    ap.add_argument("--ns", default="256,512,1024,2048,4096,8192,16384")
    ap.add_argument("--mechanisms", default="")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--torch-one", nargs=2, metavar=("NAME", "N"))
    ap.add_argument("--quadratic-limit-gb", type=float, default=10.0,
                    help="skip torch where its N x N tensors would need more than this")
    a = ap.parse_args()
    if a.torch_one:
        torch_one(a.torch_one[0], int(a.torch_one[1]), a.threads)
        return
    import torch
    names = a.mechanisms.split(",") if a.mechanisms else list(mechanisms(torch).keys())
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    print(f"B = {B}, H = {H}, d = {D}, f32, {a.threads} threads; torch {torch.__version__}\n")
    print("| mechanism | N | ours fwd ms | torch fwd ms | ours fwd+bwd ms | torch fwd+bwd ms | time torch/ours "
          "| ours peak MiB (allocator) | ours RSS growth MiB | torch RSS growth MiB | memory ours/torch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        for n in (int(s) for s in a.ns.split(",")):
            ours, err = run_capture([a.ours, "--one", name, str(n)], env)
            if ours is None:
                print(f"| {name} | {n} | ours failed: {err} |")
                continue
            _, _, of, ofb, opeak, orss = ours.split(",")
            of, ofb, opeak, orss = float(of), float(ofb), int(opeak), int(orss)
            quad_gb = 4 * B * H * n * n * 4 / 1e9  # S, P and their gradients
            if name in QUADRATIC and quad_gb > a.quadratic_limit_gb:
                tf = tfb = trss = None
                terr = f"skipped: needs ~{quad_gb:.0f} GB"
            else:
                line, terr = run_capture([sys.executable, __file__, "--torch-one", name, str(n),
                                          "--threads", str(a.threads)], env)
                tf, tfb, trss = (None, None, None) if line is None else map(float, line.split(","))
            if tf is None:
                print(f"| {name} | {n} | {of:.2f} | {terr} | {ofb:.2f} | - | - | {opeak / 2**20:.1f} | "
                      f"{orss / 1024:.1f} | - | - |")
            else:
                print(f"| {name} | {n} | {of:.2f} | {tf:.2f} | {ofb:.2f} | {tfb:.2f} | {tfb / ofb:.2f} | "
                      f"{opeak / 2**20:.1f} | {orss / 1024:.1f} | {trss / 1024:.1f} | "
                      f"{(orss / trss) if trss > 0 else float('nan'):.2f} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
