#!/usr/bin/env bash
# The parameter server (tandem train --ps-servers S --ps-mode sync|async|ssp) across real
# processes: sync mode gives data parallelism's weights bit for bit (the servers sum the workers'
# gradients in worker-rank order), with 1 or 2 servers, on shm and tcp, so the result does not
# depend on the number of servers; async with one worker is sequential training bit for bit, and
# with two it is not data parallelism (the comparison can fail); ssp holds a fast worker within
# --staleness steps of one slowed by injected sleeps (async lets it run further ahead); the
# servers' update logs replay an async run bit for bit (tandem ps-replay); the workers compute in
# bf16 and recompute as data parallelism does (sync: its bits); a worker killed
# mid-run is dropped by async and ssp servers, which go on (the survivors finish on a
# communicator of their own), and stops sync ones naming it; a dead server is named by the
# workers, within seconds, when the ranks are started one by one (as on several hosts); bad input
# is a clear error.
# usage: test_ps.sh path/to/tandem [base|faults|all]
set -u
T=${1:?usage: test_ps.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"

job() { # job RANKS TRANSPORT ARGS...: tandem ARGS on RANKS processes under tandem run, bounded
  local n=$1 tr=$2; shift 2
  TANDEM_TRANSPORT=$tr timeout 120 "$T" run -n "$n" -- tandem "$@"
}
M=(train --model mlp --data synthetic --steps 5 --threads 1 --prefetch off --batch-size 16 --eval-batch-size 1000
   --optimizer adamw --weight-decay 0.05 --dropout 0.3 --lr 0.002 --seed 3)

sync_is_dp() {
  job 2 shm "${M[@]}" --save-weights "$TMP/dp2.st" >"$TMP/o" 2>&1 &&
    job 3 shm "${M[@]}" --ps-servers 1 --save-weights "$TMP/ps2_1.st" >"$TMP/o1" 2>&1 &&
    job 4 tcp "${M[@]}" --ps-servers 2 --save-weights "$TMP/ps2_2.st" >"$TMP/o2" 2>&1 &&
    job 3 shm "${M[@]}" --save-weights "$TMP/dp3.st" >"$TMP/o" 2>&1 &&
    job 5 shm "${M[@]}" --ps-servers 2 --save-weights "$TMP/ps3_2.st" >"$TMP/o3" 2>&1 ||
    { echo "  a job failed:"; tail -n 3 "$TMP"/o*; return 1; }
  cmp "$TMP/dp2.st" "$TMP/ps2_1.st" && cmp "$TMP/dp2.st" "$TMP/ps2_2.st" && cmp "$TMP/dp3.st" "$TMP/ps3_2.st" &&
    ! cmp -s "$TMP/dp2.st" "$TMP/dp3.st" || return 1
  # the servers' loads: two halves of the keys, equal in bytes to within one key
  grep -o '"keys":\[[0-9]*,[0-9]*\],"bytes":[0-9]*' "$TMP/o2" | sort
  local b; b=$(grep -o '"bytes":[0-9]*' "$TMP/o2" | cut -d: -f2 | sort -n | tr '\n' ' ')
  read -r lo hi <<<"$b"
  [[ -n "$lo" && -n "$hi" && $((hi - lo)) -le 4 ]]
}

async_one_worker_is_sequential() {
  timeout 60 "$T" "${M[@]}" --save-weights "$TMP/one.st" >"$TMP/o" 2>&1 &&
    job 3 shm "${M[@]}" --ps-servers 2 --ps-mode async --save-weights "$TMP/a1.st" >"$TMP/o" 2>&1 &&
    job 4 shm "${M[@]}" --ps-servers 2 --ps-mode async --save-weights "$TMP/a2.st" >"$TMP/o2" 2>&1 ||
    { echo "  a job failed:"; tail -n 3 "$TMP/o" "$TMP/o2"; return 1; }
  cmp "$TMP/one.st" "$TMP/a1.st" && ! cmp -s "$TMP/a2.st" "$TMP/dp2.st"
}

# A GPT's workers in bf16 with block recomputation, and in f32 with selective recomputation: sync
# mode gives data parallelism's weights bit for bit (the workers' tape is the data-parallel
# engine's); fp16 is refused (an overflowing push would reach the servers)
mixed_and_recompute_are_dp() {
  local G=(train --model gpt --config mini --layers 2 --width 64 --heads 2 --steps 4 --batch-size 4 --seq-len 32
           --threads 1 --prefetch off --seed 5 --val-every 0 --val-batches 2 --clip 0)
  job 2 shm "${G[@]}" --precision bf16 --recompute block --save-weights "$TMP/gdp_b.st" >"$TMP/o" 2>&1 &&
    job 3 shm "${G[@]}" --precision bf16 --recompute block --ps-servers 1 --save-weights "$TMP/gps_b.st" >"$TMP/o1" 2>&1 &&
    job 2 shm "${G[@]}" --recompute selective --save-weights "$TMP/gdp_s.st" >"$TMP/o" 2>&1 &&
    job 3 shm "${G[@]}" --recompute selective --ps-servers 1 --save-weights "$TMP/gps_s.st" >"$TMP/o2" 2>&1 ||
    { echo "  a job failed:"; tail -n 3 "$TMP"/o*; return 1; }
  cmp "$TMP/gdp_b.st" "$TMP/gps_b.st" && cmp "$TMP/gdp_s.st" "$TMP/gps_s.st" && ! cmp -s "$TMP/gdp_b.st" "$TMP/gdp_s.st" || return 1
  ! job 3 shm "${G[@]}" --precision fp16 --ps-servers 1 >"$TMP/o" 2>&1 &&
    grep -q "fp16 skips the steps whose gradients overflow, and the ps engine cannot skip a step" "$TMP/o"
}

# 3 workers and 1 server; worker 1 sleeps 30 ms every step, the others run free
gap() { sed -n 's/.*"max_clock_gap":\([0-9]*\).*/\1/p' "$1"; }
stale() { sed -n 's/.*"max_staleness":\([0-9]*\).*/\1/p' "$1"; }
ssp_bound_holds() {
  local S=(train --model mlp --data synthetic --steps 12 --threads 1 --prefetch off --batch-size 8 --eval-batch-size 1000
           --seed 4 --ps-servers 1 --ps-delay 1:0.03)
  job 4 shm "${S[@]}" --ps-mode ssp --staleness 1 --metrics "$TMP/ssp1.jsonl" >"$TMP/o" 2>&1 &&
    job 4 shm "${S[@]}" --ps-mode ssp --staleness 0 --metrics "$TMP/ssp0.jsonl" >"$TMP/o1" 2>&1 &&
    job 4 shm "${S[@]}" --ps-mode async --metrics "$TMP/async.jsonl" >"$TMP/o2" 2>&1 ||
    { echo "  a job failed:"; tail -n 3 "$TMP/o" "$TMP/o1" "$TMP/o2"; return 1; }
  local g1 s1 g0 ga
  g1=$(gap "$TMP/ssp1.jsonl.ps0") s1=$(stale "$TMP/ssp1.jsonl.ps0") g0=$(gap "$TMP/ssp0.jsonl.ps0") ga=$(gap "$TMP/async.jsonl.ps0")
  echo "  max clock gap: ssp 1: $g1 (max staleness $s1), ssp 0: $g0, async: $ga"
  # worker 0's step records: the staleness of each push (one server: one value) within the
  # server's maximum and not all 0, and the bytes of one shard each way (its 56-byte header too)
  local st; st=$(grep -o '"ps_staleness":\[[0-9]*\]' "$TMP/ssp1.jsonl" | tr -dc '0-9\n' | sort -n | uniq -c | tr '\n' ' ')
  echo "  worker 0's pushes by staleness (count value): $st"
  [[ $(grep -c '"ps_bytes_pushed":2143328,"ps_bytes_pulled":2143328,"ps_staleness":\[[0-9]*\]' "$TMP/ssp1.jsonl") -eq 12 ]] &&
    [[ $(grep -o '"ps_staleness":\[[0-9]*\]' "$TMP/ssp1.jsonl" | tr -dc '0-9\n' | sort -n | tail -1) -le "$s1" ]] &&
    grep -q '"ps_staleness":\[[1-9]' "$TMP/ssp1.jsonl" || return 1
  # the bound holds; and it is the servers' doing: without it the fast workers run ahead
  [[ -n "$g1" && -n "$g0" && -n "$ga" && "$g1" -le 1 && "$g0" -eq 0 && "$s1" -ge 1 && "$ga" -ge 1 ]]
}

# The update log: an async run of 2 workers and 2 servers replayed gives its weights bit for bit;
# stopping early does not; a flipped byte in a logged gradient is named, not applied
replay_reproduces_async() {
  local R=(--model mlp --data synthetic --steps 4 --threads 1 --prefetch off --batch-size 16 --eval-batch-size 1000
           --optimizer adamw --weight-decay 0.05 --dropout 0.3 --lr 0.002 --seed 3)
  job 4 shm train "${R[@]}" --ps-servers 2 --ps-mode async --ps-log "$TMP/log" --save-weights "$TMP/run.st" >"$TMP/o" 2>&1 &&
    timeout 60 "$T" ps-replay "${R[@]}" --ps-log "$TMP/log" --save-weights "$TMP/replay.st" >"$TMP/o2" 2>&1 &&
    timeout 60 "$T" ps-replay "${R[@]}" --ps-log "$TMP/log" --until 5 --save-weights "$TMP/early.st" >"$TMP/o3" 2>&1 ||
    { echo "  a step failed:"; tail -n 3 "$TMP/o" "$TMP/o2" "$TMP/o3"; return 1; }
  cat "$TMP/o2"
  # the values bit for bit (the data section: the two writers pad their headers differently)
  local n=2143272
  cmp <(tail -c $n "$TMP/run.st") <(tail -c $n "$TMP/replay.st") && "$T" weights-diff "$TMP/run.st" "$TMP/replay.st" --quiet &&
    ! cmp -s <(tail -c $n "$TMP/run.st") <(tail -c $n "$TMP/early.st") || return 1
  printf '\x55' | dd of="$TMP/log/ps-server-1.log" bs=1 seek=$((56 + 48 + 1000)) conv=notrunc 2>/dev/null
  timeout 60 "$T" ps-replay "${R[@]}" --ps-log "$TMP/log" --save-weights "$TMP/bad.st" >"$TMP/o4" 2>&1
  [[ $? -eq 1 ]] && grep -q "ps-server-1.log: update 0 (worker [01]) fails its checksum" "$TMP/o4" && [[ ! -e "$TMP/bad.st" ]] ||
    { tail -n 2 "$TMP/o4"; return 1; }
}

# Ranks started one by one (as on several hosts): tcp, a store at a free port.
start_rank() { # start_rank R N ARGS...: rank R of N in the background; its pid in PIDS[R]
  local r=$1 n=$2; shift 2
  RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT TANDEM_TRANSPORT=tcp TANDEM_TIMEOUT=30 \
    "$T" "$@" >"$TMP/r$r" 2>&1 &
  PIDS[$r]=$!
}
watchdog() { # whatever of PIDS still runs after $1 seconds is killed (a hang fails the case)
  (sleep "$1"; for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done) >/dev/null 2>&1 &
  WD=$!
}
unwatch() { kill $(pgrep -P "$WD") "$WD" 2>/dev/null; } # the watchdog and its sleep
PIDS=()
on_exit 'for p in "${PIDS[@]}"; do kill -9 $p 2>/dev/null; done'
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Checkpoints hold the servers' shards and moments (format 3: the workers' files are empty): a
# sync run killed after step 4 and resumed from its step-4 checkpoint ends with data parallelism's
# uninterrupted weights byte for byte (sync == DP); so does that checkpoint resumed by data
# parallelism (2 ranks), and data parallelism's step-4 checkpoint resumed by 2 workers and 2
# servers (tcp)
checkpoint_resumes() {
  local C=("${M[@]}" --checkpoint-every 2)
  { TANDEM_FAULT=0:4 job 3 shm "${C[@]}" --ps-servers 1 --checkpoint-dir "$TMP/cps" >"$TMP/o1" 2>&1; [[ $? -eq 3 ]]; } &&
    cp -r "$TMP/cps" "$TMP/cps_dp" &&
    job 3 shm "${C[@]}" --ps-servers 1 --checkpoint-dir "$TMP/cps" --resume --save-weights "$TMP/res.st" >"$TMP/o2" 2>&1 &&
    job 2 shm "${C[@]}" --checkpoint-dir "$TMP/cps_dp" --resume --save-weights "$TMP/res_dp.st" >"$TMP/o3" 2>&1 &&
    { TANDEM_FAULT=0:4 job 2 shm "${C[@]}" --checkpoint-dir "$TMP/cdp" >"$TMP/o4" 2>&1; [[ $? -eq 3 ]]; } &&
    job 4 tcp "${C[@]}" --ps-servers 2 --checkpoint-dir "$TMP/cdp" --resume --save-weights "$TMP/res_ps.st" >"$TMP/o5" 2>&1 ||
    { echo "  a job failed:"; tail -n 3 "$TMP"/o*; return 1; }
  grep -h "resumed from" "$TMP/o2" "$TMP/o3" "$TMP/o5"
  "$T" checkpoint info "$TMP/cps/ckpt-000000000004.safetensors" | grep -E "^step|^layout|rank-[0-9]"
  "$T" checkpoint info "$TMP/cps/ckpt-000000000004.safetensors" | grep -q "step 4, optimizer adamw with 4 steps" &&
    cmp "$TMP/dp2.st" "$TMP/res.st" && cmp "$TMP/dp2.st" "$TMP/res_dp.st" && cmp "$TMP/dp2.st" "$TMP/res_ps.st" &&
    grep -q "resumed from step 4 of .*written by parameter server (sync), 2 workers, 1 server; resharded to data parallel" "$TMP/o3" &&
    grep -q "resumed from step 4 of .*written by data parallel, 2 ranks; resharded to parameter server (sync), 2 workers, 2 servers" "$TMP/o5"
}

