#!/usr/bin/env bash
# --device cuda from the command line. Whatever the machine: what the CUDA backend lacks is refused
# by name (exit 2) before any device is touched. Then, by what this build and machine have:
#   built without CUDA (arg 2 OFF): train and bench say "built without CUDA" (exit 1);
#   built, no GPU (nvidia-smi lists none): they say "no CUDA device found" (exit 1);
#   built, with a GPU: a tiny GPT trains 20 steps (loss printed, falling) and the bench prints tokens/s.
# usage: test_cuda_cli.sh path/to/tandem ON|OFF
set -u
TANDEM=${1:?usage: test_cuda_cli.sh path/to/tandem ON|OFF}
BUILT=${2:-OFF}
. "$(dirname "$0")/../harness.sh"

expect_fail() {
  local code=$1 text=$2; shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [[ $rc -ne $code ]]; then echo "  exit $rc, expected $code: $*"; cat "$TMP/err"; return 1; fi
  grep -qF -- "$text" "$TMP/err" || { echo "  stderr lacks '$text':"; cat "$TMP/err"; return 1; }
}
TINY=(--layers 1 --heads 2 --width 32 --block 16 --seq-len 16 --batch-size 2)

check "mlp on cuda refused" expect_fail 2 "a model other than gpt is not on the CUDA backend" "$TANDEM" train --model mlp --device cuda
check "gpt's default dropout refused" expect_fail 2 "give --dropout 0" "$TANDEM" train --model gpt --device cuda "${TINY[@]}"
check "fp16 on cuda refused" expect_fail 2 "--precision fp16 is not on the CUDA backend" "$TANDEM" train --model gpt --device cuda --dropout 0 --precision fp16
check "--tf32 with bf16 refused" expect_fail 2 "--tf32 is for fp32 products" "$TANDEM" train --model gpt --device cuda --dropout 0 --precision bf16 --tf32
check "zero on cuda refused" expect_fail 2 "--zero, --tp, --pp or --ps-servers" "$TANDEM" train --model gpt --device cuda --dropout 0 --zero 1
check "bench llama on cuda refused" expect_fail 2 "llama is not on the CUDA backend" "$TANDEM" bench llama --device cuda
check "bench fp16 on cuda refused" expect_fail 2 "--precision fp16 is not on the CUDA backend" "$TANDEM" bench gpt --device cuda --precision fp16
check "--tf32 without cuda refused" expect_fail 2 "--tf32 applies to --device cuda" "$TANDEM" train --tf32

# tandem plan --device cuda: arithmetic, on any machine and build. GPT-2 small (124,439,808
# parameters): parameters and gradients 4 bytes each, AdamW 8, bf16's weight copy 2; bf16 keeps
# less activation memory than fp32 (no T x T probabilities, 16-bit product inputs).
plan_gpu() {
  local P=124439808 f b
  f=$("$TANDEM" plan --device cuda --model gpt --config gpt2-124M --batch-size 16 --seq-len 1024 --dropout 0 --json) || return 1
  b=$("$TANDEM" plan --device cuda --model gpt --config gpt2-124M --batch-size 16 --seq-len 1024 --dropout 0 --precision bf16 --json) || return 1
  echo "  fp32: $f"; echo "  bf16: $b"
  python3 - "$f" "$b" "$P" <<'PY'
import json, sys
f, b, P = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
for d, w16 in ((f, 0), (b, 2 * P)):
    assert (d["parameters"], d["gradients"], d["optimizer"], d["weights_bf16"]) == (4 * P, 4 * P, 8 * P, w16), d
    assert d["total"] == d["parameters"] + d["gradients"] + d["optimizer"] + d["weights_bf16"] + d["activations"], d
# fp32 keeps the probabilities, 12 layers x 16 x 12 heads x 1024^2 floats, which bf16's fused kernel never stores
assert f["activations"] > b["activations"] + 12 * 16 * 12 * 1024 * 1024 * 4, (f, b)
PY
}
check "plan --device cuda: the closed form of parameters, gradients, AdamW and bf16 weights; bf16 holds less" plan_gpu
check "plan --device cuda: a head size the flash kernel lacks, named" expect_fail 1 "takes head sizes 16, 32, 64 or 128" \
  "$TANDEM" plan --device cuda --model gpt --precision bf16 --dropout 0 --layers 1 --heads 2 --width 48 --block 16
check "plan --device cuda --model mlp refused" expect_fail 2 "the CUDA backend trains --model gpt" "$TANDEM" plan --device cuda --model mlp
check "plan --device cuda over --memory-limit: by how much" expect_fail 1 "over --memory-limit" \
  "$TANDEM" plan --device cuda --model gpt --config gpt2-124M --batch-size 16 --seq-len 1024 --dropout 0 --memory-limit 4G

if [[ $BUILT != ON ]]; then
  check "train: built without CUDA" expect_fail 1 "built without CUDA" "$TANDEM" train --model gpt --device cuda --dropout 0 --steps 1 "${TINY[@]}"
  check "bench: built without CUDA" expect_fail 1 "built without CUDA" "$TANDEM" bench gpt --device cuda --steps 1 "${TINY[@]}"
elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  check "train: no device" expect_fail 1 "no CUDA device found (cudaGetDeviceCount" "$TANDEM" train --model gpt --device cuda --dropout 0 --steps 1 "${TINY[@]}"
  check "bench: no device" expect_fail 1 "no CUDA device found (cudaGetDeviceCount" "$TANDEM" bench gpt --device cuda --steps 1 "${TINY[@]}"
else
  trains() {
    "$TANDEM" train --model gpt --device cuda --dropout 0 --steps 20 --lr 3e-3 --warmup 0 --val-batches 2 "${TINY[@]}" "$@" \
      --save-weights "$TMP/w.safetensors" >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; return 1; }
    cat "$TMP/out"
    grep -q "val loss" "$TMP/out" && [[ -s $TMP/w.safetensors ]] || return 1
    # loss falls: step 20's below step 1's (bytes of Shakespeare from ln 256 = 5.55)
    local first last
    first=$(grep -m1 '^step 1/' "$TMP/err" | awk '{print $4}')
    last=$(grep '^step 20/' "$TMP/err" | awk '{print $4}')
    echo "  loss $first -> $last"
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'
  }
  check "train --device cuda: a tiny GPT learns" trains
  check "train --device cuda --precision bf16: a tiny GPT learns" trains --precision bf16
  bench() {
    "$TANDEM" bench gpt --device cuda --steps 3 --warmup 1 "${TINY[@]}" "$@" >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; return 1; }
    cat "$TMP/out"
    grep -q "tokens/s" "$TMP/out"
  }
  check "bench gpt --device cuda" bench
  check "bench gpt --device cuda --precision bf16" bench --precision bf16
  check "bf16 with head size 24 refused" expect_fail 1 "takes head sizes 16, 32, 64 or 128" "$TANDEM" train --model gpt --device cuda --dropout 0 --precision bf16 --steps 1 --layers 1 --heads 2 --width 48 --block 16 --seq-len 16 --batch-size 2
fi
finish
