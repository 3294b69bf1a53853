#!/usr/bin/env bash
# The MPI transport under Open MPI's mpirun: collectives on 2 and 3 ranks with checked values;
# payloads in pieces; mismatched calls named on both ranks; tagged messages and any-source receives;
# the parameter server in sync mode over MPI equals data parallelism bit for bit.
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
# The MPI transport in pieces (a payload over 2 GiB cannot be one MPI message: counts are int),
# and each field of a call's identity: the call fails on both ranks naming both calls
# (test_multirank's cases under mpirun, one per field; a failed MPI transport aborts the job at
# the end, so each case is a job of its own).
TESTS=$(dirname "$TANDEM")/tests/test_multirank
out=$(timeout 120 mpirun -np 2 "$TESTS" mpi-pieces 2>&1)
rc=$?
if [[ $rc -eq 0 ]] && [[ $(grep -c "collectives with 1000-byte pieces: ok" <<<"$out") -eq 2 ]]; then
  passed=$((passed + 1)); echo "ok   mpirun -np 2: every collective with payloads in 1000-byte pieces"
else
  failed=$((failed + 1)); echo "FAIL mpirun -np 2: collectives in pieces (exit $rc)"; tail -5 <<<"$out"
fi
cases=0 bad=0
while read -r coll field; do
  dir=$(mktemp -d /tmp/tandem-mpi-XXXXXX)
  out=$(timeout 60 mpirun -np 2 "$TESTS" mpi-mismatch "$coll" "$field" "$dir" 2>&1 </dev/null) # mpirun reads stdin
  rm -rf "$dir"
  cases=$((cases + 1))
  if [[ $(grep -c "^rank [01]: .*: ok$" <<<"$out") -ne 2 ]]; then
    bad=$((bad + 1)); echo "  case $coll $field:"; grep "^rank\|mismatch\|error" <<<"$out" | head -4
  fi
done < <("$TESTS" mm-cases | awk '!seen[$2]++') # one call per field: test_multirank tries every pair over shm and tcp
if [[ $bad -eq 0 && $cases -ge 5 ]]; then
  passed=$((passed + 1)); echo "ok   mpirun -np 2: $cases mismatched calls (one per field of a call's identity), each failed on both ranks naming both calls"
else
  failed=$((failed + 1)); echo "FAIL mpirun -np 2: $bad of $cases mismatched calls not named on both ranks"
fi
# Tagged messages and receives from any source (test_tagged's cases on the MPI transport, in
# 1000-byte pieces): each case prints "rank R: CASE: ok" on every rank.
TAGGED=$(dirname "$TANDEM")/tests/test_tagged
for c in "basic 2" "basic 3" "orders 2" "too-big 2" "among 3" "silent 2" "quiet-peer 2" "collective-met 2"; do
  read -r name np <<<"$c"
  dir=$(mktemp -d /tmp/tandem-mpi-XXXXXX)
  # Each rank prints its verdict before the job ends; the cases that fail the transport on
  # purpose end in MPI_Abort, whose teardown once hung mpirun past its timeout's SIGTERM in a
  # loaded CI run: -k kills it, and any rank left over from this case's directory goes with it.
  out=$(timeout -k 10 60 mpirun -np "$np" "$TAGGED" mpi "$name" "$dir" 2>&1 </dev/null)
  pkill -KILL -f -- "$TAGGED mpi $name $dir" 2>/dev/null || true
  rm -rf "$dir"
  if [[ $(grep -c "^rank [0-9]: $name: ok$" <<<"$out") -eq $np ]]; then
    passed=$((passed + 1)); echo "ok   mpirun -np $np: tagged messages, $name"
  else
    failed=$((failed + 1)); echo "FAIL mpirun -np $np: tagged messages, $name"; grep -v "^\s*$" <<<"$out" | tail -6
  fi
done
# The parameter server over the MPI transport (its traffic is tagged messages and any-source
# receives): sync mode with 1 and 2 servers ends with data parallelism's weights bit for bit.
dir=$(mktemp -d /tmp/tandem-mpi-XXXXXX)
M=(train --model mlp --data synthetic --steps 5 --threads 1 --prefetch off --batch-size 16 --eval-batch-size 1000
   --optimizer adamw --weight-decay 0.05 --dropout 0.3 --lr 0.002 --seed 3)
ps_ok=1
for c in "2 0 dp" "3 1 ps1" "4 2 ps2"; do
  read -r np servers name <<<"$c"
  extra=(); [[ $servers -gt 0 ]] && extra=(--ps-servers "$servers")
  TANDEM_TRANSPORT=mpi timeout 120 mpirun -np "$np" -x TANDEM_TRANSPORT "$TANDEM" "${M[@]}" "${extra[@]}" \
    --save-weights "$dir/$name.st" >"$dir/$name.out" 2>&1 </dev/null && grep -q "transport mpi" "$dir/$name.out" ||
    { ps_ok=0; echo "  $name (mpirun -np $np):"; tail -n 4 "$dir/$name.out"; }
done
if [[ $ps_ok -eq 1 ]] && cmp "$dir/dp.st" "$dir/ps1.st" && cmp "$dir/dp.st" "$dir/ps2.st"; then
  passed=$((passed + 1)); echo "ok   mpirun: parameter server (sync, 1 and 2 servers) over MPI == data parallelism bit for bit"
else
  failed=$((failed + 1)); echo "FAIL mpirun: parameter server over MPI"
fi
rm -rf "$dir"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
