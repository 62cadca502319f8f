#!/usr/bin/python3
"""Checks an `attnforge export --format pytorch` directory of a language model or an
encoder-decoder against `attnforge generate --logits`.

    /usr/bin/python3 tests/export/check_generate.py EXPORT_DIR LOGITS.jsonl [--tol 1e-5]

LOGITS.jsonl has a line per token attnforge drew: the tokens before it ("context"),
the encoder's input ("source", encoder-decoders) and the "logits" it drew from. The
export's model.py (torch only) computes the logits of the last context token over the
last max_len tokens (the references' generate loop, teacher-forced with attnforge's
tokens); a line's error is max |ours - attnforge's| / max |attnforge's|. The worst is
printed; the exit status is 1 when it exceeds --tol, or when there is no line.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_export import load_model  # noqa: E402  (the export's own model.py)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export_dir")
    p.add_argument("logits")
    p.add_argument("--tol", type=float, default=1e-5, help="largest relative error (default 1e-5)")
    args = p.parse_args()

    with open(os.path.join(args.export_dir, "config.json")) as f:
        m = json.load(f)["model"]
    model = load_model(args.export_dir)
    seq2seq = m["type"] == "encoder_decoder"
    window = m["target_max_len"] if seq2seq else m["max_len"]
    with open(args.logits) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    if not lines:
        print(f"FAIL: {args.logits} has no line")
        return 1
    worst, at = 0.0, 0
    with torch.no_grad():
        for i, line in enumerate(lines):
            tokens = torch.tensor([line["context"][-window:]], dtype=torch.int64)
            if seq2seq:
                out = model(torch.tensor([line["source"]], dtype=torch.int64), tokens)
            else:
                out = model(tokens)
            ours = out[0, -1].to(torch.float64)
            theirs = torch.tensor(line["logits"], dtype=torch.float64)
            err = float((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1e-30))
            if err > worst:
                worst, at = err, i
    ok = worst <= args.tol
    kind = m["attention"]["per_layer"] or m["attention"]["kind"]
    print(f"{'ok' if ok else 'FAIL'}: {len(lines)} draws, {m['type']} {kind}: worst relative "
          f"error {worst:.3g} (draw {at}; tol {args.tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
