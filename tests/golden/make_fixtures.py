#!/usr/bin/python3
"""Writes the golden fixtures the C tests compare against, using PyTorch (Debian's python3-torch).

    /usr/bin/python3 tests/golden/make_fixtures.py

Each fixture is a safetensors file (written here by hand, no extra package needed):
  ops.safetensors        for every op case C: C.in0, C.in1, ... (inputs), C.gout (upstream
                         gradient), C.out (output), C.grad0, ... (input gradients)
  mlp_adamw.safetensors  a small MLP: initial weights, a batch, the loss and every gradient
                         of step 1, the losses of 3 AdamW steps and the weights after them
  gpt_block.safetensors  one pre-LN GPT-2 block: weights, input, upstream gradient, output
                         and every gradient
  gpt_tiny.safetensors   a 2-layer GPT in nanoGPT's names (lm_head tied): weights, tokens,
                         targets, logits, loss and every parameter gradient
  llama_tiny.safetensors a 2-layer Llama in Hugging Face's LlamaForCausalLM names (grouped-query
                         attention, untied head): weights, tokens, targets, logits, loss, every
                         gradient, 3 AdamW steps; and (prefix "tied.") one with a tied head and
                         Llama 3's rope scaling: logits, loss and every gradient
The Llama reference below is written here from Hugging Face's conventions (rotate_half, rsqrt
RMSNorm, repeat_kv, Llama 3's inv_freq scaling), since transformers is not installed.
The C tests need only the committed files, not PyTorch.
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(1234)
torch.set_default_dtype(torch.float32)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

DT = {torch.float32: "F32", torch.int64: "I64", torch.int32: "I32"}


def save(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        b = t.numpy().tobytes()
        header[name] = {"dtype": DT[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
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


def rnd(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).requires_grad_(True)


def attention_ref(qkv, n_head):
    B, T, C3 = qkv.shape
    C = C3 // 3
    q, k, v = qkv.split(C, dim=2)
    hs = C // n_head
    q = q.view(B, T, n_head, hs).transpose(1, 2)
    k = k.view(B, T, n_head, hs).transpose(1, 2)
    v = v.view(B, T, n_head, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return (att @ v).transpose(1, 2).contiguous().view(B, T, C)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_inv_freq(hs, theta, scaling=None):
    inv = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    if scaling:  # transformers' _compute_llama3_parameters
        factor, low, high, old = scaling
        low_wl, high_wl = old / low, old / high
        wl = 2 * math.pi / inv
        inv_l = torch.where(wl > low_wl, inv / factor, inv)
        smooth = (old / wl - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wl < high_wl) * ~(wl > low_wl)
        inv = torch.where(medium, smoothed, inv_l)
    return inv


def rope_ref(x, n_head, theta, pos0=0, scaling=None):
    B, T, W = x.shape
    hs = W // n_head
    inv = rope_inv_freq(hs, theta, scaling)
    pos = torch.arange(pos0, pos0 + T).float()
    freqs = (inv[:, None] @ pos[None, :]).t()  # as LlamaRotaryEmbedding: a float32 product
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    xh = x.view(B, T, n_head, hs)
    return (xh * cos + rotate_half(xh) * sin).reshape(B, T, W)


def rmsnorm_ref(x, w, eps=1e-5):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def gqa_ref(q, k, v, n_head, n_kv):
    B, T, W = q.shape
    hs = W // n_head
    q = q.view(B, T, n_head, hs).transpose(1, 2)
    k = k.view(B, T, n_kv, hs).transpose(1, 2)
    v = v.view(B, T, n_kv, hs).transpose(1, 2)
    g = n_head // n_kv  # repeat_kv: query head h reads key/value head h // g
    k = k[:, :, None].expand(B, n_kv, g, T, hs).reshape(B, n_head, T, hs)
    v = v[:, :, None].expand(B, n_kv, g, T, hs).reshape(B, n_head, T, hs)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return (att @ v).transpose(1, 2).contiguous().view(B, T, W)


def op_fixtures():
    out = {}

    def case(name, fn, *inputs):
        y = fn(*inputs)
        gout = torch.randn_like(y) if y.dim() > 0 else torch.tensor(1.0)
        y.backward(gout)
        for i, x in enumerate(inputs):
            out[f"{name}.in{i}"] = x
            if x.dtype == torch.float32:
                out[f"{name}.grad{i}"] = x.grad if x.grad is not None else torch.zeros_like(x)
        out[f"{name}.gout"] = gout.reshape(y.shape)
        out[f"{name}.out"] = y

    case("matmul", lambda a, b: a @ b, rnd(5, 7), rnd(7, 3))
    case("matmul_tn", lambda a, b: a.t() @ b, rnd(7, 5), rnd(7, 3))
    case("matmul_nt", lambda a, b: a @ b.t(), rnd(5, 7), rnd(3, 7))
    case("matmul_tt", lambda a, b: a.t() @ b.t(), rnd(7, 5), rnd(3, 7))
    case("bmm", lambda a, b: a @ b, rnd(2, 3, 4, 5), rnd(2, 3, 5, 6))
    case("bmm_shared", lambda a, b: a @ b, rnd(3, 4, 5), rnd(5, 2))
    case("linear", lambda x, w, b: F.linear(x, w, b), rnd(2, 3, 6), rnd(4, 6), rnd(4))
    case("add_bcast", lambda a, b: a + b, rnd(3, 4, 5), rnd(4, 1))
    case("sub_bcast", lambda a, b: a - b, rnd(3, 1, 5), rnd(2, 1))
    case("mul_bcast", lambda a, b: a * b, rnd(2, 3, 4), rnd(3, 1))
    case("div", lambda a, b: a / b, rnd(3, 4), (torch.rand(3, 4) + 0.5).requires_grad_(True))
    case("scale", lambda a: a * 0.37, rnd(4, 3))
    case("sum_axes", lambda a: a.sum(dim=(0, 2)), rnd(3, 4, 5))
    case("mean_keep", lambda a: a.mean(dim=1, keepdim=True), rnd(3, 4, 5))
    case("sum_all", lambda a: a.sum(), rnd(3, 4))
    case("relu", F.relu, rnd(4, 6))
    case("gelu", lambda x: F.gelu(x, approximate="tanh"), rnd(4, 6, scale=2))
    case("tanh", torch.tanh, rnd(4, 6))
    case("sigmoid", torch.sigmoid, rnd(4, 6, scale=3))
    case("softmax", lambda x: F.softmax(x, dim=1), rnd(2, 5, 3, scale=3))
    case("log_softmax", lambda x: F.log_softmax(x, dim=-1), rnd(4, 7, scale=3))
    tgt = torch.tensor([3, 0, -100, 6, 2, 6])
    case("cross_entropy", lambda x, t: F.cross_entropy(x, t, ignore_index=-100), rnd(6, 7, scale=2), tgt)
    case("cross_entropy_big", lambda x, t: F.cross_entropy(x, t), (torch.randn(3, 5) * 30).requires_grad_(True),
         torch.tensor([1, 4, 0]))
    case("mse", F.mse_loss, rnd(3, 4), rnd(3, 4))
    case("layernorm", lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5), rnd(2, 3, 8, scale=2),
         (1 + 0.1 * torch.randn(8)).requires_grad_(True), rnd(8))
    case("embedding", F.embedding, torch.tensor([[1, 4, 4], [0, 2, 1]]), rnd(5, 3))
    case("attention", lambda q: attention_ref(q, 2), rnd(2, 5, 12))
    case("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), rnd(2, 3, 7, 6), rnd(4, 3, 3, 3),
         rnd(4))
    case("conv2d_k5", lambda x, w, b: F.conv2d(x, w, b, padding=2), rnd(1, 2, 6, 6), rnd(3, 2, 5, 5), rnd(3))
    case("maxpool2d", lambda x: F.max_pool2d(x, 2, 2), rnd(2, 3, 6, 7))
    case("avgpool2d", lambda x: F.avg_pool2d(x, 3, 2, 1), rnd(2, 2, 7, 6))
    case("concat", lambda a, b: torch.cat([a, b], dim=1), rnd(2, 3, 4), rnd(2, 2, 4))
    case("transpose", lambda a: a.transpose(0, 2).contiguous() * 1.0, rnd(2, 3, 4))
    case("slice", lambda a: a[:, 1:3] * 1.0, rnd(3, 5))
    case("reshape", lambda a: a.reshape(6, 4) * 1.0, rnd(2, 3, 4))
    case("rmsnorm", lambda x, w: rmsnorm_ref(x, w), rnd(2, 3, 8, scale=2), (1 + 0.1 * torch.randn(8)).requires_grad_(True))
    case("rope", lambda x: rope_ref(x, 2, 10000.0), rnd(2, 5, 12))
    case("rope_llama3", lambda x: rope_ref(x, 2, 500000.0, 1000, (32.0, 1.0, 4.0, 8192)), rnd(1, 5, 16))
    case("swiglu", lambda g, u: F.silu(g) * u, rnd(3, 7, scale=3), rnd(3, 7))
    case("attention_gqa", lambda q, k, v: gqa_ref(q, k, v, 4, 2), rnd(2, 5, 16), rnd(2, 5, 8), rnd(2, 5, 8))
    return out


def mlp_fixture():
    torch.manual_seed(7)
    layers = torch.nn.Sequential(torch.nn.Linear(32, 24), torch.nn.ReLU(), torch.nn.Dropout(0.0),
                                 torch.nn.Linear(24, 16), torch.nn.ReLU(), torch.nn.Dropout(0.0),
                                 torch.nn.Linear(16, 10))
    model = torch.nn.Module()
    model.layers = layers
    out = {}
    for n, p in model.named_parameters():
        out["init." + n] = p.detach().clone()
    x = torch.rand(8, 32)
    y = torch.randint(0, 10, (8,))
    out["x"], out["y"] = x, y
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    losses = []
    for step in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(layers(x), y)
        loss.backward()
        if step == 0:
            for n, p in model.named_parameters():
                out["grad." + n] = p.grad.detach().clone()
        losses.append(loss.item())
        opt.step()
    out["losses"] = torch.tensor(losses)
    for n, p in model.named_parameters():
        out["final." + n] = p.detach().clone()
    return out


def gpt_block_fixture():
    torch.manual_seed(11)
    C, NH, B, T = 32, 4, 2, 8

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = torch.nn.LayerNorm(C)
            self.attn = torch.nn.Module()
            self.attn.c_attn = torch.nn.Linear(C, 3 * C)
            self.attn.c_proj = torch.nn.Linear(C, C)
            self.ln_2 = torch.nn.LayerNorm(C)
            self.mlp = torch.nn.Module()
            self.mlp.c_fc = torch.nn.Linear(C, 4 * C)
            self.mlp.c_proj = torch.nn.Linear(4 * C, C)

        def forward(self, x):
            x = x + self.attn.c_proj(attention_ref(self.attn.c_attn(self.ln_1(x)), NH))
            return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))

    blk = Block()
    with torch.no_grad():  # non-trivial LayerNorm parameters
        for ln in (blk.ln_1, blk.ln_2):
            ln.weight.add_(0.1 * torch.randn(C))
            ln.bias.add_(0.1 * torch.randn(C))
    out = {}
    for n, p in blk.named_parameters():
        out["transformer.h.0." + n] = p.detach().clone()
    x = torch.randn(B, T, C, requires_grad=True)
    y = blk(x)
    gout = torch.randn_like(y)
    y.backward(gout)
    out["x"], out["gout"], out["out"], out["grad.x"] = x.detach(), gout, y.detach(), x.grad
    for n, p in blk.named_parameters():
        out["grad.transformer.h.0." + n] = p.grad
    return out


class GPT(torch.nn.Module):
    """nanoGPT's layout (names and shapes), without dropout, with lm_head tied to wte."""

    def __init__(self, L, NH, C, block, V):
        super().__init__()
        self.NH = NH
        self.transformer = torch.nn.Module()
        self.transformer.wte = torch.nn.Embedding(V, C)
        self.transformer.wpe = torch.nn.Embedding(block, C)
        self.transformer.h = torch.nn.ModuleList()
        for _ in range(L):
            b = torch.nn.Module()
            b.ln_1 = torch.nn.LayerNorm(C)
            b.attn = torch.nn.Module()
            b.attn.c_attn = torch.nn.Linear(C, 3 * C)
            b.attn.c_proj = torch.nn.Linear(C, C)
            b.ln_2 = torch.nn.LayerNorm(C)
            b.mlp = torch.nn.Module()
            b.mlp.c_fc = torch.nn.Linear(C, 4 * C)
            b.mlp.c_proj = torch.nn.Linear(4 * C, C)
            self.transformer.h.append(b)
        self.transformer.ln_f = torch.nn.LayerNorm(C)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T))
        for b in self.transformer.h:
            x = x + b.attn.c_proj(attention_ref(b.attn.c_attn(b.ln_1(x)), self.NH))
            x = x + b.mlp.c_proj(F.gelu(b.mlp.c_fc(b.ln_2(x)), approximate="tanh"))
        return self.transformer.ln_f(x) @ self.transformer.wte.weight.t()


