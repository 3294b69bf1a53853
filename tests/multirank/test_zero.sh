#!/usr/bin/env bash
# ZeRO across real processes (tandem train --zero): stages 1-3 give stage 0's weights bit for bit
# at the same world size (2 and 3 ranks, shm and tcp, and mpirun; with accumulation, dropout,
# clipping and weight decay; the GPT with other gather units and no prefetch); N ranks equal one
# process with the N-times batch (SGD, 1e-5); checkpoints resume bit-exact at every stage, each
# rank writing its own pieces, and at any other stage (resharded); the weights a stage-3 run streams out load back anywhere; bad input
# (stages, options, a memory limit, data too small for the global
# batch) is a clear error; tandem plan follows the closed forms.
# usage: test_zero.sh path/to/tandem   (run from the repository root: the GPT reads data/)
set -u
T=${1:?usage: test_zero.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"

# every job and command is bounded: a hang fails its case (tandem run stops its ranks on SIGTERM)
job() { # job RANKS TRANSPORT ARGS...: tandem ARGS on RANKS processes under tandem run
  local n=$1 tr=$2; shift 2
  TANDEM_TRANSPORT=$tr timeout 120 "$T" run -n "$n" -- tandem "$@"
}
same() { # bit for bit; on a difference, how far apart
  cmp -s "$1" "$2" && return 0
  echo "  $2 is not $1 bit for bit:"; "$T" weights-diff "$1" "$2" --quiet 2>&1 | tail -2 | sed 's/^/    /'
  return 1
}
close() { # within a relative tolerance, and not by accident: the files exist
  [[ -s "$1" && -s "$2" ]] && "$T" weights-diff "$1" "$2" --rtol "$3" --quiet >"$TMP/diff" 2>&1 ||
    { echo "  $2 is not within $3 of $1:"; tail -2 "$TMP/diff" | sed 's/^/    /'; return 1; }
}
ran() { # ran OUT WHAT: the job before it succeeded, else show why
  local rc=$?
  [[ $rc -eq 0 ]] || { echo "  $2 failed (exit $rc):"; grep -v '^\[rank [0-9]*\]  \|^  |  ' "$1" | tail -4 | sed 's/^/    /'; }
  return $rc
}

# The GPT: AdamW, decay 0.1, clipping at 0.5 (every step's norm is above it, 1.2-1.9), dropout,
# accumulation; 6 steps of 2 x 2 sequences per rank. The MLP likewise on synthetic data.
G=(train --model gpt --layers 2 --heads 2 --width 32 --block 16 --seq-len 16 --steps 6 --threads 1 --val-batches 2
   --val-every 0 --batch-size 2 --accum 2 --lr 0.01 --weight-decay 0.1 --clip 0.5 --dropout 0.2 --seed 5)
M=(train --data synthetic --steps 4 --threads 1 --batch-size 16 --accum 2 --optimizer adamw --weight-decay 0.05
   --clip 0.5 --dropout 0.3 --seed 3)

stages() { # stages NAME RANKS TRANSPORTS ARGS...: every stage == stage 0 over shm, bit for bit
  local name=$1 n=$2 trs=$3 tr s; shift 3
  job "$n" shm "$@" --save-weights "$TMP/$name$n.st" >"$TMP/out" 2>&1; ran "$TMP/out" "stage 0 on $n ranks" || return 1
  for tr in $trs; do
    for s in 0 1 2 3; do
      [[ $tr == shm && $s == 0 ]] && continue
      job "$n" "$tr" "$@" --zero $s --save-weights "$TMP/$name$n-$tr$s.st" >"$TMP/out" 2>&1
      ran "$TMP/out" "--zero $s on $n ranks over $tr" || return 1
      # the run was what it says: the engine and the transport it names at the start
      grep -q "$([[ $s == 0 ]] && echo "data parallel, $n ranks" || echo "zero stage $s, $n ranks").*, transport $tr" "$TMP/out" ||
        { echo "  --zero $s over $tr: not the engine or transport asked for:"; grep "transport" "$TMP/out"; return 1; }
      same "$TMP/$name$n.st" "$TMP/$name$n-$tr$s.st" || return 1
    done
  done
}
check "gpt, 2 ranks: stages 1, 2, 3 == stage 0 bit for bit, over shm and tcp" stages g 2 "shm tcp" "${G[@]}"
check "gpt, 3 ranks: stages 1, 2, 3 == stage 0 bit for bit, over shm and tcp" stages g 3 "shm tcp" "${G[@]}"
units() { # stage 3 gathers whatever the unit and prefetch: 2 blocks per unit, no prefetch, both
  local n tr a
  for n in 2 3; do
    for a in "--zero-unit 2" "--zero-prefetch off" "--zero-unit 3 --zero-prefetch off"; do
      tr=$([[ $n == 2 ]] && echo tcp || echo shm)
      job $n $tr "${G[@]}" --zero 3 $a --save-weights "$TMP/u.st" >"$TMP/out" 2>&1; ran "$TMP/out" "--zero 3 $a" || return 1
      same "$TMP/g$n.st" "$TMP/u.st" || { echo "  (--zero 3 $a on $n ranks over $tr)"; return 1; }
    done
  done
  grep -q "zero stage 3, 3 ranks, 2 units" "$TMP/out" # 3 modules a unit: (ln_f, h.1, h.0) (wpe, wte)
}
check "gpt, stage 3 with 2 and 3 blocks per unit, and without prefetch (2 ranks tcp, 3 shm): the same bits" units
check "mlp, 2 ranks over shm: stages 1, 2, 3 == stage 0 bit for bit" stages m 2 "shm" "${M[@]}"
check "mlp, 3 ranks over tcp: stages 0-3 == stage 0 over shm bit for bit" stages m 3 "tcp" "${M[@]}"

# Across world sizes: N ranks x b == 1 process x N*b (SGD with momentum, clipping, dropout)
X=(train --model gpt --layers 2 --heads 2 --width 32 --block 16 --seq-len 16 --steps 6 --threads 1 --val-batches 2
   --val-every 0 --optimizer sgd --lr 0.05 --momentum 0.9 --schedule constant --warmup 0 --dropout 0.2 --clip 0.5 --seed 11)
worlds() {
  timeout 120 "$T" "${X[@]}" --batch-size 12 --save-weights "$TMP/x1.st" >"$TMP/out" 2>&1; ran "$TMP/out" "1 process x 12" || return 1
  timeout 120 "$T" "${X[@]}" --batch-size 12 --zero 3 --save-weights "$TMP/x1z.st" >"$TMP/out" 2>&1; ran "$TMP/out" "--zero 3, 1 process" &&
    same "$TMP/x1.st" "$TMP/x1z.st" || return 1
  job 3 tcp "${X[@]}" --batch-size 4 --zero 3 --save-weights "$TMP/x3.st" >"$TMP/out" 2>&1; ran "$TMP/out" "3 ranks x 4" &&
    close "$TMP/x1.st" "$TMP/x3.st" 1e-5 || return 1
  job 2 shm "${X[@]}" --batch-size 3 --accum 2 --zero 2 --save-weights "$TMP/x2.st" >"$TMP/out" 2>&1; ran "$TMP/out" "2 ranks x 3 x 2" &&
    close "$TMP/x1.st" "$TMP/x2.st" 1e-5 || return 1
  # and the comparison can fail: another dropout is another result
  job 3 shm "${X[@]}" --batch-size 4 --zero 3 --dropout 0.3 --save-weights "$TMP/x3d.st" >/dev/null 2>&1 &&
    ! "$T" weights-diff "$TMP/x1.st" "$TMP/x3d.st" --rtol 1e-5 --quiet >/dev/null
}
check "1 process x 12 == --zero 3 on 1 process (bits) == 3 ranks x 4 at stage 3 (tcp) == 2 ranks x 3 x accum 2 at stage 2 (1e-5)" worlds

under_mpirun() { # Open MPI starts the ranks, the MPI transport carries stage 3: stage 0's bits.
  # Open MPI's plugins leak at exit (unloaded, so no suppression can name them): no leak check
  # here in the sanitizer build, the rest of ASan and UBSan stays on (a release build ignores it)
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 TANDEM_TRANSPORT=mpi \
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 120 mpirun -np 2 -x TANDEM_TRANSPORT -x ASAN_OPTIONS \
    "$T" "${G[@]}" --zero 3 --save-weights "$TMP/mpi.st" >"$TMP/out" 2>&1 </dev/null
  ran "$TMP/out" "mpirun -np 2" || return 1
  if grep -q "no MPI transport" "$TMP/out"; then echo "  built without MPI"; return 1; fi
  grep -q "zero stage 3, 2 ranks, .*transport mpi" "$TMP/out" && same "$TMP/g2.st" "$TMP/mpi.st"
}
if command -v mpirun >/dev/null; then
  check "under Open MPI's mpirun, the MPI transport, stage 3 == stage 0 over shm, bit for bit" under_mpirun
else
  echo "skip under mpirun (not installed: scripts/setup.sh installs openmpi-bin)"
fi

# Checkpoints: rank 1 dies after step 3, the run resumes from its step-2 checkpoint and ends as
# the uninterrupted run did (stage 0's weights, $TMP/g2.st)
tensors_in() { grep -ao '"[a-z_.0-9]*":{"dtype"' "$1" | sed 's/":{"dtype"//; s/^"//' | sort | tr '\n' ' '; }
resume_at() {
  local s=$1 d=$TMP/ck$1 sh
  TANDEM_FAULT=1:3 job 2 shm "${G[@]}" --zero "$s" --checkpoint-dir "$d" --checkpoint-every 2 >"$TMP/out" 2>&1
  [[ $? -ne 0 ]] && grep -q "TANDEM_FAULT: rank 1 stops after step 3" "$TMP/out" || { echo "  the fault did not fire"; return 1; }
  # a manifest and a file per rank, each holding its own pieces of the parameters and of the
  # optimizer state (no rank gathered the model or the moments to write them)
  [[ -f $d/ckpt-000000000002.safetensors ]] || { echo "  no step-2 checkpoint:"; ls -R "$d"; return 1; }
  [[ "$(tensors_in "$d/ckpt-000000000002.safetensors")" == "tandem.manifest " ]] ||
    { echo "  the manifest holds: $(tensors_in "$d/ckpt-000000000002.safetensors")"; return 1; }
  for r in 0 1; do
    sh=$d/ckpt-000000000002.shards/rank-$r.safetensors
    [[ -f $sh ]] || { echo "  no file of rank $r:"; ls -R "$d"; return 1; }
    grep -aq "\"tandem.rank\":\"$r\"" "$sh" || { echo "  rank $r's file does not say it is"; return 1; }
    grep -aq '"model\.[a-z_.0-9]*\[[0-9:,]*\]":{"dtype"' "$sh" && grep -aq '"optim\.exp_avg\.[a-z_.0-9]*\[[0-9:,]*\]":{"dtype"' "$sh" ||
      { echo "  rank $r's file lacks pieces of the parameters or moments"; return 1; }
  done
  "$T" checkpoint info "$d" | grep -q "written by 2 ranks: zero stage $s, 2 ranks" ||
    { echo "  checkpoint info does not name the layout:"; "$T" checkpoint info "$d" | head -4; return 1; }
  job 2 shm "${G[@]}" --zero "$s" --checkpoint-dir "$d" --checkpoint-every 2 --resume --save-weights "$TMP/res$s.st" >"$TMP/out" 2>&1
  ran "$TMP/out" "the resumed run" && grep -q "resumed from step 2 of $d" "$TMP/out" || return 1
  same "$TMP/g2.st" "$TMP/res$s.st"
}
for s in 1 2 3; do
  check "--zero $s, 2 ranks: killed after step 3, resumed from the step-2 checkpoint (a manifest + each rank's pieces): bit-identical" resume_at $s
done
restarted() { # rank 0 (who writes the main file) dies; tandem run restarts the job over tcp, it resumes
  TANDEM_FAULT=0:4 TANDEM_TRANSPORT=tcp timeout 120 "$T" run -n 2 --max-restarts 1 -- tandem "${G[@]}" --zero 3 \
    --checkpoint-dir "$TMP/ckr" --checkpoint-every 2 --resume --save-weights "$TMP/resr.st" >"$TMP/out" 2>&1
  ran "$TMP/out" "the restarted job" && grep -q "restarting all 2 ranks (restart 1 of 1)" "$TMP/out" &&
    grep -q "resumed from step 4" "$TMP/out" && same "$TMP/g2.st" "$TMP/resr.st"
}
check "--zero 3 over tcp, rank 0 dies after step 4, tandem run --max-restarts resumes: bit-identical" restarted

# expect CODE [-e TEXT]... CMD...: exit CODE and output holding every TEXT
expect() {
  local code=$1; shift
  local want=() w rc
  while [[ "$1" == -e ]]; do want+=("$2"); shift 2; done
  if [[ $(type -t "$1") == function ]]; then "$@"; else timeout 120 "$@"; fi >"$TMP/out" 2>&1
  rc=$?
  [[ $rc -eq $code ]] || { echo "  exit $rc, expected $code: $*"; tail -4 "$TMP/out"; return 1; }
  for w in "${want[@]}"; do grep -qF -- "$w" "$TMP/out" || { echo "  output lacks '$w':"; tail -4 "$TMP/out"; return 1; }; done
}

# A resumed run must end as the uninterrupted one did ($TMP/g2.st): the same 6 steps (the learning
# rate's schedule spans them), from the step-4 checkpoint.
bad_shard() { # the newest checkpoint (step 6) of the stage-3 run: a rank's file corrupt, then missing:
              # every rank falls back to the checkpoint before it, naming the file, and ends as uninterrupted
  local d=$TMP/ck3 f=$TMP/ck3/ckpt-000000000006.shards/rank-1.safetensors
  [[ -f $f ]] || { echo "  no step-6 file of rank 1"; ls -R "$d"; return 1; }
  printf '\x55' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 100 )) conv=notrunc 2>/dev/null
  expect 0 -e "$f: piece" -e "fails its checksum" -e "the file is corrupt" -e "resumed from step 4 of $d" \
    job 2 shm "${G[@]}" --zero 3 --checkpoint-dir "$d" --checkpoint-every 2 --resume --save-weights "$TMP/bs1.st" &&
    same "$TMP/g2.st" "$TMP/bs1.st" || return 1
  [[ -f $f ]] || { echo "  step 6 was not written again"; ls -R "$d"; return 1; }
  rm "$f"
  expect 0 -e "$f" -e "resumed from step 4 of $d" \
    job 2 shm "${G[@]}" --zero 3 --checkpoint-dir "$d" --checkpoint-every 2 --resume --save-weights "$TMP/bs2.st" &&
    same "$TMP/g2.st" "$TMP/bs2.st"
}
check "a corrupt, then a missing rank's file of the newest checkpoint: the one before it resumed, naming the file; bit-identical" bad_shard

