#!/usr/bin/env bash
# The 3-D grid across real processes under tandem run: a GPT with a vocabulary of 257 (2 does not
# divide it), dropout on, SGD with momentum, 2 micro-batches per step. --tp 2 --pp 2 on 4 ranks
# gives the weights of --tp 2 (the tensor-parallel engine) bit for bit and of one process on the
# same global batch within 1e-5 of each tensor's largest value; --dp 2 --tp 2 --pp 2 on 8 ranks
# those of one process with the 2-times batch. A --tp 2 --pp 2 checkpoint after 3 steps loads on
# one process, on --dp 2 and on --pp 2 bit for bit (the same weights), resumes at --tp 2 --pp 2
# bit-identically and on one process and --dp 2 with the same step-4 loss (to 4 decimals) and
# weights within 1e-5 of one process's; checkpoints of one process, --pp 2 and --tp 2 resume at
# --tp 2 --pp 2 likewise. Grids that do not fit the world or the model stop every rank before
# step 1, naming the values. ZeRO stage 1 on the data axis of --dp 2 --tp 2 --pp 2 gives --zero 0's
# weights bit for bit, and its checkpoint (each data rank's part of the state, cut on rows of the
# slices) resumes on one process within 1e-5 of a straight run.
# ZeRO stage 1 on the data axis of --dp 2 --pp 2 gives --zero 0's weights bit for bit, its
# checkpoint resumes on --zero 0 (and --zero 0's on --zero 1) bit-identically to a straight run;
# --pp 2 --zero 2 is refused. A Llama on --tp 2 --pp 2 gives --tp 2's weights bit for bit, and its
# checkpoint resumes on one process. In bf16 and fp16 the grid gives --tp 2's weights in the same
# precision bit for bit (GPT, and a Llama in bf16).
# usage: test_grid.sh path/to/tandem
set -u
T=${1:?usage: test_grid.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"
A=(train --model gpt --layers 2 --heads 6 --width 48 --block 16 --vocab 257 --threads 1 --optimizer sgd --lr 0.1
   --momentum 0.9 --dropout 0.1 --seed 7 --val-batches 2 --eval-batch-size 4 --lr-schedule constant --warmup 0)
G=(--tp 2 --pp 2 --microbatches 2 --batch-size 4)  # a step: 2 micro-batches of 4 per data replica
ONE=(--accum 2 --batch-size 4)                     # the same global batch on one process
DP2=(--dp 2 --accum 2 --batch-size 2)
PP2=(--pp 2 --microbatches 2 --batch-size 4)
TP2=(--tp 2 --accum 2 --batch-size 4)
same() { "$T" weights-diff "$1" "$2" --rtol "$3" --quiet >/dev/null || { echo "  $("$T" weights-diff "$1" "$2" --rtol "$3" --quiet | tail -1)"; return 1; }; }
run() { local n=$1 out=$2; shift 2; if [[ $n == 1 ]]; then "$T" "${A[@]}" "$@" >"$out" 2>&1; else "$T" run -n "$n" -- tandem "${A[@]}" "$@" >"$out" 2>&1; fi ||
  { echo "  $(tail -2 "$out")"; return 1; }; }
loss4() { sed -n 's/.*step 4\/4  loss \([0-9.]*\).*/\1/p' "$1" | head -1; }

"$T" "${A[@]}" --steps 4 "${ONE[@]}" --save-weights "$TMP/one.st" >"$TMP/one.out" 2>&1 || { echo "FAIL one process"; exit 1; }
"$T" "${A[@]}" --steps 3 "${ONE[@]}" --save-weights "$TMP/one3.st" >/dev/null 2>&1 || { echo "FAIL one process, 3 steps"; exit 1; }

tp2pp2() {
  run 4 "$TMP/g.out" --steps 3 "${G[@]}" --save-weights "$TMP/g3.st" --checkpoint-dir "$TMP/ck-g" &&
    grep -q "2 stages x 2 tensor x 1 data" "$TMP/g.out" && run 2 "$TMP/tp.out" --steps 3 "${TP2[@]}" --save-weights "$TMP/tp3.st" &&
    cmp -s "$TMP/g3.st" "$TMP/tp3.st" && same "$TMP/g3.st" "$TMP/one3.st" 1e-5
}
check "--tp 2 --pp 2 on 4 ranks == --tp 2 bit for bit, == one process within 1e-5" tp2pp2

# mixed precision: 16-bit activations between the stages, the tensor ranks' ops widening to f32
grid16() { # PRECISION [model options]
  local D=$1; shift
  run 4 "$TMP/g16.out" --steps 3 "${G[@]}" --precision "$D" "$@" --save-weights "$TMP/g16.st" &&
    run 2 "$TMP/t16.out" --steps 3 "${TP2[@]}" --precision "$D" "$@" --save-weights "$TMP/t16.st" &&
    { cmp -s "$TMP/g16.st" "$TMP/t16.st" || { echo "  the weights differ from --tp 2's"; return 1; }; }
}
check "--tp 2 --pp 2 in bf16 == --tp 2 in bf16 bit for bit" grid16 bf16
check "--tp 2 --pp 2 in fp16 (loss scaling) == --tp 2 in fp16 bit for bit" grid16 fp16
check "llama --tp 2 --pp 2 in bf16 == --tp 2 in bf16 bit for bit" grid16 bf16 --model llama --heads 6 --kv-heads 2 --ffn-width 64
# recomputation: the stages' split blocks run again in backward, collectives included; against
# --tp 2 without it
grid_rc() { # PRECISION RECOMPUTE
  run 4 "$TMP/grc.out" --steps 3 "${G[@]}" --precision "$1" --recompute "$2" --save-weights "$TMP/grc.st" &&
    run 2 "$TMP/trc.out" --steps 3 "${TP2[@]}" --precision "$1" --save-weights "$TMP/trc.st" &&
    { cmp -s "$TMP/grc.st" "$TMP/trc.st" || { echo "  the weights differ from --tp 2's without recomputation"; return 1; }; }
}
check "--tp 2 --pp 2 --recompute block == --tp 2 without recomputation, bit for bit" grid_rc fp32 block
check "--tp 2 --pp 2 --recompute selective in bf16 == --tp 2 in bf16 without it, bit for bit" grid_rc bf16 selective

dp2tp2pp2() {
  "$T" "${A[@]}" --steps 2 --accum 2 --batch-size 8 --save-weights "$TMP/one8.st" >/dev/null 2>&1 &&
    run 8 "$TMP/g8.out" --steps 2 --dp 2 "${G[@]}" --save-weights "$TMP/g8.st" && grep -q "2 stages x 2 tensor x 2 data" "$TMP/g8.out" &&
    same "$TMP/g8.st" "$TMP/one8.st" 1e-5
}
check "--dp 2 --tp 2 --pp 2 on 8 ranks == one process with the 2-times batch (within 1e-5)" dp2tp2pp2

grid_zero1() { # after dp2tp2pp2: its 2 steps with ZeRO stage 1, then the checkpoint's step 3 on one process
  run 8 "$TMP/gz.out" --steps 2 --dp 2 --zero 1 "${G[@]}" --save-weights "$TMP/gz.st" --checkpoint-dir "$TMP/ck-gz" &&
    grep -q "ZeRO stage 1" "$TMP/gz.out" &&
    { cmp -s "$TMP/gz.st" "$TMP/g8.st" || { echo "  --zero 1: not --zero 0's weights"; return 1; }; } &&
    run 1 "$TMP/gz1.out" --steps 3 --accum 2 --batch-size 8 --save-weights "$TMP/one8_3.st" &&
    run 1 "$TMP/gzr.out" --steps 3 --accum 2 --batch-size 8 --checkpoint-dir "$TMP/ck-gz" --resume --save-weights "$TMP/gzr.st" &&
    grep -q "resumed from step 2" "$TMP/gzr.out" && same "$TMP/gzr.st" "$TMP/one8_3.st" 1e-5
}
check "--dp 2 --tp 2 --pp 2 --zero 1 == --zero 0 bit for bit; its checkpoint resumes on one process (within 1e-5)" grid_zero1

# load_on N NAME ARGS...: a copy of the --tp 2 --pp 2 checkpoint (step 3) opened on N ranks with
# ARGS and nothing left to run: the weights written must be those the grid saved, bit for bit
LO=0
load_on() {
  local n=$1 dir="$TMP/lo-$((++LO))"; shift
  cp -r "$TMP/ck-g" "$dir" && run "$n" "$TMP/lo.out" --steps 3 --checkpoint-dir "$dir" --resume --save-weights "$TMP/lo.st" "$@" &&
    cmp -s "$TMP/lo.st" "$TMP/g3.st" || { echo "  on $n ranks $*: not the saved weights"; return 1; }
}
loads() { load_on 1 "${ONE[@]}" && load_on 2 "${DP2[@]}" && load_on 2 "${PP2[@]}" && load_on 4 "${G[@]}"; }
check "a --tp 2 --pp 2 checkpoint loads on one process, --dp 2, --pp 2 and --tp 2 --pp 2 bit for bit" loads

straight() { run 4 "$TMP/g4.out" --steps 4 "${G[@]}" --save-weights "$TMP/g4.st"; }
check "--tp 2 --pp 2 for 4 steps" straight

# go_on NAME N ARGS...: a copy of $TMP/ck-NAME resumed for step 4 on N ranks with ARGS: the step-4
# loss that of --tp 2 --pp 2 straight (4 decimals) and the weights one process's within 1e-5
GO=0
go_on() {
  local name=$1 n=$2 dir="$TMP/go-$((++GO))"; shift 2
  cp -r "$TMP/ck-$name" "$dir" && run "$n" "$TMP/go.out" --steps 4 --checkpoint-dir "$dir" --resume --save-weights "$TMP/go.st" "$@" &&
    grep -q "resumed from step 3" "$TMP/go.out" && same "$TMP/go.st" "$TMP/one.st" 1e-5 &&
    [[ -n "$(loss4 "$TMP/go.out")" && "$(loss4 "$TMP/go.out")" == "$(loss4 "$TMP/g4.out")" ]] ||
    { echo "  $name on $n ranks $*: step-4 loss $(loss4 "$TMP/go.out"), straight $(loss4 "$TMP/g4.out")"; return 1; }
}
resume_same() {
  cp -r "$TMP/ck-g" "$TMP/ck-same" && run 4 "$TMP/rs.out" --steps 4 "${G[@]}" --checkpoint-dir "$TMP/ck-same" --resume \
    --save-weights "$TMP/rs.st" && cmp -s "$TMP/rs.st" "$TMP/g4.st"
}
check "a --tp 2 --pp 2 checkpoint resumes at --tp 2 --pp 2 bit-identically" resume_same
elsewhere() { go_on g 1 "${ONE[@]}" && go_on g 2 "${DP2[@]}"; }
check "a --tp 2 --pp 2 checkpoint resumes on one process and --dp 2: the same step-4 loss, weights within 1e-5" elsewhere
into_grid() {
  run 1 "$TMP/c1.out" --steps 3 "${ONE[@]}" --checkpoint-dir "$TMP/ck-one" && run 2 "$TMP/c2.out" --steps 3 "${PP2[@]}" --checkpoint-dir "$TMP/ck-pp2" &&
    run 2 "$TMP/c3.out" --steps 3 "${TP2[@]}" --checkpoint-dir "$TMP/ck-tp2" &&
    go_on one 4 "${G[@]}" && go_on pp2 4 "${G[@]}" && go_on tp2 4 "${G[@]}"
}
check "checkpoints of one process, --pp 2 and --tp 2 resume at --tp 2 --pp 2 (the same step-4 loss, within 1e-5)" into_grid

# a Llama (grouped-query attention, 4 heads over 2 key/value heads, its head tied) on the grid: the
# tensor-parallel engine's bits; its checkpoint resumes on one process within 1e-5 of its weights
LL=(--model llama --heads 4 --kv-heads 2 --ffn-width 70 --tie-embeddings on)
llama_grid() {
  run 4 "$TMP/lg.out" --steps 3 "${LL[@]}" "${G[@]}" --save-weights "$TMP/lg.st" --checkpoint-dir "$TMP/ck-lg" &&
    grep -q "2 stages x 2 tensor x 1 data" "$TMP/lg.out" && run 2 "$TMP/lt.out" --steps 3 "${LL[@]}" "${TP2[@]}" --save-weights "$TMP/lt.st" &&
    { cmp -s "$TMP/lg.st" "$TMP/lt.st" || { echo "  --tp 2 --pp 2: not --tp 2's weights"; return 1; }; } &&
    run 1 "$TMP/l1.out" --steps 4 "${LL[@]}" "${ONE[@]}" --save-weights "$TMP/l1.st" &&
    run 1 "$TMP/lr.out" --steps 4 "${LL[@]}" "${ONE[@]}" --checkpoint-dir "$TMP/ck-lg" --resume --save-weights "$TMP/lr.st" &&
    grep -q "resumed from step 3" "$TMP/lr.out" && same "$TMP/lr.st" "$TMP/l1.st" 1e-5
}
check "llama --tp 2 --pp 2 == --tp 2 bit for bit; its checkpoint resumes on one process (within 1e-5)" llama_grid

bad() { # bad N WANT ARGS...: every rank stops before step 1, the message names the values
  local n=$1 want=$2; shift 2
  "$T" run -n "$n" -- tandem "${A[@]}" --steps 2 "$@" >"$TMP/bad.out" 2>&1
  local rc=$?
  [[ $rc -ne 0 ]] && grep -q -- "$want" "$TMP/bad.out" && ! grep -q "step 1/" "$TMP/bad.out" ||
    { echo "  exit $rc: $(tail -3 "$TMP/bad.out")"; return 1; }
}
check "a world that is not data x tensor x pipeline: refused" bad 6 "--dp 0 x --tp 2 x --pp 2 (dp: what is left), but 6 ranks run" "${G[@]}"
check "--dp x --tp x --pp not the world: refused" bad 4 "--dp 2 x --tp 2 x --pp 2, but 4 ranks run" --dp 2 "${G[@]}"
check "--pp larger than the blocks with --tp: refused" bad 8 "4 stages x 1 virtual stages = 4 chunks for a model of 2 blocks" \
  --tp 2 --pp 4 --microbatches 4 --batch-size 4
check "heads not divisible by --tp with --pp: refused" bad 8 "6 attention heads do not divide over --tp 4 ranks" \
  --tp 4 --pp 2 --microbatches 2 --batch-size 4
check "--zero 2 with the 3-D grid: refused" bad 8 "runs ZeRO stage 1 at most" --dp 2 --zero 2 "${G[@]}"
check "--pp 2 --zero 2: refused" bad 4 "runs ZeRO stage 1 at most" --dp 2 --zero 2 "${PP2[@]}"

DPP=(--dp 2 --pp 2 --microbatches 2 --batch-size 2)
zero1() { # ZeRO stage 1 on the pipeline's data axis: the same bits as --zero 0, checkpoints either way
  run 4 "$TMP/z0.out" --steps 4 "${DPP[@]}" --save-weights "$TMP/z0.st" &&
    run 4 "$TMP/z1.out" --steps 3 "${DPP[@]}" --zero 1 --save-weights "$TMP/z13.st" --checkpoint-dir "$TMP/ck-z1" &&
    run 4 "$TMP/z03.out" --steps 3 "${DPP[@]}" --save-weights "$TMP/z03.st" --checkpoint-dir "$TMP/ck-z0" &&
    { cmp -s "$TMP/z13.st" "$TMP/z03.st" || { echo "  --zero 1 after 3 steps: not --zero 0's weights"; return 1; }; } &&
    run 4 "$TMP/z1r.out" --steps 4 "${DPP[@]}" --checkpoint-dir "$TMP/ck-z1" --resume --save-weights "$TMP/z1r.st" &&
    grep -q "resumed from step 3" "$TMP/z1r.out" &&
    { cmp -s "$TMP/z1r.st" "$TMP/z0.st" || { echo "  --zero 1 checkpoint resumed on --zero 0: not the straight run's weights"; return 1; }; } &&
    run 4 "$TMP/z0r.out" --steps 4 "${DPP[@]}" --zero 1 --checkpoint-dir "$TMP/ck-z0" --resume --save-weights "$TMP/z0r.st" &&
    grep -q "resumed from step 3" "$TMP/z0r.out" &&
    { cmp -s "$TMP/z0r.st" "$TMP/z0.st" || { echo "  --zero 0 checkpoint resumed on --zero 1: not the straight run's weights"; return 1; }; }
}
check "--dp 2 --pp 2 --zero 1 == --zero 0 bit for bit; its checkpoint resumes on --zero 0 (and back) bit-identically" zero1
plan_3d() {
  "$T" plan --model gpt --layers 2 --heads 6 --width 48 --vocab 257 --tp 2 --pp 2 --microbatches 2 >"$TMP/plan.out" 2>&1 &&
    grep -q "pipeline: 1f1b, 2 stages" "$TMP/plan.out" && grep -q "tensor parallel 2" "$TMP/plan.out" ||
    { echo "  $(tail -2 "$TMP/plan.out")"; return 1; }
}
check "tandem plan --tp 2 --pp 2: the stages and the tensor axis" plan_3d
finish
