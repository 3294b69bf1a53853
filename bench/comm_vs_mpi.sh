#!/usr/bin/env bash
# tandem all-reduce (2 ranks, float sum) vs Open MPI's MPI_Allreduce on this machine, side by side:
# both run REPS times in turn over the same sizes; the medians of the out-of-place busbw and time
# are compared per size.
#
#   bench/comm_vs_mpi.sh [REPS=5] [TRANSPORT=shm] [MAX=256M]
#
# Needs openmpi-bin and libopenmpi-dev (apt-get install openmpi-bin libopenmpi-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
TR=${2:-shm}
MAX=${3:-256M}
command -v mpicc >/dev/null || { echo "needs Open MPI: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 2; }
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mpicc -O2 -o "$TMP/mpi_allreduce" bench/mpi_allreduce.c
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ARGS=(-b 8 -e "$MAX" -f 2 -n 20 -w 5)
for r in $(seq 1 "$REPS"); do
  ./build/tandem run -n 2 -- env TANDEM_TRANSPORT="$TR" ./build/tandem bench allreduce "${ARGS[@]}" -c 0 2>&1 |
    grep -v '#' | awk '{print $3, $8, $10}' >"$TMP/tandem.$r"
  mpirun -np 2 --oversubscribe "$TMP/mpi_allreduce" "${ARGS[@]}" 2>/dev/null | grep -v '#' | awk '{print $1, $6, $8}' >"$TMP/mpi.$r"
  echo "rep $r/$REPS done" >&2
done
/usr/bin/python3 - "$TMP" "$REPS" "$TR" <<'PYEOF'
import statistics as st, sys
tmp, reps, tr = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(name):
    rows = {}
    for r in range(1, reps + 1):
        for line in open(f"{tmp}/{name}.{r}"):
            f = line.split()
            if len(f) == 3:
                rows.setdefault(int(f[0]), []).append((float(f[1]), float(f[2])))
    return {k: (st.median(t for t, _ in v), st.median(b for _, b in v)) for k, v in rows.items()}
t, m = load("tandem"), load("mpi")
print(f"\nall-reduce, 2 ranks, float sum: tandem ({tr}) vs Open MPI, medians of {reps} runs (out-of-place)")
print(f"{'size (B)':>12} {'tandem us':>10} {'MPI us':>10} {'tandem busbw':>13} {'MPI busbw':>10} {'ratio':>7}")
for k in sorted(set(t) & set(m)):
    ratio = t[k][1] / m[k][1] if m[k][1] > 0 else float('nan')
    if k < 4096:
        ratio = m[k][0] / t[k][0]  # latency-bound: compare times
    print(f"{k:>12} {t[k][0]:>10.2f} {m[k][0]:>10.2f} {t[k][1]:>13.2f} {m[k][1]:>10.2f} {ratio:>6.2f}x")
print("(ratio: busbw tandem / MPI; below 4 KiB, time MPI / tandem. GB = 1e9 bytes)")
PYEOF