layout() { [[ $1 == 0 ]] && echo "data parallel" || echo "zero stage $1"; }
other_stage() { # a checkpoint of one stage resumes at another (resharded): the same bits as never stopping
  local from to n=0
  timeout 120 "$T" run -n 2 -- tandem "${G[@]}" --checkpoint-dir "$TMP/ck0" --checkpoint-every 2 >/dev/null 2>&1 ||
    { echo "  the stage-0 run failed"; return 1; }
  for p in "r 3 1" "r 3 0" "1 1 2" "0 0 3"; do
    set -- $p; n=$((n + 1))
    rm -rf "$TMP/os$n" && cp -a "$TMP/ck$1" "$TMP/os$n" && rm -r "$TMP/os$n"/ckpt-000000000006.* || return 1
    expect 0 -e "resumed from step 4 of $TMP/os$n (written by $(layout $2), 2 ranks" -e "resharded to $(layout $3), 2 ranks" \
      job 2 shm "${G[@]}" --zero $3 --checkpoint-dir "$TMP/os$n" --resume --save-weights "$TMP/os$n.st" &&
      same "$TMP/g2.st" "$TMP/os$n.st" || { echo "  (stage $2 resumed at stage $3)"; return 1; }
  done
}
check "a checkpoint of another ZeRO stage (3 as 1 and 0, 1 as 2, 0 as 3): resharded, the same bits as never stopping" other_stage

