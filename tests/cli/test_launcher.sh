#!/usr/bin/env bash
# tandem run's protections: ranks die with the launcher (kill -9; ranks it started directly, and
# ranks under a shell that forks, found by the watchdog), its options beyond 62 words, --log-dir
# errors before any rank starts, start failures (fork, exec), signals, a rank that closes its
# output, logs kept across restarts, and the store listening on the master address only.
# usage: test_launcher.sh path/to/tandem path/to/fork_fail.so
set -u
TANDEM=${1:?usage: test_launcher.sh path/to/tandem path/to/fork_fail.so}
FORK_FAIL=${2:?usage: test_launcher.sh path/to/tandem path/to/fork_fail.so}
. "$(dirname "$0")/../harness.sh"

# Processes started here carry TDM_TEST_MARK=$MARK in their environment, so whatever one of them
# started can be found (and, if a case fails, killed) wherever it was re-parented.
MARK=tdm-launcher-test-$$-$RANDOM
marked() { # live (not zombie) marked processes
  local f p st
  for f in $(grep -lzx "TDM_TEST_MARK=$MARK" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; p=${p%/environ}
    st=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1)
    [[ -n $st && $st != Z && $st != X ]] && echo "$p"
  done
}
kill_marked() { local p; for p in $(marked); do kill -9 "$p" 2>/dev/null; done; }
on_exit kill_marked
MARKED=(env "TDM_TEST_MARK=$MARK") # a prefix, not a function: "$!" of `${MARKED[@]} cmd &` is cmd's pid
wait_marked() { # until at least $1 marked processes run (10 s at most)
  local t=0
  until (( $(marked | wc -l) >= $1 )); do
    sleep 0.1
    (( ++t < 100 )) || { echo "  only $(marked | wc -l) of $1 processes started"; return 1; }
  done
}
wait_none_marked() { # until no marked process runs ($1 s at most); else show and kill them
  local t=0
  while [[ -n $(marked) ]]; do
    sleep 0.1
    (( ++t < $1 * 10 )) && continue
    echo "  still running $1 s later:"; ps -o pid,ppid,pgid,stat,args -p "$(marked | paste -sd,)"
    kill_marked; return 1
  done
  echo "  none left after $((t * 100)) ms"
}

# ---- ranks die with their launcher ----
dies_with_launcher() { # $1: marked processes of the running job, $2: a line its ranks print; then the command
  local want=$1 ready=$2; shift 2
  "${MARKED[@]}" "$TANDEM" run -n 2 -- "$@" >"$TMP/out" 2>&1 &
  local launcher=$! t=0
  wait_marked "$want" || { cat "$TMP/out"; kill_marked; return 1; }
  until grep -q -- "$ready" "$TMP/out"; do
    sleep 0.1
    (( ++t < 100 )) || { echo "  no '$ready' in its output:"; cat "$TMP/out"; kill_marked; return 1; }
  done
  kill -9 "$launcher"; wait "$launcher" 2>/dev/null
  wait_none_marked 5
}
check "kill -9 of tandem run: the ranks it started die with it" dies_with_launcher 3 started \
  sh -c 'echo started; exec sleep 60'
check "kill -9 of tandem run: tandem ranks under a shell that forks die too" dies_with_launcher 5 started \
  sh -c "echo started; \"$TANDEM\" bench allreduce -b 8 -e 8 -n 100000000 -w 0; echo after"

setup_segment_removed() { # the launcher killed while rank 0 waits for rank 1 to map the shared memory
  # it created: the watchdog's SIGTERM ends rank 0, whose handler removes the segment's name
  "${MARKED[@]}" TANDEM_TRANSPORT=shm "$TANDEM" run -n 2 -- sh -c \
    'if [ "$RANK" = 1 ]; then exec sleep 30; fi; exec "$0" bench allreduce -b 8 -e 8 -n 10 -w 0' "$TANDEM" >"$TMP/out" 2>&1 &
  local launcher=$! t=0 seg= p
  until [[ -n $seg ]]; do
    for p in $(marked); do seg=$(ls /dev/shm 2>/dev/null | grep "^tandem-$p-" | head -1); [[ -n $seg ]] && break; done
    sleep 0.1
    (( ++t < 100 )) || { echo "  rank 0 made no segment:"; cat "$TMP/out"; kill_marked; return 1; }
  done
  kill -9 "$launcher"; wait "$launcher" 2>/dev/null
  wait_none_marked 5 || return 1
  [[ ! -e /dev/shm/$seg ]] || { echo "  /dev/shm/$seg is left"; rm -f "/dev/shm/$seg"; return 1; }
}
check "a rank ended by a signal while setting up shared memory leaves no segment in /dev/shm" setup_segment_removed

