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
/usr/bin/python3 - "$TMP" "$REPS" <<'PYEOF'
import statistics as st, sys
tmp, reps = sys.argv[1], int(sys.argv[2])
def load(name):
    rows = {}
    for r in range(1, reps + 1):
        for line in open(f"{tmp}/{name}.{r}"):
            f = line.split()
            if len(f) == 3:
                rows.setdefault(int(f[0]), []).append((float(f[1]), float(f[2])))
    return {k: (st.median(t for t, _ in v), st.median(b for _, b in v)) for k, v in rows.items()}
t, g = load("tandem"), load("gloo")
print(f"\nall-reduce over loopback TCP, 2 ranks, float sum: tandem vs Gloo, medians of {reps} runs")
print(f"{'size (B)':>12} {'tandem us':>10} {'Gloo us':>10} {'tandem busbw':>13} {'Gloo busbw':>11} {'ratio':>7}")
for k in sorted(set(t) & set(g)):
    ratio = g[k][0] / t[k][0]
    print(f"{k:>12} {t[k][0]:>10.2f} {g[k][0]:>10.2f} {t[k][1]:>13.2f} {g[k][1]:>11.2f} {ratio:>6.2f}x")
print("(ratio: Gloo time / tandem time = tandem busbw / Gloo busbw. GB = 1e9 bytes)")
PYEOF
