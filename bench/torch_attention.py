#!/usr/bin/python3
"""The attention benchmark's PyTorch side: each mechanism of ATTENTION.md as
an eager composite of torch ops, on the shapes of bench/attention.cpp
(B = 1, H = 8, d = 64, f32), run against our bench_attention in the same run.

Every configuration runs in a fresh process (ours and torch's alike); each
reports its peak-RSS growth over one forward+backward, measured the same way
(VmHWM after a reset through /proc/self/clear_refs). Prints a Markdown table of times and
the ratios torch / ours (time: > 1 means we are faster) and ours / torch
(memory: < 1 means we use less).

    /usr/bin/python3 bench/torch_attention.py --ours build/bench/bench_attention \
        [--ns 1024,4096,16384] [--mechanisms softmax,linear,...] [--threads 2]

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
    F = torch.nn.functional

    def softmax_attn(q, k, v, causal=False):
        s = q @ k.transpose(-1, -2) * D ** -0.5
        if causal:
            n = q.shape[-2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return s.softmax(-1) @ v

    def local_attn(q, k, v, causal=False, w=64):
        # Windows of w; each query window sees the previous window (and the next one when not causal).
        b, h, n, d = q.shape
        nw = n // w
        qw, kw, vw = (t.reshape(b, h, nw, w, d) for t in (q, k, v))
        lf = 0 if causal else 1

        def look_around(t, fill):
            padded = F.pad(t, (0, 0, 0, 0, 1, lf), value=fill)
            return torch.cat([padded[:, :, i:i + nw] for i in range(1 + 1 + lf)], dim=3)

        kk, vv = look_around(kw, 0.0), look_around(vw, 0.0)
        s = qw @ kk.transpose(-1, -2) * d ** -0.5
        pos = torch.arange(n, device=q.device).reshape(nw, w)
        kpos = look_around(pos.reshape(1, 1, nw, w, 1).float(), -1.0)[0, 0, :, :, 0]
        # Keys from absent windows (before 0 / after the last) carry position -1 or out of range.
        window_idx = torch.arange(nw, device=q.device).reshape(nw, 1)
        offs = torch.arange(1 + 1 + lf, device=q.device).repeat_interleave(w).reshape(1, -1) - 1
        absent = ((window_idx + offs) < 0) | ((window_idx + offs) >= nw)
        mask = absent.unsqueeze(1).expand(nw, w, -1)
        if causal:
            mask = mask | (kpos.unsqueeze(1) > pos.reshape(nw, w, 1))
        s = s.masked_fill(mask, float("-inf"))
        return (s.softmax(-1) @ vv).reshape(b, h, n, d)

    def efficient_attn(q, k, v):
        q = q.softmax(-1) * D ** -0.5
        k = k.softmax(-2)
        return q @ (k.transpose(-1, -2) @ v)

    def efficient_causal(q, k, v, s=64):
        b, h, n, d = q.shape
        q = q.softmax(-1) * D ** -0.5
        k = k.exp()
        kb, vb, qb = k.reshape(b, h, n // s, s, d), v.reshape(b, h, n // s, s, d), q.reshape(b, h, n // s, s, d)
        ctx = torch.einsum("bhund,bhune->bhude", kb, vb).cumsum(2)
        z = kb.sum(3).cumsum(2)
        ctx = F.pad(ctx, (0, 0, 0, 0, 1, -1))  # buckets strictly before u
        z = F.pad(z, (0, 0, 1, -1))
        num = torch.einsum("bhund,bhude->bhune", qb, ctx)
        den = torch.einsum("bhund,bhud->bhun", qb, z).clamp(min=1e-3)
        return (num / den.unsqueeze(-1)).reshape(b, h, n, d)

    def linear_attn(q, k, v, eps=1e-6):
        q, k = F.elu(q) + 1, F.elu(k) + 1
        z = 1 / (q @ k.sum(-2).unsqueeze(-1) + eps)
        return (q @ (k.transpose(-1, -2) @ v)) * z

    def causal_linear(q, k, v, eps, chunk=128):
        # performer-pytorch's non-CUDA causal linear attention: cumulative sums of k v^T, in chunks.
        last_ctx, last_k = 0, 0
        outs = []
        for qc, kc, vc in zip(*(t.split(chunk, dim=-2) for t in (q, k, v))):
            k_cum = last_k + kc.cumsum(-2)
            d_inv = 1.0 / torch.einsum("...nd,...nd->...n", qc, k_cum.type_as(qc) + eps)
            ctx = torch.einsum("...nd,...ne->...nde", kc, vc)
            ctx_cum = last_ctx + ctx.cumsum(-3)
            outs.append(torch.einsum("...nde,...nd->...ne", ctx_cum, qc) * d_inv.unsqueeze(-1))
            last_k, last_ctx = k_cum[..., -1:, :], ctx_cum[..., -1:, :, :]
        return torch.cat(outs, dim=-2)

    def linear_causal(q, k, v):
        return causal_linear(F.elu(q) + 1, F.elu(k) + 1, v, 1e-6)

    def taylor_linear(q, k, v, eps=1e-6):
        n = k.shape[-2]
        qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        num = v.sum(-2, keepdim=True) + qn @ (kn.transpose(-1, -2) @ v)
        den = n + qn @ (kn.sum(-2) + eps).unsqueeze(-1)
        return num / den

    def linformer(q, k, v, E, Fm, bE, bF):
        K = E @ k + bE.unsqueeze(-1)
        V = Fm @ v + bF.unsqueeze(-1)
        return (q @ K.transpose(-1, -2) * D ** -0.5).softmax(-1) @ V

    def favor_features(x, W, is_query, eps=1e-4):
        c = D ** -0.25
        dash = (c * x) @ W.t()
        diag = (x ** 2).sum(-1, keepdim=True) / 2 * c * c
        mx = dash.amax(-1, keepdim=True) if is_query else dash.amax((-1, -2), keepdim=True)
        return W.shape[0] ** -0.5 * (torch.exp(dash - diag - mx.detach()) + eps)

    def favor(q, k, v, W):
        qf, kf = favor_features(q, W, True), favor_features(k, W, False)
        return (qf @ (kf.transpose(-1, -2) @ v)) / (qf @ kf.sum(-2).unsqueeze(-1))

    def favor_causal(q, k, v, W):
        return causal_linear(favor_features(q, W, True), favor_features(k, W, False), v, 1e-6)

    def favor_relu(q, k, v, W):
        c = D ** -0.25
        qf, kf = F.relu((c * q) @ W.t()) + 1e-3, F.relu((c * k) @ W.t()) + 1e-3
        return (qf @ (kf.transpose(-1, -2) @ v)) / (qf @ kf.sum(-2).unsqueeze(-1))

    def ts_normalize(q, k, tau):
        return tau.reshape(1, -1, 1, 1) * F.normalize(q, dim=-1), F.normalize(k, dim=-1)

    def taylorshift_direct(q, k, v, tau, a=0.5, b=1.0, c=1.0):
        qh, kh = ts_normalize(q, k, tau)
        A = qh @ kh.transpose(-1, -2)
        T = a * A * A + b * A + c
        return (T / T.sum(-1, keepdim=True)) @ v

    def taylorshift_efficient(q, k, v, tau, a=0.5, b=1.0, c=1.0):
        qh, kh = ts_normalize(q, k, tau)
        n, d = k.shape[-2], q.shape[-1]
        sigma = d ** 0.25
        qt, kt = sigma * qh, sigma * kh
        vt = torch.cat([torch.ones_like(v[..., :1]), v], dim=-1) / n
        kk = (kt.unsqueeze(-1) * kt.unsqueeze(-2)).flatten(-2)
        qq = (qt.unsqueeze(-1) * qt.unsqueeze(-2)).flatten(-2)
        y = a * qq @ (kk.transpose(-1, -2) @ vt) + sigma ** 2 * b * qt @ (kt.transpose(-1, -2) @ vt) \
            + sigma ** 4 * c * vt.sum(-2, keepdim=True)
        return y[..., 1:] / y[..., :1]

    return {
        "softmax": lambda x: softmax_attn(x["q"], x["k"], x["v"]),
        "softmax_causal": lambda x: softmax_attn(x["q"], x["k"], x["v"], causal=True),
        "local_w64": lambda x: local_attn(x["q"], x["k"], x["v"]),
        "local_w64_causal": lambda x: local_attn(x["q"], x["k"], x["v"], causal=True),
        "efficient": lambda x: efficient_attn(x["q"], x["k"], x["v"]),
        "efficient_causal": lambda x: efficient_causal(x["q"], x["k"], x["v"]),
        "linear": lambda x: linear_attn(x["q"], x["k"], x["v"]),
        "linear_causal": lambda x: linear_causal(x["q"], x["k"], x["v"]),
        "taylor_linear": lambda x: taylor_linear(x["q"], x["k"], x["v"]),
        "linformer_k256": lambda x: linformer(x["q"], x["k"], x["v"], x["E"], x["F"], x["bE"], x["bF"]),
        "favor": lambda x: favor(x["q"], x["k"], x["v"], x["W"]),
        "favor_causal": lambda x: favor_causal(x["q"], x["k"], x["v"], x["W"]),
        "favor_relu": lambda x: favor_relu(x["q"], x["k"], x["v"], x["W"]),
        "taylorshift_efficient": lambda x: taylorshift_efficient(x["q"], x["k"], x["v"], x["tau"]),
        "taylorshift_direct": lambda x: taylorshift_direct(x["q"], x["k"], x["v"], x["tau"]),
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


QUADRATIC = {"softmax", "softmax_causal", "taylorshift_direct"}


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
