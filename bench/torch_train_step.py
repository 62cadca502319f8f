#!/usr/bin/python3
"""A ViT or the LRA ListOps classifier as plain eager PyTorch: one training
step (forward, cross-entropy, backward, AdamW) on random inputs, timed as
bench/train_step.cpp times ours, in the same run.

    # the default recipe's ViT on the CPU (Debian's python3-torch)
    /usr/bin/python3 bench/torch_train_step.py --ours build/bench/bench_train_step [--threads 2]
    # ViT-S/16, 224, bf16 autocast on the GPU machine (PyTorch 2.11; see docs/GPU.md)
    python3 bench/torch_train_step.py --ours BUILD/bench/bench_train_step --model s16 \
        --device cuda --precision bf16 --batches 128

    # LRA ListOps (N = 2000) with FAVOR+ on the GPU
    python3 bench/torch_train_step.py --ours BUILD/bench/bench_train_step --model listops \
        --attention favor --device cuda --precision bf16 --batches 32

The PyTorch model is the same network written plainly (softmax attention as
softmax(q k^T / sqrt d) v, not scaled_dot_product_attention; favor and
taylorshift as the eager composites of bench/torch_attention.py); on the GPU it
runs under torch.autocast with f32 master weights (fp16 with a GradScaler),
as our `precision: bf16 | fp16`. Prints a Markdown table: median ms per step,
images/s, torch / ours, and peak memory of both.

Each side of each batch size runs alone in a fresh process (this driver only
starts them and computes nothing): a PyTorch step in the driver would leave
its OpenMP threads spinning while our program runs, and the other way round.
"""
import argparse
import os
import subprocess
import time

import math
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_attention as eager  # noqa: E402  (the mechanisms as eager composites)

# LayerNorm epsilon of our ViT and sequence classifier (timm's 1e-6).
EPS = 1e-6


