#!/usr/bin/env bash
# Elastic jobs (tandem run --nnodes MIN:MAX --rdzv-endpoint): launchers on this machine stand in
# for nodes. Two launchers of one rank train the MLP with a checkpoint every step; one launcher
# and its rank are killed with SIGKILL; the other goes on alone at world size 1 from the last
# checkpoint; a third launcher started later joins at the next restart; all steps finish. The
# metrics hold every step once, in order, with the world size going 2, 1, 2, and the global batch
# kept (--elastic-batch keep); the final weights equal a job never resized (2 ranks, the same
# global batch) within a relative 1e-4 (the summation order differs while one rank accumulates 4
# micro-batches: 4e-6 measured), while --elastic-batch scale-lr (another trajectory) is farther.
# Then the rendezvous itself, with a shell for a program: its host killed (a survivor takes it
# over); below MIN after a loss (fails after --rdzv-timeout naming the lost node); --max-restarts;
# and bad input: MIN above MAX, an endpoint that does not answer, another job's token.
# Metrics across a plain resume: a process killed just before its checkpoint's manifest is renamed
# has recorded steps no checkpoint covers; the resumed run does not record them again.
# usage: test_elastic.sh path/to/tandem path/to/libtdm_kill_at.so
set -u
T=${1:?usage: test_elastic.sh path/to/tandem path/to/libtdm_kill_at.so}
KILL=${2:?usage: test_elastic.sh path/to/tandem path/to/libtdm_kill_at.so}
. "$(dirname "$0")/../harness.sh"
PIDS=
on_exit 'kill -9 $PIDS 2>/dev/null; for p in $PIDS; do pkill -9 -P $p 2>/dev/null; done; wait 2>/dev/null'
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# launch NAME ARGS... -- PROGRAM...: a launcher in the background, output in $TMP/NAME.out; its pid
# in $NAME (and PIDS, for the trap)
launch() {
  local name=$1; shift
  : >"$TMP/$name.out" # here, not in the child: it may truncate only after the caller grepped an older run's lines
  "$T" run --nproc-per-node 1 --rdzv-endpoint "127.0.0.1:$PORT" "$@" >>"$TMP/$name.out" 2>&1 &
  printf -v "$name" %s $!
  PIDS="$PIDS $!"
}
# wait_for SECONDS CMD...: until CMD succeeds; fails (printing what the launchers said) at the deadline
wait_for() {
  local t=$(( $1 * 10 )); shift
  until "$@"; do
    (( t-- > 0 )) || { echo "  timed out waiting for: $*"; tail -n 5 "$TMP"/*.out; return 1; }
    sleep 0.1
  done
}
# ended PID SECONDS: waits for the launcher to exit (killed at the deadline); its status in $RC
ended() {
  local t=$(( $2 * 10 ))
  while kill -0 "$1" 2>/dev/null && (( t-- > 0 )); do sleep 0.1; done
  kill -9 "$1" 2>/dev/null
  wait "$1" 2>/dev/null; RC=$?
}
records() { grep -c '"step_time_ms"' "$1" 2>/dev/null || true; }
at_world() { [[ $(grep '"step_time_ms"' "$1" 2>/dev/null | grep -c "\"world_size\":$2,") -ge $3 ]]; }
# no rank of ours left (every rank's command line names $TMP: its checkpoint directory, or the
# shell's $0); the launchers are reaped by `ended`
none_left() { ! pgrep -af -- "$TMP/" | grep -v python3 | grep . && return 0; echo "  ranks left behind"; return 1; }

STEPS=20
A=(train --steps $STEPS --threads 1 --seed 5 --batch-size 16 --accum 2 --dropout 0 --checkpoint-every 1 --resume)

ref() { # never resized: 2 ranks, global batch 2 x 16 x 2
  "$T" run -n 2 -- tandem "${A[@]:0:13}" --save-weights "$TMP/ref.st" >"$TMP/ref.out" 2>&1 || { tail -3 "$TMP/ref.out"; return 1; }
}
check "a job never resized (the reference)" ref

shrink_and_grow() {
  PORT=$(free_port)
  local J=(train "${A[@]:1}" --checkpoint-dir "$TMP/ck" --metrics "$TMP/m.jsonl" --save-weights "$TMP/el.st")
  export TANDEM_STEP_DELAY=0.1 # the test acts between steps: a margin on a loaded machine
  launch NA --nnodes 1:2 --rdzv-last-call 5 -- tandem "${J[@]}"
  wait_for 20 grep -q "hosts the rendezvous" "$TMP/NA.out" || return 1 # B is not the host (test host_lost is)
  launch NB --nnodes 1:2 --rdzv-last-call 5 -- tandem "${J[@]}"
  wait_for 60 at_world "$TMP/m.jsonl" 2 4 || return 1
  local rank_b; rank_b=$(pgrep -P "$NB")
  kill -9 "$NB" $rank_b; wait "$NB" 2>/dev/null
  wait_for 60 at_world "$TMP/m.jsonl" 1 3 || return 1
  launch NC --nnodes 1:2 --rdzv-last-call 5 -- tandem "${J[@]}"
  unset TANDEM_STEP_DELAY
  ended "$NA" 120; local ra=$RC
  ended "$NC" 30; local rc=$RC
  ended "$NB" 1
  [[ $ra -eq 0 && $rc -eq 0 ]] || { echo "  exit codes: A $ra, C $rc"; tail -n 8 "$TMP/NA.out" "$TMP/NC.out"; return 1; }
  none_left "$NA" "$NB" "$NC" || return 1
  local steps worlds
  steps=$(grep '"step_time_ms"' "$TMP/m.jsonl" | grep -o '^{"step":[0-9]*' | grep -o '[0-9]*$' | tr '\n' ' ')
  [[ $steps == "$(seq -s ' ' 0 $((STEPS - 1))) " ]] || { echo "  the steps recorded: $steps"; return 1; }
  worlds=$(grep '"step_time_ms"' "$TMP/m.jsonl" | grep -o '"world_size":[0-9]*' | uniq | grep -o '[0-9]*$' | tr '\n' ' ')
  [[ $worlds == "2 1 2 " ]] || { echo "  world sizes in order: $worlds"; return 1; }
  [[ $(grep '"step_time_ms"' "$TMP/m.jsonl" | grep -vc '"global_batch":64,') -eq 0 ]] || { echo "  a global batch not 64"; return 1; }
  grep -q "round 1 stops: node .* was lost" "$TMP/NA.out" && grep -q "round 2 stops: node .* joined" "$TMP/NA.out" &&
    grep -q "world size 1 of 2: accumulation 4 (given 2), global batch 64" "$TMP/NA.out" &&
    grep -q "resumed from step .* resharded to data parallel, 1 rank" "$TMP/NA.out" &&
    grep -q "resumed from step .* resharded to data parallel, 2 ranks" "$TMP/NA.out" &&
    grep -q "this node is node 1 (ranks 1..1)" "$TMP/NC.out" || { echo "  the launchers' output:"; grep -v '^\[rank' "$TMP/NA.out"; return 1; }
  "$T" weights-diff "$TMP/ref.st" "$TMP/el.st" --rtol 1e-4 --quiet || return 1
}
check "2 nodes, one killed -9: the other goes on alone from the checkpoint, a third joins; every step once, world size 2 1 2, weights = never resized (keep)" shrink_and_grow

scale_lr() { # alone at first (half the global batch, half the lr), then a second node joins
  PORT=$(free_port)
  local J=(train "${A[@]:1}" --checkpoint-dir "$TMP/cks" --metrics "$TMP/s.jsonl" --save-weights "$TMP/sl.st")
  export TANDEM_STEP_DELAY=0.1 # the test acts between steps: a margin on a loaded machine
  launch NA --nnodes 1:2 --rdzv-last-call 0.1 --elastic-batch scale-lr -- tandem "${J[@]}"
  wait_for 60 at_world "$TMP/s.jsonl" 1 3 || return 1
  launch NB --nnodes 1:2 --elastic-batch scale-lr -- tandem "${J[@]}"
  unset TANDEM_STEP_DELAY
  ended "$NA" 120; local ra=$RC
  ended "$NB" 30; local rb=$RC
  [[ $ra -eq 0 && $rb -eq 0 ]] || { echo "  exit codes: A $ra, B $rb"; tail -n 8 "$TMP/NA.out" "$TMP/NB.out"; return 1; }
  local seen
  seen=$(grep '"step_time_ms"' "$TMP/s.jsonl" | grep -o '"lr":[0-9.e-]*,"rank":0,"world_size":[0-9]*,"global_batch":[0-9]*' | uniq | tr '\n' ' ')
  [[ $seen == '"lr":0.0005,"rank":0,"world_size":1,"global_batch":32 "lr":0.001,"rank":0,"world_size":2,"global_batch":64 ' ]] ||
    { echo "  lr, world size, global batch in order: $seen"; return 1; }
  [[ $(records "$TMP/s.jsonl") -eq $STEPS ]] || { echo "  $(records "$TMP/s.jsonl") step records"; return 1; }
  grep -q "scale-lr: world size 1 of 2: global batch 32 .* lr 0.0005 (given 0.001" "$TMP/NA.out" || return 1
  # another trajectory: the tolerance above tells it apart
  ! "$T" weights-diff "$TMP/ref.st" "$TMP/sl.st" --rtol 1e-4 --quiet >/dev/null
}
check "--elastic-batch scale-lr: alone at half the global batch and lr, then 2 nodes at the full; every step once" scale_lr

metrics_resume() { # one process: killed before the manifest of step 10 is renamed, resumed from step 5
  local J=(train --steps 14 --threads 1 --seed 5 --batch-size 16 --dropout 0 --checkpoint-dir "$TMP/ckm" --checkpoint-every 5)
  "$T" "${J[@]:0:11}" --metrics "$TMP/u.jsonl" >/dev/null 2>&1 || return 1
  (env LD_PRELOAD="$KILL" TDM_KILL_RENAME=ckpt-000000000010.safetensors \
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" timeout 120 "$T" "${J[@]}" --metrics "$TMP/r.jsonl" \
    >"$TMP/r1.out" 2>&1) 2>/dev/null # the shell's "Killed"
  local rc=$?
  [[ $rc -eq 137 && $(records "$TMP/r.jsonl") -eq 10 ]] || { echo "  exit $rc, $(records "$TMP/r.jsonl") records"; return 1; }
  "$T" "${J[@]}" --resume --metrics "$TMP/r.jsonl" >"$TMP/r2.out" 2>&1 || { tail -3 "$TMP/r2.out"; return 1; }
  grep -q "resumed from step 5" "$TMP/r2.out" && grep -q "holds steps up to 9 already" "$TMP/r2.out" || { cat "$TMP/r2.out"; return 1; }
  local steps
  steps=$(grep '"step_time_ms"' "$TMP/r.jsonl" | grep -o '^{"step":[0-9]*' | grep -o '[0-9]*$' | tr '\n' ' ')
  [[ $steps == "$(seq -s ' ' 0 13) " ]] || { echo "  the steps recorded: $steps"; return 1; }
  # the same losses as a run never interrupted (a resume at the same world size is bit-identical)
  diff <(grep -o '"loss":[^,]*' "$TMP/u.jsonl") <(grep -o '"loss":[^,]*' "$TMP/r.jsonl") >/dev/null ||
    { echo "  the losses differ from the uninterrupted run's"; return 1; }
  [[ $(grep -c test_loss "$TMP/r.jsonl") -eq 1 ]] # the end's evaluation, once
}
check "metrics across a resume: killed mid-checkpoint with steps 5-9 recorded, resumed from 5: steps 0-13 once, the uninterrupted losses" metrics_resume

SH=(sh -c 'echo "up: rank $RANK of $WORLD_SIZE"; exec sleep "${NAP:-60}"' "$TMP/rank")
host_lost() { # the launcher hosting the rendezvous is killed: the survivor takes it over
  PORT=$(free_port)
  launch NA --nnodes 1:2 --rdzv-last-call 1 -- "${SH[@]}"
  wait_for 20 grep -q "hosts the rendezvous" "$TMP/NA.out" || return 1
  NAP=3 launch NB --nnodes 1:2 --rdzv-last-call 1 -- "${SH[@]}"
  wait_for 20 grep -q "up: rank 1 of 2" "$TMP/NB.out" || return 1
  kill -9 "$NA"; wait "$NA" 2>/dev/null
  ended "$NB" 60
  [[ $RC -eq 0 ]] || { echo "  exit $RC"; cat "$TMP/NB.out"; return 1; }
  grep -q "lost the rendezvous at 127.0.0.1:$PORT" "$TMP/NB.out" && grep -q "hosts the rendezvous" "$TMP/NB.out" &&
    grep -q "up: rank 0 of 1" "$TMP/NB.out" && grep -q "the job finished (round 2, world size 1)" "$TMP/NB.out" ||
    { cat "$TMP/NB.out"; return 1; }
  ended "$NA" 1
  none_left "$NA" "$NB"
}
check "the rendezvous' host killed -9: the survivor takes the endpoint over and finishes at world size 1" host_lost

ranks_fail() { # a node's ranks fail (its launcher lives): the same nodes restart, bounded by --max-restarts
  PORT=$(free_port)
  local F=(sh -c '[ "$TANDEM_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ] && exit 3; echo "up: rank $RANK of $WORLD_SIZE"' "$TMP/rank")
  launch NA --nnodes 1:2 --rdzv-last-call 5 -- "${F[@]}"
  wait_for 20 grep -q "hosts the rendezvous" "$TMP/NA.out" || return 1
  launch NB --nnodes 1:2 --rdzv-last-call 5 -- "${F[@]}"
  ended "$NA" 60; local ra=$RC
  ended "$NB" 10; local rb=$RC
  [[ $ra -eq 0 && $rb -eq 0 ]] && grep -q "round 1 stops: node $(hostname):$NB: rank 1 exited with code 3" "$TMP/NA.out" &&
    grep -q "up: rank 0 of 2" "$TMP/NA.out" && grep -q "up: rank 1 of 2" "$TMP/NB.out" &&
    grep -q "the job finished (round 2, world size 2)" "$TMP/NB.out" || { echo "  exit $ra $rb"; cat "$TMP/NA.out" "$TMP/NB.out"; return 1; }
}
check "a node's ranks fail: both nodes restart (restart 1), then finish" ranks_fail
relayed_waits() { # rank 0 exits 4 (it passed on another rank's failure) a second before rank 1 fails of its
  # own: the node reports rank 1 (within the 3 s grace); with rank 1 slower than the grace, rank 0, saying so
  local d want
  for d in 1 5; do
    PORT=$(free_port)
    want="the job failed: node $(hostname):[0-9]*: rank 1 exited with code 1; --max-restarts 0 reached"
    [[ $d == 5 ]] && want="rank 0 exited with code 4 (passing on another rank's failure)"
    timeout 60 "$T" run --nproc-per-node 2 --nnodes 1:1 --rdzv-endpoint "127.0.0.1:$PORT" --max-restarts 0 -- \
      sh -c 'if [ "$RANK" = 0 ]; then exit 4; fi; sleep '$d'; exit 1' >"$TMP/relay.out" 2>&1
    local rc=$?
    [[ $rc -eq 1 ]] && grep -q "$want" "$TMP/relay.out" || { echo "  rank 1 after $d s: exit $rc"; cat "$TMP/relay.out"; return 1; }
  done
}
check "a relayed failure (exit 4) waits the grace for the rank's own failure it passed on" relayed_waits

# lose_node_expect FLAGS MESSAGE: two launchers with FLAGS start a 2-node job, the one that does not
# host the rendezvous is killed -9, and the survivor must exit 1 with MESSAGE (a grep pattern in
# which VICTIM stands for the lost node's name)
lose_node_expect() {
  local flags=($1) message=$2
  PORT=$(free_port)
  launch NA "${flags[@]}" -- "${SH[@]}"
  launch NB "${flags[@]}" -- "${SH[@]}"
  wait_for 20 grep -q "up: rank 1 of 2" "$TMP/NA.out" "$TMP/NB.out" || return 1
  local victim=$NB
  grep -q "hosts the rendezvous" "$TMP/NB.out" && victim=$NA
  local survivor=$(( victim == NA ? NB : NA ))
  kill -9 "$victim"; wait "$victim" 2>/dev/null
  ended "$survivor" 30
  local out="$TMP/NA.out"; [[ $survivor == "$NB" ]] && out="$TMP/NB.out"
  [[ $RC -eq 1 ]] && grep -q "${message//VICTIM/$(hostname):$victim}" "$out" ||
    { echo "  exit $RC"; cat "$out"; return 1; }
  ended "$victim" 1
  none_left "$NA" "$NB"
}
below_min() { # --nnodes 2:2 loses a node: fails after --rdzv-timeout naming it
  lose_node_expect "--nnodes 2:2 --rdzv-timeout 2" \
    "the job needs at least 2 nodes (--nnodes 2:2); after 2 s (--rdzv-timeout) 1 is here .*; missing: VICTIM"
}
check "below --nnodes MIN after a loss: fails after --rdzv-timeout naming the lost node, exit 1" below_min

max_restarts() {
  lose_node_expect "--nnodes 1:2 --max-restarts 0" "the job failed: node VICTIM was lost .*; --max-restarts 0 reached"
}
check "--max-restarts 0: a lost node ends the job, naming it" max_restarts

# expect CODE TEXT CMD...: exit code CODE and TEXT in the output
expect() {
  local code=$1 text=$2; shift 2
  timeout 60 "$@" >"$TMP/out" 2>&1
  local rc=$?
  [[ $rc -eq $code ]] && grep -qF -- "$text" "$TMP/out" || { echo "  exit $rc (expected $code): $*"; cat "$TMP/out"; return 1; }
}
check "--nnodes 3:2: MIN above MAX, exit 2" \
  expect 2 "--nnodes 3:2: MIN 3 is above MAX 2" "$T" run --nnodes 3:2 --rdzv-endpoint 127.0.0.1:1 -- true
check "--nnodes 1:3 with --accum 1 (keep cannot hold on 2 nodes): exit 2 before anything starts" \
  expect 2 "cannot be kept on 2 nodes" "$T" run --nnodes 1:3 --rdzv-endpoint 127.0.0.1:1 -- tandem train --accum 1

silent() { # something listens on the endpoint and never answers
  rm -f "$TMP/port"
  python3 -c 'import socket, time, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(4)
open(sys.argv[1], "w").write(str(s.getsockname()[1])); time.sleep(30)' "$TMP/port.tmp" &
  local py=$!
  PIDS="$PIDS $py"
  wait_for 20 test -s "$TMP/port.tmp" || return 1
  local port; port=$(cat "$TMP/port.tmp")
  expect 1 "the rendezvous endpoint 127.0.0.1:$port (--rdzv-endpoint) accepted the connection but did not answer within 2 s (--rdzv-timeout)" \
    "$T" run --nnodes 1:2 --rdzv-endpoint "127.0.0.1:$port" --rdzv-timeout 2 -- true
  local rc=$?
  kill "$py"; wait "$py" 2>/dev/null
  return $rc
}
check "an endpoint that does not answer: named, after --rdzv-timeout, exit 1" silent

token() {
  PORT=$(free_port)
  launch NA --nnodes 2:2 --rdzv-timeout 3 --rdzv-id job-one -- "${SH[@]}"
  wait_for 20 grep -q "hosts the rendezvous" "$TMP/NA.out" || return 1
  expect 1 "the rendezvous at 127.0.0.1:$PORT refused our job token 'job-two' (--rdzv-id)" \
    "$T" run --nproc-per-node 1 --nnodes 2:2 --rdzv-endpoint "127.0.0.1:$PORT" --rdzv-id job-two -- "${SH[@]}" || return 1
  expect 2 "the rendezvous refused this launcher: its --nnodes 1:2 --nproc-per-node 1 differ from the job's --nnodes 2:2 --nproc-per-node 1" \
    "$T" run --nproc-per-node 1 --nnodes 1:2 --rdzv-endpoint "127.0.0.1:$PORT" --rdzv-id job-one -- "${SH[@]}" || return 1
  ended "$NA" 30
  [[ $RC -eq 1 ]] && grep -q "wrong job token" "$TMP/NA.out" || { echo "  host: exit $RC"; cat "$TMP/NA.out"; return 1; }
}
check "launchers with another --rdzv-id (refused naming its token, exit 1) or other --nnodes (refused naming both, exit 2)" token

finish
