#!/usr/bin/python3
"""Checks an `attnforge export --format timm` directory with timm itself.

    python3 tests/export/check_timm.py EXPORT_DIR PRED.jsonl IMAGE...

Builds timm.create_model(config["timm"]["model_name"], pretrained=False,
**config["timm"]["kwargs"]), loads model.safetensors with strict=True (every
name and shape must be timm's), runs the IMAGEs (PNG / JPEG) prepared as
config["card"]["input"] says (shorter side resized to floor(size / crop_pct)
with PIL's filter of that name, centre crop, u8 / 255, mean / std), and
compares the logits with those `attnforge predict CKPT IMAGE... --out
PRED.jsonl` wrote. PIL rounds the resized picture to 8 bits where attnforge
keeps it in f32, so the logits agree to about 1e-3, not to rounding: the
check is the worst difference relative to the row's largest logit (<= 2e-2)
and the same top-1 class for every image. Exit status 1 on a failure. Needs
torch, timm, safetensors and PIL (the GPU machine has them; Debian has no timm).
"""
import json
import math
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

import timm


def prepare(path, card_input):
    size = int(card_input["size"])
    crop_pct = float(card_input.get("crop_pct", 0.875))
    resample = Image.BICUBIC if card_input.get("interpolation") == "bicubic" else Image.BILINEAR
    img = Image.open(path).convert("RGB")
    w, h = img.size
    short = math.floor(size / crop_pct)
    if w <= h:
        nw, nh = short, int(short * h / w)
    else:
        nw, nh = int(short * w / h), short
    img = img.resize((nw, nh), resample)
    left, top = int(round((nw - size) / 2.0)), int(round((nh - size) / 2.0))
    img = img.crop((left, top, left + size, top + size))
    x = np.asarray(img, dtype=np.float32) / 255.0
    mean = np.array(card_input["mean"], dtype=np.float32)
    std = np.array(card_input["std"], dtype=np.float32)
    x = (x - mean) / std
    return torch.from_numpy(x.transpose(2, 0, 1).copy())


def main():
    export_dir, pred_path, images = sys.argv[1], sys.argv[2], sys.argv[3:]
    with open(f"{export_dir}/config.json") as f:
        config = json.load(f)
    spec = config["timm"]
    model = timm.create_model(spec["model_name"], pretrained=False, **spec["kwargs"])
    missing, unexpected = model.load_state_dict(load_file(f"{export_dir}/model.safetensors"),
                                                strict=True)
    print(f"timm {timm.__version__}: {spec['model_name']} {spec['kwargs']} loaded strictly "
          f"({len(model.state_dict())} tensors)")
    model.eval()
    with open(pred_path) as f:
        preds = [json.loads(line) for line in f if line.strip()]
    assert len(preds) == len(images), f"{len(preds)} predictions for {len(images)} images"
    x = torch.stack([prepare(p, config["card"]["input"]) for p in images])
    with torch.no_grad():
        logits = model(x).double()
    worst, same = 0.0, 0
    for k, pred in enumerate(preds):
        ours = torch.tensor(pred["logits"], dtype=torch.float64)
        err = (logits[k] - ours).abs().max().item() / max(ours.abs().max().item(), 1e-12)
        worst = max(worst, err)
        same += int(logits[k].argmax().item() == ours.argmax().item())
    ok = worst <= 2e-2 and same == len(images)
    print(f"timm's logits against attnforge predict: worst relative difference {worst:.2e}, "
          f"top-1 agrees on {same}/{len(images)}: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