# SGD with momentum: the momentum lives on the servers and the workers hold no optimizer state;
# the checkpoint still resumes bit for bit (read "without momentum", the workers refused it, and
# data parallelism's checkpoints alike)
momentum_resumes() {
  local C=("${M[@]/adamw/sgd}" --momentum 0.9 --checkpoint-every 2)
  job 3 shm "${C[@]}" --ps-servers 1 --save-weights "$TMP/m_full.st" >"$TMP/m0" 2>&1 &&
    { TANDEM_FAULT=0:4 job 3 shm "${C[@]}" --ps-servers 1 --checkpoint-dir "$TMP/mps" >"$TMP/m1" 2>&1; [[ $? -eq 3 ]]; } &&
    job 3 shm "${C[@]}" --ps-servers 1 --checkpoint-dir "$TMP/mps" --resume --save-weights "$TMP/m_res.st" >"$TMP/m2" 2>&1 ||
    { echo "  a job failed:"; tail -n 2 "$TMP"/m[0-2]; return 1; }
  cmp "$TMP/m_full.st" "$TMP/m_res.st"
}

# --max-time in ssp: each worker stops on its own clock and sends its final pull; the server no
# longer counts it as the slowest (a faster worker held for it waited until the timeout)
max_time_own_clocks() {
  local X=("${M[@]/--steps 5/--steps 1000000}" --max-time 1)
  TANDEM_TIMEOUT=20 job 3 shm "${X[@]}" --ps-servers 1 --ps-mode ssp --staleness 1 >"$TMP/mt1" 2>&1 ||
    { echo "  ssp with --max-time:"; tail -n 3 "$TMP/mt1"; return 1; }
  grep -q '"max_clock_gap":[01],' "$TMP/mt1" || { echo "  the bound"; grep ps_server "$TMP/mt1"; return 1; }
  TANDEM_TIMEOUT=20 job 3 shm "${X[@]}" --ps-servers 1 --ps-mode async --checkpoint-dir "$TMP/mtck" >"$TMP/mt2" 2>&1
  [[ $? -ne 0 ]] && grep -q -- "--max-time with --ps-mode async and --checkpoint-dir" "$TMP/mt2" ||
    { echo "  async, --max-time, checkpoints:"; tail -n 2 "$TMP/mt2"; return 1; }
}

