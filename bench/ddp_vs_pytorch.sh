#!/usr/bin/env bash
# Data-parallel MLP training, tandem vs PyTorch DDP (gloo), 1 and 2 ranks, 1 thread each, batch 64
# per rank: samples/s (all ranks), scaling efficiency = 2-rank / (2 x 1-rank), medians of REPS
# alternating runs.   bench/ddp_vs_pytorch.sh [REPS=3] [STEPS=400]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
STEPS=${2:-400}
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
sps_tandem() { # ranks
  rm -f "$TMP/m.jsonl" # metrics files are appended to
  if [[ $1 -eq 1 ]]; then
    OPENBLAS_NUM_THREADS=1 ./build/tandem train --steps "$STEPS" --threads 1 --metrics "$TMP/m.jsonl" >/dev/null 2>&1
  else
    ./build/tandem run -n "$1" -- tandem train --steps "$STEPS" --threads 1 --metrics "$TMP/m.jsonl" >/dev/null 2>&1
  fi
  /usr/bin/python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if "step_time_ms" in l][20:]
print(sum(x["samples_per_sec"] * x["step_time_ms"] for x in r) / sum(x["step_time_ms"] for x in r))' "$TMP/m.jsonl"
}
sps_torch() {
  /usr/bin/python3 bench/ddp_pytorch.py --ranks "$1" --steps "$STEPS" --batch 64 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["samples_per_sec"])'
}
for r in $(seq 1 "$REPS"); do
  for n in 1 2; do
    sps_tandem $n >>"$TMP/t$n"
    sps_torch $n >>"$TMP/p$n"
  done
  echo "rep $r/$REPS done" >&2
done
med() { sort -g "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
t1=$(med "$TMP/t1"); t2=$(med "$TMP/t2"); p1=$(med "$TMP/p1"); p2=$(med "$TMP/p2")
awk -v t1="$t1" -v t2="$t2" -v p1="$p1" -v p2="$p2" 'BEGIN {
  printf "\nMLP, batch 64 per rank, 1 thread per rank, samples/s over all ranks (medians)\n"
  printf "%-8s %10s %10s %12s\n", "", "1 rank", "2 ranks", "efficiency"
  printf "%-8s %10.0f %10.0f %11.0f%%\n", "tandem", t1, t2, 100 * t2 / (2 * t1)
  printf "%-8s %10.0f %10.0f %11.0f%%\n", "PyTorch", p1, p2, 100 * p2 / (2 * p1)
  printf "2-rank throughput, tandem / PyTorch: %.2fx\n", t2 / p2 }'
