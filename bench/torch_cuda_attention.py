#!/usr/bin/python3
"""The GPU attention benchmark: every mechanism of ATTENTION.md, ours
(bench_attention --device cuda) against the same math in eager PyTorch (the
composites of bench/torch_attention.py) and, for softmax, against
torch.nn.functional.scaled_dot_product_attention with each of its backends
forced in turn (torch.nn.attention.sdpa_kernel: FlashAttention-2, cuDNN,
memory-efficient), in the same run on the same GPU.

Shapes (issue 7): B x N = --tokens (16384) tokens, H = 16, d = dv = 64 and
128, bf16, N = 1024 .. 65536. Work per configuration: one forward, and one
forward plus backward of sum(o) with gradients to every input; times are
medians after a warm-up, with the device synchronised around each call. Peak
memory: the growth of the allocator's peak over one forward+backward (ours:
the CUDA caching allocator's counters; PyTorch: torch.cuda.max_memory_allocated).
TFLOP/s for softmax counts 4 B H N^2 d for the forward (half when causal) and
2.5x that for the backward, as FlashAttention's papers do. The bandwidth
floor (bench_attention's): the bytes a forward + backward must move (q, k,
v, o, do, dq, dk, dv once each) over the GPU's measured copy bandwidth.

    python3 bench/torch_cuda_attention.py --ours PATH/bench_attention \
        [--dims 64,128] [--ns 1024,...,65536] [--tokens 16384] [--heads 16] \
        [--dtype bf16] [--mechanisms softmax,linear,...] [--raw OUT.csv] \
        [--flash-engine tiled|mma|cudnn]   (our softmax / local kernels: issue 29's switch)

Prints a Markdown table per head dimension; --raw also writes every figure as CSV.
Needs PyTorch with CUDA (PyTorch 2.11 on the GPU machine).
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_attention as eager  # noqa: E402  (the composites, parameterised by its globals)

ALL_NS = "1024,2048,4096,8192,16384,32768,65536"
SDPA_BACKENDS = ("flash", "cudnn", "efficient")
SOFTMAX_LIKE = {"softmax/plain": False, "softmax/causal": True}


def flops_fwd(name, b, h, n, d):
    if name in SOFTMAX_LIKE:
        return 4 * b * h * n * n * d / (2 if SOFTMAX_LIKE[name] else 1)
    if name == "taylorshift/direct":
        return 4 * b * h * n * n * d
    return None


def median_ms(torch, fn, budget=0.5):
    ts, start = [], time.perf_counter()
    while len(ts) < 3 or (time.perf_counter() - start < budget and len(ts) < 30):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2] * 1e3


def torch_run(torch, fn, x):
    """(fwd ms, fwd+bwd ms, peak MiB) of fn on inputs x, or an error string."""
    leaves = [t for t in x.values() if t.requires_grad]

    def fwdbwd():
        for t in leaves:
            t.grad = None
        fn(x).float().sum().backward()

    try:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fwdbwd()  # warm-up and memory
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        fb = median_ms(torch, fwdbwd)
        with torch.no_grad():
            f = median_ms(torch, lambda: fn(x))
        return f, fb, peak
    except torch.cuda.OutOfMemoryError:
        return "out of memory"
    except RuntimeError as e:  # an SDPA backend that does not take this case
        return "unsupported" if "kernel" in str(e).lower() else f"error: {str(e)[:60]}"
    finally:
        for t in leaves:
            t.grad = None
        torch.cuda.empty_cache()


def sdpa_fn(torch, backend, causal):
    """SDPA with one backend forced; a shape or dtype it does not take raises."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    kind = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def fn(y):
        with sdpa_kernel(kind):
            return torch.nn.functional.scaled_dot_product_attention(y["q"], y["k"], y["v"],
                                                                    is_causal=causal)
    return fn


def make_inputs(torch, b, h, n, d, dtype):
    g = torch.Generator(device="cuda").manual_seed(1234)

    def leaf(*s, scale=1.0):
        return (torch.randn(*s, generator=g, device="cuda") * scale).to(dtype).requires_grad_()

    xavier = (2.0 / (eager.LINFORMER_K + n)) ** 0.5
    return {"q": leaf(b, h, n, d), "k": leaf(b, h, n, d), "v": leaf(b, h, n, d),
            "E": leaf(eager.LINFORMER_K, n, scale=xavier), "F": leaf(eager.LINFORMER_K, n, scale=xavier),
            "bE": leaf(eager.LINFORMER_K, scale=0.0), "bF": leaf(eager.LINFORMER_K, scale=0.0),
            "W": torch.randn(eager.FAVOR_M, d, generator=g, device="cuda").to(dtype),
            "tau": torch.ones(h, device="cuda", dtype=dtype, requires_grad=True)}


