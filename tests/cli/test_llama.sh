#!/usr/bin/env bash
# The Llama model as a user meets it: training with Hugging Face's names and the architecture in
# the weights' metadata, generation from weights and checkpoints, the plan of Llama 3.2 1B, and
# configurations that cannot work refused with the value, what was expected and where.
# usage: test_llama.sh path/to/tandem
set -u
TANDEM=${1:?usage: test_llama.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"
export TANDEM_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
SMALL=(--model llama --layers 2 --heads 4 --kv-heads 2 --width 32 --ffn-width 48 --block 32 --seq-len 32 --batch-size 4
       --val-batches 2 --val-every 0)

expect_fail() {
  local code=$1 text=$2; shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [[ $rc -ne $code ]]; then echo "  exit $rc, expected $code: $*"; cat "$TMP/err"; return 1; fi
  grep -qF -- "$text" "$TMP/err" || { echo "  stderr lacks '$text':"; cat "$TMP/err"; return 1; }
}

meta() { # meta FILE KEY: a metadata value of a safetensors file
  python3 -c "import json,struct,sys; f=open(sys.argv[1],'rb'); n=struct.unpack('<Q',f.read(8))[0]; print(json.loads(f.read(n))['__metadata__'].get(sys.argv[2],''))" "$1" "$2"
}

train_and_names() {
  "$TANDEM" train "${SMALL[@]}" --steps 20 --save-weights "$TMP/l.st" --checkpoint-dir "$TMP/ck" >"$TMP/out" 2>"$TMP/err" ||
    { tail -3 "$TMP/err"; return 1; }
  grep -q "val loss" "$TMP/out" || return 1
  [[ $(meta "$TMP/l.st" architectures) == LlamaForCausalLM && $(meta "$TMP/l.st" num_key_value_heads) == 2 &&
     $(meta "$TMP/l.st" intermediate_size) == 48 && $(meta "$TMP/l.st" tie_word_embeddings) == false ]] ||
    { echo "  metadata: $(meta "$TMP/l.st" architectures) $(meta "$TMP/l.st" num_key_value_heads)"; return 1; }
  python3 - "$TMP/l.st" <<'PY' || return 1
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
want = {"model.embed_tokens.weight": [256, 32], "model.layers.1.self_attn.k_proj.weight": [16, 32],
        "model.layers.0.mlp.gate_proj.weight": [48, 32], "model.layers.1.post_attention_layernorm.weight": [32],
        "model.norm.weight": [32], "lm_head.weight": [256, 32]}
for k, v in want.items():
    assert h[k]["shape"] == v, (k, h.get(k))
assert not any("bias" in k for k in h), "Llama has no biases"
PY
}
check "train: Hugging Face's names, the architecture in the metadata" train_and_names

generates() {
  "$@" --prompt "ROMEO:" --tokens 20 --top-k 1 >"$TMP/gen" 2>"$TMP/err" || { cat "$TMP/err"; return 1; }
  [[ $(head -c 6 "$TMP/gen") == "ROMEO:" && $(wc -c <"$TMP/gen") -ge 26 ]] || { echo "  output: $(cat "$TMP/gen")"; return 1; }
}
check "generate: from the weights (key/value cache of grouped heads)" generates "$TANDEM" generate --weights "$TMP/l.st"
check "generate: from the checkpoint" generates "$TANDEM" generate --checkpoint "$TMP/ck"
same_text() {
  "$TANDEM" generate --weights "$TMP/l.st" --prompt "ROMEO:" --tokens 20 --top-k 1 >"$TMP/a" 2>&1 &&
  "$TANDEM" generate --checkpoint "$TMP/ck" --prompt "ROMEO:" --tokens 20 --top-k 1 >"$TMP/b" 2>&1 && cmp -s "$TMP/a" "$TMP/b"
}
check "generate: weights and checkpoint of one run write the same text" same_text
check "generate: GPT flags refused for a Llama file" expect_fail 2 "apply to GPT files only" \
  "$TANDEM" generate --weights "$TMP/l.st" --layers 2
strip_meta() { # a copy without metadata, as Hugging Face's own files are
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); data = f.read()
h.pop("__metadata__", None); b = json.dumps(h).encode(); b += b" " * ((8 - len(b) % 8) % 8)
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(b)) + b + data)
PY
}
strip_meta "$TMP/l.st" "$TMP/nometa.st"
check "generate: a Llama file without metadata needs --config" expect_fail 2 "give --config llama-mini or llama3.2-1B" \
  "$TANDEM" generate --weights "$TMP/nometa.st" --model llama
