#!/usr/bin/env bash
# Checkpoints that reshard, with real processes under tandem run: an MLP and a GPT saved by 4 ranks
# at ZeRO stage 3 resume at 1, 2 and 3 ranks at every stage 0-3 with the saved state bit for bit
# (tandem checkpoint consolidate of the state saved again after loading equals the original's), and
# train on exactly as the same state put in place by hand in data parallelism; tandem train
# resumed at another world size and stage from a 4-rank stage-3 checkpoint continues the sample
# stream (equal to the uninterrupted 4-rank run within the tolerance of another summation order),
# and at another global batch goes on; tandem checkpoint info and consolidate (the weights equal
# --save-weights', load with --init-weights and give tandem generate --checkpoint's text); a corrupt
# piece, a missing shard file and another checkpoint's shard file are each named and the previous
# checkpoint used; another model is refused; a rank killed with SIGKILL while writing its file, or
# rank 0 killed just before renaming the manifest, leaves the previous checkpoint the newest valid
# one, and the resumed run ends bit-identical to an uninterrupted one, leaving no debris.
# usage: test_reshard.sh path/to/tandem path/to/reshard_job path/to/libtdm_kill_at.so
set -u
T=${1:?usage: test_reshard.sh tandem reshard_job kill_at.so}
JOB=${2:?usage: test_reshard.sh tandem reshard_job kill_at.so}
KILL=${3:?usage: test_reshard.sh tandem reshard_job kill_at.so}
. "$(dirname "$0")/../harness.sh"

# run CMD..., expect exit code $1 and output containing each of the following -e TEXT
expect() {
  local code=$1; shift
  local want=()
  while [[ "$1" == -e ]]; do want+=("$2"); shift 2; done
  timeout 120 "$@" >"$TMP/out" 2>&1
  local rc=$?
  [[ $rc -eq $code ]] || { echo "  exit $rc, expected $code: $*"; tail -4 "$TMP/out"; return 1; }
  for w in "${want[@]}"; do grep -qF -- "$w" "$TMP/out" || { echo "  output lacks '$w':"; tail -4 "$TMP/out"; return 1; }; done
}

# consolidate CKPT_DIR OUT: its logical state (parameters and moments) as one file
consolidate() { "$T" checkpoint consolidate "$1" "$2" --optimizer 2>"$TMP/cons.err" || { cat "$TMP/cons.err"; return 1; }; }

library() { # the library calls alone (tdm_ckpt_save_engine, tdm_ckpt_resume_engine), any layout into any other
  local model=$1 m s
  timeout 120 "$T" run -n 4 -- "$JOB" save "$TMP/$model" "$model" >"$TMP/out" 2>&1 || { tail -3 "$TMP/out"; return 1; }
  consolidate "$TMP/$model" "$TMP/$model.st" || return 1
  for m in 1 2 3; do
    mkdir -p "$TMP/$model-$m"
    timeout 120 "$T" run -n $m -- "$JOB" resume "$TMP/$model" "$model" "$TMP/$model-$m" >"$TMP/out" 2>&1 ||
      { echo "  $m ranks:"; tail -3 "$TMP/out"; return 1; }
    consolidate "$TMP/$model-$m/ref-final" "$TMP/ref.st" || return 1
    for s in 0 1 2 3; do
      consolidate "$TMP/$model-$m/s$s-loaded" "$TMP/loaded.st" && consolidate "$TMP/$model-$m/s$s-final" "$TMP/final.st" || return 1
      cmp -s "$TMP/$model.st" "$TMP/loaded.st" || { echo "  $m ranks, stage $s: the state as loaded differs from the saved one"; return 1; }
      cmp -s "$TMP/ref.st" "$TMP/final.st" || { echo "  $m ranks, stage $s: trained on, it differs from the state put in place by hand"; return 1; }
    done
  done
}
check "MLP: saved at 4 ranks, stage 3; resumed at 1, 2, 3 ranks, stages 0-3: the state bit for bit; trained on as the same state in place" library mlp
check "GPT: the same" library gpt

GPT=(train --model gpt --layers 2 --heads 2 --width 32 --block 32 --threads 1 --optimizer sgd --momentum 0.9 --lr 0.1
     --schedule constant --warmup 0 --val-batches 1 --seed 3) # a schedule that does not depend on --steps