weights_back() { # the weights a stage-3 run streamed out, unit by unit, load anywhere
  local w=$TMP/g2-shm3.st
  # learning rate 0: what was loaded is what is saved, at stage 0 (one file read whole) and at
  # stage 3 (each rank reads its pieces; saved by streaming the units again)
  job 2 shm "${G[@]}" --steps 1 --lr 0 --init-weights "$w" --save-weights "$TMP/back0.st" >"$TMP/out" 2>&1 &&
    same "$w" "$TMP/back0.st" &&
    job 3 tcp "${G[@]}" --steps 1 --lr 0 --zero 3 --init-weights "$w" --save-weights "$TMP/back3.st" >"$TMP/out" 2>&1 &&
    same "$w" "$TMP/back3.st" || return 1
  # and training on from them: stage 0 and stage 3 agree, and moved away from the start
  job 2 shm "${G[@]}" --steps 3 --seed 8 --init-weights "$w" --save-weights "$TMP/on0.st" >"$TMP/out" 2>&1 &&
    job 2 tcp "${G[@]}" --steps 3 --seed 8 --zero 3 --init-weights "$w" --save-weights "$TMP/on3.st" >"$TMP/out" 2>&1 &&
    same "$TMP/on0.st" "$TMP/on3.st" && ! cmp -s "$w" "$TMP/on0.st"
}
check "a stage-3 run's weights: --init-weights at stage 0 and at stage 3 (lr 0) saves them back bit for bit; training on agrees" weights_back

