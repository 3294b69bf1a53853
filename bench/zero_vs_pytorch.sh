#!/usr/bin/env bash
# tandem's ZeRO stages 0-3 against PyTorch 1.13 on the same GPT mini (4 layers, 4 heads, width
# 256, vocab 256, block 128), B=4 T=64 per rank, AdamW, fp32, 2 ranks with one thread each:
#   stage 0  tandem data parallel (shm)       PyTorch DistributedDataParallel (gloo)
#   stage 1  tandem --zero 1                  DDP + ZeroRedundancyOptimizer
#   stage 2  tandem --zero 2                  FSDP SHARD_GRAD_OP (on the CPU: bench/zero_pytorch.py)
#   stage 3  tandem --zero 3 (unit: a block)  FSDP FULL_SHARD, one unit per block
# Step time (rank 0's median of its steps) and memory per rank: peak RSS (the largest of any
# rank), and the training state a rank holds (parameters, gradients, optimizer state; tandem: the
# library's count at the peak; PyTorch: the tensors it keeps after a step).
#
#   bench/zero_vs_pytorch.sh [REPS=5] [STEPS=10]
#
# Both sides run in turn, every stage in every repetition, in an order that rotates; the table
# shows medians over the repetitions and the median of the per-repetition ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
STEPS=${2:-10}
PY=/usr/bin/python3
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
MODES=(ddp zero1 grad_op full)

for r in $(seq 1 "$REPS"); do
  for k in 0 1 2 3; do
    s=$(((k + r) % 4))
    ./build/tandem run -n 2 -- tandem bench gpt --config mini --batch-size 4 --seq-len 64 --threads 1 --zero "$s" \
      --steps "$STEPS" --warmup 3 --json | sed 's/^\[rank 0\] //' >>"$TMP/tandem_$s"
    OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
      $PY bench/zero_pytorch.py --mode "${MODES[$s]}" --ranks 2 --layers 4 --heads 4 --width 256 --vocab 256 \
      --block 128 --batch 4 --seq 64 --threads 1 --steps "$STEPS" --warmup 3 2>/dev/null >>"$TMP/torch_$s"
  done
  echo "rep $r/$REPS done" >&2
done

$PY - "$TMP" "$REPS" <<'PYEOF'
import json, os, statistics as st, sys
d, reps = sys.argv[1], int(sys.argv[2])
rows = lambda f: [json.loads(l) for l in open(os.path.join(d, f))]
med = lambda xs: st.median(xs)
modes = ["DDP", "DDP + ZeroRedundancyOptimizer", "FSDP SHARD_GRAD_OP", "FSDP FULL_SHARD"]
print(f"\nGPT mini, B=4 T=64 per rank, 2 ranks x 1 thread, AdamW fp32: medians of {reps} alternating runs")
print("%-5s %-30s %10s %10s %7s %9s %9s %9s %9s %9s" % ("stage", "PyTorch", "tandem ms", "PyTorch ms", "ratio", "RSS tdm",
      "RSS pt", "(pt base)", "state tdm", "state pt"))
for s in range(4):
    t, p = rows(f"tandem_{s}"), rows(f"torch_{s}")
    ratio = med([a["ms"] / b["ms"] for a, b in zip(t, p)])
    state_t = med([a["parameters_mib"] + a["gradients_mib"] + a["optimizer_mib"] for a in t])
    print("%-5d %-30s %10.1f %10.1f %7.2f %8.0fM %8.0fM %8.0fM %8.1fM %8.1fM" % (
        s, modes[s], med([a["ms"] for a in t]), med([b["ms"] for b in p]), ratio,
        max(a["peak_rss_mib"] for a in t), max(max(b["peak_rss_mib"]) for b in p), max(max(b["base_rss_mib"]) for b in p),
        state_t, med([max(b["state_mib"]) for b in p])))
print("(ratio: tandem / PyTorch, the median of the per-repetition ratios. RSS: the peak of the largest rank; pt base: PyTorch's")
print(" RSS before it builds the model, the Python and torch runtime. state: parameters + gradients + optimizer state per rank,")
print(" tandem's at the peak of a step (rank 0), PyTorch's after a step (the largest rank); theory 16, 12, 10 and 8 bytes x Ψ)")
PYEOF
