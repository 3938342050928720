#!/usr/bin/env python3
"""Peer of `dtrain data bench` for data.dataset: image-folder: torchvision's PIL path,
step for step, on Pillow and NumPy (Debian's python3-pil, python3-numpy).

  make DIR [--classes C] [--per-class N] [--val-per-class N] [--seed S]
      writes DIR/train/<class>/*.jpg and DIR/val/<class>/*.jpg: JPEG quality 90, sizes
      drawn in [256, 640] x [224, 512] (ImageNet's typical photo), smooth colour fields
      with grain, so that decoding costs what a photograph's does.
  time DIR [--batch B] [--batches K] [--workers W] [--size S] [--split train|test]
      the samples per second of what torchvision's ImageFolder + DataLoader does with
      RandomResizedCrop(S) + RandomHorizontalFlip + ToTensor + Normalize (train) or
      Resize(S / 0.875) + CenterCrop(S) + ToTensor + Normalize (test): PIL decode,
      convert("RGB"), torchvision's crop-box rule, PIL's bilinear resize (which filters
      when shrinking, as torchvision's antialias does), float32 CHW, ImageNet
      normalisation, batches stacked. W > 0: a pool of W processes each making whole
      batches in order (DataLoader's workers; only their labels come back, the batch's
      transfer to this process is not counted); W = 0: in this process. Timed from
      opening the pool to the K-th batch, as dtrain data bench times from opening the feed.
      Prints one JSON line.
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time

import numpy as np
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


def make(args):
    rng = np.random.default_rng(args.seed)
    for split, n in (("train", args.per_class), ("val", args.val_per_class)):
        for c in range(args.classes):
            d = os.path.join(args.dir, split, f"class{c:03d}")
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                w, h = int(rng.integers(256, 641)), int(rng.integers(224, 513))
                # A smooth field from a coarse grid, bilinear-upsampled, plus grain.
                coarse = rng.integers(0, 256, size=(6, 8, 3)).astype(np.uint8)
                field = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BILINEAR))
                grain = rng.normal(0, 12, size=(h, w, 3))
                px = np.clip(field + grain, 0, 255).astype(np.uint8)
                Image.fromarray(px).save(os.path.join(d, f"{i:05d}.jpg"), quality=90)


def files_of(root, split):
    """ImageFolder's samples: sorted class directories, files sorted within each."""
    d = os.path.join(root, "train" if split == "train" else "val")
    classes = sorted(e.name for e in os.scandir(d) if e.is_dir())
    out = []
    for k, c in enumerate(classes):
        for base, _, names in sorted(os.walk(os.path.join(d, c), followlinks=True)):
            out += [(os.path.join(base, n), k) for n in sorted(names) if n.endswith(".jpg")]
    return out


def crop_params(rnd, width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rnd.uniform(*scale)
        aspect = math.exp(rnd.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rnd.randint(0, height - h), rnd.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def sample(path, split, size, rnd):
    with open(path, "rb") as f:
        img = Image.open(f).convert("RGB")
    if split == "train":
        i, j, h, w = crop_params(rnd, *img.size)
        img = img.resize((size, size), Image.BILINEAR, box=(j, i, j + w, i + h))
        if rnd.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
    else:
        short = int(size / 0.875)
        width, height = img.size
        if width < height:
            img = img.resize((short, int(short * height / width)), Image.BILINEAR)
        else:
            img = img.resize((int(short * width / height), short), Image.BILINEAR)
        left = int(round((img.size[0] - size) / 2.0))
        top = int(round((img.size[1] - size) / 2.0))
        img = img.crop((left, top, left + size, top + size))
    x = np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0
    return (x - MEAN) / STD


def batch(job):
    items, split, size, seed = job
    rnd = random.Random(seed)
    xs = [sample(p, split, size, rnd) for p, _ in items]
    return np.stack(xs), np.array([k for _, k in items], dtype=np.int64)


def batch_labels(job):
    """A worker's batch, of which only the labels travel back: DataLoader hands tensors
    over in shared memory, a pool would pickle 19 MB a batch, so the transfer is left
    out (in the peer's favour)."""
    return batch(job)[1]


def time_it(args):
    samples = files_of(args.dir, args.split)
    order = list(range(len(samples)))
    if args.split == "train":
        random.Random(args.seed).shuffle(order)
    jobs = []
    for k in range(args.batches):
        idx = [order[(k * args.batch + t) % len(order)] for t in range(args.batch)]
        jobs.append(([samples[i] for i in idx], args.split, args.size, args.seed * 1000003 + k))
    t0 = time.perf_counter()
    n = 0
    if args.workers == 0:
        for j in jobs:
            n += len(batch(j)[1])
    else:
        with mp.get_context("fork").Pool(args.workers) as pool:
            for labels in pool.imap(batch_labels, jobs):
                n += len(labels)
    s = time.perf_counter() - t0
    print(json.dumps({"peer": f"Pillow {Image.__version__} + NumPy {np.__version__} "
                               "(torchvision's PIL path)",
                      "workers": args.workers, "samples": n, "seconds": s,
                      "samples_per_s": n / s}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--classes", type=int, default=4)
    m.add_argument("--per-class", type=int, default=100)
    m.add_argument("--val-per-class", type=int, default=25)
    m.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("time")
    t.add_argument("dir")
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--batches", type=int, default=10)
    t.add_argument("--workers", type=int, default=0)
    t.add_argument("--size", type=int, default=224)
    t.add_argument("--split", choices=["train", "test"], default="train")
    t.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    make(args) if args.cmd == "make" else time_it(args)


if __name__ == "__main__":
    sys.exit(main())
