#!/usr/bin/python3
"""The default recipe's ViT (recipes/vit/fmnist_tiny.yaml) as plain eager
PyTorch: one training step (forward, cross-entropy, backward, AdamW) on random
28x28 images, timed as bench/vit_step.cpp times ours, in the same run.

    /usr/bin/python3 bench/torch_vit_step.py --ours build/bench/bench_vit_step [--threads 2]

Prints a Markdown table: median ms per step, images/s, and torch / ours.
Needs Debian's python3-torch (CPU).
"""
import argparse
import subprocess
import time

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.heads = heads

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = ((q @ k.transpose(-1, -2)) * (d // self.heads) ** -0.5).softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, image=28, patch=4, dim=64, depth=4, heads=4, hidden=128, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(1, dim, patch, patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def torch_step_ms(batch, steps, warmup):
    torch.manual_seed(0)
    model = ViT()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    x = torch.randn(batch, 1, 28, 28)
    y = torch.arange(batch) % 10
    ms = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if s >= warmup:
            ms.append((time.perf_counter() - t0) * 1000)
    ms.sort()
    return ms[len(ms) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ours", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="32,128,256")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"ViT of recipes/vit/fmnist_tiny.yaml, one training step (AdamW), f32, {args.threads} threads, "
          f"torch {torch.__version__}")
    print("| batch | ours ms | torch ms | ours img/s | torch img/s | torch / ours (time) | ours peak MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for b in [int(v) for v in args.batches.split(",")]:
        out = subprocess.run([args.ours, "--batch", str(b), "--steps", str(args.steps)],
                             check=True, capture_output=True, text=True,
                             env={"OMP_NUM_THREADS": str(args.threads)}).stdout.strip()
        _, _, ours_ms, ours_ips, peak = out.split(",")
        t = torch_step_ms(b, args.steps, 5)
        print(f"| {b} | {float(ours_ms):.1f} | {t:.1f} | {float(ours_ips):.0f} | {1000 * b / t:.0f} | "
              f"{t / float(ours_ms):.2f} | {float(peak):.1f} |")


if __name__ == "__main__":
    main()