watchdog() { # the launcher's pid given without tandem run: gone, reused, and alive
  local start
  start=$(sed 's/.*) //' /proc/$$/stat | awk '{print $20}')
  sh -c 'exit 0' & local dead=$!; wait $dead
  TANDEM_LAUNCHER_PID=$dead TANDEM_LAUNCHER_START=$start timeout -s KILL 20 \
    "$TANDEM" bench allreduce -b 8 -e 8 -n 100000000 -w 0 >"$TMP/out" 2>&1
  local rc=$?
  [[ $rc -eq 143 ]] && grep -q "the launcher (tandem run, pid $dead) is gone: stopping" "$TMP/out" ||
    { echo "  a launcher that exited: exit $rc"; cat "$TMP/out"; return 1; }
  TANDEM_LAUNCHER_PID=$$ TANDEM_LAUNCHER_START=$((start + 1)) timeout -s KILL 20 \
    "$TANDEM" bench allreduce -b 8 -e 8 -n 100000000 -w 0 >"$TMP/out" 2>&1
  rc=$?
  [[ $rc -eq 143 ]] || { echo "  the launcher's pid reused by another process: exit $rc"; cat "$TMP/out"; return 1; }
  TANDEM_LAUNCHER_PID=$$ TANDEM_LAUNCHER_START=$start timeout -s KILL 20 \
    "$TANDEM" bench allreduce -b 8 -e 8 -n 2 -w 0 >"$TMP/out" 2>&1 ||
    { echo "  a live launcher: exit $?"; cat "$TMP/out"; return 1; }
}
check "a tandem process stops when TANDEM_LAUNCHER_PID is gone or reused, and runs while it lives" watchdog

# ---- options and --log-dir ----
expect_fail() { # CODE TEXT CMD...: exit code CODE, TEXT in stderr
  local code=$1 text=$2; shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [[ $rc -eq $code ]] || { echo "  exit $rc, expected $code: $*"; cat "$TMP/err"; return 1; }
  grep -qF -- "$text" "$TMP/err" || { echo "  stderr lacks '$text':"; cat "$TMP/err"; return 1; }
}

many_words() {
  local args=() i
  for i in $(seq 40); do args+=(--max-restarts 0); done
  "$TANDEM" run "${args[@]}" -n 2 -- sh -c 'echo "w=$WORLD_SIZE"' >"$TMP/out" 2>&1 || { cat "$TMP/out"; return 1; }
  grep -q '^\[rank 1\] w=2$' "$TMP/out" || { echo "  -n 2 after 80 words was not applied:"; cat "$TMP/out"; return 1; }
}
check "options after the 62nd word are applied" many_words

bad_log_dir() {
  touch "$TMP/afile"
  expect_fail 2 "--log-dir $TMP/afile is not a directory" "$TANDEM" run -n 2 --log-dir "$TMP/afile" -- touch "$TMP/ran" &&
    expect_fail 2 "cannot create --log-dir $TMP/afile/sub: Not a directory" \
      "$TANDEM" run -n 2 --log-dir "$TMP/afile/sub" -- touch "$TMP/ran" || return 1
  mkdir -p "$TMP/logs/rank-1.log"
  expect_fail 2 "cannot open the log $TMP/logs/rank-1.log for writing (--log-dir): Is a directory" \
    "$TANDEM" run -n 2 --log-dir "$TMP/logs" -- touch "$TMP/ran" || return 1
  if [[ $(id -u) != 0 ]]; then # permissions do not stop root
    mkdir "$TMP/ro" && chmod 500 "$TMP/ro"
    expect_fail 2 "cannot open the log $TMP/ro/rank-0.log for writing (--log-dir): Permission denied" \
      "$TANDEM" run -n 2 --log-dir "$TMP/ro" -- touch "$TMP/ran" || return 1
  fi
  [[ ! -e $TMP/ran ]] || { echo "  a rank started"; return 1; }
}
check "a bad --log-dir is an error before any rank starts" bad_log_dir

log_write_fails() {
  mkdir "$TMP/full" && ln -s /dev/full "$TMP/full/rank-1.log"
  expect_fail 1 "cannot write $TMP/full/rank-1.log: No space left on device" \
    "$TANDEM" run -n 2 --log-dir "$TMP/full" -- echo hello &&
    grep -q "not every log under --log-dir was written" "$TMP/err" && grep -qx hello "$TMP/full/rank-0.log"
}
check "a rank log that cannot be written is a non-zero exit" log_write_fails

