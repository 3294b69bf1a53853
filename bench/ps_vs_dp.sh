#!/usr/bin/env bash
# The parameter server against data parallelism, 2 workers, one thread each (MLP, synthetic data,
# batch 64 per worker, Adam): the median step time (steps 10 and later of --metrics' step_time_ms)
# of data parallelism on 2 ranks, sync mode with 1 and 2 servers (3 and 4 ranks), async with 1
# server; the runs alternate, REPS times, and the table shows each layout's median over
# repetitions and the median of its per-repetition ratio to data parallelism. The servers' bytes
# in per step (their reports) are printed too: 2 workers x the shard x 4 bytes, + 56 per message.
#
#   bench/ps_vs_dp.sh [REPS=5] [STEPS=60]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
STEPS=${2:-60}
T=./build/tandem
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
A=(train --model mlp --data synthetic --steps "$STEPS" --batch-size 64 --threads 1 --prefetch off --eval-batch-size 1000)
declare -A RUN=([dp]="2" [sync1]="3 --ps-servers 1" [sync2]="4 --ps-servers 2" [async1]="3 --ps-servers 1 --ps-mode async")
ORDER=(dp sync1 sync2 async1)
med() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for r in $(seq "$REPS"); do
  for k in "${ORDER[@]}"; do
    set -- ${RUN[$k]}
    n=$1; shift
    timeout 300 "$T" run -n "$n" -- tandem "${A[@]}" "$@" --metrics "$TMP/$k.$r.jsonl" >"$TMP/$k.$r.out" 2>&1
    /usr/bin/python3 -c 'import json,sys,statistics as s
v=[json.loads(l)["step_time_ms"] for l in open(sys.argv[1]) if "step_time_ms" in l][9:]
print(s.median(v))' "$TMP/$k.$r.jsonl" >"$TMP/$k.$r.ms"
  done
  ORDER=("${ORDER[@]:1}" "${ORDER[0]}") # rotate the order
done
printf "%-8s %12s %10s %s\n" layout "step ms" "vs dp" "server bytes in per step"
for k in dp sync1 sync2 async1; do
  m=$(cat "$TMP"/$k.*.ms | med)
  ratio=$(for r in $(seq "$REPS"); do echo "$(cat "$TMP/$k.$r.ms") / $(cat "$TMP/dp.$r.ms")" | bc -l; done | med)
  bytes=$( (grep -ho '"bytes_in":[0-9]*' "$TMP"/$k.1.out | cut -d: -f2 | awk -v s="$STEPS" '{printf "%s%.0f", (NR > 1 ? ", " : ""), $1 / s}') || true)
  printf "%-8s %12.2f %10.3f %s\n" "$k" "$m" "$ratio" "${bytes:--}"
done