# A worker killed mid-run (TANDEM_FAULT: exit 3 after 3 steps) under tandem run --keep-going:
# async and ssp servers name it and go on; the survivors finish, evaluate and save on a
# communicator of their own; every push that arrived is in the saved weights (the update log
# replays to them bit for bit, the dead worker's 3 pushes included); sync stops naming it.
ps_json() { grep -o '{"ps_server".*}' "$1"; }
lost_worker_async_goes_on() {
  local A=(--model mlp --data synthetic --steps 10 --threads 1 --prefetch off --batch-size 16 --eval-batch-size 1000
           --optimizer adamw --lr 0.002 --seed 3)
  TANDEM_FAULT=1:3 TANDEM_TRANSPORT=tcp timeout 120 "$T" run --keep-going -n 4 -- tandem train "${A[@]}" --ps-servers 1 \
    --ps-mode async --ps-log "$TMP/llog" --save-weights "$TMP/lost.st" >"$TMP/o" 2>&1
  local rc=$?
  timeout 60 "$T" ps-replay "${A[@]}" --ps-log "$TMP/llog" --save-weights "$TMP/lost_replay.st" >"$TMP/o2" 2>&1 ||
    { tail -n 3 "$TMP/o" "$TMP/o2"; return 1; }
  grep "lost" "$TMP/o" | head -3
  local js; js=$(ps_json "$TMP/o")
  echo "  server: $(grep -o '"pushes":[0-9]*' <<<"$js"), $(grep -o '"lost_workers":\[[0-9,]*\]' <<<"$js"); launcher exit $rc"
  # workers 0 and 2 pushed 10 steps each, worker 1 three before it died
  [[ $rc -eq 3 ]] && grep -q '"pushes":23,' <<<"$js" && grep -q '"lost_workers":\[1\]' <<<"$js" &&
    grep -q "parameter server 0 (rank 3, keys \[0, 535818)): worker 1 lost (rank 1 closed its connection" "$TMP/o" &&
    grep -q "\[rank 0\] tandem train: worker 1 lost (named by the servers); 2 workers go on without it" "$TMP/o" &&
    grep -q "\[rank 0\] epoch 1: test loss" "$TMP/o" && grep -q "ps-replay: server 0: 23 updates replayed" "$TMP/o2" &&
    cmp <(tail -c 2143272 "$TMP/lost.st") <(tail -c 2143272 "$TMP/lost_replay.st") || { tail -n 5 "$TMP/o"; return 1; }
}

