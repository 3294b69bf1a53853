#!/usr/bin/python3
"""PyTorch's side of bench/pp_vs_pytorch.sh: a GPT training step cut into pipeline stages, on CPU.

  --mode gpipe|1f1b  a hand-written pipeline over torch.distributed (gloo), one process per stage
                     (P processes, 1 thread each): stage r runs its blocks (the first the embeddings,
                     the last the final norm, the tied head and the loss), activations and their
                     gradients go between neighbours with isend/recv; the tied embedding's gradient
                     is summed between the first and the last stage (all-reduce), as Megatron does;
                     AdamW per stage. GPipe: all forwards, then all backwards; 1F1B: P-1-r forwards,
                     then one forward one backward.
  --mode pipe        torch.distributed.pipeline.sync.Pipe (PyTorch 1.13's GPipe), one process: on CPU
                     every partition is on the one device, so Pipe has one worker and cannot overlap
                     the stages (it runs; it is the library's equivalent).

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/pp_pytorch.py --mode 1f1b --stages 2 --micro 8 --batch 4 --seq 64

Prints one JSON object: the median ms per step (the update included), and per stage the ms spent
computing and the bubble (1 - computing / the step without the update).
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
from make_fixtures import GPT, attention_ref  # noqa: E402


def make_model(a):
    torch.manual_seed(a.seed)
    m = GPT(a.layers, a.heads, a.width, a.block, a.vocab)
    for n, p in m.named_parameters():  # nanoGPT's initialisation
        torch.nn.init.normal_(p, 0.0, 0.02) if p.dim() >= 2 else (torch.nn.init.zeros_(p) if "bias" in n else torch.nn.init.ones_(p))
    return m


def block_fwd(b, x, NH):
    x = x + b.attn.c_proj(attention_ref(b.attn.c_attn(b.ln_1(x)), NH))
    return x + b.mlp.c_proj(F.gelu(b.mlp.c_fc(b.ln_2(x)), approximate="tanh"))


def adamw(params):
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=3e-4,
                             betas=(0.9, 0.95))


def stage_main(rank, a, port, q):
    torch.set_num_threads(1)
    P = a.stages
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P)
    tied = dist.new_group([0, P - 1]) if P > 1 else None
    m = make_model(a)
    t = m.transformer
    per = a.layers // P
    blocks = list(t.h)[rank * per:(rank + 1) * per if rank < P - 1 else a.layers]
    first, last = rank == 0, rank == P - 1
    params = [p for b in blocks for p in b.parameters()]
    if first:
        params += [t.wte.weight, t.wpe.weight]
    if last:
        params += list(t.ln_f.parameters()) + ([t.wte.weight] if not first else [])
    opt = adamw(params)
    B, T, C, M = a.batch, a.seq, a.width, a.micro
    g = torch.Generator().manual_seed(a.seed + 1)

    def forward(mb, x_in):
        if first:
            h = t.wte(mb[0]) + t.wpe(torch.arange(T))
        else:
            h = x_in
        for b in blocks:
            h = block_fwd(b, h, a.heads)
        if last:
            logits = t.ln_f(h) @ t.wte.weight.t()
            return F.cross_entropy(logits.view(-1, a.vocab), mb[1].view(-1)) / M
        return h

    step_ms, busy_ms, idle = [], [], []
    for s in range(a.warmup + a.steps):
        toks = [torch.randint(0, a.vocab, (B, T + 1), generator=g) for _ in range(M)]
        mbs = [(x[:, :-1].contiguous(), x[:, 1:].contiguous()) for x in toks]
        dist.barrier()
        t0 = time.perf_counter()
        busy = 0.0
        opt.zero_grad(set_to_none=True)
        ins, outs, sends = {}, {}, []

        def fwd(i):
            nonlocal busy
            x = None
            if not first:
                x = torch.empty(B, T, C)
                dist.recv(x, rank - 1)
                x.requires_grad_(True)
            c0 = time.perf_counter()
            out = forward(mbs[i], x)
            busy += time.perf_counter() - c0
            ins[i], outs[i] = x, out
            if not last:
                sends.append(dist.isend(out.detach().contiguous(), rank + 1))

        def bwd(i):
            nonlocal busy
            gout = None
            if not last:
                gout = torch.empty(B, T, C)
                dist.recv(gout, rank + 1)
            c0 = time.perf_counter()
            outs[i].backward(gout)
            busy += time.perf_counter() - c0
            if not first:
                sends.append(dist.isend(ins[i].grad.contiguous(), rank - 1))
            del ins[i], outs[i]

        if a.mode == "gpipe":
            for i in range(M):
                fwd(i)
            for i in range(M):
                bwd(i)
        else:
            w = min(P - 1 - rank, M)
            for i in range(w):
                fwd(i)
            for i in range(M - w):
                fwd(w + i)
                bwd(i)
            for i in range(M - w, M):
                bwd(i)
        for r in sends:
            r.wait()
        if P > 1 and (first or last):  # the tied embedding's two parts, summed
            dist.all_reduce(t.wte.weight.grad, group=tied)
        c0 = time.perf_counter()
        opt.step()
        busy_opt = time.perf_counter() - c0
        t1 = time.perf_counter()
        if s >= a.warmup:
            step_ms.append((t1 - t0) * 1e3)
            busy_ms.append(busy * 1e3)
            idle.append(1 - busy / (t1 - t0 - busy_opt))
    q.put((rank, statistics.median(step_ms), statistics.median(busy_ms), statistics.median(idle)))
    dist.destroy_process_group()


def run_pipe(a):
    import torch.distributed.rpc as rpc
    from torch.distributed.pipeline.sync import Pipe
    torch.set_num_threads(a.threads)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(free_port())
    rpc.init_rpc("pipe", rank=0, world_size=1)
    m = make_model(a)
    t = m.transformer
    NH, T, V = a.heads, a.seq, a.vocab

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = t.wte, t.wpe

        def forward(self, idx):
            return self.wte(idx) + self.wpe(torch.arange(T))

    class Blocks(torch.nn.Module):
        def __init__(self, bs):
            super().__init__()
            self.bs = torch.nn.ModuleList(bs)

        def forward(self, x):
            for b in self.bs:
                x = block_fwd(b, x, NH)
            return x

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_f = t.ln_f

        def forward(self, x):
            return self.ln_f(x) @ t.wte.weight.t()

    per = a.layers // a.stages
    parts = [torch.nn.Sequential(Embed(), Blocks(list(t.h)[:per]))]
    for r in range(1, a.stages):
        bs = list(t.h)[r * per:(r + 1) * per if r < a.stages - 1 else a.layers]
        parts.append(torch.nn.Sequential(Blocks(bs), Head()) if r == a.stages - 1 else Blocks(bs))
    pipe = Pipe(torch.nn.Sequential(*parts), chunks=a.micro)
    opt = adamw(list(m.parameters()))
    g = torch.Generator().manual_seed(a.seed + 1)
    step_ms = []
    for s in range(a.warmup + a.steps):
        tok = torch.randint(0, V, (a.batch * a.micro, T + 1), generator=g)
        x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(pipe(x).local_value().view(-1, V), y.view(-1))
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        if s >= a.warmup:
            step_ms.append((t1 - t0) * 1e3)
    rpc.shutdown()
    return {"ms": statistics.median(step_ms), "stages": []}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="1f1b", choices=["gpipe", "1f1b", "pipe"])
    for k, d in (("layers", 4), ("heads", 4), ("width", 256), ("vocab", 256), ("block", 128), ("batch", 4), ("seq", 64),
                 ("stages", 2), ("micro", 8), ("threads", 1), ("steps", 5), ("warmup", 2), ("seed", 1)):
        ap.add_argument("--" + k, type=int, default=d)
    a = ap.parse_args()
    if a.mode == "pipe":
        out = run_pipe(a)
    else:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=stage_main, args=(r, a, port, q)) for r in range(a.stages)]
        for p in procs:
            p.start()
        res = sorted(q.get(timeout=900) for _ in procs)
        for p in procs:
            p.join()
        out = {"ms": res[0][1], "stages": [{"busy_ms": b, "bubble": i} for _, ms, b, i in res]}
    out["mode"], out["micro"], out["stages_n"] = a.mode, a.micro, a.stages
    print(json.dumps(out))


if __name__ == "__main__":
    main()