def run_ours(args, d):
    cmd = [args.ours, "--device", "cuda", "--dtype", args.dtype, "--heads", str(args.heads), "--dim",
           str(d), "--tokens", str(args.tokens), "--ns", args.ns, "--csv"]
    if args.mechanisms:
        cmd += ["--mechanisms", args.mechanisms]
    if args.flash_engine:
        cmd += ["--flash-engine", args.flash_engine]
    p = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(p.stderr)
    ours = {}
    for line in p.stdout.splitlines()[1:]:
        name, b, n, f, fb, peak, floor = line.split(",")
        ours[(name, int(n))] = ("failed" if f == "failed" else
                                (float(f), float(fb), float(peak), float(floor)))
    if p.returncode != 0:
        print(f"(bench_attention exited {p.returncode}; rows it did not reach are missing)")
    return ours


def fmt(x, spec=".2f"):
    return "-" if x is None else (x if isinstance(x, str) else format(x, spec))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", default="build/bench/bench_attention")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--ns", default=ALL_NS)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--mechanisms", default="")
    ap.add_argument("--raw", default="")
    ap.add_argument("--flash-engine", default="", choices=["", "tiled", "mma", "cudnn"])
    a = ap.parse_args()
    import torch
    F = torch.nn.functional
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    ns = [int(s) for s in a.ns.split(",")]
    raw = ["d,mechanism,B,N,side,fwd_ms,fwdbwd_ms,peak_MiB"]
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; {a.dtype}, "
          f"H = {a.heads}, B x N = {a.tokens} tokens\n")
    for d in (int(s) for s in a.dims.split(",")):
        eager.B, eager.H, eager.D = 1, a.heads, d  # the composites read D for their scales
        eager.FAVOR_M = int(d * __import__("math").log(d))
        comps = eager.mechanisms(torch)
        names = a.mechanisms.split(",") if a.mechanisms else list(comps.keys())
        ours = run_ours(a, d)
        print(f"### d = dv = {d}\n")
        print("| mechanism | B | N | ours fwd ms | eager fwd ms | ours fwd+bwd ms | eager fwd+bwd ms "
              "| eager/ours (fwd+bwd) | ours / bandwidth floor (fwd+bwd) "
              "| SDPA fwd+bwd ms: flash / cudnn / efficient "
              "| ours / fastest SDPA throughput (fwd, fwd+bwd) | ours TFLOP/s (fwd, fwd+bwd) "
              "| ours peak MiB | eager peak MiB | SDPA peak MiB (fastest) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name in names:
            for n in ns:
                b = max(1, a.tokens // n)
                o = ours.get((name, n))
                x = make_inputs(torch, b, a.heads, n, d, dtype)
                t = torch_run(torch, comps[name], x)
                sdpa = {}
                if name in SOFTMAX_LIKE:
                    for backend in SDPA_BACKENDS:
                        sdpa[backend] = torch_run(torch, sdpa_fn(torch, backend, SOFTMAX_LIKE[name]), x)
                del x
                of, ofb, opk, ofl = o if isinstance(o, tuple) else (o, None, None, None)
                tf, tfb, tpk = t if isinstance(t, tuple) else (t, None, None)
                ran = [r for r in sdpa.values() if isinstance(r, tuple)]
                best_f = min((r[0] for r in ran), default=None)
                best_fb = min((r[1] for r in ran), default=None)
                best_pk = min(ran, key=lambda r: r[1])[2] if ran else None
                ratio = tfb / ofb if isinstance(t, tuple) and isinstance(o, tuple) else None
                sratio = (f"{best_f / of:.2f}, {best_fb / ofb:.2f}"
                          if ran and isinstance(o, tuple) else None)
                fl = flops_fwd(name, b, a.heads, n, d)
                tflops = (f"{fl / (of * 1e-3) / 1e12:.1f}, {fl * 3.5 / (ofb * 1e-3) / 1e12:.1f}"
                          if fl and isinstance(o, tuple) else None)
                sdpa_ms = (" / ".join(fmt(r[1] if isinstance(r, tuple) else r) for r in sdpa.values())
                           if sdpa else None)
                over_floor = ofb / ofl if isinstance(o, tuple) and ofl else None
                print(f"| {name} | {b} | {n} | {fmt(of)} | {fmt(tf)} | {fmt(ofb)} | {fmt(tfb)} | "
                      f"{fmt(ratio)} | {fmt(over_floor, '.1f')} | {fmt(sdpa_ms)} | {fmt(sratio)} | "
                      f"{fmt(tflops)} | "
                      f"{fmt(opk, '.1f')} | {fmt(tpk, '.1f')} | {fmt(best_pk, '.1f')} |")
                sys.stdout.flush()
                sides = [("ours", o), ("eager", t)] + [(f"sdpa_{k}", r) for k, r in sdpa.items()]
                for side, r in sides:
                    if r is not None:
                        vals = r[:3] if isinstance(r, tuple) else (r, r, r)
                        raw.append(f"{d},{name},{b},{n},{side}," + ",".join(str(v) for v in vals))
        print()
    if a.raw:
        with open(a.raw, "w") as f:
            f.write("\n".join(raw) + "\n")


if __name__ == "__main__":
    main()