# ssp over shm, 2 servers, worker 0 (the reporting rank) lost: the first survivor (rank 1) reports,
# and the bound holds for the others
lost_worker_ssp_goes_on() {
  local A=(--model mlp --data synthetic --steps 10 --threads 1 --prefetch off --batch-size 8 --eval-batch-size 1000 --seed 4)
  TANDEM_FAULT=0:2 TANDEM_TRANSPORT=shm timeout 120 "$T" run --keep-going -n 5 -- tandem train "${A[@]}" --ps-servers 2 \
    --ps-mode ssp --staleness 1 --ps-delay 2:0.03 --metrics "$TMP/lssp.jsonl" --save-weights "$TMP/lssp.st" >"$TMP/o" 2>&1
  local rc=$? g0 g1
  g0=$(gap "$TMP/lssp.jsonl.ps0") g1=$(gap "$TMP/lssp.jsonl.ps1")
  echo "  launcher exit $rc; max clock gap $g0 / $g1"
  [[ $rc -eq 3 && -s "$TMP/lssp.st" && -n "$g0" && "$g0" -le 1 && "$g1" -le 1 ]] &&
    grep -q '"lost_workers":\[0\]' "$TMP/lssp.jsonl.ps0" && grep -q '"lost_workers":\[0\]' "$TMP/lssp.jsonl.ps1" &&
    grep -q '"pushes":22,' "$TMP/lssp.jsonl.ps1" &&
    grep -q "\[rank 1\] tandem train: worker 0 lost (named by the servers); 2 workers go on without it" "$TMP/o" &&
    grep -q "\[rank 1\] weights written to" "$TMP/o" || { tail -n 5 "$TMP/o"; return 1; }
}