logs_keep_every_attempt() {
  "$TANDEM" run -n 1 --max-restarts 1 --log-dir "$TMP/rl" -- \
    sh -c 'echo "attempt $TANDEM_RESTART_COUNT"; [ "$TANDEM_RESTART_COUNT" = 1 ]' >"$TMP/out" 2>&1 || { cat "$TMP/out"; return 1; }
  grep -qx "attempt 0" "$TMP/rl/rank-0.log" && grep -q "restart 1 of 1" "$TMP/rl/rank-0.log" &&
    grep -qx "attempt 1" "$TMP/rl/rank-0.log" || { echo "  rank-0.log:"; cat "$TMP/rl/rank-0.log"; return 1; }
}
check "--log-dir keeps the output of every attempt of a restarted job" logs_keep_every_attempt

# ---- start failures and signals ----
fork_fails() { # the third fork fails: ranks 0 and 1 are stopped, the exit says why
  local t0=$SECONDS
  "${MARKED[@]}" LD_PRELOAD="$FORK_FAIL" TDM_FAIL_FORK_AT=3 ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
    timeout -s KILL 30 "$TANDEM" run -n 3 -- sleep 30 >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [[ $rc -eq 1 ]] && grep -q "cannot start rank 2: fork: Resource temporarily unavailable" "$TMP/err" &&
    grep -q "the 2 ranks started before it were stopped" "$TMP/err" ||
    { echo "  exit $rc after $((SECONDS - t0)) s"; cat "$TMP/err"; kill_marked; return 1; }
  wait_none_marked 2
}
check "a rank that cannot be forked stops the others and exits 1" fork_fails
exec_fails() {
  expect_fail 127 "cannot start /nonexistent/program: No such file or directory" \
    "$TANDEM" run -n 2 -- /nonexistent/program && grep -q "failed first: exit code 127" "$TMP/err"
}
check "a program that cannot be executed is reported by its rank and exits 127" exec_fails

signalled() { # $1: signal, $2: expected exit code
  "${MARKED[@]}" "$TANDEM" run -n 2 -- sleep 30 >"$TMP/out" 2>"$TMP/err" &
  local launcher=$!
  wait_marked 3 || { kill_marked; return 1; }
  kill -"$1" "$launcher"; wait "$launcher"
  local rc=$?
  [[ $rc -eq $2 ]] && grep -q "tandem run: stopped by signal" "$TMP/err" ||
    { echo "  exit $rc, expected $2"; cat "$TMP/err"; kill_marked; return 1; }
  wait_none_marked 2
}
check "SIGTERM to tandem run stops the ranks and exits 143" signalled TERM 143
check "SIGHUP to tandem run stops the ranks and exits 129" signalled HUP 129

quiet_rank() { # a rank that closes its output but runs on: the launcher must sleep, not spin
  "$TANDEM" run -n 1 -- sh -c 'exec >/dev/null 2>&1; sleep 3' &
  local launcher=$!
  sleep 2.5
  local ticks
  ticks=$(sed 's/.*) //' "/proc/$launcher/stat" | awk '{print $12 + $13}')
  wait "$launcher" || return 1
  echo "  the launcher used $ticks clock ticks of CPU in 2.5 s"
  (( ticks < 50 ))
}
check "a rank that closes its output does not make the launcher spin" quiet_rank

