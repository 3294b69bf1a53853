#!/usr/bin/env bash
# tandem all-reduce over TCP (loopback) vs PyTorch's Gloo, 2 ranks, float sum, side by side:
# REPS alternating runs, medians compared per size.
#
#   bench/tcp_vs_gloo.sh [REPS=3] [MAX=64M]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
MAX=${2:-64M}
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
ARGS=(-b 64 -e "$MAX" -f 4 -n 10 -w 3)
for r in $(seq 1 "$REPS"); do
  ./build/tandem run -n 2 -- ./build/tandem bench allreduce "${ARGS[@]}" -c 0 --transport tcp 2>&1 |
    grep -v '#' | awk '{print $3, $8, $10}' >"$TMP/tandem.$r"
  /usr/bin/python3 bench/gloo_allreduce.py "${ARGS[@]}" 2>/dev/null | grep -v '#' | awk '{print $1, $6, $8}' >"$TMP/gloo.$r"
  echo "rep $r/$REPS done" >&2
done
/usr/bin/python3 bench/compare_medians.py "$TMP" "$REPS" tandem gloo \
  "all-reduce over loopback TCP, 2 ranks, float sum: tandem vs Gloo"
