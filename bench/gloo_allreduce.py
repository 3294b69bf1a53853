#!/usr/bin/python3
"""PyTorch's Gloo all-reduce over loopback TCP, timed as tandem bench times its all-reduce
(mean of -n iterations after -w warm-ups, the slowest rank's), printing nccl-tests columns.

    /usr/bin/python3 bench/gloo_allreduce.py -b 8 -e 64M -f 2 [-n 20] [-w 5] [--ranks 2]
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * m[s[-1].upper()]) if s[-1].upper() in m else int(s)


def rank_main(rank, a, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.ranks)
    P = a.ranks
    if rank == 0:
        print("#       size         count      type   redop    root     time   algbw   busbw #wrong", flush=True)
    s = a.b
    while s <= a.e:
        n = s // 4
        x = torch.ones(n)
        for _ in range(a.w):
            dist.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.n):
            dist.all_reduce(x)
        us = torch.tensor([(time.perf_counter() - t0) / a.n * 1e6], dtype=torch.float64)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        t = us.item()
        if rank == 0:
            alg = n * 4 / t / 1e3
            print(f"{n * 4:12d}  {n:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}  {t:7.2f}  {alg:6.2f}  {alg * 2 * (P - 1) / P:6.2f}  {0:5d}",
                  flush=True)
        s *= a.f
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", type=size, default=8)
    ap.add_argument("-e", type=size, default=32 << 20)
    ap.add_argument("-f", type=int, default=2)
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("-w", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    a = ap.parse_args()
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(rank_main, args=(a, port), nprocs=a.ranks)
