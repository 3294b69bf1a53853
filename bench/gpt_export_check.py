#!/usr/bin/python3
"""Loads GPT weights written by `tandem train --model gpt --save-weights` into a PyTorch GPT of
the same config (nanoGPT's names and shapes, lm_head tied to wte), runs the same prompt through
both, and prints the largest logit difference. Exit 0 when it is below 1e-4.

    bench/gpt_export_check.py WEIGHTS.safetensors [PROMPT]
"""
import json, os, struct, subprocess, sys, tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
from make_fixtures import GPT  # the PyTorch model the golden fixtures use


def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    t = {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype=np.float32).reshape(v["shape"])
         for k, v in h.items()}
    return meta, t


def main():
    weights = sys.argv[1]
    prompt = sys.argv[2] if len(sys.argv) > 2 else "ROMEO:\nWhat light through yonder window breaks?"
    tandem = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "tandem")
    meta, w = load(weights)
    L, NH, C, B, V = (int(meta[k]) for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"))
    prompt = prompt[:B]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.safetensors")
        subprocess.run([tandem, "generate", "--weights", weights, "--prompt", prompt, "--tokens", "0",
                        "--logits-out", out], check=True, stdout=subprocess.DEVNULL)
        _, lt = load(out)
    m = GPT(L, NH, C, B, V)
    sd = {k: torch.from_numpy(v.copy()) for k, v in w.items()}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    idx = torch.tensor([[b for b in prompt.encode()]])
    with torch.no_grad():
        ref = m(idx)[0].numpy()
    diff = float(np.abs(ref - lt["logits"]).max())
    print(f"{weights}: {L} layers, {NH} heads, width {C}, block {B}, vocab {V}; {len(prompt)} prompt tokens")
    print(f"max |logit difference| tandem vs PyTorch: {diff:.3e} ({'OK' if diff < 1e-4 else 'TOO LARGE'}, limit 1e-4)")
    sys.exit(0 if diff < 1e-4 else 1)


if __name__ == "__main__":
    main()
