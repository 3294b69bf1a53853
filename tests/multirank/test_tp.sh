#!/usr/bin/env bash
# Tensor parallelism across real processes under tandem run: a GPT with a vocabulary of 257 (no
# T > 1 divides it), dropout on, SGD with momentum and clipping, trained on T ranks (shm, tcp) or
# data x tensor ranks, ends with the weights of one process on the same global batch (within 1e-5
# of each tensor's largest value); a checkpoint of a tensor-parallel run resumes bit for bit at the
# same split, and on one process, ZeRO stage 3, another split and a pipeline (and theirs at --tp 2)
# within 1e-5; bad layouts stop every rank before any step, naming the values (the 3-D grid,
# --tp with --pp: tests/multirank/test_grid.sh). A Llama (grouped-query attention) at --tp 3 over
# tcp, tied, equals one process; its --tp 2 checkpoint resumes on one process and one process's at
# --tp 2; key/value heads --tp does not divide are refused. --dp 2 --tp 2 --zero 1 gives --zero 0's
# weights bit for bit; --zero 2 beside --tp is refused.
# In bf16, --tp 2 ends within 1e-2 of one bf16 process (16-bit partial sums).
# usage: test_tp.sh path/to/tandem
set -u
T=${1:?usage: test_tp.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"
A=(train --model gpt --layers 2 --heads 6 --width 48 --block 16 --vocab 257 --steps 6 --threads 1 --optimizer sgd
   --lr 0.1 --momentum 0.9 --dropout 0.1 --seed 7 --val-batches 2 --eval-batch-size 4 --schedule constant --warmup 0)
"$T" "${A[@]}" --batch-size 4 --save-weights "$TMP/one.st" >/dev/null 2>&1 || { echo "FAIL one process"; exit 1; }
"$T" "${A[@]}" --batch-size 8 --save-weights "$TMP/one8.st" >/dev/null 2>&1 || { echo "FAIL one process, batch 8"; exit 1; }
same() { "$T" weights-diff "$1" "$2" --rtol "$3" --quiet | tail -1; "$T" weights-diff "$1" "$2" --rtol "$3" --quiet >/dev/null; }

tp2_shm() {
  TANDEM_TRANSPORT=shm "$T" run -n 2 -- tandem "${A[@]}" --tp 2 --batch-size 4 --save-weights "$TMP/tp2.st" >"$TMP/tp2.out" 2>&1 &&
    grep -q "tensor parallel 2" "$TMP/tp2.out" && same "$TMP/tp2.st" "$TMP/one.st" 1e-5
}
check "--tp 2 over shm == one process (weights within 1e-5)" tp2_shm

tp3_tcp() {
  TANDEM_TRANSPORT=tcp "$T" run -n 3 -- tandem "${A[@]}" --tp 3 --batch-size 4 --save-weights "$TMP/tp3.st" >/dev/null 2>&1 &&
    same "$TMP/tp3.st" "$TMP/one.st" 1e-5
}
check "--tp 3 over tcp == one process" tp3_tcp

# bf16: the tensor ranks' partial sums are rounded to 16 bits where one process rounds the whole
# sum once; measured 3.3e-3 (per tensor, relative) from one bf16 process, as bf16 alone moves one
# process 4.0e-3 from fp32
tp2_bf16() {
  "$T" "${A[@]}" --batch-size 4 --precision bf16 --save-weights "$TMP/one16.st" >/dev/null 2>&1 || return 1
  "$T" run -n 2 -- tandem "${A[@]}" --tp 2 --batch-size 4 --precision bf16 --save-weights "$TMP/tp16.st" >/dev/null 2>&1 &&
    same "$TMP/tp16.st" "$TMP/one16.st" 1e-2
}
check "--tp 2 in bf16 == one bf16 process (weights within 1e-2)" tp2_bf16

tp2_recompute() { # the split blocks run again in backward (their collectives too): the same bits
  TANDEM_TRANSPORT=shm "$T" run -n 2 -- tandem "${A[@]}" --tp 2 --batch-size 4 --recompute block --save-weights "$TMP/tp2rc.st" \
    >/dev/null 2>&1 && { [[ -s $TMP/tp2.st ]] || return 1; } && cmp -s "$TMP/tp2rc.st" "$TMP/tp2.st"
}
check "--tp 2 --recompute block == --tp 2 bit for bit" tp2_recompute

dp2_tp2() {
  "$T" run -n 4 -- tandem "${A[@]}" --tp 2 --dp 2 --batch-size 4 --save-weights "$TMP/dp2tp2.st" >"$TMP/dp2tp2.out" 2>&1 &&
    grep -q "tensor parallel 2 x data parallel 2" "$TMP/dp2tp2.out" && same "$TMP/dp2tp2.st" "$TMP/one8.st" 1e-5
}
check "--dp 2 --tp 2 on 4 ranks == one process with the 2-times batch" dp2_tp2

# ZeRO stage 1 on the data axis: each data rank updates its part of the slices, the gradients are
# averaged whole as at --zero 0: the same bits
dp2_tp2_zero1() {
  "$T" run -n 4 -- tandem "${A[@]}" --tp 2 --dp 2 --zero 1 --batch-size 4 --save-weights "$TMP/z1.st" >"$TMP/z1.out" 2>&1 &&
    grep -q "data parallel 2 (ZeRO stage 1)" "$TMP/z1.out" && cmp -s "$TMP/z1.st" "$TMP/dp2tp2.st" ||
    { echo "  $(tail -2 "$TMP/z1.out")"; return 1; }
}
check "--dp 2 --tp 2 --zero 1 == --dp 2 --tp 2 bit for bit" dp2_tp2_zero1

resume() {
  local C=(--tp 2 --batch-size 4 --checkpoint-dir)
  "$T" run -n 2 -- tandem "${A[@]}" "${C[@]}" "$TMP/ck1" --save-weights "$TMP/straight.st" >/dev/null 2>&1 &&
    "$T" run -n 2 -- tandem "${A[@]}" --steps 3 "${C[@]}" "$TMP/ck2" >/dev/null 2>&1 && cp -r "$TMP/ck2" "$TMP/ck-tp2" &&
    "$T" run -n 2 -- tandem "${A[@]}" "${C[@]}" "$TMP/ck2" --resume --save-weights "$TMP/resumed.st" >"$TMP/res.out" 2>&1 &&
    cmp -s "$TMP/straight.st" "$TMP/resumed.st" || { echo "  $(tail -2 "$TMP/res.out")"; return 1; }
}
check "a checkpoint of --tp 2 resumes at --tp 2 bit-identically" resume

# go_on NAME N ARGS...: resumes a copy of $TMP/ck-NAME for steps 4-6 on N ranks with ARGS;
# the weights must be one process's after 6 steps within 1e-5 (the layouts sum in other orders)
GO=0
go_on() {
  local name=$1 n=$2 dir="$TMP/go-$((++GO))"; shift 2
  cp -r "$TMP/ck-$name" "$dir" &&
    "$T" run -n "$n" -- tandem "${A[@]}" --checkpoint-dir "$dir" --resume "$@" --save-weights "$TMP/go.st" \
      >"$TMP/go.out" 2>&1 && grep -q "resumed from step 3" "$TMP/go.out" && same "$TMP/go.st" "$TMP/one.st" 1e-5 ||
    { echo "  $(tail -2 "$TMP/go.out")"; return 1; }
}
tp2_elsewhere() { # the --tp 2 checkpoint after 3 steps, on other layouts
  go_on tp2 1 --batch-size 4 && go_on tp2 2 --zero 3 --batch-size 2 &&
    go_on tp2 3 --tp 3 --batch-size 4 && go_on tp2 2 --pp 2 --batch-size 4
}
check "a --tp 2 checkpoint resumes on one process, at --zero 3, --tp 3 and --pp 2 (== one process within 1e-5)" tp2_elsewhere

elsewhere_tp2() { # checkpoints of those layouts after 3 steps, resumed at --tp 2
  "$T" "${A[@]}" --steps 3 --batch-size 4 --checkpoint-dir "$TMP/ck-one" >/dev/null 2>&1 &&
    "$T" run -n 2 -- tandem "${A[@]}" --steps 3 --zero 3 --batch-size 2 --checkpoint-dir "$TMP/ck-z3" >/dev/null 2>&1 &&
    "$T" run -n 3 -- tandem "${A[@]}" --steps 3 --tp 3 --batch-size 4 --checkpoint-dir "$TMP/ck-tp3" >/dev/null 2>&1 &&
    "$T" run -n 2 -- tandem "${A[@]}" --steps 3 --pp 2 --batch-size 4 --checkpoint-dir "$TMP/ck-pp2" >/dev/null 2>&1 &&
    go_on one 2 --tp 2 --batch-size 4 && go_on z3 2 --tp 2 --batch-size 4 && go_on tp3 2 --tp 2 --batch-size 4 &&
    go_on pp2 2 --tp 2 --batch-size 4
}
check "checkpoints of one process, --zero 3, --tp 3 and --pp 2 resume at --tp 2 (== one process within 1e-5)" elsewhere_tp2

# Llama: 12 heads over 6 key/value heads (groups of 2: --tp 2 and 3 keep whole groups), a SwiGLU
# width of 100 and a vocabulary of 257 that 3 does not divide
L=(train --model llama --layers 2 --heads 12 --kv-heads 6 --width 48 --ffn-width 100 --block 16 --vocab 257 --threads 1
   --optimizer sgd --lr 0.1 --momentum 0.9 --dropout 0.1 --seed 7 --val-batches 2 --eval-batch-size 4 --lr-schedule constant
   --warmup 0 --batch-size 4)
llama_tp3() { # a tied head
  "$T" "${L[@]}" --steps 4 --tie-embeddings on --save-weights "$TMP/l1.st" >/dev/null 2>&1 &&
    TANDEM_TRANSPORT=tcp "$T" run -n 3 -- tandem "${L[@]}" --steps 4 --tie-embeddings on --tp 3 --save-weights "$TMP/l3.st" \
      >"$TMP/l3.out" 2>&1 && grep -q "tensor parallel 3" "$TMP/l3.out" && same "$TMP/l3.st" "$TMP/l1.st" 1e-5 ||
    { echo "  $(tail -2 "$TMP/l3.out")"; return 1; }
}
check "llama --tp 3 over tcp (grouped-query attention, tied head) == one process (weights within 1e-5)" llama_tp3

llama_resume() { # an untied head: a --tp 2 checkpoint after 2 steps goes on at one process, and one process's at --tp 2
  "$T" "${L[@]}" --steps 4 --save-weights "$TMP/lu.st" >/dev/null 2>&1 &&
    "$T" run -n 2 -- tandem "${L[@]}" --steps 2 --tp 2 --checkpoint-dir "$TMP/lck2" >/dev/null 2>&1 &&
    "$T" "${L[@]}" --steps 2 --checkpoint-dir "$TMP/lck1" >/dev/null 2>&1 &&
    "$T" "${L[@]}" --steps 4 --checkpoint-dir "$TMP/lck2" --resume --save-weights "$TMP/lr1.st" >"$TMP/lr.out" 2>&1 &&
    grep -q "resumed from step 2" "$TMP/lr.out" && same "$TMP/lr1.st" "$TMP/lu.st" 1e-5 &&
    "$T" run -n 2 -- tandem "${L[@]}" --steps 4 --tp 2 --checkpoint-dir "$TMP/lck1" --resume --save-weights "$TMP/lr2.st" \
      >"$TMP/lr.out" 2>&1 && grep -q "resumed from step 2" "$TMP/lr.out" && same "$TMP/lr2.st" "$TMP/lu.st" 1e-5 ||
    { echo "  $(tail -2 "$TMP/lr.out")"; return 1; }
}
check "llama: a --tp 2 checkpoint resumes on one process, one process's at --tp 2 (== one process within 1e-5)" llama_resume

bad() { # bad N WANT ARGS...: every rank stops before step 1, the message names the values
  local n=$1 want=$2; shift 2
  "$T" run -n "$n" -- tandem "${A[@]}" --batch-size 4 "$@" >"$TMP/bad.out" 2>&1
  local rc=$?
  [[ $rc -ne 0 ]] && grep -q -- "$want" "$TMP/bad.out" && ! grep -q "step 1/" "$TMP/bad.out" ||
    { echo "  exit $rc: $(tail -3 "$TMP/bad.out")"; return 1; }
}
check "a world that is not data x tensor: refused" bad 3 "--dp 0 x --tp 2 x --pp 1 (dp: what is left), but 3 ranks run" --tp 2
check "--dp x --tp not the world: refused" bad 4 "--dp 3 x --tp 2 x --pp 1, but 4 ranks run" --tp 2 --dp 3
check "heads not divisible by --tp: refused" bad 4 "6 attention heads do not divide over --tp 4 ranks" --tp 4
check "--tp larger than the heads: refused" bad 8 "--tp 8 is larger than the 6 attention heads" --tp 8
other_model() { # (the gpt's own options would be refused first)
  "$T" run -n 2 -- tandem train --model mlp --data synthetic --tp 2 --steps 1 --threads 1 >"$TMP/bad.out" 2>&1
  local rc=$?
  [[ $rc -ne 0 ]] && grep -q -- "the mlp model has no heads to split" "$TMP/bad.out" && ! grep -q "step 1/" "$TMP/bad.out" ||
    { echo "  exit $rc: $(tail -3 "$TMP/bad.out")"; return 1; }
}
check "--tp with another model: refused" other_model
check "--tp 2 --zero 2: refused" bad 4 "runs ZeRO stage 1 at most" --tp 2 --dp 2 --zero 2
check "llama: key/value heads not divisible by --tp: refused" bad 4 "6 key/value heads do not divide over --tp 4 ranks" \
  --model llama --heads 12 --kv-heads 6 --ffn-width 100 --tp 4
finish
