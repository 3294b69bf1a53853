#!/usr/bin/env bash
# The hierarchical all-reduce vs the flat ring, 4 ranks over TCP as 2 "nodes" of 2
# (TANDEM_NODE_ID = RANK / 2). TANDEM_NET_EMULATE then slows only the links between the nodes:
# inside a node the ring's neighbours talk over loopback TCP, the hierarchical all-reduce over
# shared memory. Float sum, 1 MB to MAX by 4x, results checked (#wrong must be 0), REPS
# alternating runs (hier first, then ring), medians per size and their ratio.
#
#   bench/hier_allreduce.sh [REPS=3] [NET=100us,1gbps] [MAX=64M]
#   (ITERS=5 timed iterations a size, BUILD=build)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
NET=${2:-100us,1gbps}
MAX=${3:-64M}
B=${BUILD:-build}
[[ -x $B/tandem ]] || make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
ARGS=(-b 1M -e "$MAX" -f 4 -n "${ITERS:-5}" -w 1 -c 1)
side() { # side ALGO > rows "size time_us busbw"
  TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE="$NET" "./$B/tandem" run -n 4 -- \
    sh -c 'TANDEM_NODE_ID=node$((RANK / 2)) exec "$0" "$@"' "./$B/tandem" bench allreduce "${ARGS[@]}" -a "$1" >"$TMP/raw" 2>&1 ||
    { cat "$TMP/raw" >&2; exit 1; }
  awk '$1 == "[rank" && $2 == "0]" && $3 ~ /^[0-9]+$/ {
         if ($11 != 0 || $15 != 0) { print "wrong results at size " $3 > "/dev/stderr"; exit 1 }
         print $3, $8, $10 }' "$TMP/raw"
}
for r in $(seq 1 "$REPS"); do
  side hier >"$TMP/hier.$r"
  side ring >"$TMP/ring.$r"
  echo "rep $r/$REPS done" >&2
done
python3 bench/compare_medians.py "$TMP" "$REPS" hier ring \
  "all-reduce, 4 ranks as 2 nodes of 2 over TCP, links between nodes emulated at $NET, float sum: hierarchical vs flat ring"
