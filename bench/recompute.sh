#!/usr/bin/env bash
# Activation recomputation: what it saves and what it costs. tandem bench gpt runs the training
# step (forward, backward, AdamW) with --recompute none, block and selective in turn, REPS times;
# the table gives the medians of step time and of the tape's peak (the activations category of
# tandem's memory accounting), each against none.
#
#   bench/recompute.sh [REPS=3] [CONFIGS="mini:16:128 124M:4:256"] [THREADS=2] [MODEL=gpt]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
CONFIGS=${2:-"mini:16:128 124M:4:256"}
THREADS=${3:-2}
MODEL=${4:-gpt}
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

config() {
  case $MODEL:$1 in
  gpt:mini) echo "--config mini" ;; gpt:124M) echo "--config gpt2-124M" ;;
  llama:mini) echo "--config llama-mini" ;; llama:1B) echo "--config llama3.2-1B --optimizer sgd" ;;
  *) echo "unknown config $1" >&2; exit 2 ;;
  esac
}
steps() { case $1 in mini) echo "8 2" ;; *) echo "3 1" ;; esac; }

for r in $(seq 1 "$REPS"); do
  for c in $CONFIGS; do
    IFS=: read -r name B T <<<"$c"
    read -r n w <<<"$(steps "$name")"
    for mode in none block selective; do
      # shellcheck disable=SC2046
      ./build/tandem bench "$MODEL" $(config "$name") --batch-size "$B" --seq-len "$T" --threads "$THREADS" --steps "$n" \
        --warmup "$w" --recompute "$mode" --json >>"$TMP/${name}_${B}_${T}_$mode"
    done
  done
  echo "rep $r/$REPS done" >&2
done

/usr/bin/python3 - "$TMP" "$CONFIGS" "$REPS" "$THREADS" "$MODEL" <<'PYEOF'
import json, os, statistics, sys
d, configs, reps, threads, model = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4], sys.argv[5]
print(f"\nActivation recomputation, {model}, {threads} threads, medians of {reps} runs")
print(f"{'config':<16} {'mode':<10} {'step ms':>9} {'vs none':>8} {'activations MiB':>16} {'reduction':>10}")
for c in configs:
    name, B, T = c.split(":")
    med = {}
    for mode in ("none", "block", "selective"):
        rows = [json.loads(l) for l in open(os.path.join(d, f"{name}_{B}_{T}_{mode}"))]
        med[mode] = (statistics.median(r["ms"] for r in rows), statistics.median(r["activations_mib"] for r in rows))
    for mode in ("none", "block", "selective"):
        ms, act = med[mode]
        print(f"{name + ' B=' + B + ' T=' + T:<16} {mode:<10} {ms:>9.1f} {100 * (ms / med['none'][0] - 1):>+7.1f}% {act:>16.1f} "
              f"{100 * (1 - act / med['none'][1]):>9.1f}%")
PYEOF