def gpt_tiny_fixture():
    torch.manual_seed(13)
    L, NH, C, block, V, B, T = 2, 2, 16, 8, 32, 2, 8
    m = GPT(L, NH, C, block, V)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 and p.shape[0] == C else 0.0))
    out = {n: p.detach().clone() for n, p in m.named_parameters()}
    idx = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    logits = m(idx)
    loss = F.cross_entropy(logits.view(-1, V), tgt.view(-1))
    loss.backward()
    out["idx"], out["targets"], out["logits"], out["loss"] = idx, tgt, logits.detach(), loss.detach().reshape(1)
    for n, p in m.named_parameters():
        out["grad." + n] = p.grad.clone()
    # three AdamW steps as nanoGPT configures them: decay 0.1 on matrices only, betas (0.9, 0.95)
    decay = [p for p in m.parameters() if p.dim() >= 2]
    no_decay = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95))
    losses = []
    for _ in range(3):
        opt.zero_grad()
        l = F.cross_entropy(m(idx).view(-1, V), tgt.view(-1))
        l.backward()
        losses.append(l.item())
        opt.step()
    out["adamw.losses"] = torch.tensor(losses)
    for n, p in m.named_parameters():
        out["adamw.final." + n] = p.detach().clone()
    return out


class RMSNorm(torch.nn.Module):
    def __init__(self, C):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(C))

    def forward(self, x):
        return rmsnorm_ref(x, self.weight)


