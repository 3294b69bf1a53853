#!/usr/bin/env python3
"""A plain nanoGPT-style GPT-2 training step on one GPU, PyTorch eager (or torch.compile): the
peer of `tandem bench gpt --device cuda` (bench/gpt_cuda_vs_pytorch.sh runs both in turn).

    python3 bench/gpt_pytorch_cuda.py [--batch 16] [--seq 1024] [--steps 10] [--warmup 3]
                                      [--precision fp32|tf32|bf16] [--compile] [--layers 12 ...]

Model as nanoGPT's model.py (pre-LN blocks, GELU tanh, fused qkv, tied lm_head, no dropout,
F.scaled_dot_product_attention with is_causal), random tokens, cross-entropy, backward,
clip_grad_norm_(1.0), AdamW (lr 3e-4, betas (0.9, 0.95), decay 0.1 on matrices only, fused=True
as nanoGPT picks on CUDA). fp32: strict fp32 products; tf32: TF32 products
(allow_tf32); bf16: autocast to bf16 with fp32 weights (nanoGPT's default). Prints one JSON line:
median step ms, tokens/s and MFU (nanoGPT's 6N + 12LCT FLOPs per token against --peak-tflops).
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, block, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(block, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if n.endswith("c_proj.weight") or n.endswith("mlp_proj.weight") else 0.02
                torch.nn.init.normal_(p, 0.0, std)
            elif n.endswith("bias") and not n.startswith("ln"):
                torch.nn.init.zeros_(p)

    def forward(self, idx, tgt):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied lm_head
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.4)
    a = ap.parse_args()
    torch.manual_seed(1)
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = a.precision != "fp32"
    torch.backends.cudnn.allow_tf32 = a.precision != "fp32"
    m = GPT(a.layers, a.heads, a.width, a.block, a.vocab).to(dev)
    decay = [p for p in m.parameters() if p.dim() >= 2]
    other = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), fused=True)
    step_model = torch.compile(m) if a.compile else m
    times = []
    for s in range(a.warmup + a.steps):
        x = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
        y = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = step_model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    np_ = sum(p.numel() for p in m.parameters())
    N = a.batch * a.seq
    flops = (6 * (np_ - a.block * a.width) + 12 * a.layers * a.width * a.seq) * N
    ms = statistics.median(times[a.warmup:])
    print(json.dumps({"side": "pytorch", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                      "precision": a.precision, "compile": a.compile, "batch": a.batch, "seq": a.seq, "params": np_,
                      "ms": round(ms, 3), "tokens_per_s": round(N / (ms * 1e-3), 1),
                      "tflops": round(flops / (ms * 1e-3) * 1e-12, 2), "mfu": round(flops / (ms * 1e-3) / (a.peak_tflops * 1e12), 4),
                      "max_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), "loss": round(loss.item(), 4)}))


if __name__ == "__main__":
    main()