check "generate: --config's shapes against the file's" expect_fail 2 "model.embed_tokens.weight is (256, 32); the architecture needs (256, 256)" \
  "$TANDEM" generate --weights "$TMP/nometa.st" --model llama --config llama-mini

plan_1b() {
  local p
  p=$("$TANDEM" plan --model llama --config llama3.2-1B --batch-size 1 --seq-len 64 --json) || return 1
  grep -q '"params":1235814400,' <<<"$p" || { echo "  $p"; return 1; }
  "$TANDEM" plan --model llama --config llama3.2-1B --batch-size 1 --seq-len 64 | grep -q "1235814400 parameters"
}
check "plan: Llama 3.2 1B has 1.24 B parameters (tied)" plan_1b

check "bad input: key/value heads not dividing the heads" expect_fail 1 "3 key/value heads do not divide the 4 query heads" \
  "$TANDEM" train "${SMALL[@]}" --kv-heads 3 --steps 1
check "bad input: width not divisible by the heads" expect_fail 1 "3 heads do not divide the width 32" \
  "$TANDEM" train "${SMALL[@]}" --heads 3 --kv-heads 1 --steps 1
check "bad input: an odd head size for rotary embeddings" expect_fail 1 "the head size 9 (width 36 / 4 heads) is odd" \
  "$TANDEM" train "${SMALL[@]}" --width 36 --steps 1
check "bad input: llama options with gpt" expect_fail 2 "apply to --model llama only" \
  "$TANDEM" train --model gpt --kv-heads 2 --steps 1
check "bad input: a gpt config for llama" expect_fail 1 "--config 'gpt2-124M' with --model llama" \
  "$TANDEM" train --model llama --config gpt2-124M --steps 1
check "bad input: a llama config for gpt" expect_fail 1 "--config 'llama-mini' with --model gpt" \
  "$TANDEM" train --model gpt --config llama-mini --steps 1
recompute_same_weights() {
  local m
  for m in none block selective; do
    "$TANDEM" train "${SMALL[@]}" --steps 6 --dropout 0.2 --recompute $m --save-weights "$TMP/r_$m.st" >/dev/null 2>"$TMP/err" ||
      { tail -2 "$TMP/err"; return 1; }
  done
  cmp -s "$TMP/r_none.st" "$TMP/r_block.st" && cmp -s "$TMP/r_none.st" "$TMP/r_selective.st"
}
check "--recompute block and selective: the very same weights file (dropout on)" recompute_same_weights
check "bad input: --recompute with a model without blocks" expect_fail 1 "--recompute block with --model mlp" \
  "$TANDEM" train --model mlp --data synthetic --recompute block --steps 1
