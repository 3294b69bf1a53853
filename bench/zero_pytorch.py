#!/usr/bin/python3
"""PyTorch's side of bench/zero_vs_pytorch.sh: GPT training steps (forward, cross-entropy, backward,
AdamW; fp32) on random tokens on N processes over gloo, with one of
    ddp     DistributedDataParallel (every rank holds everything: ZeRO stage 0)
    zero1   DDP + ZeroRedundancyOptimizer (optimizer state sharded: ZeRO stage 1)
    grad_op FSDP ShardingStrategy.SHARD_GRAD_OP (gradients and optimizer state: ZeRO stage 2)
    full    FSDP ShardingStrategy.FULL_SHARD, one unit per transformer block (ZeRO stage 3)

    /usr/bin/python3 bench/zero_pytorch.py --mode full --ranks 2 --layers 4 --heads 4 --width 256 \
        --vocab 256 --block 128 --batch 4 --seq 64

Prints one JSON object: the median ms per step (rank 0); per rank, the peak RSS in MiB, the RSS
before the model was built (the Python and torch runtime, which tandem does not carry), and the
training state the rank holds after the last step (parameters, gradients, optimizer state: the
tensors it keeps, FSDP's flat shards included), in MiB.

PyTorch 1.13's FSDP runs only on CUDA, and its gloo backend has neither all_gather_into_tensor
nor reduce_scatter. So that FSDP's own logic (flat parameters, gathering before forward and
backward, freeing after, reduce-scatter after backward) runs here unchanged, this script
(1) replaces CUDA streams and events with no-ops and computes on the CPU, and (2) gives gloo
an all-gather into a tensor (gloo's all_gather into its chunks) and a reduce-scatter made of an
all-reduce and a copy of the rank's chunk: FSDP's reduce-scatter therefore moves twice the bytes
it would with a real one. Python 3.11 also needs a one-line fix to import torch.distributed's
sharded tensors (a dataclass default that 3.11 rejects).
"""
import argparse
import contextlib
import dataclasses
import json
import os
import resource
import socket
import statistics
import sys
import time

_dataclass = dataclasses.dataclass


def _dataclass_311(cls=None, **kw):  # torch 1.13's TensorProperties is an unhashable default on 3.11
    def wrap(c):
        if c.__name__ == "TensorProperties":
            kw.setdefault("unsafe_hash", True)
        return _dataclass(c, **kw)
    return wrap if cls is None else wrap(cls)


dataclasses.dataclass = _dataclass_311

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
from make_fixtures import attention_ref  # noqa: E402


def cpu_fsdp():
    """FSDP on the CPU: CUDA streams and events become no-ops; gloo gets the two collectives."""
    class Stream:
        def __init__(self, *a, **k): pass
        def wait_stream(self, s): pass
        def wait_event(self, e): pass
        def synchronize(self): pass

    class Event:
        def __init__(self, *a, **k): pass
        def record(self, s=None): pass
        def synchronize(self): pass
        def query(self): return True

    torch.cuda.Stream, torch.cuda.Event = Stream, Event
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.current_stream = lambda *a, **k: Stream()
    torch.cuda.is_available = lambda: True
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: 0
    torch.cuda.device_count = lambda: 1
    torch.Tensor.record_stream = lambda self, s: None
    from torch.distributed.fsdp import fully_sharded_data_parallel as fsdp
    fsdp.FullyShardedDataParallel._get_compute_device = lambda self, *a, **k: torch.device("cpu")

    def all_gather_base(out, inp, group=None, async_op=False):
        dist.all_gather(list(out.chunk(dist.get_world_size(group))), inp, group=group)

    def reduce_scatter_base(out, inp, op=dist.ReduceOp.SUM, group=None, async_op=False):
        full = inp.clone()
        dist.all_reduce(full, op=op, group=group)
        out.copy_(full.chunk(dist.get_world_size(group))[dist.get_rank(group)])

    dist._all_gather_base, dist._reduce_scatter_base = all_gather_base, reduce_scatter_base


class Block(torch.nn.Module):
    """One GPT-2 block with nanoGPT's names; a module of its own, so that FSDP can wrap it."""

    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = torch.nn.LayerNorm(C)
        self.attn = torch.nn.Module()
        self.attn.c_attn = torch.nn.Linear(C, 3 * C)
        self.attn.c_proj = torch.nn.Linear(C, C)
        self.ln_2 = torch.nn.LayerNorm(C)
        self.mlp = torch.nn.Module()
        self.mlp.c_fc = torch.nn.Linear(C, 4 * C)
        self.mlp.c_proj = torch.nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn.c_proj(attention_ref(self.attn.c_attn(self.ln_1(x)), self.NH))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self, L, NH, C, block, V):
        super().__init__()
        self.transformer = torch.nn.Module()
        self.transformer.wte = torch.nn.Embedding(V, C)
        self.transformer.wpe = torch.nn.Embedding(block, C)
        self.transformer.h = torch.nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.transformer.ln_f = torch.nn.LayerNorm(C)

    def forward(self, idx):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))
        for b in self.transformer.h:
            x = b(x)
        return self.transformer.ln_f(x) @ self.transformer.wte.weight.t()


def rank_main(rank, a, port, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(a.threads)
    if a.mode in ("grad_op", "full"):
        cpu_fsdp()  # in each rank: spawned processes start afresh
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    torch.manual_seed(a.seed)
    m = GPT(a.layers, a.heads, a.width, a.block, a.vocab)
    adamw = dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    if a.mode in ("grad_op", "full"):
        import functools
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        strategy = ShardingStrategy.FULL_SHARD if a.mode == "full" else ShardingStrategy.SHARD_GRAD_OP
        m = FSDP(m, sharding_strategy=strategy,
                 auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}))
        opt = torch.optim.AdamW(m.parameters(), **adamw)
    else:
        m = torch.nn.parallel.DistributedDataParallel(m)
        if a.mode == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, **adamw)
        else:
            opt = torch.optim.AdamW(m.parameters(), **adamw)
    g = torch.Generator().manual_seed(a.seed + 1 + rank)
    times = []
    for s in range(a.warmup + a.steps):
        tok = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
        x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(x).view(-1, a.vocab), y.view(-1)).backward()
        opt.step()
        if s >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    # what this rank holds: its parameters and their gradients as the wrapper keeps them (FSDP: the
    # flat shards, outside forward and backward), and the optimizer state it owns
    params = list(m.parameters())
    state = (opt.optim if a.mode == "zero1" else opt).state
    held = sum(p.numel() for p in params) + sum(p.grad.numel() for p in params if p.grad is not None)
    held += sum(t.numel() for s in state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    out[rank] = (statistics.median(times), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, base_rss,
                 held * 4 / 1048576)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["ddp", "zero1", "grad_op", "full"], default="ddp")
    for k, d in (("ranks", 2), ("layers", 4), ("heads", 4), ("width", 256), ("vocab", 256), ("block", 128),
                 ("batch", 4), ("seq", 64), ("threads", 1), ("steps", 10), ("warmup", 3), ("seed", 1)):
        ap.add_argument("--" + k, type=int, default=d)
    a = ap.parse_args()
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(rank_main, args=(a, port, out), nprocs=a.ranks)
    print(json.dumps({"mode": a.mode, "ranks": a.ranks, "ms": out[0][0],
                      "peak_rss_mib": [round(out[r][1], 1) for r in range(a.ranks)],
                      "base_rss_mib": [round(out[r][2], 1) for r in range(a.ranks)],
                      "state_mib": [round(out[r][3], 2) for r in range(a.ranks)]}))


if __name__ == "__main__":
    main()