# Ranks started one by one (no launcher), sync: the server stops naming the killed worker within
# seconds (a round needs every worker), and worker 0 stops too
dead_worker_named() {
  PORT=$(free_port)
  local t0=$SECONDS
  for r in 0 1 2; do TANDEM_FAULT=1:3 start_rank $r 3 "${M[@]}" --steps 50 --ps-servers 1 --ps-mode sync; done
  watchdog 60
  wait "${PIDS[2]}"; local s=$?
  wait "${PIDS[0]}"; local w=$?
  wait "${PIDS[1]}"
  unwatch
  echo "  after $((SECONDS - t0)) s: server: $(tail -1 "$TMP/r2" | cut -c1-160)"
  echo "  worker 0: $(tail -1 "$TMP/r0" | cut -c1-160)"
  # (worker 0 all-reduces each step's loss with worker 1: it may fail first, naming rank 1, and be
  # the worker the server finds lost, naming rank 1's connection in its turn)
  [[ $s -ne 0 && $w -ne 0 && $((SECONDS - t0)) -lt 30 ]] &&
    grep -Eq "parameter server 0 \(rank 2.*worker [01] was lost: .*rank 1 (closed|reset) its connection" "$TMP/r2" &&
    grep -Eq "parameter server 0 \(rank 2\)|rank 1 (closed|reset) its connection" "$TMP/r0"
}