never_whole() { # at stage 3 no rank holds the whole model, saving and checkpointing included:
                # the parameter memory rank 0 measured, less its shard, stays below the model
  local psi owned peak
  job 2 shm "${G[@]}" --layers 4 --zero 3 --checkpoint-dir "$TMP/ckw" --checkpoint-every 3 --save-weights "$TMP/w4.st" \
    --metrics "$TMP/w4.m" >"$TMP/out" 2>&1; ran "$TMP/out" "4 layers at stage 3" || return 1
  psi=$(grep -o '[0-9]* parameters, stage 3' "$TMP/out" | head -1 | cut -d' ' -f1)
  owned=$(grep -o 'this rank updates at most [0-9]*' "$TMP/out" | head -1 | awk '{print $NF}')
  peak=$(grep -o '"memory_peak":{"parameters":[0-9]*' "$TMP/w4.m" | grep -o '[0-9]*$')
  echo "  parameters: $psi; rank 0 owns at most $owned; its peak parameter bytes $peak (the model: $((4 * psi)))"
  [[ -n $psi && -n $owned && -n $peak ]] && (( peak > 4 * owned && peak - 4 * owned < 4 * psi ))
}
check "stage 3 (4 layers): rank 0's parameter memory, less its shard, never reaches the whole model (checkpoint and save included)" never_whole

