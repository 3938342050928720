#!/usr/bin/python3
# PyTorch peer of `dtrain train configs/resnet50-synthetic.yaml`: times one fp32
# eager ResNet-50 v1.5 training step (zero_grad, forward, cross-entropy, backward,
# SGD momentum 0.9) on a fixed random 32x3x224x224 batch and prints one JSON line
# with every step time and the median after the warm-up. --channels-last puts the
# model and the batch in torch.channels_last (NHWC), PyTorch's faster setting for
# convolutional nets on the CPU. --arch vit_b_16: torchvision's ViT-B/16 instead
# (configs/vit-b16-synthetic.yaml: batch 16, AdamW lr 1e-4, weight decay 0.01, no
# dropout, as dtrain's vit-base). Not a test; run it with Debian's /usr/bin/python3
# (python3-torch), OMP_NUM_THREADS set by the caller.
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

# torchvision's models, and dtrain's resnet50 and vit-base at 1000 classes
EXPECTED_PARAMS = {"resnet50": 25_557_032, "vit_b_16": 86_567_656}


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride here: v1.5) -> 1x1 to 4 x planes, + shortcut, ReLU."""

    def __init__(self, cin, planes, stride):
        super().__init__()
        out = 4 * planes
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x):
        h = self.relu(self.bn1(self.conv1(x)))
        h = self.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return self.relu(h + (x if self.downsample is None else self.downsample(x)))


def resnet50_by_hand(classes):
    """The torchvision layout (stem, layers of 3/4/6/3 bottlenecks, avgpool, fc)."""
    layers, cin = [], 64
    for i, blocks in enumerate((3, 4, 6, 3)):
        planes = 64 << i
        for b in range(blocks):
            layers.append(Bottleneck(cin, planes, 2 if (b == 0 and i > 0) else 1))
            cin = 4 * planes
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(cin, classes),
    )


def build_model(source, arch):
    if source == "torchvision":
        import torchvision

        make = torchvision.models.resnet50 if arch == "resnet50" else torchvision.models.vit_b_16
        return make(weights=None), torchvision.__version__
    if arch != "resnet50":
        sys.exit("--model by-hand builds ResNet-50 only")
    return resnet50_by_hand(1000), None


def sync(device):
    """Step times on a GPU count the work, not just its launch."""
    if device != "cpu":
        torch.cuda.synchronize()


def use_fp32(device):
    """On a GPU: plain FP32 maths as dtrain's (no TF32 in matmuls or cuDNN convolutions)."""
    if device != "cpu":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=7, help="timed steps including warm-up")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (scripts/gpu-check.sh)")
    ap.add_argument("--amp", choices=["none", "bf16"], default="none",
                    help="bf16: torch.autocast around forward and loss (fp32 weights and "
                         "optimizer, bf16 compute; no loss scaler needed), PyTorch AMP")
    ap.add_argument("--model", choices=["torchvision", "by-hand"], default="torchvision")
    ap.add_argument("--arch", choices=["resnet50", "vit_b_16"], default="resnet50")
    ap.add_argument("--channels-last", action="store_true",
                    help="model and batch in torch.channels_last (NHWC)")
    args = ap.parse_args()
    if args.steps < args.warmup + 5:
        sys.exit("--steps must leave at least 5 timed steps after --warmup")
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    model, tv_version = build_model(args.model, args.arch)
    params = sum(p.numel() for p in model.parameters())
    want = EXPECTED_PARAMS[args.arch]
    assert params == want, f"{args.arch} has {params} parameters, want {want}"
    use_fp32(args.device)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model.to(args.device, memory_format=fmt).train()
    if args.arch == "resnet50":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand(args.batch, 3, 224, 224).to(args.device).contiguous(memory_format=fmt)
    y = torch.randint(0, 1000, (args.batch,)).to(args.device)
    times = []
    for _ in range(args.steps):
        sync(args.device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=args.device.split(":")[0], dtype=torch.bfloat16,
                            enabled=args.amp == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        sync(args.device)
        times.append(time.perf_counter() - t0)
        assert torch.isfinite(loss), "non-finite loss"
    timed = times[args.warmup:]
    print(json.dumps({
        "median_step_s": statistics.median(timed),
        "step_times_s": times,
        "warmup": args.warmup,
        "params": params,
        "model": args.model,
        "arch": args.arch,
        "batch": args.batch,
        "channels_last": args.channels_last,
        "amp": args.amp,
        "torch": torch.__version__,
        "torchvision": tv_version,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "parallel_info": torch.__config__.parallel_info(),
        "device": args.device,
        "peak_device_bytes": torch.cuda.max_memory_allocated() if args.device != "cpu" else None,
    }))


if __name__ == "__main__":
    main()
