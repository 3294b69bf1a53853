#!/usr/bin/python3
"""Writes tests/golden/fixtures/resnet_small.safetensors with PyTorch (Debian's python3-torch):

    /usr/bin/python3 tests/golden/make_resnet_fixture.py

A small ResNet in torchvision's structure and names (a 3x3 stem, basic blocks of conv-BN-ReLU-conv-BN
plus the identity or a 1x1 conv + BN projection, global average pooling, fc) on 1x8x8 images:
  init.<name>     every parameter and running statistic (num_batches_tracked left out), randomised
                  (BN weights, biases and running statistics too, so nothing is trivially 1 or 0)
  x0, x1, x2, y0, y1, y2   three batches
  train.logits, train.loss, grad.<name>    step 1 in training mode: the output, loss, every gradient
  after.<name>    every parameter and running statistic after 3 SGD steps (lr 0.1, momentum 0.9,
                  nesterov, weight decay 5e-4 on conv and fc weights only) on batches 0, 1, 2
  eval.logits     evaluation mode on batch 0 after those steps (the running statistics normalise)
The C test (tests/golden/test_golden_resnet.c) needs only the committed file.
"""
import json
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_resnet import ResNet

torch.manual_seed(4321)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "resnet_small.safetensors")


def Net():  # stages of 2 and 1 blocks, width 4: identity and projection shortcuts both
    return ResNet(1, 4, [2, 1], 5)


def state(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items() if not k.endswith("num_batches_tracked")}


def save(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        b = t.numpy().tobytes()
        header[name] = {"dtype": {torch.float32: "F32", torch.int32: "I32"}[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    print(f"wrote {path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes")


net = Net()
with torch.no_grad():
    for name, mod in net.named_modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.weight.copy_(1 + 0.2 * torch.randn_like(mod.weight))
            mod.bias.copy_(0.2 * torch.randn_like(mod.bias))
            mod.running_mean.copy_(0.1 * torch.randn_like(mod.running_mean))
            mod.running_var.copy_(1 + 0.3 * torch.rand_like(mod.running_var))
out = {f"init.{k}": v for k, v in state(net).items()}
xs = [torch.randn(6, 1, 8, 8) for _ in range(3)]
ys = [torch.randint(0, 5, (6,), dtype=torch.int32) for _ in range(3)]
for i in range(3):
    out[f"x{i}"], out[f"y{i}"] = xs[i], ys[i]

decay = [p for n, p in net.named_parameters() if n.endswith("weight") and p.dim() > 1]
no_decay = [p for n, p in net.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
                      lr=0.1, momentum=0.9, nesterov=True)
net.train()
for step in range(3):
    opt.zero_grad()
    logits = net(xs[step])
    loss = F.cross_entropy(logits, ys[step].long())
    loss.backward()
    if step == 0:
        out["train.logits"], out["train.loss"] = logits, loss.reshape(1)
        for n, p in net.named_parameters():
            out[f"grad.{n}"] = p.grad.clone()
        for k, v in state(net).items():
            if "running" in k:
                out[f"step1.{k}"] = v
    opt.step()
for k, v in state(net).items():
    out[f"after.{k}"] = v
net.eval()
with torch.no_grad():
    out["eval.logits"] = net(xs[0])
save(OUT, out)