# ---- bad input --------------------------------------------------------------------------------
options() {
  expect 2 -e "--zero: 4 is out of range; expected 0..3" "$T" train --zero 4 --steps 1 &&
    expect 2 -e "--zero: -1 is out of range; expected 0..3" "$T" train --zero -1 --steps 1 &&
    expect 2 -e "--zero: 'abc' is not an integer; expected 0..3" "$T" train --zero abc --steps 1 &&
    expect 2 -e "--zero: 4 is out of range; expected 0..3" "$T" plan --zero 4 --world 4 &&
    expect 2 -e "--zero-unit applies to --zero 3 only (given --zero 2)" "$T" train --zero 2 --zero-unit 2 &&
    expect 2 -e "--zero-prefetch applies to --zero 3 only (given --zero 0)" "$T" train --zero-prefetch off &&
    expect 2 -e "--zero-unit: 0 is out of range; expected 1.." "$T" train --zero 3 --zero-unit 0 &&
    expect 2 -e "--compress bf16 applies to --zero 0 only: ZeRO reduces gradients in f32" "$T" train --zero 2 --compress bf16 &&
    expect 2 -e "--compress fp16 applies to --zero 0 only" "$T" run -n 2 -- tandem train --zero 1 --compress fp16
}
check "unknown --zero values (4, -1, abc), --zero-unit/--zero-prefetch below stage 3, --compress with ZeRO: clear errors, exit 2" options

