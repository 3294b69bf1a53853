#!/usr/bin/env bash
# Mixed precision: step time and memory of --precision fp32, bf16 and fp16 in tandem bench gpt and
# tandem bench llama (mini configs), and of PyTorch 1.13's GPT (nanoGPT's, bench/gpt_pytorch.py) in
# fp32 and under torch.autocast("cpu", dtype=torch.bfloat16), run alternately REPS times; the table
# gives medians: step ms (wall) and CPU ms per step (every thread; unlike wall time, not stretched
# while other jobs hold the cores), each against the same side's fp32, tandem's activations
# category (the tape's peak) and each process's peak RSS.
#
#   bench/mixed.sh [REPS=3] [B=8] [T=128] [THREADS=2] [STEPS=4]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
B=${2:-8}
T=${3:-128}
THREADS=${4:-2}
STEPS=${5:-4}
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=$THREADS

for r in $(seq 1 "$REPS"); do
  for p in fp32 bf16 fp16; do
    ./build/tandem bench gpt --config mini --batch-size "$B" --seq-len "$T" --threads "$THREADS" --steps "$STEPS" --warmup 1 \
      --precision $p --json >>"$TMP/gpt_$p"
    ./build/tandem bench llama --config llama-mini --batch-size "$B" --seq-len "$T" --threads "$THREADS" --steps "$STEPS" \
      --warmup 1 --precision $p --json >>"$TMP/llama_$p"
  done
  for a in none bf16; do
    /usr/bin/python3 bench/gpt_pytorch.py --layers 4 --heads 4 --width 256 --vocab 256 --block 128 --batch "$B" --seq "$T" \
      --threads "$THREADS" --steps "$STEPS" --warmup 1 --autocast $a >>"$TMP/torch_$a"
  done
  echo "rep $r/$REPS done" >&2
done

/usr/bin/python3 - "$TMP" "$REPS" "$B" "$T" "$THREADS" <<'PYEOF'
import json, os, statistics, sys
d, reps, B, T, threads = sys.argv[1:]
med = lambda rows, k: statistics.median(r[k] for r in rows)
load = lambda n: [json.loads(l) for l in open(os.path.join(d, n))]
print(f"\nMixed precision, mini models, B={B} T={T}, {threads} threads, medians of {reps} runs")
print(f"{'side':<22} {'precision':<14} {'step ms':>9} {'CPU ms':>9} {'vs fp32':>8} {'activations MiB':>16} {'vs fp32':>8} {'peak RSS MiB':>13}")
for model in ("gpt", "llama"):
    base = load(f"{model}_fp32")
    for p in ("fp32", "bf16", "fp16"):
        rows = load(f"{model}_{p}")
        print(f"{'tandem ' + model:<22} {p:<14} {med(rows, 'ms'):>9.1f} {med(rows, 'cpu_ms'):>9.1f} {med(rows, 'cpu_ms') / med(base, 'cpu_ms'):>7.2f}x "
              f"{med(rows, 'activations_mib'):>16.1f} {med(rows, 'activations_mib') / med(base, 'activations_mib'):>7.2f}x "
              f"{med(rows, 'peak_rss_mib'):>13.1f}")
base = load("torch_none")
for a, label in (("none", "fp32"), ("bf16", "autocast bf16")):
    rows = load(f"torch_{a}")
    print(f"{'PyTorch 1.13 gpt':<22} {label:<14} {med(rows, 'ms'):>9.1f} {med(rows, 'cpu_ms'):>9.1f} {med(rows, 'cpu_ms') / med(base, 'cpu_ms'):>7.2f}x "
          f"{'-':>16} {'':>8} {med(rows, 'peak_rss_mib'):>13.1f}")
PYEOF
