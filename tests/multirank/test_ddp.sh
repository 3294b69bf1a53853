#!/usr/bin/env bash
# Data-parallel training is proven equivalent: N ranks == one process with an N-times batch,
# K-step accumulation == one K-times batch (SGD with momentum and dropout 0.3, parameters within
# 1e-5 relative), the same seed twice == bit-identical, under tandem run (shm, tcp) and mpirun.
# usage: test_ddp.sh path/to/tandem
set -u
T=${1:?usage: test_ddp.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"
. "$(dirname "$0")/ranks.sh"
trap 'kill -9 $RANK_PIDS 2>/dev/null; wait $RANK_PIDS 2>/dev/null; rm -rf "$TMP"' EXIT
A=(train --steps 20 --threads 1 --optimizer sgd --lr 0.05 --momentum 0.9 --dropout 0.3 --seed 7)
"$T" "${A[@]}" --batch-size 96 --save-weights "$TMP/one.st" --metrics "$TMP/one.m" >/dev/null 2>&1 ||
  { echo "FAIL the one-process reference did not run"; exit 1; }

same() { "$T" weights-diff "$1" "$2" --rtol "$3" --quiet | tail -1; "$T" weights-diff "$1" "$2" --rtol "$3" --quiet >/dev/null; }

three_shm() {
  TANDEM_TRANSPORT=shm "$T" run -n 3 -- tandem "${A[@]}" --batch-size 32 --save-weights "$TMP/shm3.st" --metrics "$TMP/shm3.m" >/dev/null 2>&1 &&
    same "$TMP/one.st" "$TMP/shm3.st" 1e-5 &&
    [[ "$(grep -o '"loss":[0-9.]*' "$TMP/one.m" | tail -1)" == "$(grep -o '"loss":[0-9.]*' "$TMP/shm3.m" | tail -1)" ]] &&
    grep -q '"world_size":3' "$TMP/shm3.m" && grep -q '"time_comm_wait_ms"' "$TMP/shm3.m" &&
    paste <(grep -o '"grad_norm":[0-9.e+-]*' "$TMP/one.m" | cut -d: -f2) <(grep -o '"grad_norm":[0-9.e+-]*' "$TMP/shm3.m" | cut -d: -f2) |
      awk 'NF != 2 || $1 <= 0 || ($1 - $2) / $1 > 1e-5 || ($2 - $1) / $1 > 1e-5 { bad = 1 } END { exit bad || NR != 20 }' ||
    { echo "  gradient norms differ:"; paste <(grep -o '"grad_norm":[0-9.e+-]*' "$TMP/one.m") <(grep -o '"grad_norm":[0-9.e+-]*' "$TMP/shm3.m") | head -3; return 1; }
}
check "3 ranks (shm) x 32 == 1 process x 96: parameters, losses and gradient norms (after averaging)" three_shm
zero_copy() { # gradients averaged in place in shared memory == averaged by the copying all-reduce, bit for bit
  TANDEM_LOG=info TANDEM_TRANSPORT=shm "$T" run -n 3 -- tandem "${A[@]}" --batch-size 32 --save-weights "$TMP/zc1.st" \
    >"$TMP/zc1.out" 2>&1 && grep -q "averaged in place (zero-copy)" "$TMP/zc1.out" &&
    TANDEM_DP_ZERO_COPY=0 TANDEM_LOG=info TANDEM_TRANSPORT=shm "$T" run -n 3 -- tandem "${A[@]}" --batch-size 32 \
      --save-weights "$TMP/zc0.st" >"$TMP/zc0.out" 2>&1 && ! grep -q "zero-copy" "$TMP/zc0.out" &&
    cmp -s "$TMP/zc1.st" "$TMP/zc0.st" &&
    TANDEM_DP_INLINE=0 TANDEM_TRANSPORT=shm "$T" run -n 3 -- tandem "${A[@]}" --batch-size 32 --bucket-mb 0.1 \
      --save-weights "$TMP/zca.st" >/dev/null 2>&1 && cmp -s "$TMP/zc1.st" "$TMP/zca.st"
}
check "zero-copy gradient averaging (shm; on the training thread, and on the communication thread with many buckets) == the copying all-reduce, bit for bit" zero_copy
peer_dies() { # without the launcher to stop it, the survivor must notice the dead rank in the averaging
  local port p0 p1 t0 rc
  port=$(free_port)
  start_rank 0 "$port" "$TMP/pd0" train --steps 100000 --threads 1 --eval-batch-size 100; p0=$!
  start_rank 1 "$port" "$TMP/pd1" train --steps 100000 --threads 1 --eval-batch-size 100; p1=$!
  for _ in $(seq 1 300); do # until both ranks are set up and training (at most 30 s), then a little more
    grep -q "^tandem train: " "$TMP/pd0" && break
    sleep 0.1
  done
  sleep 0.5
  kill -9 $p1 2>/dev/null
  t0=$SECONDS
  wait $p0; rc=$?
  wait $p1 2>/dev/null
  (( rc != 0 && SECONDS - t0 < 20 )) && grep -q "rank 1 (pid [0-9]*) died" "$TMP/pd0" || { echo "  exit $rc:"; tail -2 "$TMP/pd0"; return 1; }
}
check "a rank killed during training: the other fails naming it, no hang" peer_dies
three_tcp() {
  TANDEM_TRANSPORT=tcp "$T" run -n 3 -- tandem "${A[@]}" --batch-size 32 --save-weights "$TMP/tcp3.st" >/dev/null 2>&1 &&
    same "$TMP/one.st" "$TMP/tcp3.st" 1e-5
}
check "3 ranks (tcp) x 32 == 1 process x 96" three_tcp
few_descriptors() { # 4 tcp ranks need about 44 descriptors on rank 0: a soft limit of 16 is raised; a hard one named
  ( ulimit -Sn 16; TANDEM_TRANSPORT=tcp TANDEM_TIMEOUT=20 timeout 120 "$T" run -n 4 -- tandem train --model mlp --data synthetic \
      --steps 2 --threads 1 ) >"$TMP/fd.out" 2>&1 || { tail -3 "$TMP/fd.out"; return 1; }
  ( ulimit -n 16; TANDEM_TRANSPORT=tcp TANDEM_TIMEOUT=20 timeout 120 "$T" run -n 4 -- tandem train --model mlp --data synthetic \
      --steps 2 --threads 1 ) >"$TMP/fd.out" 2>&1
  [[ $? -eq 1 ]] && grep -q "file descriptors (a socket per peer.*); ulimit -n is 16 and the hard limit 16: raise it" "$TMP/fd.out" &&
    ! grep -q "launcher .* is gone" "$TMP/fd.out" || { tail -3 "$TMP/fd.out"; return 1; }
}
check "out of file descriptors over tcp: a soft limit raised, a hard one named (no rank stops itself for a launcher it thinks gone)" few_descriptors
two_ranks() {
  "$T" run -n 2 -- tandem "${A[@]}" --batch-size 48 --save-weights "$TMP/two.st" >/dev/null 2>&1 && same "$TMP/one.st" "$TMP/two.st" 1e-5
}
check "2 ranks x 48 == 1 process x 96" two_ranks
accum() {
  "$T" "${A[@]}" --batch-size 32 --accum 3 --save-weights "$TMP/acc.st" >/dev/null 2>&1 && same "$TMP/one.st" "$TMP/acc.st" 1e-5 &&
    "$T" run -n 3 -- tandem "${A[@]}" --batch-size 16 --accum 2 --save-weights "$TMP/acc3.st" >/dev/null 2>&1 &&
    same "$TMP/one.st" "$TMP/acc3.st" 1e-5
}
check "accumulation: 1 x 32 x 3 steps, and 3 ranks x 16 x 2 steps == 1 x 96" accum
bitwise() {
  "$T" run -n 2 -- tandem "${A[@]}" --batch-size 48 --save-weights "$TMP/again.st" >/dev/null 2>&1 && cmp -s "$TMP/two.st" "$TMP/again.st"
}
check "the same seed twice on 2 ranks: bit-identical weights" bitwise
small_shm() { # a /dev/shm too small for the gradients: a warning and the copying all-reduce, same result;
              # too small for the transport: a clear error, no bus error
  unshare -m bash -c "mount -t tmpfs -o size=10m tmpfs /dev/shm && TANDEM_TRANSPORT=shm \"$T\" run -n 2 -- tandem ${A[*]} \
      --batch-size 48 --save-weights $TMP/small.st" >"$TMP/small.out" 2>&1 &&
    grep -q "gradients stay private (shared buffer: some rank could not reserve" "$TMP/small.out" &&
    cmp -s "$TMP/small.st" "$TMP/two.st" &&
    ! unshare -m bash -c "mount -t tmpfs -o size=4m tmpfs /dev/shm && TANDEM_TRANSPORT=shm \"$T\" run -n 2 -- tandem ${A[*]} \
      --batch-size 48" >"$TMP/tiny.out" 2>&1 && grep -q "cannot reserve [0-9]* bytes in /dev/shm" "$TMP/tiny.out" &&
    ! grep -q "Bus error" "$TMP/tiny.out" || { tail -n 3 "$TMP/small.out" "$TMP/tiny.out"; return 1; }
}
if unshare -m bash -c "mount -t tmpfs -o size=1m tmpfs /dev/shm" 2>/dev/null; then
  check "a small /dev/shm: zero-copy falls back with a warning (same weights); smaller still: a clear error" small_shm
else
  echo "skip a small /dev/shm (needs mount namespaces: unshare -m)"
fi
under_mpirun() {
  command -v mpirun >/dev/null || { echo "  mpirun missing: scripts/setup.sh installs openmpi-bin"; return 1; }
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    timeout 120 mpirun -np 2 "$T" "${A[@]}" --batch-size 48 --save-weights "$TMP/mpi.st" >"$TMP/mpi.out" 2>&1 ||
    { tail -5 "$TMP/mpi.out"; return 1; }
  same "$TMP/one.st" "$TMP/mpi.st" 1e-5
}
check "under Open MPI's mpirun (2 ranks) == 1 process" under_mpirun
different_settings() { # rank 1 started with other options by hand: every rank names the option and both values
  local extra want
  while IFS='|' read -r extra want; do
    "$T" run -n 2 -- sh -c "if [ \"\$RANK\" = 1 ]; then exec \"$T\" train --steps 1 --threads 1 $extra; else exec \"$T\" train --steps 1 --threads 1; fi" \
      >"$TMP/out" 2>&1
    local rc=$?
    [[ $rc -ne 0 && $(grep -c -- "different training settings: $want" "$TMP/out") -ge 2 ]] ||
      { echo "  rank 1 with $extra: exit $rc"; tail -5 "$TMP/out"; return 1; }
  done <<'EOF'
--model cnn|--model is cnn on rank 1 but mlp on rank 0
--lr 0.01|--lr is 0.01 on rank 1 but 0.001 on rank 0
--seed 7|--seed is 7 on rank 1 but 42 on rank 0
--batch-size 32|--batch-size is 32 on rank 1 but 64 on rank 0
EOF
  # and a switch of the environment that changes the collectives (unset is on)
  "$T" run -n 2 -- sh -c "if [ \"\$RANK\" = 1 ]; then export TANDEM_DP_ZERO_COPY=0; fi; exec \"$T\" train --steps 1 --threads 1" \
    >"$TMP/out" 2>&1
  local rc=$?
  [[ $rc -ne 0 && $(grep -c -- "different training settings: TANDEM_DP_ZERO_COPY (environment) is 0 on rank 1 but 1 on rank 0" "$TMP/out") -ge 2 ]] ||
    { echo "  rank 1 with TANDEM_DP_ZERO_COPY=0: exit $rc"; tail -5 "$TMP/out"; return 1; }
  # the same options over different files (paths may differ): a text that differs in its first byte
  head -c 30000 data/tinyshakespeare.txt >"$TMP/text0.txt"
  { printf 'X'; tail -c +2 "$TMP/text0.txt"; } >"$TMP/text1.txt"
  "$T" run -n 2 -- sh -c "exec \"$T\" train --model gpt --layers 1 --heads 2 --width 16 --block 16 --steps 1 --threads 1 \
    --data-path \"$TMP/text\$RANK.txt\"" >"$TMP/out" 2>&1
  rc=$?
  [[ $rc -ne 0 && $(grep -c -- "the ranks do not read the same data: training data (a checksum of 64 samples) is [0-9a-f]* on rank 1 but [0-9a-f]* on rank 0" "$TMP/out") -ge 2 ]] ||
    { echo "  rank 1 reading another text: exit $rc"; tail -5 "$TMP/out"; return 1; }
  # what may differ from rank to rank: threads
  "$T" run -n 2 -- sh -c "exec \"$T\" train --steps 1 --threads \$((RANK + 1))" >"$TMP/out" 2>&1 ||
    { echo "  ranks with 1 and 2 threads were refused"; tail -3 "$TMP/out"; return 1; }
}
check "ranks started with different settings (model, lr, seed, batch, TANDEM_DP_ZERO_COPY) or reading different data: every rank names the option and both values" different_settings
val_same_samples() { # --val-batches counts global batches: the same validation whatever the layout
  local V=(train --model gpt --layers 2 --heads 2 --width 48 --block 16 --vocab 257 --threads 1 --val-batches 2 --seed 5 --steps 2
           --optimizer sgd --lr 0.1 --dropout 0 --warmup 0 --lr-schedule constant)
  "$T" "${V[@]}" --batch-size 8 >"$TMP/v1" 2>&1 && "$T" run -n 2 -- tandem "${V[@]}" --batch-size 2 --accum 2 >"$TMP/v2" 2>&1 ||
    { tail -2 "$TMP/v1" "$TMP/v2"; return 1; }
  local a b
  a=$(grep -o "val loss: [0-9.]* nats per byte  next-byte accuracy: [0-9.]*" "$TMP/v1")
  b=$(grep -o "val loss: [0-9.]* nats per byte  next-byte accuracy: [0-9.]*" "$TMP/v2")
  [[ -n $a && $a == "$b" ]] || { echo "  1 process: $a"; echo "  2 ranks x 2 micro-batches: $b"; return 1; }
}
check "gpt: the validation is the same samples on 1 process x 8 and 2 ranks x 2 micro-batches of 2" val_same_samples
fp16_skips() { # each rank's backward seeded with the loss scale over the data ranks: the same steps overflow as in one process
  local F=(train --model gpt --layers 2 --heads 2 --width 48 --block 16 --vocab 257 --threads 1 --val-batches 1 --seed 5 --steps 12
           --optimizer sgd --momentum 0.9 --lr 0.1 --dropout 0.2 --clip 0.5 --precision fp16 --loss-scale-init 3e6 --loss-scale-window 2)
  "$T" "${F[@]}" --batch-size 8 --metrics "$TMP/fp1.m" >/dev/null 2>&1 &&
    "$T" run -n 2 -- tandem "${F[@]}" --batch-size 4 --metrics "$TMP/fp2.m" >/dev/null 2>&1 || return 1
  local a b
  a=$(grep -o '"skipped":[01]' "$TMP/fp1.m" | cut -d: -f2 | tr -d '\n')
  b=$(grep -o '"skipped":[01]' "$TMP/fp2.m" | cut -d: -f2 | tr -d '\n')
  [[ ${#a} == 12 && $a == *1* && $a == "$b" ]] || { echo "  skipped steps: 1 process $a, 2 ranks $b"; return 1; }
}
check "fp16: 2 ranks skip the steps one process skips (the loss scale seeded over the data ranks)" fp16_skips
duplicate_rank() { # a third process given RANK=1 too: refused at once, naming the rank and the first one's address
  local port p0 p1 rc
  port=$(free_port)
  for r in 0 1; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=3 TANDEM_TRANSPORT=tcp TANDEM_TIMEOUT=6 RANK=$r \
      "$T" train --data synthetic --steps 2 --threads 1 >"$TMP/dup.$r" 2>&1 &
    RANK_PIDS="$RANK_PIDS $!"
    [[ $r == 0 ]] && p0=$! || p1=$!
    sleep 0.5 # rank 1 joins before its double
  done
  local t0=$SECONDS
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=3 TANDEM_TRANSPORT=tcp TANDEM_TIMEOUT=6 RANK=1 \
    timeout 30 "$T" train --data synthetic --steps 2 --threads 1 >"$TMP/dup.x" 2>&1
  rc=$?
  local took=$((SECONDS - t0))
  kill -9 $p0 $p1 2>/dev/null; wait $p0 $p1 2>/dev/null # (they would wait for rank 2 until their timeout)
  [[ $rc == 1 ]] && (( took <= 3 )) &&
    grep -q "rank 1: another process has joined as rank 1 already (it listens at 127.0.0.1:[0-9]*): two processes given RANK=1" "$TMP/dup.x" ||
    { echo "  exit $rc after $took s"; tail -2 "$TMP/dup.x"; return 1; }
}
check "a second process given the same RANK is refused at once, naming the rank" duplicate_rank
compressed() {
  "$T" run -n 2 -- tandem "${A[@]}" --batch-size 48 --compress bf16 --save-weights "$TMP/bf16.st" >/dev/null 2>&1 &&
    ! "$T" weights-diff "$TMP/one.st" "$TMP/bf16.st" --rtol 1e-5 --quiet >/dev/null && same "$TMP/one.st" "$TMP/bf16.st" 2e-2
}
check "bf16 gradients on the wire: close to, not equal to, f32" compressed
synthetic() {
  "$T" run -n 2 -- tandem train --data synthetic --steps 150 --threads 1 >"$TMP/syn.out" 2>&1 &&
    awk '/test accuracy: / { exit !($4 > 0.5) }' <(sed 's/^\[rank 0\] //' "$TMP/syn.out")
}
check "--data synthetic learns on 2 ranks (accuracy > 0.5; chance 0.1)" synthetic
G=(train --model gpt --layers 2 --heads 2 --width 64 --block 32 --steps 8 --threads 1 --optimizer sgd --lr 0.1
   --momentum 0.9 --schedule constant --warmup 0 --dropout 0.1 --val-every 0 --val-batches 2)
gpt_equal() {
  "$T" "${G[@]}" --batch-size 12 --save-weights "$TMP/g1.st" --checkpoint-dir "$TMP/gck" >/dev/null 2>&1 &&
    "$T" run -n 3 -- tandem "${G[@]}" --batch-size 4 --bucket-mb 0.02 --save-weights "$TMP/g3.st" >/dev/null 2>&1 &&
    same "$TMP/g1.st" "$TMP/g3.st" 1e-5 &&
    "$T" "${G[@]}" --batch-size 6 --accum 2 --save-weights "$TMP/ga.st" >/dev/null 2>&1 && same "$TMP/g1.st" "$TMP/ga.st" 1e-5 &&
    head -c 400 "$TMP/g1.st" | grep -aq '"n_layer":"2","n_head":"2","n_embd":"64","block_size":"32","vocab_size":"256"'
}
check "gpt on tiny Shakespeare: 3 ranks x 4 (20 KiB buckets) and accumulation 6 x 2 == 1 x 12 (dropout on); config in the weights" gpt_equal
max_time() {
  local t0=$SECONDS
  "$T" run -n 2 -- tandem train --model gpt --layers 1 --heads 2 --width 32 --block 32 --steps 100000 --max-time 2 \
    --val-batches 2 --threads 1 --save-weights "$TMP/mt.st" >"$TMP/mt.out" 2>&1 || { tail -3 "$TMP/mt.out"; return 1; }
  (( SECONDS - t0 < 30 )) && grep -q "val loss: " "$TMP/mt.out" && [[ -s "$TMP/mt.st" ]]
}
check "--max-time ends a 2-rank gpt run cleanly: final validation and weights" max_time
generate() {
  local a b g1 g2
  a=$("$T" generate --weights "$TMP/g1.st" --prompt "ROMEO:" --tokens 30 --seed 5) &&
    b=$("$T" generate --checkpoint "$TMP/gck" --prompt "ROMEO:" --tokens 30 --seed 5) &&
    g1=$("$T" generate --weights "$TMP/g1.st" --prompt "ROMEO:" --tokens 30 --top-k 1 --seed 1) &&
    g2=$("$T" generate --weights "$TMP/g1.st" --prompt "ROMEO:" --tokens 30 --top-k 1 --seed 2) || return 1
  [[ "$a" == "$b" && "$g1" == "$g2" && "${a:0:6}" == "ROMEO:" && ${#a} -ge 36 ]] || { echo "  '$a' '$b' '$g1' '$g2'"; return 1; }
  "$T" generate --weights "$TMP/g1.st" --prompt "ROMEO:" --tokens 0 --logits-out "$TMP/lg.st" >/dev/null &&
    head -c 200 "$TMP/lg.st" | grep -aq '"logits":{"dtype":"F32","shape":\[6,256\]' &&
    "$T" generate --weights "$TMP/g1.st" --prompt "$(printf 'x%.0s' $(seq 1 40))" 2>&1 | grep -q "block size is 32" &&
    "$T" generate --weights "$TMP/g1.st" --layers 3 2>&1 | grep -q "n_layer = 2, the command line 3" &&
    "$T" generate --weights "$TMP/one.st" 2>&1 | grep -q "has no 'n_layer' in its metadata" &&
    "$T" generate --weights "$TMP/g1.st" --checkpoint "$TMP/gck" 2>&1 | grep -q "either --weights FILE or --checkpoint DIR" &&
    "$T" generate --checkpoint "$TMP/nothing" 2>&1 | grep -q "no checkpoint in $TMP/nothing"
}
check "tandem generate: same seed same text (weights file == its run's checkpoint), greedy independent of the seed, clear errors" generate
gpt_bad() {
  "$T" train --model gpt --heads 3 --steps 1 2>&1 | grep -q "3 heads do not divide the width 256" &&
    "$T" train --model gpt --seq-len 500 --steps 1 2>&1 | grep -q "seq-len 500; expected 1..block size 128" &&
    "$T" train --model gpt --vocab 100 --steps 1 2>&1 | grep -q "vocabulary 100 is smaller than the 256 byte tokens" &&
    "$T" train --model gpt --data fashion-mnist --steps 1 2>&1 | grep -q "the gpt model trains on tinyshakespeare"
}
check "gpt: heads not dividing the width, seq-len beyond the block, a small vocabulary, wrong data: clear errors" gpt_bad
finish
