#!/usr/bin/python3
"""The training step of `tandem train --model resnet|cnn` in PyTorch 1.13, timed: resnet20
(CIFAR-style basic blocks, 1x1 projection shortcuts, width 16) or the small CNN (conv5x5(16)-pool-
conv5x5(32)-pool-dropout-fc) on 1x28x28 inputs, SGD momentum 0.9, batch B, T threads.

    /usr/bin/python3 bench/resnet_pytorch.py --model resnet --batch 128 --threads 1 --steps 10

Prints one JSON line: samples_per_sec over the steps after --warmup, and flop_per_sample (the
training step's multiply-adds x 2: forward, input gradients (not the first conv's) and weight
gradients of every conv and linear layer), so both sides are set against the same count.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
from torch_resnet import ResNet  # noqa: E402  (the same model the golden test is made with)


def cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 5, 1, 2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 5, 1, 2), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.3), nn.Linear(32 * 7 * 7, 10))


def flop_per_sample(model):
    macs, first = [0], [True]

    def hook(mod, inp, out):
        if isinstance(mod, nn.Conv2d):
            m = out[0].numel() * mod.in_channels * mod.kernel_size[0] * mod.kernel_size[1] // mod.groups
        else:
            m = mod.in_features * mod.out_features
        macs[0] += m * (2 if first[0] else 3)  # forward + weight grads (+ input grads but for the first layer)
        first[0] = False

    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model(torch.zeros(1, 1, 28, 28))
    for h in hs:
        h.remove()
    return 2 * macs[0]


ap = argparse.ArgumentParser()
ap.add_argument("--model", default="resnet", choices=["resnet", "cnn"])
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--warmup", type=int, default=3)
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
model = ResNet(1, 16, [3, 3, 3], 10) if a.model == "resnet" else cnn()
fps = flop_per_sample(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model.train()
x = torch.rand(a.batch, 1, 28, 28)
y = torch.randint(0, 10, (a.batch,))
t = None
for s in range(a.warmup + a.steps):
    if s == a.warmup:
        t = time.perf_counter()
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
dt = time.perf_counter() - t
print(json.dumps({"samples_per_sec": a.steps * a.batch / dt, "flop_per_sample": fps}))