class Llama(torch.nn.Module):
    """LlamaForCausalLM's layout (names and shapes), no dropout; lm_head untied unless tied."""

    def __init__(self, L, NH, NKV, C, F, V, theta, scaling=None, tied=False):
        super().__init__()
        self.NH, self.NKV, self.theta, self.scaling, self.tied = NH, NKV, theta, scaling, tied
        hs = C // NH
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(V, C)
        self.model.layers = torch.nn.ModuleList()
        for _ in range(L):
            b = torch.nn.Module()
            b.input_layernorm = RMSNorm(C)
            b.self_attn = torch.nn.Module()
            b.self_attn.q_proj = torch.nn.Linear(C, NH * hs, bias=False)
            b.self_attn.k_proj = torch.nn.Linear(C, NKV * hs, bias=False)
            b.self_attn.v_proj = torch.nn.Linear(C, NKV * hs, bias=False)
            b.self_attn.o_proj = torch.nn.Linear(NH * hs, C, bias=False)
            b.post_attention_layernorm = RMSNorm(C)
            b.mlp = torch.nn.Module()
            b.mlp.gate_proj = torch.nn.Linear(C, F, bias=False)
            b.mlp.up_proj = torch.nn.Linear(C, F, bias=False)
            b.mlp.down_proj = torch.nn.Linear(F, C, bias=False)
            self.model.layers.append(b)
        self.model.norm = RMSNorm(C)
        if not tied:
            self.lm_head = torch.nn.Linear(C, V, bias=False)

    def forward(self, idx):
        x = self.model.embed_tokens(idx)
        for b in self.model.layers:
            h = b.input_layernorm(x)
            q = rope_ref(b.self_attn.q_proj(h), self.NH, self.theta, 0, self.scaling)
            k = rope_ref(b.self_attn.k_proj(h), self.NKV, self.theta, 0, self.scaling)
            x = x + b.self_attn.o_proj(gqa_ref(q, k, b.self_attn.v_proj(h), self.NH, self.NKV))
            h = b.post_attention_layernorm(x)
            x = x + b.mlp.down_proj(F.silu(b.mlp.gate_proj(h)) * b.mlp.up_proj(h))
        h = self.model.norm(x)
        return h @ (self.model.embed_tokens.weight if self.tied else self.lm_head.weight).t()


