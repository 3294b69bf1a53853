#!/usr/bin/env bash
# The tandem command as a user meets it: help, errors with exit codes, metrics and weights files.
# usage: test_cli.sh path/to/tandem
set -u
TANDEM=${1:?usage: test_cli.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"

# run CMD, expect exit code $1 and stderr containing $2
expect_fail() {
  local code=$1 text=$2; shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [[ $rc -ne $code ]]; then echo "  exit $rc, expected $code: $*"; cat "$TMP/err"; return 1; fi
  grep -qF -- "$text" "$TMP/err" || { echo "  stderr lacks '$text':"; cat "$TMP/err"; return 1; }
}

help_lists_every_option() {
  "$TANDEM" train --help >"$TMP/help" || return 1
  for o in model data data-dir epochs steps batch-size lr optimizer dropout seed threads init-weights save-weights metrics; do
    grep -q -- "--$o" "$TMP/help" || { echo "  --help lacks --$o"; return 1; }
  done
  grep -q "default: 64" "$TMP/help" && grep -q "default: 0.3" "$TMP/help" && grep -q "default: adam" "$TMP/help"
}
check "help lists every option with its default" help_lists_every_option
check "unknown option" expect_fail 2 "unknown option '--bogus'" "$TANDEM" train --bogus
check "invalid integer" expect_fail 2 "--batch-size: 'ten' is not an integer" "$TANDEM" train --batch-size ten
check "out of range" expect_fail 2 "--dropout: 1.5 is out of range" "$TANDEM" train --dropout 1.5
check "bad choice" expect_fail 2 "'rmsprop' is not one of sgd|adam|adamw" "$TANDEM" train --optimizer rmsprop
check "missing value" expect_fail 2 "--lr needs a value" "$TANDEM" train --lr
check "epochs and steps" expect_fail 2 "not both" "$TANDEM" train --epochs 2 --steps 5
check "missing data set names the package" expect_fail 1 "dataset-fashion-mnist" "$TANDEM" train --data-dir "$TMP/none"
printf 'not a safetensors file' >"$TMP/bad.safetensors"
check "corrupt weights file" expect_fail 1 "bad.safetensors" "$TANDEM" train --steps 1 --init-weights "$TMP/bad.safetensors"
check "unknown command" expect_fail 2 "unknown command 'trian'" "$TANDEM" trian

metrics_and_weights() {
  "$TANDEM" train --steps 30 --threads 1 --metrics "$TMP/m.jsonl" --save-weights "$TMP/w.safetensors" \
    >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; return 1; }
  grep -q "test accuracy" "$TMP/out" || return 1
  [[ $(grep -c '"step_time_ms"' "$TMP/m.jsonl") -eq 30 ]] || { echo "  expected 30 step records"; return 1; }
  for k in step loss samples_per_sec step_time_ms time_forward_ms time_backward_ms time_optimizer_ms; do
    head -1 "$TMP/m.jsonl" | grep -q "\"$k\":" || { echo "  step record lacks $k"; return 1; }
  done
  tail -1 "$TMP/m.jsonl" | grep -q '"test_accuracy":0\.[0-9]' || { echo "  no evaluation record"; return 1; }
  tail -1 "$TMP/m.jsonl" | grep -q '"test_loss":' || return 1
  # the weights file starts with a little-endian header length and a JSON header naming the layers
  head -c 400 "$TMP/w.safetensors" | grep -aq '"layers.0.weight":{"dtype":"F32","shape":\[512,784\]' ||
    { echo "  weights header unexpected"; return 1; }
  # and loads back as initial weights
  "$TANDEM" train --steps 1 --lr 0 --threads 1 --init-weights "$TMP/w.safetensors" >/dev/null 2>&1
}
check "metrics JSON lines and safetensors weights" metrics_and_weights

finish
