#!/usr/bin/env bash
# tandem's CUDA GPT step against a plain nanoGPT-style PyTorch GPT-2 (bench/gpt_pytorch_cuda.py) on
# the same GPU: gpt2-124M, B x T tokens, random tokens, AdamW with clipping at 1.0. Both sides run in
# turn, REPS times; the table shows medians of the per-run medians, tokens/s, MFU (nanoGPT's
# 6N + 12LCT FLOPs per token against 989.4 TFLOP/s, H100 SXM dense bf16) and the ratio of tokens/s
# (tandem / PyTorch) at the same precision.
#
#   bench/gpt_cuda_vs_pytorch.sh [REPS=3] [B=16] [T=1024] [STEPS=8]
#   env: BUILD=build (tandem built with the CUDA backend), PYTHON=python3 (with torch + CUDA),
#        COMPILE=1 adds torch.compile runs (tf32 and bf16, one per rep: compilation is slow)
#
# precisions: fp32 (strict fp32 products on both sides), tf32 (TF32 tensor-core products on both
# sides: tandem --tf32, torch allow_tf32), bf16 (tandem --precision bf16: bf16 products and stored
# product inputs, flash attention, fp32 master weights; PyTorch autocast to bf16).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
B=${2:-16}
T=${3:-1024}
STEPS=${4:-8}
BUILD=${BUILD:-build}
PY=${PYTHON:-python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
TANDEM="$BUILD/tandem"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

for r in $(seq 1 "$REPS"); do
  for p in fp32 tf32 bf16; do
    flag=""
    [[ $p == tf32 ]] && flag="--tf32"
    [[ $p == bf16 ]] && flag="--precision bf16"
    "$TANDEM" bench gpt --device cuda --config gpt2-124M --batch-size "$B" --seq-len "$T" --steps "$STEPS" --warmup 2 --json $flag \
      >"$TMP/tandem.$p.$r" || echo '{"error":1}' >"$TMP/tandem.$p.$r"
    "$PY" bench/gpt_pytorch_cuda.py --batch "$B" --seq "$T" --steps "$STEPS" --warmup 2 --precision $p \
      >"$TMP/pytorch.$p.$r" || echo '{"error":1}' >"$TMP/pytorch.$p.$r"
  done
  if [[ ${COMPILE:-0} == 1 ]]; then
    for p in tf32 bf16; do
      "$PY" bench/gpt_pytorch_cuda.py --batch "$B" --seq "$T" --steps "$STEPS" --warmup 3 --precision $p --compile \
        >"$TMP/compile.$p.$r" 2>/dev/null || echo '{"error":1}' >"$TMP/compile.$p.$r"
    done
  fi
  echo "round $r done" >&2
done

"$PY" - "$TMP" "$REPS" "$B" "$T" <<'PY'
import json, statistics, sys, glob
tmp, reps, B, T = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(side, p):
    rows = []
    for r in range(1, reps + 1):
        try:
            d = json.loads(open(f"{tmp}/{side}.{p}.{r}").read().strip().splitlines()[-1])
        except Exception:
            continue
        if "ms" in d: rows.append(d)
    return rows
print(f"\ngpt2-124M training step, B={B} T={T}, medians of {reps} alternating runs")
print(f"{'side':<22}{'precision':<10}{'ms':>9}{'tokens/s':>11}{'MFU':>7}  runs (ms)")
res = {}
for side in ("tandem", "pytorch", "compile"):
    for p in ("fp32", "tf32", "bf16"):
        rows = load(side, p)
        if not rows: continue
        ms = statistics.median(d["ms"] for d in rows)
        tps = statistics.median(d["tokens_per_s"] for d in rows)
        mfu = statistics.median(d["mfu"] for d in rows)
        res[(side, p)] = tps
        name = {"tandem": "tandem (CUDA)", "pytorch": "PyTorch eager", "compile": "PyTorch torch.compile"}[side]
        print(f"{name:<22}{p:<10}{ms:>9.1f}{tps:>11.0f}{100*mfu:>6.1f}%  " + " ".join(f"{d['ms']:.1f}" for d in rows))
for p in ("fp32", "tf32", "bf16"):
    if ("tandem", p) in res and ("pytorch", p) in res:
        print(f"ratio tokens/s tandem / PyTorch eager, {p}: {res[('tandem', p)] / res[('pytorch', p)]:.2f}x")
    if ("tandem", p) in res and ("compile", p) in res:
        print(f"ratio tokens/s tandem / torch.compile, {p}: {res[('tandem', p)] / res[('compile', p)]:.2f}x")
PY
