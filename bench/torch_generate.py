#!/usr/bin/python3
"""Generation speed: the references' generate loop in PyTorch against `attnforge generate`,
on the same trained model, in the same run.

    attnforge export runs/fortunes --out /tmp/fortunes-pt
    /usr/bin/python3 bench/torch_generate.py --ours build/apps/attnforge --run runs/fortunes \\
        --export /tmp/fortunes-pt [--lengths 250,2000] [--threads 2] [--repeats 3]

The PyTorch side is performer-pytorch's AutoregressiveWrapper.generate (and
linear-attention-transformer's, the same loop) as they write it: under no_grad,
for every new token the model runs over the last max_len tokens, its last
logits go through the top-k filter (filter_thres 0.9: the top 10% of the
vocabulary kept), softmax and torch.multinomial. The model is the run's
export (model.py, plain PyTorch: each mechanism computed directly, which at
a few hundred positions is as fast in eager PyTorch as the references'
prefix sums). Ours is `attnforge generate --filter-thres 0.9` with its
decoding state (rebuilt past the window) and with --exact-window (the same
loop as the references'). Each side runs in its own process with the same
thread count; the prompt is "The ". Prints a Markdown table of tokens/s
(median of --repeats runs) and ours / torch.
"""
import argparse
import re
import statistics
import subprocess
import sys

TORCH_SIDE = r"""
import importlib.util, json, os, sys, time
import torch
import torch.nn.functional as F
export, length, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
torch.manual_seed(0)
spec = importlib.util.spec_from_file_location("exported", os.path.join(export, "model.py"))
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
model = module.load(export)
max_len = json.load(open(os.path.join(export, "config.json")))["model"]["max_len"]

def top_k(logits, thres=0.9):      # performer-pytorch's filter
    k = int((1 - thres) * logits.shape[-1])
    val, ind = torch.topk(logits, k)
    probs = torch.full_like(logits, float("-inf"))
    probs.scatter_(1, ind, val)
    return probs

out = torch.tensor([list(b"The ")], dtype=torch.int64)
start = time.perf_counter()
with torch.no_grad():
    for _ in range(length):
        x = out[:, -max_len:]
        logits = model(x)[:, -1, :]
        probs = F.softmax(top_k(logits) / 1.0, dim=-1)
        out = torch.cat((out, torch.multinomial(probs, 1)), dim=-1)
print(length / (time.perf_counter() - start))
"""


def torch_rate(export, length, threads):
    out = subprocess.run([sys.executable, "-c", TORCH_SIDE, export, str(length), str(threads)],
                         check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def ours_rate(binary, run, length, threads, exact):
    cmd = [binary, "generate", run, "--prompt", "The ", "--length", str(length),
           "--filter-thres", "0.9", "--set", f"threads={threads}"]
    if exact:
        cmd.append("--exact-window")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    found = re.search(r"([0-9.]+) tokens/s", out.stderr)
    if not found:
        sys.exit(f"no tokens/s in the output of {' '.join(cmd)}:\n{out.stderr}")
    return float(found.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ours", required=True, help="the attnforge program")
    p.add_argument("--run", required=True, help="a run or checkpoint of a language model")
    p.add_argument("--export", required=True, help="its `attnforge export --format pytorch` directory")
    p.add_argument("--lengths", default="250,2000")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print(f"| new tokens | torch loop tok/s | ours, state tok/s | ours / torch | ours, --exact-window tok/s "
          f"| ours exact / torch |")
    print("|---|---|---|---|---|---|")
    for length in [int(n) for n in args.lengths.split(",")]:
        median = lambda f: statistics.median(f() for _ in range(args.repeats))
        t = median(lambda: torch_rate(args.export, length, args.threads))
        state = median(lambda: ours_rate(args.ours, args.run, length, args.threads, False))
        exact = median(lambda: ours_rate(args.ours, args.run, length, args.threads, True))
        print(f"| {length} | {t:.0f} | {state:.0f} | {state / t:.1f}x | {exact:.0f} | {exact / t:.2f}x |",
              flush=True)


if __name__ == "__main__":
    main()
