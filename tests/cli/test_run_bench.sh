#!/usr/bin/env bash
# tandem run (environment, prefixed output, first-failure summary, signals) and tandem bench
# (every collective over real processes, #wrong, JSON). usage: test_run_bench.sh path/to/tandem
set -u
TANDEM=${1:?usage: test_run_bench.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"
env_and_prefix() {
  "$TANDEM" run -n 3 -- sh -c 'echo "r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK lw=$LOCAL_WORLD_SIZE m=$MASTER_ADDR:$MASTER_PORT t=${#TANDEM_JOB_TOKEN}"' \
    >"$TMP/out" 2>&1 || { cat "$TMP/out"; return 1; }
  for r in 0 1 2; do
    grep -q "^\[rank $r\] r=$r w=3 l=$r lw=3 m=127.0.0.1:[0-9]* t=32$" "$TMP/out" || { echo "  rank $r line:"; cat "$TMP/out"; return 1; }
  done
}
check "tandem run sets the torchrun environment and prefixes lines" env_and_prefix

first_failure() {
  local t0=$SECONDS
  "$TANDEM" run -n 3 -- sh -c 'if [ "$RANK" = 1 ]; then echo "about to fail"; exit 7; fi; sleep 30' >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [[ $rc -eq 7 ]] || { echo "  exit $rc, expected 7"; cat "$TMP/err"; return 1; }
  (( SECONDS - t0 < 15 )) || { echo "  took $((SECONDS - t0)) s: the others were not stopped"; return 1; }
  grep -q "rank 1 failed first: exit code 7" "$TMP/err" && grep -q "about to fail" "$TMP/err" && grep -q "stopped" "$TMP/err"
}
check "a failing rank stops the others and is named with its last lines" first_failure

killed() {
  "$TANDEM" run -n 2 -- sh -c 'if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 30' >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [[ $rc -eq 137 ]] && grep -q "rank 1 failed first: killed by signal 9" "$TMP/err" || { echo "  exit $rc"; cat "$TMP/err"; return 1; }
}
check "a rank killed by a signal is reported" killed
check "run without a program" bash -c "\"$TANDEM\" run -n 2 2>&1 | grep -q 'no program given'"

bench_all() {
  for op in allreduce broadcast reduce reducescatter allgather alltoall sendrecv; do
    "$TANDEM" run -n 3 -- tandem bench $op -b 8 -e 256K -f 16 -n 3 -w 1 -J "$TMP/$op.json" >"$TMP/$op.out" 2>&1 ||
      { echo "  $op failed:"; tail -5 "$TMP/$op.out"; return 1; }
    grep -q "#       size         count      type   redop    root     time   algbw   busbw #wrong" "$TMP/$op.out" || return 1
    grep -q "Out of bounds values : 0 OK" "$TMP/$op.out" || { echo "  $op: wrong values"; cat "$TMP/$op.out"; return 1; }
    [[ $(grep -c '"busbw"' "$TMP/$op.json") -ge 4 ]] || { echo "  $op: JSON rows missing"; return 1; }
    # the median iteration: a time of its own on every row (in place too where the collective has it)
    /usr/bin/python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))
inplace = sys.argv[2] not in ("alltoall", "sendrecv")
sys.exit(0 if rows and all(r["time_us_median"] > 0 and (r["time_us_inplace_median"] > 0) == inplace for r in rows) else 1)' \
      "$TMP/$op.json" $op || { echo "  $op: time_us_median missing or 0"; cat "$TMP/$op.json"; return 1; }
  done
  "$TANDEM" run -n 2 -- tandem bench allreduce -d bfloat16 -o max -b 1K -e 1M -f 32 -a ring >"$TMP/bf.out" 2>&1 &&
    grep -q "bfloat16     max" "$TMP/bf.out" && grep -q "0 OK" "$TMP/bf.out"
}
check "tandem bench: every collective on 3 ranks, values checked, JSON written" bench_all
bench_gpt() { # runs, reports a step with no steady-state allocation, rejects a sequence beyond the block
  "$TANDEM" bench gpt --layers 1 --heads 2 --width 32 --block 16 --vocab 64 --batch-size 2 --seq-len 16 --steps 2 \
    --warmup 2 --threads 2 --json >"$TMP/g.json" 2>&1 || { cat "$TMP/g.json"; return 1; }
  grep -q '"params":15328,' "$TMP/g.json" && grep -q '"allocs_per_step":0.000,' "$TMP/g.json" &&
    grep -Eq '"ms":[0-9]+\.[0-9]+,' "$TMP/g.json" && ! grep -q '"ms":0.000,' "$TMP/g.json" || { cat "$TMP/g.json"; return 1; }
  "$TANDEM" bench gpt --seq-len 500 2>&1 | grep -q "seq-len 500 exceeds the block size 128" || return 1
  # a pipeline's step allocates nothing either (before: a work handle per exchange, 5-11 a step)
  "$TANDEM" run -n 2 -- tandem bench gpt --layers 4 --heads 2 --width 32 --block 16 --vocab 64 --batch-size 2 --seq-len 16 \
    --pp 2 --accum 4 --schedule interleaved --steps 2 --warmup 2 --json >"$TMP/p.json" 2>&1 &&
    grep -q '"allocs_per_step":0.000,' "$TMP/p.json" || { cat "$TMP/p.json"; return 1; }
}
check "tandem bench gpt: a timed step, parameter count, no steady-state allocation (one process, a pipeline), clear errors" bench_gpt
check "tandem bench: bad option" bash -c "\"$TANDEM\" bench allreduce -d complex 2>&1 | grep -q 'not one of float'"

finish
