#!/usr/bin/env bash
# Gradient compression under tandem run (tandem/compress.h): the MLP on Fashion-MNIST trains on 2
# ranks with topk:0.01 (shm) and powersgd:4 (tcp) to a stated test loss; each step's gradient
# exchange sends what the compressor says (top-k: 7k bytes a bucket, measured, about 57x fewer
# than f32) and error feedback telescopes; --compress-start sends the first steps whole; a spec
# that does not parse, and compression with ZeRO, --pp or --tp, exit 2 naming the value and what is expected; a
# compressed run killed and resumed from a checkpoint ends bit-identical (residuals saved).
# usage: test_compress.sh path/to/tandem
set -u
T=${1:?usage: test_compress.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"
DATA=/usr/share/datasets/fashion-mnist
A=(train --steps 60 --batch-size 32 --threads 1 --seed 3)
PARAMS=535818 # the MLP's parameters: f32 gradients are 4 x this many bytes a step
LOOP_BYTES=$((32 + 40 * 2)) # the training loop's per-step all-reduce on 2 ranks: the loss, and 5 step times a rank

# the last step's metrics line
last_step() { grep '"step":59,' "$1"; }
num() { grep -o "\"$2\":[0-9.e+-]*" <<<"$1" | head -1 | cut -d: -f2; }

# Bounds: from 2.3 at the start, the uncompressed run reaches a test loss of 0.69 here; measured
# (the runs are deterministic): topk:0.01 0.97, powersgd:4 0.74.
converges() { # spec transport max_test_loss min_ratio
  local spec=$1 tr=$2 bound=$3 ratio=$4 out line loss
  out=$(TANDEM_TRANSPORT=$tr timeout 300 "$T" run -n 2 -- tandem "${A[@]}" --compress "$spec" --metrics "$TMP/$spec.m" 2>&1) ||
    { echo "  $spec failed:"; tail -3 <<<"$out"; return 1; }
  loss=$(grep -o 'test loss: [0-9.]*' <<<"$out" | cut -d' ' -f3)
  line=$(last_step "$TMP/$spec.m")
  awk -v l="$loss" -v b="$bound" 'BEGIN { exit !(l < b) }' || { echo "  $spec: test loss $loss, expected < $bound"; return 1; }
  local bytes payload tel
  bytes=$(num "$line" grad_bytes) payload=$(num "$line" compress_payload_bytes) tel=$(num "$line" compress_telescope_err)
  # measured bytes == what the compressor put on the wire (2 ranks: an all-gather sends one part,
  # an all-reduce the whole), give or take the trainer's own all-reduce that may run beside it (the
  # loss, 32 bytes, and each rank's step times for the report, 40 bytes a rank: LOOP_BYTES), and the
  # ratio against f32 gradients (test_compress counts the compressor's bytes exactly)
  [[ -n "$bytes" && -n "$payload" ]] && (( bytes >= payload && bytes <= payload + LOOP_BYTES )) ||
    { echo "  $spec: $bytes bytes sent, payload $payload"; return 1; }
  # the ratio of the compressor's payload (the bytes above may hold the loss all-reduce's 32 too)
  awk -v n=$PARAMS -v b="$payload" -v r="$ratio" -v t="$tel" 'BEGIN { exit !(4 * n / b >= r && t < 1e-5) }' ||
    { echo "  $spec: $payload bytes (ratio $(awk -v n=$PARAMS -v b="$payload" 'BEGIN{print 4*n/b}')), telescoping error $tel"; return 1; }
  grep -q '"compress_rel_err":\[[0-9.e+-]*,' <<<"$line" || { echo "  no per-bucket relative error: $line"; return 1; }
  echo "  $spec: test loss $loss, $bytes bytes a step ($(awk -v n=$PARAMS -v b="$bytes" 'BEGIN{printf "%.1f", 4*n/b}')x fewer)"
}
check "topk:0.01 on 2 ranks (shm): test loss < 1.1 after 60 steps; 7k bytes a bucket measured (>= 50x fewer than f32); telescoping" \
  converges topk:0.01 shm 1.1 50
check "powersgd:4 on 2 ranks (tcp): test loss < 0.85 after 60 steps; >= 10x fewer bytes measured; telescoping" \
  converges powersgd:4 tcp 0.85 10

warm_start() { # steps 0..9 whole (f32, 4 bytes a parameter), compressed from step 10 on
  timeout 300 "$T" run -n 2 -- tandem train --steps 14 --batch-size 16 --threads 1 --compress powersgd:2 --compress-start 10 \
    --metrics "$TMP/ws.m" >/dev/null 2>&1 || return 1
  local s line
  for s in 0 9; do
    line=$(grep "\"step\":$s," "$TMP/ws.m")
    # the f32 all-reduce, and perhaps the trainer's own all-reduce running beside it
    (( $(num "$line" grad_bytes) >= 4 * PARAMS && $(num "$line" grad_bytes) <= 4 * PARAMS + LOOP_BYTES )) && ! grep -q compress_ratio <<<"$line" ||
      { echo "  step $s: $line"; return 1; }
  done
  line=$(grep '"step":10,' "$TMP/ws.m")
  (( $(num "$line" grad_bytes) < 4 * PARAMS / 10 )) && grep -q compress_ratio <<<"$line" || { echo "  step 10: $line"; return 1; }
}
check "--compress-start 10: steps 0-9 send f32 gradients, step 10 the factors" warm_start

resume_exact() { # spec: a run stopped after step 6 and resumed from its step-4 checkpoint ends as the uninterrupted one
  local spec=$1 d="$TMP/ck.$1" R=(train --steps 8 --batch-size 16 --threads 1 --seed 4 --compress "$1" --compress-start 2)
  timeout 300 "$T" run -n 2 -- tandem "${R[@]}" --save-weights "$TMP/full.$spec.st" >/dev/null 2>&1 || { echo "  the full run failed"; return 1; }
  TANDEM_FAULT=1:6 timeout 300 "$T" run -n 2 -- tandem "${R[@]}" --checkpoint-dir "$d" --checkpoint-every 4 >/dev/null 2>&1
  [[ -d "$d" ]] || { echo "  no checkpoint"; return 1; }
  timeout 300 "$T" run -n 2 -- tandem "${R[@]}" --checkpoint-dir "$d" --resume --save-weights "$TMP/res.$spec.st" >"$TMP/out" 2>&1 &&
    grep -q "resumed from step" "$TMP/out" && grep -q "resumed from step 4" "$TMP/out" ||
    { echo "  the resumed run:"; tail -3 "$TMP/out"; return 1; }
  cmp -s "$TMP/full.$spec.st" "$TMP/res.$spec.st" || { echo "  $spec: the resumed run's weights differ"; return 1; }
}
check "topk:0.05: killed after step 6, resumed from step 4 (2 ranks): bit-identical to the uninterrupted run (residuals in the checkpoint)" resume_exact topk:0.05
check "powersgd:2 likewise (residuals and the warm-start Q in the checkpoint)" resume_exact powersgd:2

expect() { # code -e text ... command
  local code=$1; shift
  local want=() w rc
  while [[ "$1" == -e ]]; do want+=("$2"); shift 2; done
  timeout 120 "$@" >"$TMP/out" 2>&1
  rc=$?
  [[ $rc -eq $code ]] || { echo "  exit $rc, expected $code: $*"; tail -3 "$TMP/out"; return 1; }
  for w in "${want[@]}"; do grep -qF -- "$w" "$TMP/out" || { echo "  output lacks '$w':"; tail -3 "$TMP/out"; return 1; }; done
}
bad_input() {
  expect 2 -e "--compress: compress 'topk:0': the ratio 0 is out of range; expected topk:RATIO with 0 < RATIO <= 1" "$T" train --compress topk:0 &&
    expect 2 -e "the ratio 2 is out of range" "$T" train --compress topk:2 &&
    expect 2 -e "the ratio 1.5 is out of range" "$T" run -n 2 -- tandem train --compress topk:1.5 &&
    expect 2 -e "compress 'powersgd:0': the rank 0 is out of range; expected powersgd:RANK" "$T" train --compress powersgd:0 &&
    expect 2 -e "the rank 'abc' is not a whole number; expected powersgd:RANK with RANK >= 1" "$T" train --compress powersgd:abc &&
    expect 2 -e "compress 'gzip': unknown; expected one of none, bf16, fp16, topk:RATIO" "$T" train --compress gzip &&
    expect 2 -e "--compress topk:0.01 applies to --zero 0 only: ZeRO reduces gradients in f32" "$T" train --zero 2 --compress topk:0.01 &&
    expect 2 -e "--compress powersgd:4 applies to --zero 0 only" "$T" run -n 2 -- tandem train --zero 1 --compress powersgd:4 &&
    expect 2 -e "--compress topk:0.01 with --pp 2: error-feedback compression runs with data parallelism only (--tp 1 --pp 1)" "$T" train --model gpt --pp 2 --compress topk:0.01 &&
    expect 2 -e "--compress powersgd:4 with --tp 2: error-feedback compression runs with data parallelism only" -e "tensor-parallel engine" "$T" train --model gpt --tp 2 --compress powersgd:4 &&
    expect 2 -e "--compress-start applies to --compress topk:RATIO or powersgd:RANK (given --compress bf16)" "$T" train --compress bf16 --compress-start 3
}
check "topk:0, topk:2, topk:1.5, powersgd:0, powersgd:abc, an unknown name, compression with ZeRO, --pp or --tp, --compress-start without a compressor: exit 2 naming the value and what is expected" bad_input
finish