# ---- the store's address ----
listen_hex() { # the local address of the LISTEN socket on port $2 in /proc/net/tcp lines in file $1
  local port
  port=$(printf '%04X' "$2")
  sed -n 's/^\[rank 0\] *[0-9]*: \([0-9A-F]\{8\}\):'"$port"' 00000000:0000 0A .*/\1/p' "$1" | paste -sd' '
}
store_address() {
  "$TANDEM" run -n 1 -- sh -c 'echo "port=$MASTER_PORT"; cat /proc/net/tcp' >"$TMP/out" 2>&1 || { cat "$TMP/out"; return 1; }
  local port addr
  port=$(sed -n 's/^\[rank 0\] port=//p' "$TMP/out")
  addr=$(listen_hex "$TMP/out" "$port")
  [[ $addr == 0100007F ]] || { echo "  the store on port $port listens on '$addr', not 127.0.0.1 (0100007F) alone"; return 1; }
  local other
  other=$(ip -4 -o addr show scope global 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -1)
  if [[ -z $other ]]; then echo "  (no address but loopback here: not tried from another address)"; return 0; fi
  "$TANDEM" run -n 1 -- bash -c "exec 3<>/dev/tcp/$other/\$MASTER_PORT && echo reached" >"$TMP/out" 2>&1
  ! grep -q "reached" "$TMP/out" && grep -q "Connection refused" "$TMP/out" ||
    { echo "  the store was reachable at $other:"; cat "$TMP/out"; return 1; }
  "$TANDEM" run -n 1 --master-addr "$other" -- sh -c 'echo "port=$MASTER_PORT"; cat /proc/net/tcp' >"$TMP/out" 2>&1 ||
    { cat "$TMP/out"; return 1; }
  port=$(sed -n 's/^\[rank 0\] port=//p' "$TMP/out")
  addr=$(listen_hex "$TMP/out" "$port")
  local a b c d
  IFS=. read -r a b c d <<<"$other"
  [[ $addr == $(printf '%02X%02X%02X%02X' "$d" "$c" "$b" "$a") ]] ||
    { echo "  with --master-addr $other the store listens on '$addr'"; return 1; }
}
check "the store listens on the master address only (loopback stays loopback)" store_address

