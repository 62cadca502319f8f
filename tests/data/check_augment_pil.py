#!/usr/bin/python3
"""Checks the PIL operations of data/augment_color.cpp and
data/augment_geometry.cpp against PIL itself.

Run by tests/data/test_augment.cpp as `check_augment_pil.py DIR`. DIR holds
the input PNGs, our output PNGs and cases.txt, one case a line:

    <input.png> <output.png> <op> <arguments...>

For each case this applies the PIL call timm (or torchvision, for adjust_hue)
makes to the input and compares it with our output: every case must match
exactly (max abs diff 0). Prints one line per op and the failing cases; exits
1 on any mismatch, 77 when PIL or numpy is missing (the test then skips).
"""
import collections
import os
import sys

try:
    import numpy as np
    from PIL import Image, ImageEnhance, ImageOps
except ImportError as e:  # pragma: no cover
    print(f"check_augment_pil.py: {e}")
    sys.exit(77)

RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
}


def fill_for(img, rgb):
    # A gray image is filled with the first value (augment.h's convention).
    return rgb[0] if img.mode == "L" else tuple(rgb)


def solarize_add(img, add, thresh):
    # timm's solarize_add.
    lut = [min(255, i + add) if i < thresh else i for i in range(256)]
    if img.mode == "RGB":
        lut = lut * 3
    return img.point(lut)


def posterize(img, bits):
    # timm's posterize: 8 or more bits keep the image.
    if bits >= 8:
        return img
    return ImageOps.posterize(img, bits)


def adjust_hue(img, hue_factor):
    # torchvision 0.14's functional_pil.adjust_hue.
    if img.mode in {"L", "1", "I", "F"}:
        return img
    h, s, v = img.convert("HSV").split()
    np_h = np.array(h, dtype=np.uint8)
    with np.errstate(over="ignore"):
        np_h += np.uint8(hue_factor * 255)
    h = Image.fromarray(np_h, "L")
    return Image.merge("HSV", (h, s, v)).convert(img.mode)


def apply(img, op, args):
    if op == "autocontrast":
        return ImageOps.autocontrast(img)
    if op == "equalize":
        return ImageOps.equalize(img)
    if op == "invert":
        return ImageOps.invert(img)
    if op == "posterize":
        return posterize(img, int(args[0]))
    if op == "solarize":
        return ImageOps.solarize(img, int(args[0]))
    if op == "solarize_add":
        return solarize_add(img, int(args[0]), int(args[1]))
    if op == "color":
        return ImageEnhance.Color(img).enhance(float(args[0]))
    if op == "contrast":
        return ImageEnhance.Contrast(img).enhance(float(args[0]))
    if op == "brightness":
        return ImageEnhance.Brightness(img).enhance(float(args[0]))
    if op == "sharpness":
        return ImageEnhance.Sharpness(img).enhance(float(args[0]))
    if op == "affine":
        matrix = tuple(float(a) for a in args[1:7])
        fill = fill_for(img, [int(a) for a in args[7:10]])
        return img.transform(img.size, Image.Transform.AFFINE, matrix, resample=RESAMPLE[args[0]],
                             fillcolor=fill)
    if op == "rotate":
        fill = fill_for(img, [int(a) for a in args[2:5]])
        return img.rotate(float(args[1]), resample=RESAMPLE[args[0]], fillcolor=fill)
    if op == "adjust_hue":
        return adjust_hue(img, float(args[0]))
    raise ValueError(f"unknown op {op!r}")


def main():
    if len(sys.argv) != 2:
        print("usage: check_augment_pil.py DIR")
        return 2
    root = sys.argv[1]
    with open(os.path.join(root, "cases.txt")) as f:
        lines = [line.split() for line in f if line.strip()]
    counts = collections.Counter()
    failures = collections.defaultdict(list)
    for input_name, output_name, op, *args in lines:
        img = Image.open(os.path.join(root, input_name))
        img.load()
        expected = np.asarray(apply(img, op, args), dtype=np.int16)
        ours = np.asarray(Image.open(os.path.join(root, output_name)), dtype=np.int16)
        counts[op] += 1
        if expected.shape != ours.shape:
            failures[op].append(f"{input_name} {op} {' '.join(args)}: shape {ours.shape}, "
                                f"PIL {expected.shape}")
            continue
        diff = np.abs(expected - ours)
        if diff.max() > 0:
            where = np.argwhere(diff > 0)
            first = tuple(int(i) for i in where[0])
            failures[op].append(
                f"{input_name} {op} {' '.join(args)}: max diff {int(diff.max())} at "
                f"{int((diff > 0).sum())} of {diff.size} values, first at (y, x[, c]) {first}: "
                f"ours {int(ours[first])}, PIL {int(expected[first])}")
    for op in sorted(counts):
        print(f"{op}: {counts[op] - len(failures[op])} of {counts[op]} cases exact")
    bad = [line for op in sorted(failures) for line in failures[op]]
    for line in bad[:40]:
        print("MISMATCH " + line)
    if len(bad) > 40:
        print(f"... and {len(bad) - 40} more")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
