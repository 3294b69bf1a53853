#!/usr/bin/env bash
# tandem vs PyTorch 1.13 training the same MLP (784-512-256-10, ReLU, dropout 0.3, Adam) on
# Fashion-MNIST, one thread each, at batch 64 and 256. Both sides run in turn, REPS times, and
# the medians are compared. PyTorch is measured two ways: the training loop over preloaded
# tensors ("loop"), and with TensorDataset + DataLoader(shuffle=True) ("DataLoader").
#
#   bench/mlp_vs_pytorch.sh [REPS=5] [STEPS=300]
#
# samples/s counts steps after a warm-up of 20 (tandem: from its per-step metrics).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
STEPS=${2:-300}
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PY=/usr/bin/python3
FLOP_PER_SAMPLE=2407424 # forward 2P + weight grads 2P + input grads of layers 2 and 3

tandem_sps() { # batch
  rm -f "$TMP/m.jsonl" # metrics files are appended to
  ./build/tandem train --steps "$STEPS" --batch-size "$1" --threads 1 --metrics "$TMP/m.jsonl" >/dev/null 2>&1
  $PY - "$TMP/m.jsonl" "$1" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step_time_ms"' in l][20:]
print(len(rows) * int(sys.argv[2]) / (sum(r["step_time_ms"] for r in rows) / 1e3))
PYEOF
}
torch_sps() { # batch loader
  $PY bench/mlp_pytorch.py --steps "$STEPS" --batch "$1" --threads 1 --loader "$2" |
    $PY -c 'import json,sys; print(json.load(sys.stdin)["samples_per_sec"])'
}

for b in 64 256; do : >"$TMP/t$b"; : >"$TMP/l$b"; : >"$TMP/d$b"; done
for r in $(seq 1 "$REPS"); do
  for b in 64 256; do
    tandem_sps $b >>"$TMP/t$b"
    torch_sps $b tensor >>"$TMP/l$b"
    torch_sps $b dataloader >>"$TMP/d$b"
  done
  echo "rep $r/$REPS done" >&2
done
PEAK=$(./build/bench/sgemm_peak | $PY -c 'import json,sys; print(json.load(sys.stdin)["sgemm_gflops"])')

median() { sort -g "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf "\nMLP training, 1 thread, medians of %s runs of %s steps (samples/s)\n" "$REPS" "$STEPS"
printf "%6s %10s %12s %12s %12s %12s %12s\n" batch tandem "torch loop" "torch DL" "x loop" "x DL" "sgemm peak"
for b in 64 256; do
  t=$(median "$TMP/t$b"); l=$(median "$TMP/l$b"); d=$(median "$TMP/d$b")
  awk -v b=$b -v t=$t -v l=$l -v d=$d -v f=$FLOP_PER_SAMPLE -v p=$PEAK 'BEGIN {
    printf "%6d %10.0f %12.0f %12.0f %11.2fx %11.2fx %11.0f%%\n", b, t, l, d, t / l, t / d, 100 * t * f / 1e9 / p }'
done
echo "(sgemm peak on one core: $PEAK GFLOP/s; x = tandem / PyTorch)"
