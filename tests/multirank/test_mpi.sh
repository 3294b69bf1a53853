#!/usr/bin/env bash
# The MPI transport under Open MPI's mpirun: collectives on 2 and 3 ranks with checked values.
# usage: test_mpi.sh path/to/tandem   (exit 77 = skipped when mpirun or the transport is missing)
set -u
TANDEM=${1:?usage: test_mpi.sh path/to/tandem}
command -v mpirun >/dev/null || { echo "mpirun not installed: skipped"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
passed=0 failed=0
for np in 2 3; do
  for op in allreduce broadcast reducescatter allgather alltoall sendrecv; do
    out=$(timeout 120 mpirun -np $np "$TANDEM" bench $op -b 8 -e 256K -f 32 -n 2 -w 1 --transport mpi 2>&1)
    rc=$?
    if [[ $rc -eq 0 ]] && grep -q "transport mpi" <<<"$out" && grep -q "Out of bounds values : 0 OK" <<<"$out"; then
      passed=$((passed + 1)); echo "ok   mpirun -np $np bench $op"
    elif grep -q "no MPI transport" <<<"$out"; then
      echo "built without MPI: skipped"; exit 77
    else
      failed=$((failed + 1)); echo "FAIL mpirun -np $np bench $op (exit $rc)"; tail -5 <<<"$out"
    fi
  done
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
