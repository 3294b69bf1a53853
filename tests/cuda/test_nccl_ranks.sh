#!/bin/bash
# Several ranks on one GPU (tests/cuda/test_nccl.c --ranks): tandem run -n 2, 3 and 4, each rank a
# process on the same GPU, so the device communicator stages through the host's shm all-reduce.
# Usage: test_nccl_ranks.sh TANDEM TEST_NCCL. Exit 77 (skipped, saying why) without a GPU.
set -u
T=$1 BIN=$2
"$BIN" --probe || exit $? # 77 and the reason when there is no GPU
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; }
trap cleanup EXIT
fail=0
for n in 2 3 4; do
  out=$(mktemp)
  # tandem run stops every rank when one fails; timeout bounds the whole job even so
  timeout 120 "$T" run -n "$n" -- "$BIN" --ranks >"$out" 2>&1 &
  PID=$!
  wait "$PID"; rc=$?
  PID=
  if [ $rc -ne 0 ] || [ "$(grep -c ': passed$' "$out")" -ne "$n" ]; then
    echo "FAIL: $n ranks on one GPU (exit $rc):"; cat "$out"; fail=1
  else
    echo "ok   $n ranks on one GPU"; grep -E 'shared GPU:|mismatch:|missing rank:' "$out"
  fi
  rm -f "$out"
done
exit $fail