# ---- --keep-going with a stopped rank ----
stopped_rank() { # rank 1 stops itself; rank 0 times out waiting for it; the launcher must not wait forever
  local t0=$SECONDS
  "${MARKED[@]}" TANDEM_TIMEOUT=2 timeout 60 "$TANDEM" run -n 2 --keep-going -- sh -c \
    'if [ "$RANK" = 1 ]; then kill -STOP $$; fi; exec "$0" train --steps 5 --threads 1' "$TANDEM" >"$TMP/out" 2>&1
  local rc=$?
  [[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "rank 1 (pid [0-9]*) is stopped (SIGSTOP?) and every other rank has exited: killing it" "$TMP/out" ||
    { echo "  exit $rc after $((SECONDS - t0)) s:"; tail -5 "$TMP/out"; kill_marked; return 1; }
  wait_none_marked 5 || return 1
  # and when every other rank succeeded, with or without --keep-going: the job did not succeed
  local kg
  for kg in ""; do
    "${MARKED[@]}" timeout 60 "$TANDEM" run -n 3 $kg -- sh -c 'if [ "$RANK" = 1 ]; then kill -STOP $$; fi; exit 0' \
      >"$TMP/out" 2>&1
    rc=$?
    [[ $rc == 137 ]] && grep -q "rank 1 (pid [0-9]*) is stopped (SIGSTOP?)" "$TMP/out" ||
      { echo "  ${kg:-without --keep-going}, the others succeeding: exit $rc"; tail -3 "$TMP/out"; kill_marked; return 1; }
  done
}
check "a stopped rank is killed and named once every other rank has exited (failed or not; --keep-going or not)" stopped_rank
stopped_blamed() { # without --keep-going: rank 0 times out waiting for the stopped rank 1, which is blamed and killed at once
  local t0=$SECONDS
  "${MARKED[@]}" TANDEM_TIMEOUT=2 timeout 60 "$TANDEM" run -n 2 -- sh -c \
    'if [ "$RANK" = 1 ]; then kill -STOP $$; fi; exec "$0" train --steps 5 --threads 1' "$TANDEM" >"$TMP/out" 2>&1
  local rc=$? took=$((SECONDS - t0))
  [[ $rc == 147 && $took -lt 5 ]] && grep -q "rank 1 (pid [0-9]*) is stopped (SIGSTOP?) while rank 0 failed" "$TMP/out" &&
    grep -q "rank 1 failed first: stopped by a signal" "$TMP/out" ||
    { echo "  exit $rc after $took s:"; tail -5 "$TMP/out"; kill_marked; return 1; }
  wait_none_marked 5
}
check "a rank stopped while another fails waiting for it is the one named (exit 147), killed at once" stopped_blamed
killed_rank_blamed() { # rank 2 killed mid-run: the launcher names it, not a peer that failed because of it
  local kg
  for kg in --keep-going; do
    "${MARKED[@]}" TANDEM_TRANSPORT=tcp timeout 60 "$TANDEM" run -n 3 $kg -- sh -c \
      'if [ "$RANK" = 2 ]; then (sleep 1; kill -9 $$) & fi; exec "$0" train --data synthetic --steps 1000000 --threads 1' \
      "$TANDEM" >"$TMP/out" 2>&1
    local rc=$?
    [[ $rc == 137 ]] && grep -q "rank 2 failed first: killed by signal 9" "$TMP/out" ||
      { echo "  ${kg:-without --keep-going}: exit $rc"; tail -4 "$TMP/out"; kill_marked; return 1; }
  done
}
check "a rank killed mid-run is the one named (exit 137), not the peers it failed" killed_rank_blamed
relayed_origin_blamed() { # rank 1 cannot write its checkpoint; 0 and 2 learn it from the agreement and exit
  # first (4: relayed); the launcher waits for rank 1 (its exit delayed 1 s here) and names it.
  # With rank 1's exit delayed past the grace, the relaying rank is named, saying so.
  local delay rc
  for delay in 1 4; do
    rm -rf "$TMP/ck"
    mkdir -p "$TMP/ck/ckpt-000000000002.shards/rank-1.safetensors" # a directory where rank 1 writes
    local t0=$SECONDS
    "${MARKED[@]}" D=$delay timeout 60 "$TANDEM" run -n 3 -- sh -c \
      'if [ "$RANK" = 1 ]; then "$0" "$@"; rc=$?; sleep $D; exit $rc; fi; exec "$0" "$@"' "$TANDEM" \
      train --data synthetic --steps 4 --batch-size 16 --threads 1 --zero 2 --checkpoint-dir "$TMP/ck" --checkpoint-every 2 \
      >"$TMP/out" 2>&1
    rc=$?
    local took=$((SECONDS - t0))
    grep -q "\[rank 0\] tandem train: I/O error (relayed from rank 1): checkpoint: rank 1 failed: .*is a directory" "$TMP/out" &&
      grep -q "\[rank 1\] tandem train: I/O error (this rank): .*is a directory" "$TMP/out" ||
      { echo "  delay $delay: the ranks' errors:"; grep "tandem train: [A-Z/]" "$TMP/out"; kill_marked; return 1; }
    if [[ $delay == 1 ]]; then
      [[ $rc == 1 ]] && grep -q "rank 1 failed first: exit code 1" "$TMP/out" ||
        { echo "  delay 1: exit $rc:"; tail -5 "$TMP/out"; kill_marked; return 1; }
    else
      [[ $rc == 4 && $took -lt 10 ]] && grep -q "rank [02] failed first: exit code 4 (it passed on another rank's failure; no rank failed of its own within 3 s)" "$TMP/out" ||
        { echo "  delay 4: exit $rc after $took s:"; tail -5 "$TMP/out"; kill_marked; return 1; }
    fi
    wait_none_marked 5
  done
}
check "a failure relayed by its peers names the rank where it began (they exit 4), within a grace" relayed_origin_blamed

# ---- one launcher per node (--nnodes N --node-rank k) ----
two_launchers() {
  local port
  port=$("$TANDEM" run -n 1 -- sh -c 'echo $MASTER_PORT' | sed 's/^\[rank 0\] //')
  # without a shared token each launcher would make its own: refused before any rank starts
  env -u TANDEM_JOB_TOKEN "$TANDEM" run --nnodes 2 --node-rank 0 -n 1 --master-addr 127.0.0.1 --master-port "$port" -- \
    sh -c 'echo started' >"$TMP/out" 2>&1
  local rc=$?
  [[ $rc == 2 ]] && grep -q "set the same TANDEM_JOB_TOKEN on every node" "$TMP/out" && ! grep -q started "$TMP/out" ||
    { echo "  without TANDEM_JOB_TOKEN: exit $rc"; cat "$TMP/out"; return 1; }
  local k pids=()
  for k in 0 1; do
    "${MARKED[@]}" TANDEM_JOB_TOKEN=two-launchers-$$ timeout 120 "$TANDEM" run --nnodes 2 --node-rank $k -n 1 \
      --master-addr 127.0.0.1 --master-port "$port" -- tandem train --steps 2 --batch-size 32 --threads 1 >"$TMP/n$k" 2>&1 &
    pids+=($!)
  done
  for k in 0 1; do wait "${pids[$k]}" || { echo "  node $k's launcher failed:"; cat "$TMP/n$k"; kill_marked; return 1; }; done
  grep -q "batch 32 x 2 data ranks" "$TMP/n0" || { echo "  node 0 did not train with 2 ranks:"; cat "$TMP/n0"; return 1; }
  grep -q "test accuracy" "$TMP/n0" || { echo "  no result on node 0:"; cat "$TMP/n0"; return 1; }
}
check "two launchers of --nnodes 2 make one job with a shared TANDEM_JOB_TOKEN, and are refused without one" two_launchers

finish
