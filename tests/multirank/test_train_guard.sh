#!/usr/bin/env bash
# tandem train never ends "successfully" with a wrong result: a run that diverges (SGD at lr 1000)
# stops at the step where the loss, the gradient norm, the test loss or a parameter stops being
# finite, on 1 and on 2 ranks (both at the same step, no hang), unless --allow-nonfinite (then
# the metrics write null, valid JSON); the gradient norm is in the metrics; the GPT's tokens per
# step come from the library (the sequence length of --config, not a guess); output paths that
# cannot be written fail before the first step, and a write that fails later fails the run.
# usage: test_train_guard.sh path/to/tandem
set -u
T=${1:?usage: test_train_guard.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"
. "$(dirname "$0")/ranks.sh"
trap 'kill -9 $RANK_PIDS 2>/dev/null; wait $RANK_PIDS 2>/dev/null; rm -rf "$TMP"' EXIT
D=(train --optimizer sgd --lr 1000 --threads 1)

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

# 4 steps: every training loss is finite, but the last update leaves the model producing NaN
check "1 rank, diverged by the last step: exit 1 naming the step, not a NaN test loss and exit 0" \
  expect 1 -e "step 3: the test loss after it is" -e "training diverged; lower --lr (now 1000), or pass --allow-nonfinite" "$T" "${D[@]}" --steps 4
check "1 rank, 50 steps: stops at the first non-finite gradient norm" \
  expect 1 -e "step 4: the gradient norm is" "$T" "${D[@]}" --steps 50

two_ranks() { # started by hand, no launcher to stop the other: both must fail alike (exit 1, same step), at once
  local t0=$SECONDS e0 e1
  by_hand "$TMP/r" "${D[@]}" --steps "$1"
  local rc=$?
  e0=$(grep -o "step [0-9]*: [a-z ]*is" "$TMP/r.0"); e1=$(grep -o "step [0-9]*: [a-z ]*is" "$TMP/r.1")
  [[ $rc -eq 1 && -n "$e0" && "$e0" == "$e1" ]] && grep -q "$2" "$TMP/r.0" && grep -q "tandem train: invalid argument" "$TMP/r.1" &&
    (( SECONDS - t0 < 60 )) || { echo "  exit $rc:"; tail -n 1 "$TMP/r.0" "$TMP/r.1"; return 1; }
}
check "2 ranks, diverged by the last step: both exit 1 naming the same step" two_ranks 5 "step 4: the test loss after it is"
check "2 ranks, 50 steps: both stop at the same step on the gradient norm (after averaging)" two_ranks 50 \
  "the gradient norm is .* (averaged over 2 ranks"

allowed() {
  expect 0 -e "test loss: " "$T" "${D[@]}" --steps 8 --allow-nonfinite --metrics "$TMP/nan.m" &&
    grep -q '"loss":null' "$TMP/nan.m" && grep -q '"grad_norm":null' "$TMP/nan.m" && ! grep -qi 'nan\|inf' "$TMP/nan.m" ||
    { echo "  metrics:"; cut -c1-100 "$TMP/nan.m"; return 1; }
}
check "--allow-nonfinite goes on; the metrics write null for NaN (valid JSON)" allowed

grad_norm() { # recorded every step; clipping to half of it halves the first update's effect, same norm seen
  "$T" train --steps 3 --threads 1 --optimizer sgd --lr 0.1 --metrics "$TMP/g.m" >/dev/null 2>&1 &&
    [[ $(grep -c '"grad_norm":[0-9.e+-]*,' "$TMP/g.m") -eq 3 ]] || { echo "  no grad_norm in every step record"; return 1; }
  local g0; g0=$(grep -o '"grad_norm":[0-9.e+-]*' "$TMP/g.m" | head -1 | cut -d: -f2)
  "$T" train --steps 3 --threads 1 --optimizer sgd --lr 0.1 --clip "$(awk "BEGIN{print $g0 / 2}")" --metrics "$TMP/gc.m" \
    >/dev/null 2>&1 || return 1
  [[ "$(grep -o '"grad_norm":[0-9.e+-]*' "$TMP/gc.m" | head -1)" == "\"grad_norm\":$g0" ]] || { echo "  norm before clipping differs"; return 1; }
}
check "the gradient norm is in every step's metrics (measured before clipping)" grad_norm

tokens() { # gpt2-124M's block is 1024: without --seq-len a step is batch x 1024 tokens
  expect 0 -e "(2 steps of 2048 tokens" "$T" train --model gpt --config gpt2-124M --layers 1 --heads 2 --width 32 --vocab 256 \
    --batch-size 2 --steps 2 --val-batches 1 --threads 1 &&
  expect 0 -e "(2 steps of 192 tokens" "$T" train --model gpt --layers 1 --heads 2 --width 32 --seq-len 32 \
    --batch-size 2 --accum 3 --steps 2 --val-batches 1 --threads 1
}
check "gpt: tokens per step from the library (--config's block, --seq-len, accumulation)" tokens

outputs() { # each fails before the first step: a run of a million steps would otherwise not end
  : >"$TMP/plain"
  expect 1 -e "--save-weights: cannot create files in $TMP/nodir: No such file or directory" \
    "$T" train --steps 1000000 --threads 1 --save-weights "$TMP/nodir/w.safetensors" &&
  expect 1 -e "--save-weights $TMP is a directory" "$T" train --steps 1000000 --threads 1 --save-weights "$TMP" &&
  expect 1 -e "cannot write metrics to $TMP/plain/m.jsonl: Not a directory" \
    "$T" train --steps 1000000 --threads 1 --metrics "$TMP/plain/m.jsonl" &&
  [[ -z "$(ls -A "$TMP" | grep -v '^plain$\|^out$\|^r\.[01]$\|^nan.m$\|^g.m$\|^gc.m$')" ]] || { echo "  left behind:"; ls -A "$TMP"; return 1; }
}
check "unwritable --save-weights and --metrics fail before the first step, leaving nothing behind" outputs
check "a metrics write that fails later (disk full) fails the run" \
  expect 1 -e "writing metrics to /dev/full failed" "$T" train --steps 3 --threads 1 --metrics /dev/full
finish