check "bench llama: a step of the small model" bash -c "\"$TANDEM\" bench llama --layers 2 --width 64 --ffn-width 96 --steps 2 --warmup 1 | grep -q 'tandem Llama step'"
# fp16's loss scaler through a checkpoint that reshards: saved by 2 ranks at ZeRO stage 2, resumed
# by 2 ranks of data parallelism; the scale (doubling every 2 clean steps, halved on an overflow)
# goes on where it was, so the resumed steps run at the uninterrupted run's scales and end at its
# weights bit for bit (each rank's f16 activations are those of the same samples in the same order).
FP16=("${SMALL[@]}" --precision fp16 --loss-scale-window 2 --schedule constant --warmup 0 --seed 5)
scales() { # scales METRICS: "step:scale" of each step record
  python3 -c "import json,sys; print(' '.join('%d:%g' % (r['step'], r['loss_scale']) for r in map(json.loads, open(sys.argv[1])) if 'loss_scale' in r))" "$1"
}
fp16_resume() {
  local out="$TMP/fp16.log"
  timeout 120 "$TANDEM" run -n 2 -- tandem train "${FP16[@]}" --batch-size 2 --zero 2 --steps 8 --metrics "$TMP/full.jsonl" \
    --save-weights "$TMP/full16.st" >"$out" 2>&1 &&
  timeout 120 "$TANDEM" run -n 2 -- tandem train "${FP16[@]}" --batch-size 2 --zero 2 --steps 4 --checkpoint-dir "$TMP/ck16" >"$out" 2>&1 &&
  timeout 120 "$TANDEM" run -n 2 -- tandem train "${FP16[@]}" --batch-size 2 --steps 8 --checkpoint-dir "$TMP/ck16" --resume --metrics "$TMP/res.jsonl" \
    --save-weights "$TMP/res16.st" >"$out" 2>&1 || { tail -3 "$out"; return 1; }
  grep -q "resumed from step 4" "$out" || { echo "  not resumed: $(tail -2 "$out")"; return 1; }
  local full res
  full=$(scales "$TMP/full.jsonl") res=$(scales "$TMP/res.jsonl")
  echo "  uninterrupted: $full; resumed: $res"
  [[ -n $res && " $full" == *" $res" ]] || { echo "  the resumed steps' scales differ"; return 1; }
  [[ $(meta "$(ls "$TMP"/ck16/ckpt-*.safetensors | tail -1)" tandem.loss_scale) == 262144 ]] || { echo "  manifest scale $(meta "$(ls "$TMP"/ck16/ckpt-*.safetensors | tail -1)" tandem.loss_scale)"; return 1; }
  "$TANDEM" weights-diff "$TMP/full16.st" "$TMP/res16.st" --rtol 0 --quiet >"$out" 2>&1 || { echo "  weights:"; tail -3 "$out"; return 1; }
}
check "fp16: the loss scaler saved by 2 ranks at stage 2, resumed at stage 0: the same scales, the same weights bit for bit" fp16_resume
check "bad input: loss-scale flags without fp16" expect_fail 2 "apply to --precision fp16 only (given --precision bf16)" \
  "$TANDEM" train "${SMALL[@]}" --precision bf16 --loss-scale-window 10 --steps 1
check "bad input: --precision with the CNN" expect_fail 1 "--precision bf16 with --model cnn" \
  "$TANDEM" train --model cnn --data synthetic --precision bf16 --steps 1
check "bad input: --precision with the ResNet" expect_fail 1 "--precision fp16 with --model resnet" \
  "$TANDEM" train --model resnet --width 4 --data synthetic --precision fp16 --steps 1
check "bad input: --recompute with the ResNet" expect_fail 1 "--recompute block with --model resnet" \
  "$TANDEM" train --model resnet --width 4 --data synthetic --recompute block --steps 1
check "bad input: image augmentation with Llama" expect_fail 1 "--flip with model llama: augmentation needs image inputs" \
  "$TANDEM" train "${SMALL[@]}" --flip --steps 1
smooth_16() { # label smoothing under bf16 / fp16 (its op reads f32: the logits widened) trains as f32 does
  local p l0 l
  for p in fp32 bf16 fp16; do
    "$TANDEM" train --model mlp --data synthetic --label-smoothing 0.1 --precision $p --steps 2 --metrics "$TMP/ls_$p.jsonl" \
      >"$TMP/out" 2>"$TMP/err" || { echo "  $p:"; tail -3 "$TMP/err"; return 1; }
  done
  l0=$(grep -m1 '"step_time_ms"' "$TMP/ls_fp32.jsonl" | grep -o '"loss":[0-9.e+-]*' | cut -d: -f2)
  for p in bf16 fp16; do
    l=$(grep -m1 '"step_time_ms"' "$TMP/ls_$p.jsonl" | grep -o '"loss":[0-9.e+-]*' | cut -d: -f2)
    echo "  step 0 loss: fp32 $l0, $p $l"
    awk -v a="$l0" -v b="$l" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.01 * a) }' || return 1
  done
}
check "mlp: --label-smoothing with --precision bf16 and fp16: step 0's loss within 1% of fp32's" smooth_16
check "bad input: label smoothing with Llama" expect_fail 1 "--label-smoothing 0.1 with model llama" \
  "$TANDEM" train "${SMALL[@]}" --label-smoothing 0.1 --steps 1
finish
