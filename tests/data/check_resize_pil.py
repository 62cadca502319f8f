#!/usr/bin/python3
"""Compares attnforge's evaluation resize + centre crop with PIL's.

    /usr/bin/python3 tests/data/check_resize_pil.py DIR

DIR/cases.txt lines "K SIZE CROP_PCT FILTER": DIR/inK.png is the input,
DIR/outK.f32 attnforge's transform_image (eval, unnormalised: f32 [3, S, S]
in [0, 1]). PIL: Image.resize to the shorter side floor(SIZE / CROP_PCT) (the
longer one int(short * long / short), as torchvision's Resize(int)) with
Image.BILINEAR or Image.BICUBIC, then the centre SIZE x SIZE crop at
round((side - SIZE) / 2). PIL rounds to 8 bits after its horizontal and its
vertical pass, attnforge keeps f32 throughout, so values are compared in 8-bit
levels: at most 1.1 apart anywhere and 0.3 on average. Exit status 1 when a
case is further apart.
"""
import math
import sys

import numpy as np
from PIL import Image

FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


def main():
    d = sys.argv[1]
    failed = 0
    for line in open(f"{d}/cases.txt"):
        k, size, crop_pct, name = line.split()
        size, crop_pct = int(size), float(crop_pct)
        img = Image.open(f"{d}/in{k}.png").convert("RGB")
        w, h = img.size
        short = math.floor(size / crop_pct)
        nw, nh = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
        r = img.resize((nw, nh), FILTERS[name])
        top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
        ref = np.asarray(r.crop((left, top, left + size, top + size)), dtype=np.float64)
        ours = np.fromfile(f"{d}/out{k}.f32", dtype=np.float32).reshape(3, size, size)
        ours = ours.transpose(1, 2, 0).astype(np.float64) * 255.0
        diff = np.abs(ours - ref)
        ok = diff.max() <= 1.1 and diff.mean() <= 0.3
        failed += not ok
        print(f"case {k}: {h}x{w} -> {nh}x{nw} {name}, crop {size}: max {diff.max():.3f} "
              f"mean {diff.mean():.3f} levels: {'ok' if ok else 'FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
