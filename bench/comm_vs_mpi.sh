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
/usr/bin/python3 bench/compare_medians.py "$TMP" "$REPS" tandem mpi \
  "all-reduce, 2 ranks, float sum, out-of-place: tandem ($TR) vs Open MPI"