# tandem ps-worker / ps-server started as separate commands (as on several hosts: --rank, --world,
# --master): sync gives data parallelism's weights byte for byte; a rank started with the wrong
# role, and a server whose --master does not answer, are clear errors
started_apart() {
  PORT=$(free_port)
  local t0=$SECONDS rc=0
  for r in 0 1 2; do
    local role=ps-worker; [[ $r -eq 2 ]] && role=ps-server
    TANDEM_TIMEOUT=30 "$T" $role --rank $r --world 3 --master 127.0.0.1:$PORT "${M[@]:1}" --ps-servers 1 \
      --save-weights "$TMP/apart.st" >"$TMP/r$r" 2>&1 &
    PIDS[$r]=$!
  done
  watchdog 60
  for r in 0 1 2; do wait "${PIDS[$r]}" || rc=1; done
  unwatch
  echo "  3 commands done after $((SECONDS - t0)) s (exit statuses $rc)"
  [[ $rc -eq 0 ]] && cmp "$TMP/dp2.st" "$TMP/apart.st" || { tail -n 2 "$TMP"/r[012]; return 1; }
  "$T" ps-server --rank 1 --world 3 --master 127.0.0.1:$PORT "${M[@]:1}" --ps-servers 1 >"$TMP/o" 2>&1
  [[ $? -eq 2 ]] && grep -q "rank 1 of 3 with 1 server is a worker (servers are ranks 2..2): start it with tandem ps-worker" "$TMP/o" ||
    { cat "$TMP/o"; return 1; }
  "$T" ps-worker --rank 0 --world 3 --master localhost "${M[@]:1}" --ps-servers 1 >"$TMP/o" 2>&1
  [[ $? -eq 2 ]] && grep -q "expected HOST:PORT" "$TMP/o" || { cat "$TMP/o"; return 1; }
  # its training options' errors carry its own name
  "$T" ps-worker --rank 0 --world 3 --master 127.0.0.1:1 --ps-servers 1 --steps 1 --epochs 1 >"$TMP/o" 2>&1
  [[ $? -eq 2 ]] && grep -q "^tandem ps-worker: give --epochs or --steps, not both" "$TMP/o" || { cat "$TMP/o"; return 1; }
  t0=$SECONDS
  TANDEM_TIMEOUT=2 timeout 30 "$T" ps-server --rank 2 --world 3 --master 127.0.0.1:$(free_port) "${M[@]:1}" --ps-servers 1 >"$TMP/o" 2>&1
  [[ $? -eq 1 && $((SECONDS - t0)) -lt 15 ]] && grep -q "rank 2 cannot reach the store at 127.0.0.1:[0-9]* (MASTER_ADDR:MASTER_PORT)" "$TMP/o" ||
    { cat "$TMP/o"; return 1; }
}

