#!/usr/bin/python3
"""The MLP of `tandem train` in PyTorch: 784-512-256-10, ReLU, dropout 0.3, Adam lr 1e-3,
Fashion-MNIST scaled to [0, 1], a fresh shuffle per epoch, the last partial batch kept.

    /usr/bin/python3 bench/mlp_pytorch.py --epochs 1            # accuracy after 1 epoch
    /usr/bin/python3 bench/mlp_pytorch.py --steps 300 --batch 64 --threads 1   # speed

Prints one JSON line: samples_per_sec (training steps only, as tandem reports it) and, after
whole epochs, test_accuracy.
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

DIR = "/usr/share/datasets/fashion-mnist"


def idx(name):
    p = os.path.join(DIR, name)
    op = gzip.open if os.path.exists(p + ".gz") else open
    with op(p + ".gz" if os.path.exists(p + ".gz") else p, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--loader", choices=["tensor", "dataloader"], default="tensor",
                    help="tensor: gather batches from preloaded tensors (the training loop alone); "
                         "dataloader: TensorDataset + DataLoader(shuffle=True), as most scripts do")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr = torch.from_numpy(idx("train-images-idx3-ubyte").reshape(-1, 784).astype(np.float32) / 255.0)
    ytr = torch.from_numpy(idx("train-labels-idx1-ubyte").astype(np.int64))
    xte = torch.from_numpy(idx("t10k-images-idx3-ubyte").reshape(-1, 784).astype(np.float32) / 255.0)
    yte = torch.from_numpy(idx("t10k-labels-idx1-ubyte").astype(np.int64))
    layers = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                 torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                 torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(layers.parameters(), lr=1e-3)
    N, B = xtr.shape[0], a.batch
    per_epoch = (N + B - 1) // B
    total = a.steps if a.steps > 0 else a.epochs * per_epoch
    step, train_time, samples, measured = 0, 0.0, 0, 0
    result = {}
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xtr, ytr), batch_size=B, shuffle=True)

    def batches():
        if a.loader == "dataloader":
            it = iter(loader)
            while True:
                t0 = time.perf_counter()  # fetching the batch counts, as in tandem
                try:
                    x, y = next(it)
                except StopIteration:
                    return
                yield t0, x, y
        else:
            perm = torch.randperm(N)
            for b in range(0, N, B):
                t0 = time.perf_counter()
                i = perm[b:b + B]
                yield t0, xtr[i], ytr[i]

    while step < total:
        layers.train()
        for t0, x, y in batches():
            if step >= total:
                break
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(layers(x), y)
            loss.backward()
            opt.step()
            dt = time.perf_counter() - t0
            if a.steps == 0 or step >= a.warmup:  # speed runs skip the first steps
                train_time += dt
                samples += x.shape[0]
            step += 1
        if a.steps == 0:
            layers.eval()
            with torch.no_grad():
                acc = (layers(xte).argmax(1) == yte).float().mean().item()
            result["test_accuracy"] = acc
    result["samples_per_sec"] = samples / train_time
    result["batch"] = B
    result["threads"] = a.threads
    result["loader"] = a.loader
    print(json.dumps(result))


if __name__ == "__main__":
    main()
