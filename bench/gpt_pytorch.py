#!/usr/bin/python3
"""PyTorch's side of bench/gpt_vs_pytorch.sh: GPT training steps (forward, cross-entropy,
backward, AdamW; fp32, or --autocast bf16: torch.autocast("cpu", dtype=torch.bfloat16) around the
forward and the loss, the parameters and AdamW staying fp32) on random tokens, with nanoGPT's model (the reference the golden tests
use: tests/golden/make_fixtures.py) and nanoGPT's optimizer settings (decay 0.1 on matrices,
betas 0.9/0.95, zero_grad(set_to_none=True)).

    OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/gpt_pytorch.py \
        --layers 4 --heads 4 --width 256 --vocab 256 --block 128 --batch 4 --seq 64 --threads 1

Prints one JSON object: median ms per step and of the optimizer step, and peak RSS in MiB.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
from make_fixtures import GPT  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    for k, d in (("layers", 4), ("heads", 4), ("width", 256), ("vocab", 256), ("block", 128), ("batch", 4),
                 ("seq", 64), ("threads", 1), ("steps", 10), ("warmup", 3), ("seed", 1)):
        ap.add_argument("--" + k, type=int, default=d)
    ap.add_argument("--autocast", choices=("none", "bf16"), default="none")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    m = GPT(a.layers, a.heads, a.width, a.block, a.vocab)
    for n, p in m.named_parameters():  # nanoGPT's initialisation
        torch.nn.init.normal_(p, 0.0, 0.02) if p.dim() >= 2 else (torch.nn.init.zeros_(p) if "bias" in n else torch.nn.init.ones_(p))
    decay = [p for p in m.parameters() if p.dim() >= 2]
    no_decay = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95))
    step_ms, opt_ms, cpu_ms = [], [], []
    for s in range(a.warmup + a.steps):
        tok = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
        x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            loss = F.cross_entropy(m(x).view(-1, a.vocab), y.view(-1))
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        if s >= a.warmup:
            step_ms.append((t2 - t0) * 1e3)
            opt_ms.append((t2 - t1) * 1e3)
            cpu_ms.append((time.process_time() - c0) * 1e3)  # every thread: not stretched by other jobs
    print(json.dumps({"ms": statistics.median(step_ms), "opt_ms": statistics.median(opt_ms), "cpu_ms": statistics.median(cpu_ms),
                      "threads": torch.get_num_threads(), "autocast": a.autocast,
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
