#!/usr/bin/env bash
# One GPT training step (tdm_engine_step: forward, backward, AdamW; fp32), the same global batch of
# B sequences four ways, REPS alternating rounds, medians of the steady-state steps:
#   1 proc    one process, one thread
#   1 proc x2 one process, two intra-op threads (both cores on one model)
#   dp=2      tandem run -n 2, data parallel: B/2 sequences per rank, gradients averaged
#   tp=2      tandem run -n 2, tensor parallel (Megatron-style): each rank half the heads, half the
#             MLP, half the vocabulary, on all B sequences; 4L+2 all-reduces of B x T x C per step
# "comm" is the step's time in collectives (tensor parallelism's inside forward and backward,
# data parallelism's wait after backward), waiting for the peer included.
#
#   bench/tp_vs_dp.sh [CONFIG=mini|gpt2-124M] [STEPS=10] [REPS=3] [B=8] [SEQ=64]
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-mini}
STEPS=${2:-10}
REPS=${3:-3}
B=${4:-8}
SEQ=${5:-64}
[[ -x build/tandem ]] || make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
A=(bench gpt --config "$CONFIG" --seq-len "$SEQ" --steps "$STEPS" --warmup 2 --json)
export TANDEM_TRANSPORT=shm
for r in $(seq 1 "$REPS"); do
  ./build/tandem "${A[@]}" --batch-size "$B" --threads 1 >>"$TMP/one"
  ./build/tandem "${A[@]}" --batch-size "$B" --threads 2 >>"$TMP/one2"
  ./build/tandem run -n 2 -- tandem "${A[@]}" --batch-size $((B / 2)) --threads 1 | sed 's/^\[rank 0\] //' >>"$TMP/dp2"
  ./build/tandem run -n 2 -- tandem "${A[@]}" --batch-size "$B" --threads 1 --tp 2 | sed 's/^\[rank 0\] //' >>"$TMP/tp2"
  echo "round $r/$REPS done" >&2
done
/usr/bin/python3 - "$TMP" "$CONFIG" "$B" "$SEQ" <<'PYEOF'
import json, os, statistics as st, sys
d, config, B, T = sys.argv[1:5]
runs = [("1 proc", "one"), ("1 proc x2", "one2"), ("dp=2", "dp2"), ("tp=2", "tp2")]
rows = {k: [json.loads(l) for l in open(os.path.join(d, f)) if l.startswith("{")] for k, f in runs}
med = lambda k, f: st.median(x[f] for x in rows[k])
base = med("1 proc", "ms")
p = rows["1 proc"][0]
print("\nGPT %s (%d parameters), global batch %s x %s tokens, medians of %d rounds (ms)" % (config, p["params"], B, T, len(rows["1 proc"])))
print("%-10s %9s %9s %9s %9s %9s %10s %8s" % ("", "step", "forward", "backward", "optim", "comm", "held MiB", "vs 1 proc"))
for k, _ in runs:
    print("%-10s %9.1f %9.1f %9.1f %9.1f %9.1f %10.1f %7.2fx" % (k, med(k, "ms"), med(k, "fwd_ms"), med(k, "bwd_ms"),
          med(k, "opt_ms"), med(k, "comm_wait_ms"), med(k, "held_mib"), base / med(k, "ms")))
PYEOF