memory_limit() { # refused before step 1: how much it needs, how much more, the largest category
  local j msg
  # each rank checks the plan before anything collective; the first to fail stops the other, so
  # the message (not rank 0's table) is what is sure to be there
  expect 1 -e "more than --memory-limit 5.00 MiB; the largest part is " \
    job 2 shm "${G[@]}" --zero 3 --memory-limit 5M --metrics "$TMP/ml.m" --save-weights "$TMP/ml.st" --checkpoint-dir "$TMP/mlck" ||
    return 1
  ! grep -q "step 1/" "$TMP/out" && [[ ! -e $TMP/ml.m && ! -e $TMP/ml.st && ! -e $TMP/mlck ]] ||
    { echo "  it started:"; grep "step 1/" "$TMP/out"; ls "$TMP" | grep ml; return 1; }
  # the figures are the plan's (its bytes per category, in JSON): the total, the total less the
  # limit, and the largest category with its size (each as printed, to 0.01 of its unit)
  msg=$(grep -o 'the plan needs .*' "$TMP/out" | head -1)
  j=$("$T" plan "${G[@]:1}" --zero 3 --world 2 --json) || return 1
  awk -v j="$j" -v m="$msg" 'function b(v, u) { return v * (u == "KiB" ? 1024 : u == "MiB" ? 1048576 : u == "GiB" ? 1073741824 : 1) }
    function near(x, y) { return x - y < 0.006 * 1048576 && y - x < 0.006 * 1048576 }
    BEGIN { gsub(/[{}"]/, "", j); n = split(j, kv, ",")
      for (i = 1; i <= n; i++) { split(kv[i], p, ":"); v[p[1]] = p[2] }
      split("parameters gradients optimizer activations communication data workspace", cats, " ")
      for (i = 1; i <= 7; i++) if (big == "" || v[cats[i]] > v[big]) big = cats[i]
      # the plan needs X U per rank, Y U more than --memory-limit 5.00 MiB; the largest part is C (Z U): hint
      split(m, w, " "); gsub(/[():]/, "", w[20]); gsub(/[():]/, "", w[21])
      ok = near(b(w[4], w[5]), v["total"]) && near(b(w[8], w[9]), v["total"] - 5 * 1048576) && w[19] == big &&
           near(b(w[20], w[21]), v[big])
      if (!ok) print "  the message does not add up with the plan: " m "\n  " j
      exit !ok }' || return 1
  expect 1 -e "EXCEEDS the memory limit of 5.00 MiB" -e "$msg" "$T" plan "${G[@]:1}" --zero 3 --world 2 --memory-limit 5M &&
    expect 0 -e "fits the memory limit of 1.00 GiB" "$T" plan "${G[@]:1}" --zero 3 --world 2 --memory-limit 1G &&
    expect 2 -e "--memory-limit: '5x' is not a size in bytes" "$T" train --memory-limit 5x
}
check "a --memory-limit the plan exceeds: refused before step 1 (nothing written), saying by how much and the largest part" memory_limit

near() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b && a <= b * 1.01) }'; } # the largest shard: even shares moved to segment edges
json() { grep -o "\"$2\":[0-9]*" <<<"$1" | cut -d: -f2; }
plan_forms() { # GPT mini (4 layers, width 256, block 128, vocab 256), AdamW, 4 ranks; bytes per rank
  local C=256 L=4 N=4 psi unit j s p g o r=0
  psi=$(( 256 * C + 128 * C + L * (12 * C * C + 13 * C) + 2 * C )) unit=$(( 4 * (12 * C * C + 13 * C) ))
  for s in 0 1 2 3; do
    j=$("$T" plan --model gpt --world $N --zero $s --json $([[ $s == 2 ]] && echo --bucket-mb 1)) || return 1
    p=$(json "$j" parameters) g=$(json "$j" gradients) o=$(json "$j" optimizer)
    printf '  stage %d: parameters %d gradients %d optimizer %d = %.3f x 16 psi / N\n' $s "$p" "$g" "$o" \
      "$(awk -v t=$((p + g + o)) -v q=$psi 'BEGIN { print t / (4 * q) }')"
    [[ $(json "$j" params) == "$psi" ]] || { echo "  psi $(json "$j" params), expected $psi"; return 1; }
    case $s in
    0) (( p == 4 * psi && g == 4 * psi && o == 8 * psi )) ;;                        # 16 psi
    1) (( p == 4 * psi && g == 4 * psi )) && near "$o" $((8 * psi / N)) ;;           # 8 psi + 8 psi / N
    2) (( p == 4 * psi && g >= 4 * psi / N && g <= 4 * psi / N * 101 / 100 + 2 * 1048576 )) &&
         near "$o" $((8 * psi / N)) ;;                                              # 4 psi + 12 psi / N, 2 buckets in flight
    3) near "$o" $((8 * psi / N)) && (( p >= 4 * psi / N + unit && p <= 4 * psi / N * 101 / 100 + 3 * unit &&
         g >= 4 * psi / N && g <= 4 * psi / N * 101 / 100 + 3 * unit )) ;;        # 16 psi / N, 1-3 blocks gathered
    esac || { echo "  stage $s does not follow its closed form"; r=1; }
  done
  return $r
}
check "tandem plan --world 4, gpt mini: 16 psi, 8 psi + 8 psi/N, 4 psi + 12 psi/N (1 MiB buckets), 16 psi/N + 1-3 gathered blocks" plan_forms

