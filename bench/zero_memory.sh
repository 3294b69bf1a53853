#!/usr/bin/env bash
# Memory per rank of ZeRO stages against stage 0: GPT-2 124M on 4 ranks (B=1, T=64 per rank, one
# thread each), a few steps of tandem bench gpt per stage: the peak RSS of the largest rank, and
# what the library holds at the peak per category on rank 0 (parameters, gradients, optimizer
# state: the training state the closed forms describe, 16Ψ bytes per rank at stage 0, 8Ψ + 8Ψ/N
# at stage 1, 4Ψ + 12Ψ/N at stage 2, 16Ψ/N at stage 3; and the activations, communication and
# workspace beside it).
#
#   bench/zero_memory.sh [STAGES="0 1 2 3"] [RANKS=4] [CONFIG=gpt2-124M] [EXTRA=""]
#
# Stage 0 needs about 2.5 GB per rank at 124M (and its gradients live in a shared region of
# 4 x 0.5 GB in /dev/shm): check `free -g` first.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGES=${1:-"0 1 2 3"}
RANKS=${2:-4}
CONFIG=${3:-gpt2-124M}
EXTRA=${4:-}
PY=/usr/bin/python3
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for s in $STAGES; do
  # shellcheck disable=SC2086
  ./build/tandem run -n "$RANKS" -- tandem bench gpt --config "$CONFIG" --batch-size 1 --seq-len 64 --threads 1 \
    --steps 2 --warmup 1 --zero "$s" --json $EXTRA | sed 's/^\[rank 0\] //' >"$TMP/$s"
  echo "stage $s done" >&2
done

$PY - "$TMP" "$STAGES" "$RANKS" <<'PYEOF'
import json, os, sys
d, stages, N = sys.argv[1], [int(s) for s in sys.argv[2].split()], int(sys.argv[3])
r = {s: json.load(open(os.path.join(d, str(s)))) for s in stages}
psi = r[stages[0]]["params"]
theory = {0: 16, 1: 8 + 8 / N, 2: 4 + 12 / N, 3: 16 / N}
M = 1048576
cats = ["parameters", "gradients", "optimizer", "activations", "communication", "workspace"]
print(f"\n{r[stages[0]]['config']} ({psi} parameters), {N} ranks, B=1 T=64 per rank; MiB per rank")
print("%-5s %9s %9s %8s %8s %8s %9s %9s %8s %8s %9s %9s %8s" % ("stage", "peak RSS", "held", "params", "grads", "optim",
      "activ", "comm", "work", "state", "theory", "vs st. 0", "ms"))
s0 = None
for s in stages:
    x = r[s]
    state = x["parameters_mib"] + x["gradients_mib"] + x["optimizer_mib"]
    s0 = state if s0 is None else s0
    print("%-5d %9.0f %9.0f %8.0f %8.0f %8.0f %9.0f %9.0f %8.0f %8.0f %9.0f %8.2fx %8.0f" % (
        s, x["peak_rss_mib"], x["held_mib"], *[x[c + "_mib"] for c in cats], state, theory[s] * psi / M, state / s0, x["ms"]))
print("(peak RSS: the largest rank's; held and its categories: rank 0 at the peak; state = parameters + gradients +")
print(" optimizer; theory: the closed form of the state in bytes x Ψ / 2^20)")
PYEOF