run4() { timeout 120 "$T" run -n 4 -- tandem "${GPT[@]}" --zero 3 --batch-size 2 "$@"; }
prepare() {
  run4 --steps 4 --checkpoint-every 2 --checkpoint-dir "$TMP/c4" --save-weights "$TMP/w4.st" >"$TMP/out" 2>&1 &&
    run4 --steps 8 --save-weights "$TMP/full.st" >"$TMP/out" 2>&1 &&
    run4 --steps 6 --save-weights "$TMP/full6.st" >"$TMP/out" 2>&1 || { tail -3 "$TMP/out"; return 1; }
}
check "tandem train: 4 ranks at stage 3 with checkpoints at steps 2 and 4; the same run uninterrupted to steps 6 and 8" prepare

# fresh DIR: a copy of c4 (without its lock)
fresh() { rm -rf "$1" && cp -r "$TMP/c4" "$1" && rm -f "$1/.lock"; }
near() { "$T" weights-diff "$1" "$2" --rtol 1e-5 --quiet >"$TMP/diff" 2>&1 || { tail -3 "$TMP/diff"; return 1; }; }

other_layouts() { # the same global batch of 8 on 2 ranks (stage 0) and 1 (stage 2): no sample skipped or repeated
  fresh "$TMP/r2" && expect 0 -e "resumed from step 4 of $TMP/r2 (written by zero stage 3, 4 ranks, 5 units; resharded to data parallel, 2 ranks)" \
    "$T" run -n 2 -- tandem "${GPT[@]}" --batch-size 4 --steps 8 --checkpoint-dir "$TMP/r2" --resume --save-weights "$TMP/r2.st" &&
    near "$TMP/r2.st" "$TMP/full.st" || return 1
  fresh "$TMP/r1" && expect 0 -e "resharded to zero stage 2, 1 rank" \
    "$T" "${GPT[@]}" --zero 2 --batch-size 8 --steps 8 --checkpoint-dir "$TMP/r1" --resume --save-weights "$TMP/r1.st" &&
    near "$TMP/r1.st" "$TMP/full.st" || return 1
  # 3 ranks cannot keep the batch of 8: 3 x 3 with --resume-override batch goes on from sample 32
  fresh "$TMP/r3" && expect 0 -e "global batch (ranks x batch size x accumulation) 8 in the checkpoint, 9 in this run (--resume-override)" \
    -e "resharded to zero stage 1, 3 ranks" \
    "$T" run -n 3 -- tandem "${GPT[@]}" --zero 1 --batch-size 3 --steps 6 --checkpoint-dir "$TMP/r3" --resume --resume-override batch &&
    "$T" checkpoint info "$TMP/r3" >"$TMP/info" && grep -q "data position: epoch 0, 50 samples of it consumed" "$TMP/info" ||
    { echo "  the 3-rank run's position:"; grep position "$TMP/info"; return 1; }
}
check "resumed at 2 ranks (stage 0) and 1 (stage 2) with the same global batch: the uninterrupted run's weights (1e-5); at 3 ranks with another batch: from sample 32 on" other_layouts

tools() {
  expect 0 -e "step 4, optimizer sgd with 4 steps, seed 3" -e "layout: written by 4 ranks: zero stage 3, 4 ranks, 5 units" \
    -e "data position: epoch 0, 32 samples of it consumed" -e "files: 4," -e "ckpt-000000000004.shards/rank-3.safetensors" \
    -e "tensors: 56 (28 parameters, 28 optimizer state)" -e "model.transformer.wte.weight" -e "every piece verified" \
    "$T" checkpoint info "$TMP/c4" --verify || return 1
  "$T" checkpoint consolidate "$TMP/c4" "$TMP/cons.st" 2>/dev/null && "$T" weights-diff "$TMP/cons.st" "$TMP/w4.st" --quiet >/dev/null ||
    { echo "  consolidated weights differ from --save-weights at step 4"; return 1; }
  consolidate "$TMP/c4" "$TMP/cons-opt.st" &&
    expect 0 -e "1 steps" "$T" "${GPT[@]}" --steps 1 --init-weights "$TMP/cons-opt.st" || return 1
  local a b
  a=$("$T" generate --weights "$TMP/cons.st" --prompt "ROMEO:" --tokens 24 --seed 9) &&
    b=$("$T" generate --checkpoint "$TMP/c4" --prompt "ROMEO:" --tokens 24 --seed 9) && [[ -n $a && "$a" == "$b" ]] ||
    { echo "  generate: '$a' vs '$b'"; return 1; }
  expect 2 -e "unknown command 'frob'" "$T" checkpoint frob && expect 1 -e "no checkpoint in $TMP" "$T" checkpoint info "$TMP"
}
check "tandem checkpoint info and consolidate: the step, layout and tensors; the weights of --save-weights; --init-weights and generate take them" tools