small_data() { # 200 bytes of text: 11 training windows of 16 bytes and 1 for validation, on 3 ranks
  head -c 200 data/tinyshakespeare.txt >"$TMP/tiny.txt"
  local D=("${G[@]}" --data-path "$TMP/tiny.txt" --batch-size 4 --accum 1)
  # a global batch of 12 cannot be filled when the last batch is dropped: the sizes are named
  expect 1 -e "11 samples do not fill one global batch of 12 (3 ranks x accum 1 x batch 4)" \
    job 3 shm "${D[@]}" --zero 3 --last-batch drop || return 1
  # padded (the default on several ranks): the batch wraps around the data, each step is an epoch,
  # and the one validation window leaves two ranks idle in evaluation (they gather anyway: no hang)
  job 3 shm "${D[@]}" --save-weights "$TMP/tiny0.st" >"$TMP/out" 2>&1; ran "$TMP/out" "stage 0 on tiny data" || return 1
  job 3 shm "${D[@]}" --zero 3 --save-weights "$TMP/tiny3.st" >"$TMP/out" 2>&1; ran "$TMP/out" "stage 3 on tiny data" || return 1
  grep -q "(11 train / 1 test samples)" "$TMP/out" && grep -q "epoch 6 step 6/6" "$TMP/out" && grep -q "val loss: " "$TMP/out" &&
    same "$TMP/tiny0.st" "$TMP/tiny3.st"
}
check "data smaller than the global batch: dropped, a clear error naming the sizes; padded, stage 3 == stage 0 (1 validation window, 3 ranks)" small_data
finish