dead_server_named() {
  PORT=$(free_port)
  for r in 0 1 2 3; do start_rank $r 4 "${M[@]}" --steps 500 --ps-servers 2 --ps-delay 0:0.05; done
  watchdog 60
  sleep 3
  kill -9 "${PIDS[3]}"
  local t0=$SECONDS rc=0
  for r in 0 1 2; do wait "${PIDS[$r]}" || rc=$((rc + 1)); done
  unwatch
  for r in 0 1 2; do echo "  after $((SECONDS - t0)) s: rank $r: $(tail -1 "$TMP/r$r")"; done
  # every rank stops, and the first to see it names the server (the others may see a peer's abort first)
  [[ $rc -eq 3 && $((SECONDS - t0)) -lt 20 ]] && cat "$TMP"/r[012] | grep -q "parameter server 1 (rank 3).*rank 3"
}

bad_input() {
  local ok=0
  job 2 shm "${M[@]}" --ps-servers 2 >"$TMP/o" 2>&1 && ok=1
  grep -q -- "--ps-servers 2 with 2 ranks; expected 1..1" "$TMP/o" || ok=1
  "$T" "${M[@]}" --ps-servers 1 >"$TMP/o" 2>&1 && ok=1
  grep -q -- "--ps-servers 1 with 1 rank" "$TMP/o" || ok=1
  "$T" "${M[@]}" --ps-servers 1 --staleness 2 >"$TMP/o" 2>&1; [[ $? -eq 2 ]] && grep -q "applies to --ps-mode ssp only" "$TMP/o" || ok=1
  "$T" "${M[@]}" --ps-mode async >"$TMP/o" 2>&1; [[ $? -eq 2 ]] && grep -q "applies with --ps-servers only" "$TMP/o" || ok=1
  "$T" "${M[@]}" --ps-servers 1 --ps-delay x >"$TMP/o" 2>&1; [[ $? -eq 2 ]] && grep -q "expected WORKER:SECONDS" "$TMP/o" || ok=1
  job 3 shm "${M[@]}" --ps-servers 1 --clip 1 >"$TMP/o" 2>&1 && ok=1
  grep -q "clipping (1) with a parameter server" "$TMP/o" || ok=1
  job 3 shm "${M[@]}" --ps-servers 1 --init-weights "$TMP/dp2.st" >"$TMP/o" 2>&1 && ok=1
  grep -q "init-weights with a parameter server is not built yet" "$TMP/o" || ok=1
  [[ $ok -eq 0 ]] || tail -2 "$TMP/o"
  return $ok
}

# two parts, each its own ctest entry (test_ps, test_ps_faults), so that each stays well within
# ctest's timeout in the sanitizer build
PART=${2:-all}
part() { [[ $PART == all || $PART == "$1" ]]; }
dp_reference() { # data parallelism's weights (2 ranks) for the faults part's comparisons
  [[ -s "$TMP/dp2.st" ]] || job 2 shm "${M[@]}" --save-weights "$TMP/dp2.st" >"$TMP/o" 2>&1
}
if part base; then
check "sync == data parallel, bit for bit (1 and 2 servers, shm and tcp)" sync_is_dp
check "async with one worker == one process; with two it differs" async_one_worker_is_sequential
check "bf16 and recomputation on the workers: sync == data parallel, bit for bit; fp16 refused" mixed_and_recompute_are_dp
check "ssp: a worker at most --staleness steps ahead of a slowed one" ssp_bound_holds
check "the update log replays an async run bit for bit" replay_reproduces_async
check "bad input is a clear error" bad_input
fi
if part faults; then
check "data parallelism's weights to compare with" dp_reference
check "checkpoints: resume bit for bit, and across data parallelism both ways" checkpoint_resumes
check "SGD with momentum: a checkpoint resumes bit for bit" momentum_resumes
check "--max-time: ssp workers stop on their own clocks, cleanly; with async and a checkpoint directory refused" max_time_own_clocks
check "a lost worker: async goes on without it, its pushes kept (tandem run --keep-going)" lost_worker_async_goes_on
check "a lost worker: ssp goes on, the first survivor reports, the bound holds" lost_worker_ssp_goes_on
check "a dead worker is named by the server (ranks started one by one)" dead_worker_named
check "tandem ps-worker / ps-server started apart == data parallel; wrong role, silent address" started_apart
check "a dead server is named by the workers" dead_server_named
fi
finish
