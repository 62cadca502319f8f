#!/usr/bin/python3
"""Checks an `attnforge export --format pytorch` directory against `attnforge predict`.

    /usr/bin/python3 tests/export/check_export.py EXPORT_DIR INPUT PRED.jsonl [--tol 1e-5]

Loads the model with the export's own model.py (torch only), runs INPUT through
it and compares every logit with the "logits" of the matching line of PRED.jsonl
(written by `attnforge predict RUN INPUT --out PRED.jsonl`, same order). A row's
error is max |ours - attnforge's| / max |attnforge's logits of that row|; the
worst is printed, and the exit status is 1 when it exceeds --tol.

INPUT is prepared as config["card"]["input"] says, like predict does:
  - vit: an IDX file of u8 images [N, H, W] (gzip or plain), H = W = the model's
    image size (no resizing here), gray; x = (u8 / 255 - mean) / std.
  - sequence_classifier: a text file, one example a line (blank lines skipped),
    the text in the last tab-separated column. ListOps: tokens split on spaces,
    "(" and ")" dropped, the others mapped through card.input.vocabulary;
    "bytes + 1" tokenizers (text, retrieval): UTF-8 byte b -> b + 1. Truncated
    to card.input.max_length; a batch is padded with 0 and a mask.
"""
import argparse
import gzip
import importlib.util
import json
import os
import struct
import sys

import torch


def load_model(export_dir):
    spec = importlib.util.spec_from_file_location("attnforge_export_model",
                                                  os.path.join(export_dir, "model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load(export_dir)


def read_idx_images(path):
    """u8 [N, H, W] from an IDX file (gzip or plain)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if data[:3] != b"\x00\x00\x08" or data[3] != 3:
        sys.exit(f"{path}: not an IDX file of u8 images [N, H, W]")
    n, h, w = struct.unpack(">3I", data[4:16])
    x = torch.frombuffer(bytearray(data[16:16 + n * h * w]), dtype=torch.uint8)
    return x.reshape(n, h, w)


def image_batches(path, card_input, batch):
    images = read_idx_images(path)
    size = card_input["size"]
    if card_input["channels"] != 1 or images.shape[1:] != (size, size):
        sys.exit(f"{path}: images {tuple(images.shape[1:])}; this check takes gray {size}x{size} "
                 "images (it does not resize)")
    mean, std = card_input["mean"][0], card_input["std"][0]
    for i in range(0, len(images), batch):
        x = images[i:i + batch].to(torch.float32) / 255
        yield ((x - mean) / std)[:, None],


def tokenize(text, card_input):
    tokenizer = card_input.get("tokenizer", "")
    if tokenizer.startswith("listops"):
        ids = {name: i for i, name in enumerate(card_input["vocabulary"])}
        tokens = [ids[t] for t in text.split(" ") if t and t not in ("(", ")")]
    elif tokenizer.startswith("bytes + 1"):
        tokens = [b + 1 for b in text.encode("utf-8")]
    else:
        sys.exit(f"tokenizer {tokenizer!r} is not handled by this check")
    return tokens[:card_input["max_length"]]


def token_batches(path, card_input, batch):
    with open(path, encoding="utf-8") as f:
        lines = [l.rstrip("\r\n") for l in f]
    rows = [tokenize(l.split("\t")[-1], card_input) for l in lines if l.strip(" \t")]
    for i in range(0, len(rows), batch):
        part = rows[i:i + batch]
        n = max(len(r) for r in part)
        tokens = torch.zeros(len(part), n, dtype=torch.int64)
        mask = torch.zeros(len(part), n, dtype=torch.bool)
        for b, r in enumerate(part):
            tokens[b, :len(r)] = torch.tensor(r, dtype=torch.int64)
            mask[b, :len(r)] = True
        yield tokens, mask


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export_dir")
    p.add_argument("input")
    p.add_argument("predictions")
    p.add_argument("--tol", type=float, default=1e-5, help="largest relative error (default 1e-5)")
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()

    with open(os.path.join(args.export_dir, "config.json")) as f:
        config = json.load(f)
    model = load_model(args.export_dir)
    card_input = config["card"]["input"]
    batches = (image_batches if config["model"]["type"] == "vit" else token_batches)(
        args.input, card_input, args.batch_size)
    with torch.no_grad():
        ours = torch.cat([model(*b).to(torch.float64) for b in batches])
    with open(args.predictions) as f:
        theirs = torch.tensor([json.loads(l)["logits"] for l in f if l.strip()], dtype=torch.float64)
    if ours.shape != theirs.shape:
        print(f"FAIL: {tuple(ours.shape)} logits from the export, {tuple(theirs.shape)} in "
              f"{args.predictions}")
        return 1
    scale = theirs.abs().amax(1).clamp(min=1e-30)
    err = ((ours - theirs).abs().amax(1) / scale)
    worst = int(err.argmax())
    kind = config["model"]["attention"]["per_layer"] or config["model"]["attention"]["kind"]
    ok = bool(err[worst] <= args.tol)
    print(f"{'ok' if ok else 'FAIL'}: {len(err)} examples, {config['model']['type']} {kind}: "
          f"worst relative error {float(err[worst]):.3g} (example {worst}; tol {args.tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
