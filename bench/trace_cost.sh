#!/usr/bin/env bash
# What --trace costs a training step: the same run with and without a timeline, alternating,
# REPS times each. Per run the median step time after a warm-up of 10 steps (metrics), and the
# CPU time per step of all ranks (GNU time: the figure that other jobs on the machine disturb
# least); then the medians over the runs, and the ratio on/off (goal: at most 1.02). The recorder's
# own cost per span (bench/trace_span_cost.c, CPU time) times the spans a step records gives its
# share of a step without the noise of whole runs.
#
#   bench/trace_cost.sh [MODEL=mlp|gpt] [RANKS=2] [STEPS=60] [REPS=5]
#
# mlp: the Fashion-MNIST MLP on synthetic data, batch 64, 1 thread per rank over shared memory,
# 0.25 MiB buckets (9 buckets: many collectives per step, the worst case for the recorder's share);
# gpt: the mini config, batch 4 x 64 tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-mlp}
RANKS=${2:-2}
STEPS=${3:-60}
REPS=${4:-5}
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cp build/tandem "$TMP/tandem" # a rebuild meanwhile does not change what is measured
# the recorder alone, in CPU time: ns per span off, on, and written by the flush
cc -O2 -std=gnu11 -Iinclude -Isrc bench/trace_span_cost.c build/libtandem.a -lopenblas -lz -lm -lpthread -o "$TMP/span_cost"
mkdir -p "$TMP/span" && "$TMP/span_cost" "$TMP/span" >"$TMP/span_ns"
case $MODEL in
mlp) ARGS=(--model mlp --data synthetic --batch-size 64 --bucket-mb 0.25) ;;
gpt) ARGS=(--model gpt --config mini --batch-size 4 --seq-len 64 --val-every 0 --val-batches 1) ;;
*) echo "model: mlp or gpt" >&2; exit 2 ;;
esac
for r in $(seq 1 "$REPS"); do
  for mode in off on; do
    extra=()
    [[ $mode == on ]] && extra=(--trace "$TMP/trace")
    rm -rf "$TMP/m.jsonl" "$TMP/trace"
    TANDEM_TRANSPORT=shm /usr/bin/time -f "%U %S" -o "$TMP/cpu" "$TMP/tandem" run -n "$RANKS" -- tandem train "${ARGS[@]}" \
      --steps "$STEPS" --threads 1 --metrics "$TMP/m.jsonl" "${extra[@]}" >/dev/null 2>&1
    /usr/bin/python3 - "$TMP/m.jsonl" "$TMP/cpu" "$STEPS" >>"$TMP/$mode" <<'PYEOF'
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"step_time_ms"' in l][10:]
u, s = map(float, open(sys.argv[2]).read().split()[-2:])
print(statistics.median(x["step_time_ms"] for x in r), (u + s) / int(sys.argv[3]) * 1e3)
PYEOF
    if [[ $mode == on ]]; then
      ev=$(/usr/bin/python3 -c "import json,sys; print(sum(1 for e in json.load(open(sys.argv[1]))['traceEvents'] if e['ph'] in 'Xb'))" "$TMP/trace/trace.rank0.json")
      echo "$ev" >>"$TMP/events"
    fi
  done
  echo "rep $r/$REPS done" >&2
done
/usr/bin/python3 - "$TMP" "$MODEL" "$RANKS" "$STEPS" <<'PYEOF'
import os, statistics, sys
d, model, ranks, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rows = {m: [list(map(float, l.split())) for l in open(os.path.join(d, m))] for m in ("off", "on")}
med = lambda m, k: statistics.median(x[k] for x in rows[m])
ev = statistics.median(int(l) for l in open(os.path.join(d, "events")))
print(f"\n{model}, {ranks} ranks over shm, 1 thread each, {steps} steps, {len(rows['on'])} runs each, alternating (medians)")
print(f"{'':10} {'step (ms)':>10} {'CPU/step (ms, all ranks)':>26}")
for m in ("off", "on"):
    print(f"{'trace ' + m:10} {med(m, 0):10.3f} {med(m, 1):26.3f}")
print(f"{'on/off':10} {med('on', 0) / med('off', 0):10.3f} {med('on', 1) / med('off', 1):26.3f}")
off_ns, on_ns, flush_ns = map(float, open(os.path.join(d, "span_ns")).read().split())
per_rank_cpu = med("on", 1) / int(ranks)
print(f"spans per step on rank 0: {ev / steps:.0f}; a span costs {off_ns:.1f} ns off, {on_ns:.0f} ns on + {flush_ns:.0f} ns "
      f"to write (CPU time, bench/trace_span_cost.c)")
print(f"recorder's share of a rank's CPU time per step: {ev / steps * (on_ns + flush_ns) / 1e6 / per_rank_cpu * 100:.3f}%")
PYEOF
