#!/usr/bin/python3
"""PyTorch DDP (gloo) training the MLP of `tandem train` (784-512-256-10, ReLU, dropout 0.3, Adam
1e-3) on Fashion-MNIST, one thread per rank, batch B per rank. Prints one JSON line with the
global samples/s after a warm-up.

    /usr/bin/python3 bench/ddp_pytorch.py --ranks 2 --steps 300 --batch 64
"""
import argparse, gzip, json, os, socket, time
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

DIR = "/usr/share/datasets/fashion-mnist"


def idx(name):
    with gzip.open(os.path.join(DIR, name + ".gz"), "rb") as f:
        d = f.read()
    n = d[3]
    dims = [int.from_bytes(d[4 + 4 * i:8 + 4 * i], "big") for i in range(n)]
    return np.frombuffer(d, dtype=np.uint8, offset=4 + 4 * n).reshape(dims)


def rank_main(rank, a, port, q):
    torch.set_num_threads(1)
    if a.ranks > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.ranks)
    torch.manual_seed(0)
    x = torch.from_numpy(idx("train-images-idx3-ubyte").reshape(-1, 784).astype(np.float32) / 255.0)
    y = torch.from_numpy(idx("train-labels-idx1-ubyte").astype(np.int64))
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(256, 10))
    if a.ranks > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    perm = torch.randperm(x.shape[0], generator=g)
    B, W = a.batch, a.ranks
    t_total, n = 0.0, 0
    for s in range(a.steps):
        i = perm[(s * B * W + rank * B) % (x.shape[0] - B * W):][:B]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i]), y[i]).backward()
        opt.step()
        if s >= a.warmup:
            t_total += time.perf_counter() - t0
            n += B
    if a.ranks > 1:
        t = torch.tensor([t_total])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        t_total = t.item()
        dist.destroy_process_group()
    if rank == 0:
        q.put(n * W / t_total)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, a, port, q)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    sps = q.get()
    for p in procs:
        p.join()
    print(json.dumps({"ranks": a.ranks, "batch": a.batch, "samples_per_sec": sps}))
