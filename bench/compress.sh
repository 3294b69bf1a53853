#!/usr/bin/env bash
# Gradient compression against uncompressed training (tandem/compress.h), 2 ranks, 1 thread each.
#
#   bench/compress.sh mlp [EPOCHS=1] [SPECS...]   Fashion-MNIST MLP: test accuracy and loss after
#                                                EPOCHS, gradient bytes a rank sends per step
#                                                (measured, the median of the metrics' grad_bytes)
#   bench/compress.sh gpt [STEPS=300] [SPECS...]  GPT mini on tinyshakespeare (B=$GPT_BATCH or 8, T=128):
#                                                validation loss after STEPS (20 batches), bytes
#   bench/compress.sh net [STEPS=60] [REPS=3] [SPECS...]
#                                                MLP step time over TCP with TANDEM_NET_EMULATE at
#                                                100us,1gbps and 100us,100mbps: medians of steps
#                                                10.. of REPS alternating runs
# SPECS default: none topk:0.01 powersgd:4 (any --compress value). BUILD: the build directory. EXTRA: more
# train options for mlp and gpt (e.g. EXTRA="--compress-start 30"). Shared machines are noisy:
# compare the step times of one invocation (alternating runs), not across invocations.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-mlp}
shift || true
B=${BUILD:-build} # the build directory (make build BUILD=...)
make build BUILD="$B" >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
summary() { # metrics file -> "median_grad_bytes median_step_ms" over steps 10..
  /usr/bin/python3 - "$1" <<'PYEOF'
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"step_time_ms"' in l]
r = r[10:] if len(r) > 20 else r
print(int(statistics.median(x.get("grad_bytes", 0) for x in r)), statistics.median(x["step_time_ms"] for x in r),
      statistics.median(x.get("compress_rel_err", [0])[0] for x in r) if "compress_rel_err" in r[-1] else "-")
PYEOF
}
case $MODE in
mlp | gpt)
  N=${1:-$([[ $MODE == mlp ]] && echo 1 || echo 300)}
  shift || true
  SPECS=("$@")
  [[ ${#SPECS[@]} -gt 0 ]] || SPECS=(none topk:0.01 powersgd:4)
  if [[ $MODE == mlp ]]; then ARGS=(--model mlp --epochs "$N"); else ARGS=(--model gpt --config mini --steps "$N" --batch-size "${GPT_BATCH:-8}" --val-every 0 --val-batches 20); fi
  printf "%s, 2 ranks (shm), 1 thread each, %s %s\n" "$MODE" "$N" "$([[ $MODE == mlp ]] && echo epochs || echo steps)"
  printf "%-12s %12s %12s %14s %8s %12s %10s\n" compress "$([[ $MODE == mlp ]] && echo test_acc || echo val_loss)" \
    "$([[ $MODE == mlp ]] && echo test_loss || echo val_acc)" "bytes/step" fewer "rel_err(b0)" "wall s"
  base=
  for s in "${SPECS[@]}"; do
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    out=$(./$B/tandem run -n 2 -- tandem train "${ARGS[@]}" --threads 1 --compress "$s" ${EXTRA:-} --metrics "$TMP/$s.m" 2>&1)
    t1=$(date +%s.%N)
    if [[ $MODE == mlp ]]; then
      a=$(grep -o 'test accuracy: [0-9.]*' <<<"$out" | awk '{print $3}'); l=$(grep -o 'test loss: [0-9.]*' <<<"$out" | tail -1 | awk '{print $3}')
    else
      a=$(grep -o 'val loss: [0-9.]*' <<<"$out" | tail -1 | awk '{print $3}'); l=$(grep -o 'next-byte accuracy: [0-9.]*' <<<"$out" | awk '{print $3}')
    fi
    read -r bytes step relerr <<<"$(summary "$TMP/$s.m")"
    [[ -n "$base" ]] || base=$bytes
    printf "%-12s %12s %12s %14s %8s %12s %10.1f\n" "$s" "$a" "$l" "$bytes" "$(awk -v a="$base" -v b="$bytes" 'BEGIN{printf "%.1fx", a/b}')" \
      "$relerr" "$(echo "$t1 - $t0" | bc)"
  done
  ;;
net)
  STEPS=${1:-60}
  REPS=${2:-3}
  shift 2 || true
  SPECS=("$@")
  [[ ${#SPECS[@]} -gt 0 ]] || SPECS=(none topk:0.01 powersgd:4)
  NETS=("100us,1gbps" "100us,100mbps")
  for r in $(seq 1 "$REPS"); do
    for net in "${NETS[@]}"; do
      for s in "${SPECS[@]}"; do
        rm -f "$TMP/m.jsonl" # metrics files are appended to: one run's steps each time
        TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=$net ./$B/tandem run -n 2 -- tandem train --model mlp --steps "$STEPS" \
          --threads 1 --compress "$s" --metrics "$TMP/m.jsonl" >/dev/null 2>&1
        summary "$TMP/m.jsonl" >>"$TMP/$net.$s"
      done
    done
    echo "rep $r/$REPS done" >&2
  done
  /usr/bin/python3 - "$TMP" "${#NETS[@]}" "${NETS[@]}" "${SPECS[@]}" <<'PYEOF'
import os, statistics, sys
d, nn = sys.argv[1], int(sys.argv[2])
nets, specs = sys.argv[3:3 + nn], sys.argv[3 + nn:]
print("\nMLP (batch 64 a rank), 2 ranks over TCP, 1 thread each: step time (ms, median of runs' medians)")
print("%-14s %-12s %12s %9s %9s" % ("network", "compress", "bytes/step", "step ms", "speed-up"))
for n in nets:
    base = None
    for s in specs:
        rows = [l.split() for l in open(os.path.join(d, n + "." + s))]
        ms = statistics.median(float(x[1]) for x in rows)
        base = base or ms
        print("%-14s %-12s %12s %9.1f %8.2fx" % (n, s, rows[0][0], ms, base / ms))
PYEOF
  ;;
*) echo "mode: mlp, gpt or net" >&2; exit 2 ;;
esac
