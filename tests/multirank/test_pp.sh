#!/usr/bin/env bash
# Pipeline parallelism in real processes under tandem run (shared memory): every schedule's weights
# are one process's bit for bit (the same micro-batches accumulated, dropout on; and with the
# blocks recomputed in backward); a data axis gives
# data parallelism's; a stage that dies is named by the other and the group restarts from a
# checkpoint to the same weights; checkpoints reshard between a pipeline and any other layout; bad layouts are refused before any rank computes; tandem plan
# draws and writes the schedule. The Llama alike (its head untied and tied): one process's weights,
# checkpoints from --pp 2 into one process and back, its bad layouts refused.
# usage: test_pp.sh path/to/tandem
set -u
T=${1:?usage: test_pp.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"
. "$(dirname "$0")/ranks.sh"
on_exit 'kill -9 $RANK_PIDS 2>/dev/null; wait $RANK_PIDS 2>/dev/null'
export TANDEM_TIMEOUT=60
G=(train --model gpt --layers 4 --heads 2 --width 32 --block 16 --batch-size 2 --steps 3 --threads 1 --dropout 0.1
   --lr-schedule constant --warmup 0 --val-batches 2)

# one process accumulating M micro-batches: the reference for M = 2, 4, 5 and 7
for M in 2 4 5 7; do "$T" "${G[@]}" --accum $M --save-weights "$TMP/one$M.st" >/dev/null 2>&1 || echo "  reference M $M failed"; done

same_as_one() { # P M SCHEDULE [options...]
  local P=$1 M=$2 S=$3; shift 3
  "$T" run -n "$P" -- tandem "${G[@]}" --pp "$P" --microbatches "$M" --schedule "$S" "$@" --save-weights "$TMP/pp.st" \
    >"$TMP/out" 2>&1 || { tail -3 "$TMP/out"; return 1; }
  cmp -s "$TMP/one$M.st" "$TMP/pp.st" || { echo "  the weights differ from one process's"; return 1; }
}
check "gpipe, 2 stages, 5 micro-batches: one process's weights" same_as_one 2 5 gpipe
check "1f1b, 3 stages, 7 micro-batches: one process's weights" same_as_one 3 7 1f1b
check "zb1p, 4 stages, 4 micro-batches: one process's weights" same_as_one 4 4 zb1p
check "interleaved, 2 stages x 2 chunks, 4 micro-batches: one process's weights" same_as_one 2 4 interleaved
check "1f1b cut by hand (--pp-split 1,3): one process's weights" same_as_one 2 2 1f1b --pp-split 1,3
check "zb1p, 2 stages, 4 micro-batches, blocks recomputed in backward: one process's weights" same_as_one 2 4 zb1p --recompute block
# mixed precision: 16-bit activations cross the stages; one process in the same precision is the reference
mixed_as_one() { # PRECISION P M SCHEDULE
  local D=$1; shift
  "$T" "${G[@]}" --accum "$2" --precision "$D" --save-weights "$TMP/one_$D.st" >/dev/null 2>&1 || { echo "  reference failed"; return 1; }
  "$T" run -n "$1" -- tandem "${G[@]}" --pp "$1" --microbatches "$2" --schedule "$3" --precision "$D" --save-weights "$TMP/pp.st" \
    >"$TMP/out" 2>&1 || { tail -3 "$TMP/out"; return 1; }
  cmp -s "$TMP/one_$D.st" "$TMP/pp.st" || { echo "  the weights differ from one process's"; return 1; }
}
check "bf16, 1f1b, 2 stages, 4 micro-batches: one bf16 process's weights" mixed_as_one bf16 2 4 1f1b
check "fp16 (loss scaling), zb1p, 2 stages, 3 micro-batches: one fp16 process's weights" mixed_as_one fp16 2 3 zb1p

grid_2x2() { # 2 data replicas of a 2-stage pipeline = data parallelism on 2 ranks
  "$T" run -n 2 -- tandem "${G[@]}" --accum 2 --save-weights "$TMP/dp2.st" >/dev/null 2>&1 || return 1
  "$T" run -n 4 -- tandem "${G[@]}" --dp 2 --pp 2 --microbatches 2 --schedule zb1p --save-weights "$TMP/g.st" >"$TMP/out" 2>&1 ||
    { tail -3 "$TMP/out"; return 1; }
  grep -q "pipeline zb1p, 2 stages x 2 data" "$TMP/out" && cmp -s "$TMP/dp2.st" "$TMP/g.st"
}
check "--dp 2 --pp 2 on 4 ranks: data parallelism's weights on 2" grid_2x2

dead_stage() { # started by hand (no launcher to stop the other): rank 1 dies after step 1
  local t0=$SECONDS
  TANDEM_FAULT=1:1 by_hand "$TMP/dead" "${G[@]}" --steps 4 --pp 2 --microbatches 2
  local el=$((SECONDS - t0))
  [[ $el -lt 30 ]] || { echo "  took $el s"; return 1; }
  grep -q "TANDEM_FAULT: rank 1 stops after step 1" "$TMP/dead.1" || { echo "  the fault did not fire"; return 1; }
  grep -qE "tandem train: .*rank 1" "$TMP/dead.0" || { echo "  rank 0 does not name rank 1:"; tail -2 "$TMP/dead.0"; return 1; }
}
check "a stage that dies: the other fails within seconds naming it" dead_stage
stage_error_relayed() { # over tcp, rank 2 (stage 0 of the second replica) fails with an error of its own:
  # the others relay it (their pipeline stage wraps it) and exit 4, and the launcher names rank 2.
  # --keep-going: the launcher waits for every rank, so each prints its error (without it, it stops
  # the others as soon as rank 2's own failure arrives, and whether they printed first was a race
  # that failed CI once)
  TANDEM_TRANSPORT=tcp TANDEM_FAULT=2:2:error timeout 120 "$T" run --keep-going -n 4 -- tandem "${G[@]}" --steps 4 --dp 2 \
    --pp 2 --microbatches 2 >"$TMP/relay.out" 2>&1
  local rc=$?
  [[ $rc == 1 ]] && grep -q "rank 2 failed first: exit code 1" "$TMP/relay.out" &&
    [[ $(grep -c "\[rank [013]\] tandem train: .*(relayed from rank 2)" "$TMP/relay.out") == 3 ]] &&
    ! grep -q "\[rank [013]\] tandem train: .*(this rank)" "$TMP/relay.out" ||
    { echo "  exit $rc:"; grep "tandem train: [a-zA-Z/ ]*(\|failed first" "$TMP/relay.out"; return 1; }
}
check "an error of one rank's own in a 2 x 2 grid over tcp: the others say they relay it, the launcher names it" stage_error_relayed

restart() { # rank 1 dies after step 4; tandem run restarts both, they resume from step 3: the same weights
  "$T" run -n 2 -- tandem "${G[@]}" --steps 6 --pp 2 --microbatches 2 --schedule zb1p --save-weights "$TMP/full.st" \
    >/dev/null 2>&1 || return 1
  TANDEM_FAULT=1:4 "$T" run -n 2 --max-restarts 1 -- tandem "${G[@]}" --steps 6 --pp 2 --microbatches 2 --schedule zb1p \
    --checkpoint-dir "$TMP/ck" --checkpoint-every 3 --resume --save-weights "$TMP/res.st" >"$TMP/out" 2>&1 ||
    { tail -3 "$TMP/out"; return 1; }
  grep -q "resumed from step 3" "$TMP/out" && ls "$TMP"/ck/ckpt-000000000003.shards/rank-1.safetensors >/dev/null &&
    cmp -s "$TMP/full.st" "$TMP/res.st"
}
check "checkpoints per stage: killed, restarted and resumed, the same weights" restart

reshard() { # format 3: a pipeline's checkpoint is one process's state; any layout resumes any other
  local R=("$T" run -n) one=("$T" "${G[@]}" --accum 2) pp=(tandem "${G[@]}" --pp 2 --microbatches 2) k
  "${one[@]}" --steps 6 --save-weights "$TMP/ref6.st" >/dev/null 2>&1 &&
    "${one[@]}" --steps 3 --checkpoint-every 3 --checkpoint-dir "$TMP/c1" >/dev/null 2>&1 &&
    "${R[@]}" 2 -- "${pp[@]}" --steps 3 --checkpoint-every 3 --checkpoint-dir "$TMP/cp" >"$TMP/out" 2>&1 || { tail -3 "$TMP/out"; return 1; }
  "$T" checkpoint consolidate "$TMP/c1" "$TMP/c1.st" --optimizer 2>/dev/null &&
    "$T" checkpoint consolidate "$TMP/cp" "$TMP/cp.st" --optimizer 2>/dev/null &&
    cmp -s "$TMP/c1.st" "$TMP/cp.st" || { echo "  consolidated, the --pp 2 checkpoint differs from one process's"; return 1; }
  for k in a b z1 zp d1 dp; do rm -rf "$TMP/$k"; done
  cp -r "$TMP/cp" "$TMP/a" && cp -r "$TMP/c1" "$TMP/b" && cp -r "$TMP/cp" "$TMP/zp" && cp -r "$TMP/c1" "$TMP/z1" &&
    cp -r "$TMP/c1" "$TMP/d1" && cp -r "$TMP/c1" "$TMP/dp" || return 1
  # bit for bit where the summation order is one process's: --pp 2 into 1 process and back
  "${one[@]}" --steps 6 --checkpoint-dir "$TMP/a" --resume --save-weights "$TMP/a.st" >"$TMP/out" 2>&1 &&
    grep -q "resharded to data parallel, 1 rank" "$TMP/out" && cmp -s "$TMP/a.st" "$TMP/ref6.st" ||
    { echo "  --pp 2 resumed on 1 process: not the uninterrupted run's weights"; tail -2 "$TMP/out"; return 1; }
  "${R[@]}" 2 -- "${pp[@]}" --steps 6 --checkpoint-dir "$TMP/b" --resume --save-weights "$TMP/b.st" >"$TMP/out" 2>&1 &&
    grep -q "resharded to pipeline 1f1b, 2 stages" "$TMP/out" && cmp -s "$TMP/b.st" "$TMP/ref6.st" ||
    { echo "  1 process resumed at --pp 2: not the uninterrupted run's weights"; tail -2 "$TMP/out"; return 1; }
  # at ZeRO stage 3 on 2 ranks (another order): the --pp 2 checkpoint gives what one process's gives
  for k in zp z1; do
    "${R[@]}" 2 -- tandem "${G[@]}" --zero 3 --batch-size 1 --accum 2 --steps 6 --checkpoint-every 3 --checkpoint-dir "$TMP/$k" \
      --resume --save-weights "$TMP/$k.st" >"$TMP/out" 2>&1 && grep -q "resharded to zero stage 3, 2 ranks" "$TMP/out" ||
      { tail -2 "$TMP/out"; return 1; }
  done
  cmp -s "$TMP/zp.st" "$TMP/z1.st" || { echo "  at --zero 3 the --pp 2 checkpoint trains otherwise than one process's"; return 1; }
  # a ZeRO stage 3 checkpoint (step 6) resumes as a pipeline: one process's bits from there
  rm -rf "$TMP/z1b" && cp -r "$TMP/z1" "$TMP/z1b" &&
    "${R[@]}" 2 -- "${pp[@]}" --steps 7 --checkpoint-dir "$TMP/z1" --resume --save-weights "$TMP/z7p.st" >/dev/null 2>&1 &&
    "${one[@]}" --steps 7 --checkpoint-dir "$TMP/z1b" --resume --save-weights "$TMP/z7.st" >/dev/null 2>&1 &&
    cmp -s "$TMP/z7p.st" "$TMP/z7.st" || { echo "  a --zero 3 checkpoint resumed at --pp 2: not one process's weights"; return 1; }
  # --dp 2 --pp 2 (1 micro-batch) is data parallelism on 2 ranks: resumed, and its checkpoint (data replicas write once)
  "${R[@]}" 4 -- tandem "${G[@]}" --dp 2 --pp 2 --microbatches 1 --steps 6 --checkpoint-every 3 --checkpoint-dir "$TMP/d1" \
    --resume --save-weights "$TMP/d1.st" >"$TMP/out" 2>&1 && grep -q "resharded to pipeline 1f1b, 2 stages x 2 data" "$TMP/out" &&
    "${R[@]}" 2 -- tandem "${G[@]}" --steps 6 --checkpoint-every 3 --checkpoint-dir "$TMP/dp" --resume --save-weights "$TMP/dp.st" \
      >/dev/null 2>&1 && cmp -s "$TMP/d1.st" "$TMP/dp.st" || { echo "  --dp 2 --pp 2 resumed: not data parallelism's weights"; return 1; }
  "$T" checkpoint consolidate "$TMP/d1" "$TMP/d1c.st" --optimizer 2>/dev/null &&
    "$T" checkpoint consolidate "$TMP/dp" "$TMP/dpc.st" --optimizer 2>/dev/null && cmp -s "$TMP/d1c.st" "$TMP/dpc.st" ||
    { echo "  consolidated, the --dp 2 --pp 2 checkpoint differs from data parallelism's"; return 1; }
}
check "checkpoints reshard: --pp 2 into 1 process and back (the uninterrupted run's bits), into --zero 3 (one process's checkpoint's bits), --zero 3 into --pp 2, 1 process into --dp 2 --pp 2 (data parallelism's bits); consolidated, one process's state" reshard

refused() { # expected text, then the command: exit 1 before any step runs
  local want=$1; shift
  timeout 60 "$@" >"$TMP/out" 2>&1
  local rc=$?
  [[ $rc -ne 0 ]] || { echo "  exit 0: $*"; return 1; }
  grep -qF -- "$want" "$TMP/out" || { echo "  output lacks '$want':"; tail -3 "$TMP/out"; return 1; }
  ! grep -q "step 1/" "$TMP/out" || { echo "  a step ran"; return 1; }
}
check "more stages than blocks" refused "5 stages x 1 virtual stages = 5 chunks for a model of 4 blocks" \
  "$T" run -n 5 -- tandem "${G[@]}" --pp 5 --microbatches 5
check "a --pp-split that does not add up" refused "--pp-split adds up to 3 blocks; the model has 4" \
  "$T" run -n 2 -- tandem "${G[@]}" --pp 2 --pp-split 1,2
check "fewer micro-batches than the schedule needs" refused "3 micro-batches for 2 pipeline ranks; it needs a multiple" \
  "$T" run -n 2 -- tandem "${G[@]}" --pp 2 --microbatches 3 --schedule interleaved
check "a world that is not --dp x --pp" refused "--dp 0 x --pp 2 (dp: what is left), but 3 ranks run" \
  "$T" run -n 3 -- tandem "${G[@]}" --pp 2
check "--dp x --pp not the world" refused "--dp 2 x --pp 2, but 2 ranks run" "$T" run -n 2 -- tandem "${G[@]}" --dp 2 --pp 2
check "the plan refuses them too" refused "--pp-split adds up to 3 blocks" "$T" plan --model gpt --layers 4 --pp 2 --pp-split 1,2

plan_trace() {
  "$T" plan --model gpt --layers 4 --pp 4 --microbatches 8 --schedule 1f1b --trace "$TMP/t.json" >"$TMP/out" 2>&1 || return 1
  grep -q "bubble 0.273" "$TMP/out" && grep -q "stage 0   blocks 0-0  holds at most 4 micro-batches" "$TMP/out" &&
    grep -q "stage 3   blocks 3-3  holds at most 1 micro-batch:" "$TMP/out" && grep -q "^rank 3 |......F0B0B0F1" "$TMP/out" &&
    /usr/bin/python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['traceEvents']; sys.exit(sum(x['ph']=='X' for x in e) != 64)" \
      "$TMP/t.json"
}
check "tandem plan: the bubble, what each stage holds, the timeline, a Chrome trace with 2 x 8 x 4 boxes" plan_trace

# the Llama: GQA, RoPE, SwiGLU; llama-mini's head is untied, --tie-embeddings on ties it (as llama3.2-1B's)
L=(train --model llama --layers 4 --heads 2 --kv-heads 1 --width 32 --ffn-width 48 --block 16 --batch-size 2 --steps 3 --threads 1
   --dropout 0.1 --lr-schedule constant --warmup 0 --val-batches 2)
"$T" "${L[@]}" --accum 4 --save-weights "$TMP/l4.st" >/dev/null 2>&1 || echo "  llama reference M 4 failed"
"$T" "${L[@]}" --accum 5 --tie-embeddings on --save-weights "$TMP/lt5.st" >/dev/null 2>&1 || echo "  llama reference M 5 tied failed"
llama_as_one() { # REFERENCE P M SCHEDULE [options...]
  local ref=$1 P=$2 M=$3 S=$4; shift 4
  "$T" run -n "$P" -- tandem "${L[@]}" --pp "$P" --microbatches "$M" --schedule "$S" "$@" --save-weights "$TMP/lpp.st" \
    >"$TMP/out" 2>&1 || { tail -3 "$TMP/out"; return 1; }
  cmp -s "$TMP/$ref.st" "$TMP/lpp.st" || { echo "  the weights differ from one process's"; return 1; }
}
check "llama, 1f1b, 3 stages, 4 micro-batches: one process's weights" llama_as_one l4 3 4 1f1b
check "llama, interleaved, 2 stages x 2 chunks, 4 micro-batches: one process's weights" llama_as_one l4 2 4 interleaved
check "llama with a tied head, zb1p, 2 stages, 5 micro-batches: one process's weights" llama_as_one lt5 2 5 zb1p --tie-embeddings on
check "llama with a tied head, gpipe cut by hand (--pp-split 1,3): one process's weights" \
  llama_as_one lt5 2 5 gpipe --pp-split 1,3 --tie-embeddings on

llama_reshard() { # --pp 2 into one process and back: the uninterrupted run's bits (the tied head's copy is not saved)
  local one=("$T" "${L[@]}" --accum 2 --tie-embeddings on) pp=("$T" run -n 2 -- tandem "${L[@]}" --pp 2 --microbatches 2 --tie-embeddings on)
  rm -rf "$TMP/lc1" "$TMP/lcp"
  "${one[@]}" --steps 6 --save-weights "$TMP/lref6.st" >/dev/null 2>&1 &&
    "${one[@]}" --checkpoint-every 3 --checkpoint-dir "$TMP/lc1" >/dev/null 2>&1 &&
    "${pp[@]}" --checkpoint-every 3 --checkpoint-dir "$TMP/lcp" >"$TMP/out" 2>&1 || { tail -3 "$TMP/out"; return 1; }
  "$T" checkpoint consolidate "$TMP/lc1" "$TMP/lc1.st" --optimizer 2>/dev/null &&
    "$T" checkpoint consolidate "$TMP/lcp" "$TMP/lcp.st" --optimizer 2>/dev/null && cmp -s "$TMP/lc1.st" "$TMP/lcp.st" ||
    { echo "  consolidated, the --pp 2 checkpoint differs from one process's"; return 1; }
  "${one[@]}" --steps 6 --checkpoint-dir "$TMP/lcp" --resume --save-weights "$TMP/la.st" >"$TMP/out" 2>&1 &&
    grep -q "resharded to data parallel, 1 rank" "$TMP/out" && cmp -s "$TMP/la.st" "$TMP/lref6.st" ||
    { echo "  --pp 2 resumed on 1 process: not the uninterrupted run's weights"; tail -2 "$TMP/out"; return 1; }
  "${pp[@]}" --steps 6 --checkpoint-dir "$TMP/lc1" --resume --save-weights "$TMP/lb.st" >"$TMP/out" 2>&1 &&
    grep -q "resharded to pipeline 1f1b, 2 stages" "$TMP/out" && cmp -s "$TMP/lb.st" "$TMP/lref6.st" ||
    { echo "  1 process resumed at --pp 2: not the uninterrupted run's weights"; tail -2 "$TMP/out"; return 1; }
}
check "llama checkpoints: --pp 2 into 1 process and back (a tied head), the uninterrupted run's bits; consolidated, one process's state" \
  llama_reshard
check "llama: more stages than layers" refused "5 stages x 1 virtual stages = 5 chunks for a model of 4 blocks" \
  "$T" run -n 5 -- tandem "${L[@]}" --pp 5 --microbatches 5
check "llama: a --pp-split that does not add up" refused "--pp-split adds up to 5 blocks; the model has 4" \
  "$T" run -n 2 -- tandem "${L[@]}" --pp 2 --pp-split 2,3
check "llama: --tp beside --pp with a key/value head --tp cannot split" refused "1 key/value heads do not divide over --tp 2 ranks" \
  "$T" run -n 4 -- tandem "${L[@]}" --tp 2 --pp 2 --microbatches 2
check "a model with no blocks to cut" refused "--pp 2 cuts a transformer's blocks: it needs --model gpt or llama (given --model mlp)" \
  "$T" train --model mlp --data synthetic --pp 2

finish
