#!/usr/bin/env bash
# How much of the gradient all-reduce backward hides: 2 ranks over TCP with an emulated network
# (TANDEM_NET_EMULATE), gradient buckets launched from the autograd hooks ("on") versus one
# all-reduce pass after backward (--no-overlap, "off"). Medians of the per-step metrics after a
# warm-up of 10 steps, REPS alternating runs.
#
#   bench/ddp_overlap.sh [MODEL=gpt|mlp] [STEPS=40] [REPS=3] [BUCKET_MB=2]
#
# hidden = 1 - (comm wait with overlap) / (comm wait without): the share of the all-reduce time
# that ran behind backward. gpt is the mini config (13 MB of gradients spread evenly over four
# blocks) at B=4, T=64; mlp is the Fashion-MNIST MLP (2.1 MB, 75% of it in the first layer).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt}
STEPS=${2:-40}
REPS=${3:-3}
BUCKET=${4:-2}
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
case $MODEL in
gpt) ARGS=(--model gpt --config mini --batch-size 4 --seq-len 64 --val-every 0 --val-batches 1) ;;
mlp) ARGS=(--model mlp --batch-size 64) ;;
*) echo "model: gpt or mlp" >&2; exit 2 ;;
esac
NETS=("100us,10gbps" "100us,1gbps")
for r in $(seq 1 "$REPS"); do
  for net in "${NETS[@]}"; do
    for ov in on off; do
      extra=()
      [[ $ov == off ]] && extra=(--no-overlap)
      rm -f "$TMP/m.jsonl" # metrics files are appended to
      TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=$net ./build/tandem run -n 2 -- tandem train "${ARGS[@]}" \
        --steps "$STEPS" --threads 1 --bucket-mb "$BUCKET" --metrics "$TMP/m.jsonl" "${extra[@]}" >/dev/null 2>&1
      /usr/bin/python3 - "$TMP/m.jsonl" >>"$TMP/$net.$ov" <<'PYEOF'
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"step_time_ms"' in l][10:]
print(statistics.median(x["step_time_ms"] for x in r), statistics.median(x["time_comm_wait_ms"] for x in r),
      statistics.median(x["time_backward_ms"] for x in r))
PYEOF
    done
  done
  echo "rep $r/$REPS done" >&2
done
BUCKET=$BUCKET /usr/bin/python3 - "$TMP" "$MODEL" "${NETS[@]}" <<'PYEOF'
import os, statistics, sys
d, model, nets = sys.argv[1], sys.argv[2], sys.argv[3:]
med = lambda f, k: statistics.median(float(l.split()[k]) for l in open(os.path.join(d, f)))
print("\n%s, 2 ranks over TCP, 1 thread each, %s MiB buckets (ms, medians)" % (model, os.environ.get("BUCKET")))
print("%-14s %-8s %9s %10s %9s %8s" % ("network", "overlap", "step", "comm wait", "backward", "hidden"))
for n in nets:
    off = med(n + ".off", 1)
    for ov in ("on", "off"):
        w = med(n + "." + ov, 1)
        print("%-14s %-8s %9.2f %10.2f %9.2f %8s" % (n, ov, med(n + "." + ov, 0), w, med(n + "." + ov, 2),
                                                     "%.0f%%" % (100 * (1 - w / off)) if ov == "on" else ""))
PYEOF
