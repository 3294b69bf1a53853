#!/usr/bin/env bash
# Checkpoints and restarts: a run stopped after step s and resumed ends bit-identical to an
# uninterrupted one (1 process, and 2 ranks restarted by tandem run --max-restarts); a corrupt
# newest checkpoint (data or header) is refused and the previous good one used; entries that are
# not valid checkpoints (directory, FIFO, dangling link, stray names) are reported and skipped,
# never block, never deleted; a directory with no valid one is an error; ranks that find
# different checkpoint directories are refused before step 1; a second job on a locked directory fails
# naming the first's pid; changed settings are refused unless allowed. (Resuming at another world
# size or stage: test_reshard.sh.)
# usage: test_ckpt.sh path/to/tandem
set -u
T=${1:?usage: test_ckpt.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"
. "$(dirname "$0")/ranks.sh"
BG=
trap 'kill -9 $BG $RANK_PIDS 2>/dev/null; wait $BG $RANK_PIDS 2>/dev/null; rm -rf "$TMP"' EXIT
A=(train --steps 12 --threads 1 --seed 5 --batch-size 32)

one_process() {
  "$T" "${A[@]}" --save-weights "$TMP/full1.st" >/dev/null 2>&1 || return 1
  TANDEM_FAULT=0:7 "$T" "${A[@]}" --checkpoint-dir "$TMP/c1" --checkpoint-every 5 >/dev/null 2>&1
  [[ $? -eq 3 ]] || { echo "  the fault did not fire"; return 1; }
  "$T" "${A[@]}" --checkpoint-dir "$TMP/c1" --resume --save-weights "$TMP/res1.st" >"$TMP/out" 2>&1 &&
    grep -q "resumed from step 5" "$TMP/out" && cmp -s "$TMP/full1.st" "$TMP/res1.st"
}
check "stopped after step 7, resumed from step 5: bit-identical to an uninterrupted run" one_process
at_the_end() { # resumed where the run ended: no step, and the result evaluated again, not zeros
  "$T" "${A[@]}" --checkpoint-dir "$TMP/c0" >"$TMP/first" 2>&1 &&
    "$T" "${A[@]}" --checkpoint-dir "$TMP/c0" --resume >"$TMP/again" 2>&1 || { tail -3 "$TMP/again"; return 1; }
  local a b
  a=$(grep -o "test accuracy: [0-9.]*  test loss: [0-9.]*" "$TMP/first")
  b=$(grep -o "test accuracy: [0-9.]*  test loss: [0-9.]*" "$TMP/again")
  [[ -n $a && $a == "$b" ]] && grep -q "nothing left to train: evaluating it" "$TMP/again" &&
    grep -q "throughput: none (no step ran)" "$TMP/again" || { echo "  first: $a"; echo "  again: $b"; tail -3 "$TMP/again"; return 1; }
}
check "resumed at its last step: nothing trained, the same test result reported (not zeros)" at_the_end
torn_record() { # a metrics record cut off by a kill: the resumed run writes that step again, its header on a line of its own
  { TANDEM_FAULT=0:5 "$T" "${A[@]}" --steps 8 --checkpoint-dir "$TMP/ct" --checkpoint-every 3 --metrics "$TMP/t.m" >/dev/null 2>&1; [[ $? -eq 3 ]]; } ||
    { echo "  the fault did not fire"; return 1; }
  # steps 0-2 are recorded and checkpointed; step 3's record, cut off where the kill caught its write
  printf '{"step":3,"epoch":0,"loss":2.1,"grad_norm":0.9,"samples_per_sec":100,"step_time_ms":1.5' >>"$TMP/t.m"
  "$T" "${A[@]}" --steps 8 --checkpoint-dir "$TMP/ct" --resume --metrics "$TMP/t.m" >"$TMP/t.out" 2>&1 || { tail -2 "$TMP/t.out"; return 1; }
  python3 - "$TMP/t.m" <<'PYEOF2'
import json, sys
broken, steps, headers = 0, [], 0
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        broken += 1
        continue
    headers += "tandem_run" in r
    if "step_time_ms" in r:
        steps.append(r["step"])
assert broken == 1 and headers == 2, "%d broken lines, %d headers" % (broken, headers)
assert sorted(steps) == list(range(8)), steps
PYEOF2
}
check "a metrics record cut off by a kill: written again on resume, the next header on its own line" torn_record

restarts() {
  "$T" run -n 2 -- tandem "${A[@]}" --save-weights "$TMP/full2.st" >/dev/null 2>&1 || return 1
  TANDEM_FAULT=1:8 "$T" run -n 2 --max-restarts 2 -- tandem "${A[@]}" --checkpoint-dir "$TMP/c2" --checkpoint-every 3 \
    --resume --save-weights "$TMP/res2.st" >"$TMP/out" 2>&1 || { tail -5 "$TMP/out"; return 1; }
  grep -q "restarting all 2 ranks (restart 1 of 2)" "$TMP/out" && grep -q "resumed from step 6" "$TMP/out" &&
    cmp -s "$TMP/full2.st" "$TMP/res2.st"
}
check "tandem run --max-restarts: rank 1 dies, the group restarts and resumes, bit-identical" restarts

corrupt() {
  rm -rf "$TMP/c3"
  "$T" "${A[@]}" --checkpoint-dir "$TMP/c3" --checkpoint-every 4 --steps 8 >/dev/null 2>&1 || return 1
  local newest; newest=$(ls "$TMP/c3"/ckpt-*.safetensors | sort | tail -1)
  printf '\x55' | dd of="$newest" bs=1 seek=$(( $(stat -c %s "$newest") - 100 )) conv=notrunc 2>/dev/null
  "$T" "${A[@]}" --checkpoint-dir "$TMP/c3" --resume --save-weights "$TMP/res3.st" >"$TMP/out" 2>&1 || { cat "$TMP/out"; return 1; }
  grep -q "checksum mismatch" "$TMP/out" && grep -q "resumed from step 4" "$TMP/out" && cmp -s "$TMP/full1.st" "$TMP/res3.st"
}
check "a corrupt newest checkpoint: refused with its reason, the previous one used, same result" corrupt

check "--resume needs --checkpoint-dir" bash -c "\"$T\" train --resume 2>&1 | grep -q 'needs --checkpoint-dir'"

# run CMD..., expect exit code $1 and output containing each of the following -e TEXT
expect() {
  local code=$1; shift
  local want=()
  while [[ "$1" == -e ]]; do want+=("$2"); shift 2; done
  if [[ $(type -t "$1") == function ]]; then "$@"; else timeout 120 "$@"; fi >"$TMP/out" 2>&1
  local rc=$?
  [[ $rc -eq $code ]] || { echo "  exit $rc, expected $code: $*"; tail -4 "$TMP/out"; return 1; }
  for w in "${want[@]}"; do grep -qF -- "$w" "$TMP/out" || { echo "  output lacks '$w':"; tail -4 "$TMP/out"; return 1; }; done
}

header_corrupt() { # the step in the newest checkpoint's header changes from 8 to 9: the checksum covers it
  rm -rf "$TMP/c5"
  "$T" "${A[@]}" --checkpoint-dir "$TMP/c5" --checkpoint-every 4 --steps 8 >/dev/null 2>&1 || return 1
  perl -0777 -pi -e 's/"tandem.step":"8"/"tandem.step":"9"/' "$TMP/c5/ckpt-000000000008.safetensors" &&
    grep -aq '"tandem.step":"9"' "$TMP/c5/ckpt-000000000008.safetensors" || { echo "  could not edit the header"; return 1; }
  expect 0 -e "checksum mismatch" -e "resumed from step 4" "$T" "${A[@]}" --checkpoint-dir "$TMP/c5" --resume \
    --save-weights "$TMP/res5.st" && cmp -s "$TMP/full1.st" "$TMP/res5.st"
}
check "a corrupt step in the newest checkpoint's header: refused by the checksum, the previous one used, same result" header_corrupt

bad_entries() { # newer entries that are not checkpoints: reported, skipped (a FIFO does not block), kept
  rm -rf "$TMP/c6"
  "$T" "${A[@]}" --checkpoint-dir "$TMP/c6" --checkpoint-every 4 --steps 8 >/dev/null 2>&1 || return 1
  mkdir "$TMP/c6/ckpt-000000000040.safetensors" && mkfifo "$TMP/c6/ckpt-000000000044.safetensors" &&
    ln -s /nonexistent "$TMP/c6/ckpt-000000000048.safetensors" &&
    cp "$TMP/c6/ckpt-000000000008.safetensors" "$TMP/c6/ckpt-1.safetensors" &&
    cp "$TMP/c6/ckpt-000000000008.safetensors" "$TMP/c6/ckpt-0000000x.safetensors" &&
    cp "$TMP/c6/ckpt-000000000008.safetensors" "$TMP/c6/ckpt-000000000008.safetensors.bak" || return 1
  expect 0 -e "resumed from step 8" -e "ckpt-000000000040.safetensors: a directory, not a checkpoint file" \
    -e "ckpt-000000000044.safetensors: a FIFO" -e "ckpt-000000000048.safetensors: a symbolic link" \
    -e "ckpt-1.safetensors: not a checkpoint's name" -e "ckpt-0000000x.safetensors: not a checkpoint's name" \
    "$T" "${A[@]}" --checkpoint-dir "$TMP/c6" --checkpoint-every 4 --resume --save-weights "$TMP/res6.st" || return 1
  cmp -s "$TMP/full1.st" "$TMP/res6.st" || { echo "  not the uninterrupted result"; return 1; }
  # rotation kept the two newest valid ones (8, 12), deleted 4, and touched nothing it did not verify
  [[ -f "$TMP/c6/ckpt-000000000012.safetensors" && -f "$TMP/c6/ckpt-000000000008.safetensors" &&
     ! -e "$TMP/c6/ckpt-000000000004.safetensors" && -d "$TMP/c6/ckpt-000000000040.safetensors" &&
     -p "$TMP/c6/ckpt-000000000044.safetensors" && -L "$TMP/c6/ckpt-000000000048.safetensors" &&
     -f "$TMP/c6/ckpt-1.safetensors" && -f "$TMP/c6/ckpt-0000000x.safetensors" && -f "$TMP/c6/ckpt-000000000008.safetensors.bak" ]] ||
    { echo "  rotation deleted the wrong entries:"; ls "$TMP/c6"; return 1; }
}
check "a directory, a FIFO, a dangling link and stray names as newer checkpoints: reported, skipped, never deleted" bad_entries

none_valid() { # entries named like checkpoints, none valid: an error that changes nothing, not a start from 0
  rm -rf "$TMP/c7" && mkdir "$TMP/c7" && ln -s /nonexistent "$TMP/c7/ckpt-000000000008.safetensors" &&
    head -c 100 "$TMP/c6/ckpt-000000000012.safetensors" >"$TMP/c7/ckpt-000000000004.safetensors" || return 1
  expect 1 -e "no valid checkpoint in $TMP/c7 (2 entries named like one" -e "Nothing was changed" \
    "$T" "${A[@]}" --checkpoint-dir "$TMP/c7" --resume || return 1
  [[ -L "$TMP/c7/ckpt-000000000008.safetensors" && $(stat -c %s "$TMP/c7/ckpt-000000000004.safetensors") -eq 100 ]]
}
check "--resume on a directory holding no valid checkpoint: an error, nothing changed" none_valid

afresh_refused() { # starting from step 0 would overwrite and rotate away another run's checkpoints
  expect 1 -e "already holds 2 checkpoint entries" -e "pass --resume" "$T" "${A[@]}" --checkpoint-dir "$TMP/c1" &&
    [[ $(ls "$TMP/c1" | grep -c '^ckpt-.*\.safetensors$') -eq 2 ]]
}
check "without --resume, a directory holding checkpoints is refused" afresh_refused

# 2 ranks, each with its own directory ($RANK picks it): every rank writes its own part of each
# checkpoint, so they must share one; refused before step 1, naming both
G2=(train --steps 8 --threads 1 --seed 5 --batch-size 16 --checkpoint-every 4)
per_rank() { timeout 120 "$T" run -n 2 -- sh -c "exec \"$T\" ${G2[*]} --checkpoint-dir $TMP/pr\$RANK --resume $*"; }
ranks_disagree() {
  rm -rf "$TMP"/pr*
  "$T" run -n 2 -- tandem "${G2[@]}" --steps 4 --checkpoint-dir "$TMP/pr0" >/dev/null 2>&1 || return 1
  expect 1 -e "checkpoint directory $TMP/pr1 (rank 1) is not the one rank 0 writes into ($TMP/pr0)" \
    -e "give every rank the same --checkpoint-dir, on a file system all of them share" per_rank || return 1
  ! grep -q "^epoch" "$TMP/out" && [[ -z $(ls -A "$TMP/pr0" | grep tandem-shared) ]] || { echo "  trained, or left its probe"; return 1; }
  rm -rf "$TMP/pr1" && cp -r "$TMP/pr0" "$TMP/pr1" && rm -f "$TMP"/pr1/.lock && expect 1 -e "is not the one rank 0 writes into" per_rank
}
check "2 ranks with different checkpoint directories (even holding the same files): refused before step 1, naming both" ranks_disagree

locked() { # a second job on the same directory fails at start, naming the first's pid
  rm -rf "$TMP/lk"
  "$T" train --steps 1000000 --threads 1 --checkpoint-dir "$TMP/lk" --checkpoint-every 1000000 >"$TMP/lk.out" 2>&1 & BG=$!
  for _ in $(seq 1 300); do grep -q "^epoch" "$TMP/lk.out" && break; sleep 0.1; done
  expect 1 -e "checkpoint directory $TMP/lk is in use by another job (pid $BG holds $TMP/lk/.lock)" \
    "$T" "${A[@]}" --checkpoint-dir "$TMP/lk" --resume &&
  # 2 ranks started by hand (no launcher to stop rank 1): rank 0 cannot lock, rank 1 says so at once
  by_hand "$TMP/h" "${A[@]}" --checkpoint-dir "$TMP/lk" --resume
  [[ $? -eq 1 ]] && grep -q "in use by another job (pid $BG" "$TMP/h.0" &&
    grep -q "rank 0 could not start: checkpoint directory $TMP/lk is in use by another job (pid $BG" "$TMP/h.1" ||
    { echo "  2 ranks:"; tail -n 1 "$TMP/h.0" "$TMP/h.1"; false; }
  local rc=$?
  kill -9 $BG; wait $BG 2>/dev/null; BG=
  return $rc
}
check "two jobs on one checkpoint directory: the second fails at start naming the first's pid (on every rank)" locked

unwritable_dir() { # found at start, not when the first checkpoint is due (never, here)
  : >"$TMP/plainfile"
  expect 1 -e "checkpoint directory $TMP/plainfile/ck: cannot create: Not a directory" \
    "$T" train --steps 1000000 --threads 1 --checkpoint-dir "$TMP/plainfile/ck"
}
check "an unusable --checkpoint-dir fails before the first step" unwritable_dir
removed_dir() { # the directory removed under a running job: it stops at its next checkpoint rather than recreate it unlocked
  mkdir -p "$TMP/rm"
  timeout 60 "$T" train --model mlp --data synthetic --threads 1 --steps 1000000 --checkpoint-dir "$TMP/rm/ck" --checkpoint-every 50 \
    >"$TMP/rm.out" 2>&1 &
  BG=$!
  local i=0
  while ! ls "$TMP/rm/ck" 2>/dev/null | grep -q '^ckpt-.*\.safetensors$' && ((i++ < 300)); do sleep 0.1; done
  rm -rf "$TMP/rm/ck"
  wait $BG
  local rc=$?
  BG=
  # (removed in the middle of a save, the save itself fails first, naming a path inside it)
  [[ $rc -eq 1 ]] && grep -q "$TMP/rm/ck.*\(was removed or replaced while this job ran\|No such file\)" "$TMP/rm.out" ||
    { echo "  exit $rc"; tail -2 "$TMP/rm.out"; return 1; }
}
check "the checkpoint directory removed during a run: the job stops at its next checkpoint, naming it" removed_dir

settings() { # from c1 (mlp, adam, seed 5, 1 rank x 32, fashion-mnist, step 12); every difference is named
  expect 1 -e "was written by a run with other settings: optimizer adam in the checkpoint, sgd in this run" \
    -e "; global batch (ranks x batch size x accumulation) 32 in the checkpoint, 64 in this run" \
    -e "; data set fashion-mnist in the checkpoint, synthetic in this run" -e "; seed 5 in the checkpoint, 6 in this run" \
    -e "The model and the optimizer cannot change on resume" \
    "$T" "${A[@]}" --steps 14 --checkpoint-dir "$TMP/c1" --resume --seed 6 --batch-size 64 --optimizer sgd --data synthetic &&
  expect 1 -e "seed 5 in the checkpoint, 6 in this run. Resume with the checkpoint's settings, or allow the change with --resume-override" \
    "$T" "${A[@]}" --steps 14 --checkpoint-dir "$TMP/c1" --resume --seed 6 &&
  expect 1 -e "model mlp in the checkpoint, cnn in this run" \
    "$T" "${A[@]}" --steps 14 --checkpoint-dir "$TMP/c1" --resume --model cnn &&
  expect 1 -e "--resume-override: 'model'; expected a comma-separated list of seed, batch, data" \
    "$T" "${A[@]}" --checkpoint-dir "$TMP/c1" --resume --resume-override seed,model &&
  [[ $(ls "$TMP/c1" | grep -c '^ckpt-.*\.safetensors$') -eq 2 ]] || return 1 # nothing written by the refused runs
  # allowed: the learning rate and the steps; the same global batch split otherwise; an overridden seed
  cp -r "$TMP/c1" "$TMP/c8" && expect 0 -e "resumed from step 12" \
    "$T" "${A[@]}" --steps 13 --checkpoint-dir "$TMP/c8" --resume --lr 0.002 --batch-size 16 --accum 2 &&
  expect 0 -e "resuming with changed settings: seed 5 in the checkpoint, 6 in this run (--resume-override)" \
    "$T" "${A[@]}" --steps 14 --checkpoint-dir "$TMP/c8" --resume --seed 6 --resume-override seed
}
check "a changed seed, batch, model, optimizer or data set is refused naming both values; lr, steps, an override allowed" settings
last_batch_rule() { # 60,000 samples in batches of 14 leave 8: --last-batch auto is partial on one process, pad with accumulation
  local B=(train --steps 3 --threads 1 --seed 5 --checkpoint-dir "$TMP/c9")
  "$T" "${B[@]}" --batch-size 14 >/dev/null 2>&1 || return 1
  expect 1 -e "last batch (--last-batch; auto is partial on one process, pad on several ranks or with accumulation) partial in the checkpoint, pad in this run" \
    "$T" "${B[@]}" --steps 4 --resume --batch-size 7 --accum 2 &&
  expect 0 -e "resumed from step 3" "$T" "${B[@]}" --steps 4 --resume --batch-size 14 --last-batch partial &&
  expect 0 -e "resuming with changed settings: last batch" "$T" "${B[@]}" --steps 5 --resume --batch-size 7 --accum 2 --resume-override batch
}
check "the last batch's rule is kept on resume: auto that resolves otherwise (one process to accumulation) is refused" last_batch_rule
last_batch_adopted() { # 112 windows in global batches of 12: two epochs of 10 steps, each ending on a batch of 4 real windows
  head -c 2000 data/tinyshakespeare.txt >"$TMP/small.txt"
  local G=(train --model gpt --layers 2 --heads 2 --width 32 --block 16 --epochs 2 --seed 5 --optimizer sgd --momentum 0.9 --lr 0.05
           --data-path "$TMP/small.txt" --val-batches 1 --threads 1)
  "$T" "${G[@]}" --batch-size 4 --accum 3 --save-weights "$TMP/lb-pad.st" >/dev/null 2>&1 || return 1
  TANDEM_FAULT=0:4 "$T" "${G[@]}" --batch-size 4 --accum 3 --checkpoint-dir "$TMP/c10" --checkpoint-every 3 >/dev/null 2>&1
  # auto on one process would be partial: it takes the checkpoint's pad, and ends where the uninterrupted run did
  expect 0 -e "last batch (--last-batch; auto is partial on one process, pad on several ranks or with accumulation): pad, as the checkpoint's" \
    "$T" "${G[@]}" --batch-size 12 --checkpoint-dir "$TMP/c10" --resume --save-weights "$TMP/lb-res.st" &&
  "$T" weights-diff "$TMP/lb-pad.st" "$TMP/lb-res.st" --rtol 1e-5 --quiet >/dev/null || { echo "  the resumed run differs"; return 1; }
  # the control: partial throughout is another run (the difference the adoption removes)
  "$T" "${G[@]}" --batch-size 12 --save-weights "$TMP/lb-part.st" >/dev/null 2>&1 &&
    ! "$T" weights-diff "$TMP/lb-pad.st" "$TMP/lb-part.st" --rtol 1e-5 --quiet >/dev/null
}
check "--last-batch auto on resume takes the checkpoint's rule where the layout allows it: the uninterrupted run's weights (1e-5)" last_batch_adopted
data_replaced() { # another text of the same size: the sample count alone did not tell
  head -c 20000 data/tinyshakespeare.txt >"$TMP/d.txt"
  local G=(train --model gpt --layers 2 --heads 2 --width 32 --block 16 --batch-size 4 --threads 1 --data-path "$TMP/d.txt"
           --val-batches 1 --checkpoint-dir "$TMP/c11")
  "$T" "${G[@]}" --steps 4 >/dev/null 2>&1 || return 1
  head -c 20000 data/tinyshakespeare.txt | tr a-z A-Z >"$TMP/d.txt"
  expect 1 -e "training data (a checksum of 64 samples)" -e "in the checkpoint" "$T" "${G[@]}" --steps 6 --resume &&
    expect 0 -e "resuming with changed settings: training data" "$T" "${G[@]}" --steps 6 --resume --resume-override data
}
check "a training set replaced by another of the same size: refused on resume (the data override accepts it)" data_replaced
finish