def gaussian_orthogonal(m, d):
    """FAVOR+'s projection [m, d]: stacked orthogonal blocks, rows scaled by Gaussian norms."""
    blocks = [torch.linalg.qr(torch.randn(d, d))[0].t() for _ in range((m + d - 1) // d)]
    w = torch.cat(blocks)[:m]
    return w * torch.randn(m, d).norm(dim=1, keepdim=True)


class Block(nn.Module):
    def __init__(self, dim, heads, hidden, attention="softmax"):
        super().__init__()
        d = dim // heads
        self.attention = attention
        if attention == "favor":
            self.register_buffer("W", gaussian_orthogonal(int(d * math.log(d)), d))
        if attention == "taylorshift":
            self.tau = nn.Parameter(torch.ones(heads))
        self.norm1 = nn.LayerNorm(dim, eps=EPS)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=EPS)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.heads = heads

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        eager.D = d // self.heads  # the composites read the head dimension from there
        if self.attention == "favor":
            a = eager.mechanisms(torch)["favor/softmax"]({"q": q, "k": k, "v": v, "W": self.W})
        elif self.attention == "taylorshift":
            # Direct below the switch point N0 = d^2 + d + 1, as ours decides.
            form = "taylorshift/direct" if n <= eager.D ** 2 + eager.D + 1 else "taylorshift/efficient"
            a = eager.mechanisms(torch)[form]({"q": q, "k": k, "v": v, "tau": self.tau})
        else:
            a = ((q @ k.transpose(-1, -2)) * (d // self.heads) ** -0.5).softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


MODELS = {
    # name: (image, patch, channels, dim, depth, heads, hidden, classes)
    "tiny": (28, 7, 1, 96, 6, 4, 192, 10),  # recipes/vit/fmnist_tiny.yaml
    "p4": (28, 4, 1, 64, 4, 4, 128, 10),  # the default recipe before issue 18
    "s16": (224, 16, 3, 384, 12, 6, 1536, 1000),
}
# ListOps (recipes/lra/listops.yaml, no dropout): tokens, vocabulary, dim, depth, heads, hidden, classes
LISTOPS = (2000, 16, 512, 4, 8, 1024, 10)


class Patches(nn.Module):
    """Images [B, C, H, W] -> patch tokens [B, (H / p) (W / p), dim]."""

    def __init__(self, chans, dim, patch):
        super().__init__()
        self.conv = nn.Conv2d(chans, dim, patch, patch)

    def forward(self, x):
        return self.conv(x).flatten(2).transpose(1, 2)


class Classifier(nn.Module):
    """Tokens (patches or a token embedding) of n positions, a CLS token, learned
    positions, pre-norm blocks, CLS pooling: our ViT and sequence classifier."""

    def __init__(self, tokens, n, dim, depth, heads, hidden, classes, attention="softmax"):
        super().__init__()
        self.tokens = tokens
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, hidden, attention) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=EPS)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.tokens(x)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def torch_step_ms(model_name, attention, device, precision, batch, steps, warmup):
    """Median ms of one step, and the peak memory in MB (GPU: allocator peak; CPU: not measured)."""
    torch.manual_seed(0)
    if model_name == "listops":
        n, vocab, dim, depth, heads, hidden, classes = LISTOPS
        model = Classifier(nn.Embedding(vocab, dim), n, dim, depth, heads, hidden, classes, attention).to(device)
        x = torch.randint(1, vocab, (batch, n), device=device)
    else:
        image, patch, chans, dim, depth, heads, hidden, classes = MODELS[model_name]
        model = Classifier(Patches(chans, dim, patch), (image // patch) ** 2, dim, depth, heads, hidden, classes,
                           attention).to(device)
        x = torch.randn(batch, chans, image, image, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    y = torch.arange(batch, device=device) % classes
    cuda = device == "cuda"
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16") if cuda else None
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    ms = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        if scaler is not None and scaler.is_enabled():
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        if cuda:
            torch.cuda.synchronize()
        if s >= warmup:
            ms.append((time.perf_counter() - t0) * 1000)
    ms.sort()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else float("nan")
    return ms[len(ms) // 2], peak


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ours", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="32,64,128,256")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--model", choices=sorted(MODELS) + ["listops"], default="tiny")
    p.add_argument("--attention", choices=["softmax", "favor", "taylorshift"], default="softmax")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    p.add_argument("--flash-engine", choices=["tiled", "mma", "cudnn"], default="tiled",
                   help="our softmax attention kernels on the GPU (issue 29's switch)")
    p.add_argument("--torch-one", type=int, metavar="BATCH",
                   help="(internal) time PyTorch's step at this batch in this process; print ms,peak")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.torch_one:
        t, peak = torch_step_ms(args.model, args.attention, args.device, args.precision, args.torch_one,
                                args.steps, 5)
        print(f"{t},{peak}")
        return
    where = (torch.cuda.get_device_name(0) if args.device == "cuda" else f"{args.threads} CPU threads")
    print(f"{args.model} with {args.attention} attention, one training step (AdamW), {args.precision}, "
          f"{where}, torch {torch.__version__}"
          + (f"; our flash engine: {args.flash_engine}" if args.device == "cuda" else ""))
    print("| batch | ours ms | torch ms | ours samples/s | torch samples/s | torch / ours (time) | ours peak MB | torch peak MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    for b in [int(v) for v in args.batches.split(",")]:
        out = subprocess.run([args.ours, "--batch", str(b), "--steps", str(args.steps), "--model", args.model,
                              "--attention", args.attention, "--device", args.device, "--precision", args.precision,
                              "--flash-engine", args.flash_engine],
                             check=True, capture_output=True, text=True, env=env).stdout.strip()
        _, _, ours_ms, ours_ips, peak = out.split(",")
        line = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-one", str(b), "--ours", args.ours,
                               "--threads", str(args.threads), "--steps", str(args.steps), "--model", args.model,
                               "--attention", args.attention, "--device", args.device, "--precision", args.precision],
                              check=True, capture_output=True, text=True, env=env).stdout.strip().splitlines()[-1]
        t, torch_peak = (float(v) for v in line.split(","))
        print(f"| {b} | {float(ours_ms):.1f} | {t:.1f} | {float(ours_ips):.0f} | {1000 * b / t:.0f} | "
              f"{t / float(ours_ms):.2f} | {float(peak):.1f} | {torch_peak:.1f} |")


if __name__ == "__main__":
    main()
