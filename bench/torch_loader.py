#!/usr/bin/env python3
"""Images/s of torchvision's DeiT training pipeline, timed as bench_loader times ours.

    torch_loader.py ROOT [--workers 1,2] [--batches 16] [--batch-size 64] [--out FILE]

ROOT holds train/<class>/*.jpg (bench_loader --print-root gives the synthetic
set bench_loader uses). torchvision's ImageFolder (PIL decoding) with DeiT's
training transform written in torchvision:

    RandomResizedCrop(224, scale=(0.08, 1), interpolation=BICUBIC)
    -> RandomHorizontalFlip() -> RandAugment(num_ops=2, magnitude=9)
    -> ToTensor() -> Normalize(ImageNet mean, std) -> RandomErasing(p=0.25, value='random')

DeiT itself uses timm's RandAugment ("rand-m9-mstd0.5-inc1"); timm is not
packaged in Debian, so torchvision's RandAugment (fixed magnitude 9, its own
op list) stands in. Mixup / cutmix are left out: DeiT applies them in the
training loop, not in the loader. torch.utils.data.DataLoader(shuffle=True,
num_workers=w, batch_size=B); worker processes run torch with one thread
(torch's default for workers, set again in worker_init_fn). One warm-up batch
per worker, then K batches timed, as bench_loader does. The evaluation
transform (Resize(256, BICUBIC) -> CenterCrop(224) -> ToTensor -> Normalize)
is timed once with the largest worker count. Prints a table and one JSON line
per configuration (to stdout, or to --out FILE).
"""
import argparse
import json
import os
import time

import torch
from torch.utils.data import DataLoader
from torchvision import datasets
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SIZE = 224
CROP_PCT = 0.875

TRAIN_DESCRIPTION = (
    "RandomResizedCrop(224, scale=(0.08, 1), bicubic) -> RandomHorizontalFlip(0.5) -> "
    "RandAugment(num_ops=2, magnitude=9) (torchvision's) -> ToTensor -> Normalize(ImageNet) -> "
    "RandomErasing(p=0.25, value='random')"
)
EVAL_DESCRIPTION = "Resize(256, bicubic) -> CenterCrop(224) -> ToTensor -> Normalize(ImageNet)"


def train_transform():
    return T.Compose([
        T.RandomResizedCrop(SIZE, scale=(0.08, 1.0), interpolation=InterpolationMode.BICUBIC),
        T.RandomHorizontalFlip(),
        T.RandAugment(num_ops=2, magnitude=9),
        T.ToTensor(),
        T.Normalize(MEAN, STD),
        T.RandomErasing(p=0.25, value="random"),
    ])


def eval_transform():
    return T.Compose([
        T.Resize(int(SIZE / CROP_PCT), interpolation=InterpolationMode.BICUBIC),
        T.CenterCrop(SIZE),
        T.ToTensor(),
        T.Normalize(MEAN, STD),
    ])


def one_thread(_worker_id):
    torch.set_num_threads(1)


def time_loader(loader, workers, batches):
    """One warm-up batch per worker, then `batches` timed; epochs roll over."""
    it = iter(loader)

    def take():
        nonlocal it
        try:
            images, _ = next(it)
        except StopIteration:
            it = iter(loader)
            images, _ = next(it)
        return images.shape[0]

    for _ in range(max(1, workers)):
        take()
    start = time.perf_counter()
    images = sum(take() for _ in range(batches))
    seconds = time.perf_counter() - start
    return images, seconds


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--batches", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--out", default="")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    workers = [int(w) for w in a.workers.split(",")]
    cores = os.cpu_count()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    train_dir = os.path.join(a.root, "train")

    print(f"torch_loader.py: torch {torch.__version__}, torchvision "
          f"{__import__('torchvision').__version__}, {train_dir}\n  train: {TRAIN_DESCRIPTION}\n"
          f"  eval: {EVAL_DESCRIPTION}\n  {cores} cores, load average {load} (before the runs)")
    print(f"{'loader':<11} {'mode':<6} {'workers':>7} {'batch':>6} {'images':>8} {'images/s':>10}")
    lines = []

    def run(train, w):
        ds = datasets.ImageFolder(train_dir, transform=train_transform() if train else eval_transform())
        g = torch.Generator()
        g.manual_seed(a.seed)
        loader = DataLoader(ds, batch_size=a.batch_size, shuffle=train, num_workers=w,
                            drop_last=True, generator=g, worker_init_fn=one_thread if w else None,
                            persistent_workers=w > 0)
        images, seconds = time_loader(loader, w, a.batches)
        rate = images / seconds
        mode = "train" if train else "eval"
        print(f"{'torchvision':<11} {mode:<6} {w:>7} {a.batch_size:>6} {images:>8} {rate:>10.1f}",
              flush=True)
        lines.append(json.dumps({
            "loader": "torchvision", "mode": mode, "workers": w, "images_per_s": rate,
            "batch_size": a.batch_size, "batches": a.batches, "images": images,
            "seconds": seconds, "cores": cores, "load_average": load, "root": a.root,
            "transform": TRAIN_DESCRIPTION if train else EVAL_DESCRIPTION,
        }))

    for w in workers:
        run(True, w)
    run(False, max(workers))
    if a.out:
        with open(a.out, "w") as f:
            f.write("".join(line + "\n" for line in lines))
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