def llama_case(m, V, B, T, prefix, out, adamw):
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if n.endswith("layernorm.weight") or n == "model.norm.weight" else 0.0))
    for n, p in m.named_parameters():
        out[prefix + n] = p.detach().clone()
    idx = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    logits = m(idx)
    loss = F.cross_entropy(logits.view(-1, V), tgt.view(-1))
    loss.backward()
    out[prefix + "idx"], out[prefix + "targets"] = idx, tgt
    out[prefix + "logits"], out[prefix + "loss"] = logits.detach(), loss.detach().reshape(1)
    for n, p in m.named_parameters():
        out[prefix + "grad." + n] = p.grad.clone()
    if not adamw:
        return
    decay = [p for p in m.parameters() if p.dim() >= 2]
    no_decay = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95))
    losses = []
    for _ in range(3):
        opt.zero_grad()
        l = F.cross_entropy(m(idx).view(-1, V), tgt.view(-1))
        l.backward()
        losses.append(l.item())
        opt.step()
    out[prefix + "adamw.losses"] = torch.tensor(losses)
    for n, p in m.named_parameters():
        out[prefix + "adamw.final." + n] = p.detach().clone()


def llama_tiny_fixture():
    torch.manual_seed(17)
    out = {}
    # 2 layers, 4 heads sharing 2 key/value heads, width 32 (head size 8), SwiGLU 48, vocab 40
    llama_case(Llama(2, 4, 2, 32, 48, 40, 10000.0), 40, 2, 8, "", out, True)
    llama_case(Llama(2, 4, 1, 32, 40, 40, 500000.0, (32.0, 1.0, 4.0, 8192), tied=True), 40, 2, 8, "tied.", out, False)
    return out


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    save(os.path.join(OUT, "ops.safetensors"), op_fixtures())
    save(os.path.join(OUT, "mlp_adamw.safetensors"), mlp_fixture())
    save(os.path.join(OUT, "gpt_block.safetensors"), gpt_block_fixture())
    save(os.path.join(OUT, "gpt_tiny.safetensors"), gpt_tiny_fixture())
    save(os.path.join(OUT, "llama_tiny.safetensors"), llama_tiny_fixture())
    sys.exit(0)
