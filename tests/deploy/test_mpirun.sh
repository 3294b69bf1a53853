#!/usr/bin/env bash
# Open MPI's mpirun with nothing set by hand: on one node `mpirun -np 2 tandem train` is a 2-rank
# job over shared memory (local ranks from OMPI_COMM_WORLD_LOCAL_SIZE, the store's port from the
# job id); as if across two nodes (each rank told by OMPI_COMM_WORLD_LOCAL_SIZE=1 that it is alone
# on its node, no MASTER_ADDR) the job bootstraps through MPI and runs on the MPI transport, and
# its weights equal the shared-memory job's bit for bit.
# usage: test_mpirun.sh path/to/tandem   (exit 77 = skipped: no mpirun, or built without MPI)
set -u
T=$(readlink -f "${1:?usage: test_mpirun.sh path/to/tandem}")
command -v mpirun >/dev/null || { echo "skip: mpirun not installed (scripts/setup.sh installs openmpi-bin)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" # Open MPI's own
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TANDEM_NUM_THREADS TANDEM_TRANSPORT TANDEM_STORE_DIR
TMP=$(mktemp -d /tmp/tandem-mpirun-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP" || exit 1
A=(train --steps 60 --seed 5)
failed=0
header() { grep "^tandem train:" "$1"; }

timeout 180 mpirun -np 2 "$T" "${A[@]}" --save-weights one.st >one.out 2>&1 </dev/null
if [[ $? -eq 0 ]] && header one.out | grep -q "batch 64 x 2 data ranks.*, 2 ranks, transport shm"; then
  echo "ok   mpirun -np 2 on one node: 2 ranks over shm ($(header one.out | grep -o '[0-9]* threads\? per rank'))"
else
  echo "FAIL mpirun -np 2 on one node"; tail -15 one.out; failed=1
fi

timeout 180 mpirun -np 2 env OMPI_COMM_WORLD_LOCAL_SIZE=1 OMPI_COMM_WORLD_LOCAL_RANK=0 "$T" "${A[@]}" --save-weights two.st \
  >two.out 2>&1 </dev/null
rc=$?
if grep -q "built without MPI" two.out; then
  echo "skip the MPI bootstrap: this tandem is built without MPI, and says so:"; grep "built without MPI" two.out | head -1
  exit $((failed ? 1 : 77))
fi
if [[ $rc -eq 0 ]] && header two.out | grep -q ", 2 ranks, transport mpi" && cmp -s one.st two.st; then
  echo "ok   mpirun -np 2 as two nodes, no MASTER_ADDR: bootstrapped through MPI, weights == the shm job's bit for bit"
else
  echo "FAIL mpirun -np 2 as two nodes (exit $rc)"; header two.out; tail -15 two.out; cmp one.st two.st; failed=1
fi
exit $failed
