# Sourced by the multi-process shell tests, after harness.sh and with $T set to tandem: a 2-rank
# job started by hand, without tandem run, to see what every rank does when no launcher stops the
# others. The caller's EXIT trap kills $RANK_PIDS.
RANK_PIDS=
# A port that was free a moment ago (tandem run binds port 0 to choose it): a fixed number could
# fall in the ephemeral range and collide with another job's connection.
free_port() { "$T" run -n 1 -- sh -c 'echo $MASTER_PORT' | sed 's/^\[rank 0\] //'; }
# start_rank R PORT OUT CMD...: rank R of 2 in the background (shared memory, collectives time
# out after 60 s), output in OUT; $! and the last word of RANK_PIDS are tandem's own pid
start_rank() {
  local r=$1 port=$2 out=$3; shift 3
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 TANDEM_TRANSPORT=shm TANDEM_TIMEOUT=60 \
    RANK=$r LOCAL_RANK=$r "$T" "$@" >"$out" 2>&1 &
  RANK_PIDS="$RANK_PIDS $!"
}
# by_hand OUT CMD...: ranks 0 and 1 run CMD, their output in OUT.0 and OUT.1; returns the larger
# exit code once both have ended (both are killed after 120 s: a hang fails, never blocks the test),
# as tandem run would: a rank that relayed the other's failure (exit 4) counts as that rank's code
by_hand() {
  local out=$1 port p0 p1 rc0 rc1; shift
  port=$(free_port)
  start_rank 0 "$port" "$out.0" "$@"; p0=$!
  start_rank 1 "$port" "$out.1" "$@"; p1=$!
  for _ in $(seq 1 1200); do
    kill -0 $p0 2>/dev/null || kill -0 $p1 2>/dev/null || break
    sleep 0.1
  done
  kill -9 $p0 $p1 2>/dev/null
  wait $p0; rc0=$?
  wait $p1; rc1=$?
  (( rc0 == 4 && rc1 != 0 )) && rc0=$rc1
  (( rc1 == 4 && rc0 != 0 )) && rc1=$rc0
  return $(( rc0 > rc1 ? rc0 : rc1 ))
}