fallback() { # each a named reason in "skipped", then the checkpoint of step 2, and the run ends as it should
  local why=$1 dir=$TMP/f-$2
  fresh "$dir" || return 1
  local s4=$dir/ckpt-000000000004.shards
  case $2 in
    corrupt) printf '\x5a' | dd of="$s4/rank-2.safetensors" bs=1 seek=$(( $(stat -c %s "$s4/rank-2.safetensors") - 9 )) conv=notrunc 2>/dev/null ;;
    missing) rm "$s4/rank-3.safetensors" ;;
    swapped) cp "$dir/ckpt-000000000002.shards/rank-1.safetensors" "$s4/rank-1.safetensors" ;;
  esac
  expect 0 -e "skipped in $dir: " -e "$why" -e "resumed from step 2 of $dir" \
    "$T" run -n 2 -- tandem "${GPT[@]}" --batch-size 4 --steps 8 --checkpoint-dir "$dir" --resume --save-weights "$dir.st" &&
    near "$dir.st" "$TMP/full.st"
}
check "a corrupt piece: named, the previous checkpoint used" fallback "rank-2.safetensors: piece " corrupt
check "a missing shard file: named, the previous checkpoint used" fallback "rank-3.safetensors is missing (the manifest lists 4 files)" missing
check "another checkpoint's shard file: named, the previous checkpoint used" fallback "is not the one the manifest" swapped
check "another model: refused naming both" expect 1 -e "model gpt in the checkpoint, mlp in this run" \
  "$T" train --steps 6 --threads 1 --checkpoint-dir "$TMP/c4" --resume

killed() { # $1: TDM_KILL_RENAME or TDM_KILL_WRITE, $2 its text, $3 the rank killed
  local dir=$TMP/k$3
  rm -rf "$dir"
  env LD_PRELOAD="$KILL" "$1=$2" TDM_KILL_RANK=$3 ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" timeout 120 "$T" run -n 4 -- tandem "${GPT[@]}" --zero 3 --batch-size 2 \
    --steps 6 --checkpoint-every 2 --checkpoint-dir "$dir" >"$TMP/out" 2>&1
  [[ $? -ne 0 ]] && grep -q "killed by signal 9\|signal 9" "$TMP/out" || { echo "  the kill did not happen:"; tail -3 "$TMP/out"; return 1; }
  [[ -f $dir/ckpt-000000000002.safetensors && ! -e $dir/ckpt-000000000004.safetensors ]] || { echo "  left:"; ls -A "$dir"; return 1; }
  ls -A "$dir" "$dir"/ckpt-000000000004.shards >"$TMP/left" 2>&1
  grep -q "tmp-" "$TMP/left" || { echo "  no half-written file was left to ignore:"; cat "$TMP/left"; return 1; }
  expect 0 -e "resumed from step 2 of $dir" "$T" run -n 4 -- tandem "${GPT[@]}" --zero 3 --batch-size 2 --steps 6 \
    --checkpoint-every 2 --checkpoint-dir "$dir" --resume --save-weights "$dir.st" &&
    cmp -s "$dir.st" "$TMP/full6.st" || { echo "  not the uninterrupted run's weights"; return 1; }
  # what the killed save left is gone: no temporaries, the shards of the checkpoints kept only
  [[ -z $(find "$dir" -name '*tmp-*') && $(ls "$dir" | grep -c '^ckpt-') -eq 4 ]] || { echo "  debris:"; find "$dir"; return 1; }
}
check "SIGKILL of rank 2 while writing its file at step 4: step 2 resumed, bit-identical, no debris" killed TDM_KILL_WRITE "ckpt-000000000004.shards/.rank-2" 2
check "SIGKILL of rank 0 just before renaming the manifest of step 4: the same" killed TDM_KILL_RENAME "ckpt-000000000004.safetensors" 0
finish
