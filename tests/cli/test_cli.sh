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
# options of another model, optimizer or data set are refused, not ignored
check "--layers with the mlp" expect_fail 2 "--layers applies to --model gpt or llama (given --model mlp)" "$TANDEM" train --layers 2
check "--width with the cnn" expect_fail 2 "--width applies to --model gpt, llama or resnet (given --model cnn)" "$TANDEM" train --model cnn --width 8
check "--momentum with adam" expect_fail 2 "--momentum applies to --optimizer sgd (given --optimizer adam)" "$TANDEM" train --momentum 0.9
check "--sync-bn with the mlp" expect_fail 1 "--sync-bn with model mlp, which has no batch norm" "$TANDEM" train --sync-bn
check "--compress bf16 with --pp (the pipeline reduces f32: it was ignored)" expect_fail 2 \
  "--compress bf16 with --pp 2: the pipeline reduces the data axis's gradients in f32 only" "$TANDEM" train --model gpt --pp 2 --compress bf16
address_space_limit() { # ulimit -v below what OpenBLAS's buffers need: a hang in its allocation (and at exit) before
  # (AddressSanitizer cannot start under ulimit -v at all: its shadow memory is terabytes of address space)
  if nm -C "$TANDEM" 2>/dev/null | grep -q __asan_init; then echo "  (a sanitized build: not applicable)"; return 0; fi
  ( ulimit -v 300000; timeout 60 "$TANDEM" train --model mlp --data synthetic --steps 2 --threads 1 ) >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [[ $rc -eq 1 ]] && grep -q "the address-space limit (ulimit -v) is 293 MiB; this run maps about" "$TMP/err" || { echo "  exit $rc"; cat "$TMP/err"; return 1; }
}
check "an address-space limit below the run's: refused naming both, no hang" address_space_limit
check "--data mnist without --data-dir" expect_fail 2 "--data mnist reads its files from --data-dir" "$TANDEM" train --data mnist

# Outputs are written beside their name and renamed over it: a FIFO (or /dev/null) would be
# replaced. Refused before the first step, and the node is left as it was.
save_weights_to_fifo() {
  mkfifo "$TMP/out-fifo" || return 1
  expect_fail 1 "--save-weights $TMP/out-fifo is a FIFO" "$TANDEM" train --steps 2 --threads 1 --save-weights "$TMP/out-fifo" ||
    return 1
  [[ -p $TMP/out-fifo ]] || { echo "  the FIFO was replaced"; return 1; }
  ! grep -q "step 1" "$TMP/out" "$TMP/err" || { echo "  a step ran before the refusal"; return 1; }
}
check "--save-weights onto a FIFO is refused before the first step, the FIFO kept" save_weights_to_fifo
init_weights_nan() { # a NaN in the initial weights is named at load, not blamed on the learning rate after step 1
  "$TANDEM" train --steps 1 --threads 1 --save-weights "$TMP/w1.st" >/dev/null 2>&1 || return 1
  python3 - "$TMP/w1.st" "$TMP/wnan.st" <<'PYEOF2' || return 1
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read()); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
o = 8 + n + h["layers.0.bias"]["data_offsets"][0] + 4 * 5
b[o:o + 4] = struct.pack("<f", float("nan")); open(sys.argv[2], "wb").write(b)
PYEOF2
  expect_fail 1 "--init-weights $TMP/wnan.st: 'layers.0.bias' holds a non-finite value (element 5)" \
    "$TANDEM" train --steps 1 --threads 1 --init-weights "$TMP/wnan.st"
}
check "--init-weights holding a NaN: named at load" init_weights_nan
labels_beyond_training() { # a test label the model has no output for: refused at start, naming the data; the reverse warned
  python3 - "$TMP" <<'PYEOF2' || return 1
import os, struct, sys
def idx(path, dims, data):
    with open(path, "wb") as f:
        f.write(struct.pack(">HBB", 0, 8, len(dims)) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data))
for d, trl, tel in (("lab1", [i % 10 for i in range(64)], [i % 10 for i in range(9)] + [12]),
                    ("lab2", [i % 10 for i in range(63)] + [42], [i % 10 for i in range(10)])):
    d = os.path.join(sys.argv[1], d); os.makedirs(d)
    idx(d + "/train-images-idx3-ubyte", (64, 4, 4), [7] * 64 * 16); idx(d + "/train-labels-idx1-ubyte", (64,), trl)
    idx(d + "/t10k-images-idx3-ubyte", (10, 4, 4), [7] * 160); idx(d + "/t10k-labels-idx1-ubyte", (10,), tel)
PYEOF2
  expect_fail 1 "$TMP/lab1: the test labels go up to 12 but the training labels only to 9" \
    "$TANDEM" train --data-dir "$TMP/lab1" --steps 1 --batch-size 8 --threads 1 || return 1
  ! grep -q "step 1" "$TMP/out" || { echo "  a step ran first"; return 1; }
  "$TANDEM" train --data-dir "$TMP/lab2" --steps 1 --batch-size 8 --threads 1 >"$TMP/out" 2>&1 &&
    grep -q "the training labels go up to 42, the test labels to 9: the model gets 43 outputs" "$TMP/out" || { cat "$TMP/out"; return 1; }
}
check "test labels beyond the training set's classes: refused before step 1; a stray training label warned" labels_beyond_training
check "--save-weights and --metrics on one file" expect_fail 1 "--save-weights and --metrics are both" \
  "$TANDEM" train --steps 2 --threads 1 --save-weights "$TMP/same" --metrics "$TMP/same"

metrics_and_weights() {
  "$TANDEM" train --steps 30 --threads 1 --metrics "$TMP/m.jsonl" --save-weights "$TMP/w.safetensors" \
    >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; return 1; }
  grep -q "test accuracy" "$TMP/out" || return 1
  [[ $(grep -c '"step_time_ms"' "$TMP/m.jsonl") -eq 30 ]] || { echo "  expected 30 step records"; return 1; }
  for k in step loss samples_per_sec step_time_ms time_forward_ms time_backward_ms time_optimizer_ms; do
    grep -m1 "\"step_time_ms\"" "$TMP/m.jsonl" | grep -q "\"$k\":" || { echo "  step record lacks $k"; return 1; }
  done
  grep -q '"test_accuracy":0\.[0-9]' "$TMP/m.jsonl" || { echo "  no evaluation record"; return 1; }
  for k in parameters gradients optimizer activations data workspace total; do # the measured peaks, last (no communication: one process)
    tail -1 "$TMP/m.jsonl" | grep -q "\"memory_peak\":{.*\"$k\":[1-9]" || { echo "  the last record lacks the peak of $k"; return 1; }
  done
  tail -2 "$TMP/m.jsonl" | head -1 | grep -q '"test_loss":' || return 1
  # the weights file starts with a little-endian header length and a JSON header naming the layers
  head -c 400 "$TMP/w.safetensors" | grep -aq '"layers.0.weight":{"dtype":"F32","shape":\[512,784\]' ||
    { echo "  weights header unexpected"; return 1; }
  # and loads back as initial weights
  "$TANDEM" train --steps 1 --lr 0 --threads 1 --init-weights "$TMP/w.safetensors" >/dev/null 2>&1
}
check "metrics JSON lines and safetensors weights" metrics_and_weights

# ---- files written with the shell alone, so the cases below need no Python and no training -------
# st_file PATH HEADER-JSON DATA-BYTES [random]: a safetensors file; the data is zeros (or random)
st_file() {
  local len=${#2}
  { printf "$(printf '\\x%02x' $((len & 255)) $(((len >> 8) & 255)) $(((len >> 16) & 255)) 0 0 0 0 0)"
    printf '%s' "$2"
    head -c "$3" "${4:+/dev/urandom}${4:-/dev/zero}"; } >"$1"
}
# gpt_file PATH LAYERS WIDTH BLOCK VOCAB [METADATA-JSON] [EXTRA...]: a GPT in nanoGPT's names with zero
# weights (all logits equal). EXTRA: "lm_head" (tied: equal to wte), "mask" (attn.bias buffers).
gpt_file() {
  local path=$1 L=$2 C=$3 B=$4 V=$5 meta=${6:-} h="{" off=0 l p x
  shift 6 2>/dev/null || shift $#
  [[ -n $meta ]] && h+="\"__metadata__\":$meta,"
  t() { local name=$1 n=4 s="" d; shift; for d in "$@"; do n=$((n * d)); s+="${s:+,}$d"; done
        h+="\"$name\":{\"dtype\":\"F32\",\"shape\":[$s],\"data_offsets\":[$off,$((off + n))]},"; off=$((off + n)); }
  t transformer.wte.weight "$V" "$C"; t transformer.wpe.weight "$B" "$C"
  for ((l = 0; l < L; l++)); do p=transformer.h.$l
    t $p.ln_1.weight "$C"; t $p.ln_1.bias "$C"; t $p.attn.c_attn.weight $((3 * C)) "$C"; t $p.attn.c_attn.bias $((3 * C))
    t $p.attn.c_proj.weight "$C" "$C"; t $p.attn.c_proj.bias "$C"; t $p.ln_2.weight "$C"; t $p.ln_2.bias "$C"
    t $p.mlp.c_fc.weight $((4 * C)) "$C"; t $p.mlp.c_fc.bias $((4 * C)); t $p.mlp.c_proj.weight "$C" $((4 * C))
    t $p.mlp.c_proj.bias "$C"
  done
  t transformer.ln_f.weight "$C"; t transformer.ln_f.bias "$C"
  for x in "$@"; do
    [[ $x == lm_head ]] && t lm_head.weight "$V" "$C"
    if [[ $x == mask ]]; then for ((l = 0; l < L; l++)); do t transformer.h.$l.attn.bias 1 1 "$B" "$B"; done; fi
  done
  st_file "$path" "${h%,}}" "$off"
}
META='{"n_layer":"1","n_head":"2","n_embd":"8","block_size":"8","vocab_size":"100"}'
ARCH=(--layers 1 --heads 2 --width 8 --block 8 --vocab 100)

# ---- data that is not a regular file: refused at once, saying why --------------------------------------
pipe_data() { # --data-path /dev/stdin with a pipe on stdin, and a FIFO nobody writes to
  printf 'hello, world' | "$TANDEM" train --model gpt --data-path /dev/stdin --steps 1 >"$TMP/out" 2>"$TMP/err"
  [[ $? -eq 1 ]] && grep -q "not a regular file but a FIFO or pipe" "$TMP/err" || { cat "$TMP/err"; return 1; }
  mkfifo "$TMP/fifo" || return 1
  timeout 30 "$TANDEM" train --model gpt --data-path "$TMP/fifo" --steps 1 >"$TMP/out" 2>"$TMP/err"
  [[ $? -eq 1 ]] && grep -q "fifo: not a regular file but a FIFO or pipe" "$TMP/err" || { cat "$TMP/err"; return 1; }
  timeout 30 "$TANDEM" generate --weights "$TMP/fifo" >"$TMP/out" 2>"$TMP/err"
  [[ $? -eq 1 ]] && grep -q "fifo: not a regular file but a FIFO or pipe" "$TMP/err" || { cat "$TMP/err"; return 1; }
}
check "a pipe or FIFO as data or weights is refused, never waited on" pipe_data

# ---- tandem generate --------------------------------------------------------------------------------
gpt_file "$TMP/g100.st" 1 8 8 100 "$META"
gpt_file "$TMP/nano.st" 1 8 8 100
gpt_file "$TMP/nano_extra.st" 1 8 8 100 "" lm_head mask
check "generate: empty prompt" expect_fail 2 "--prompt is empty" "$TANDEM" generate --weights "$TMP/g100.st" --prompt ""
check "generate: prompt byte outside the vocabulary" expect_fail 2 \
  "byte 200 (0xc8) at position 2 is outside the model's vocabulary of 100 tokens" \
  "$TANDEM" generate --weights "$TMP/g100.st" --prompt "ab$(printf '\xc8')"
generates() { # the prompt, then N tokens and a newline on stdout, exit 0
  "$@" --prompt "ab" --tokens 5 >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; return 1; }
  [[ $(head -c 2 "$TMP/out") == ab && $(wc -c <"$TMP/out") -eq 8 ]] || { echo "  output:"; od -c "$TMP/out" | head -3; return 1; }
}
check "generate: tandem's file with metadata" generates "$TANDEM" generate --weights "$TMP/g100.st"
check "generate: nanoGPT file without metadata, architecture from the flags" \
  generates "$TANDEM" generate --weights "$TMP/nano.st" "${ARCH[@]}"
check "generate: nanoGPT file with a tied lm_head and attn.bias masks" \
  generates "$TANDEM" generate --weights "$TMP/nano_extra.st" "${ARCH[@]}"
check "generate: file without metadata, flags missing are listed" expect_fail 2 \
  "nano.st has no 'n_head' in its metadata (not written by tandem train --model gpt; nanoGPT's?): give --heads N --block N" \
  "$TANDEM" generate --weights "$TMP/nano.st" --layers 1 --width 8 --vocab 100
check "generate: a flag contradicting the metadata names both" expect_fail 2 \
  "g100.st says n_embd = 8, the command line 16: --width contradicts the file's metadata" \
  "$TANDEM" generate --weights "$TMP/g100.st" --width 16
check "generate: flags contradicting the file's shapes" expect_fail 2 \
  "transformer.wte.weight is (100, 8); the architecture (vocab 100, block 8, width 16) needs (100, 16)" \
  "$TANDEM" generate --weights "$TMP/nano.st" --layers 1 --heads 2 --width 16 --block 8 --vocab 100
check "generate: too many layers given" expect_fail 2 "does not hold 2 layers (transformer.h.1.ln_1.weight is missing)" \
  "$TANDEM" generate --weights "$TMP/nano.st" --layers 2 --heads 2 --width 8 --block 8 --vocab 100
gpt_file "$TMP/badmeta.st" 1 8 8 100 '{"n_layer":"1x","n_head":"2","n_embd":"8","block_size":"8","vocab_size":"100"}'
check "generate: metadata that is not an integer" expect_fail 1 "metadata n_layer = '1x' is not an integer in 1..1000" \
  "$TANDEM" generate --weights "$TMP/badmeta.st"
logits_bad_path() { # refused before any text is generated
  expect_fail 1 "--logits-out: $TMP/none/l.st: cannot create" "$TANDEM" generate --weights "$TMP/g100.st" \
    --logits-out "$TMP/none/l.st" || return 1
  [[ ! -s $TMP/out ]] || { echo "  generated text before failing"; return 1; }
  expect_fail 1 "is a directory" "$TANDEM" generate --weights "$TMP/g100.st" --logits-out "$TMP"
}
check "generate: --logits-out to a bad path fails first" logits_bad_path
logits_written() {
  "$TANDEM" generate --weights "$TMP/g100.st" --prompt abc --tokens 0 --logits-out "$TMP/l.st" >/dev/null || return 1
  head -c 200 "$TMP/l.st" | grep -aq '"logits":{"dtype":"F32","shape":\[3,100\]'
}
check "generate: --logits-out writes (prompt, vocab) logits" logits_written
check "generate: --tokens must be an integer" expect_fail 2 "--tokens: '1e3' is not an integer" \
  "$TANDEM" generate --weights "$TMP/g100.st" --tokens 1e3
check "generate: --temperature nan" expect_fail 2 "--temperature: 'nan' is not a number" \
  "$TANDEM" generate --weights "$TMP/g100.st" --temperature nan

# ---- tandem bench (one process) -----------------------------------------------------------------------
check "bench: -b 1e30" expect_fail 2 "-b: '1e30' is not a size in bytes" "$TANDEM" bench allreduce -b 1e30
check "bench: -b nan" expect_fail 2 "-b: 'nan' is not a size in bytes" "$TANDEM" bench allreduce -b nan
check "bench: -e beyond 1 TiB" expect_fail 2 "-e: 2T is out of range; expected 0..1099511627776 bytes" \
  "$TANDEM" bench allreduce -e 2T
check "bench: -n 99999999999999999999" expect_fail 2 "-n: 99999999999999999999 is out of range; expected 1..1000000000" \
  "$TANDEM" bench allreduce -n 99999999999999999999
check "bench: -f 1e300" expect_fail 2 "-f: '1e300' is not an integer" "$TANDEM" bench allreduce -f 1e300
check "bench: -f 2^61 (its product overflowed)" expect_fail 2 "-f: 2305843009213693952 is out of range" \
  "$TANDEM" bench allreduce -b 8 -e 64 -f 2305843009213693952
check "bench: -c 2" expect_fail 2 "-c: 2 is out of range; expected 0..1" "$TANDEM" bench allreduce -c 2
check "bench: -w with junk" expect_fail 2 "-w: '5x' is not an integer" "$TANDEM" bench allreduce -w 5x
check "bench: -J to a bad path" expect_fail 1 "-J $TMP/none/b.json: cannot create" \
  "$TANDEM" bench allreduce -e 64 -J "$TMP/none/b.json"
bench_rows() { # -b 1.5K with the largest factor: exactly one row, of 1536 bytes
  "$TANDEM" bench allreduce -b 1.5K -e 2K -f 1099511627776 -n 1 -w 0 -J "$TMP/b.json" >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; return 1; }
  [[ $(grep -vc '^#' "$TMP/out") -eq 1 ]] && grep -q '^ *1536 ' "$TMP/out" && grep -q '"size":1536' "$TMP/b.json"
}
check "bench: fractional sizes and a huge factor" bench_rows
check "bench: sizes that hold no element" expect_fail 2 "-e 3 bytes holds no element of double (8 bytes)" \
  "$TANDEM" bench allreduce -b 3 -e 3 -d double
bench_sub_element() { # sizes below a float move nothing: one row of 0 bytes, then 4 and 8
  "$TANDEM" bench allreduce -b 1 -e 8 -n 1 -w 0 >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; return 1; }
  [[ $(grep -v '^#' "$TMP/out" | awk '{print $1}' | tr '\n' ' ') == "0 4 8 " ]] || { cat "$TMP/out"; return 1; }
}
check "bench: sizes below an element give one row" bench_sub_element
check "bench: buffers beyond the machine's memory" expect_fail 2 "-e 1099511627776 bytes needs 2 x 1024.0 GiB of buffers on every rank" \
  "$TANDEM" bench allreduce -b 8 -e 1T
check "bench gpt: --width above its bound" expect_fail 2 "--width: 100000 is out of range; expected 0..65536" \
  "$TANDEM" bench gpt --width 100000

# ---- tandem weights-diff ----------------------------------------------------------------------------------
st_file "$TMP/a.st" '{"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}' 24
st_file "$TMP/b.st" '{"x":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]}}' 24
st_file "$TMP/c.st" '{"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"y":{"dtype":"I32","shape":[1],"data_offsets":[24,28]}}' 28
check "weights-diff: --rtol abc" expect_fail 2 "--rtol: 'abc' is not a number" "$TANDEM" weights-diff "$TMP/a.st" "$TMP/a.st" --rtol abc
check "weights-diff: --rtol nan" expect_fail 2 "--rtol: 'nan' is not a number" "$TANDEM" weights-diff "$TMP/a.st" "$TMP/a.st" --rtol nan
check "weights-diff: same file" bash -c "\"$TANDEM\" weights-diff \"$TMP/a.st\" \"$TMP/a.st\" | grep -q ': same$'"
shapes_differ() { # same bytes, other shape: different, and it says which
  "$TANDEM" weights-diff "$TMP/a.st" "$TMP/b.st" >"$TMP/out" 2>&1; [[ $? -eq 1 ]] || { cat "$TMP/out"; return 1; }
  grep -q "x: f32 (2, 3) in $TMP/a.st, f32 (3, 2) in $TMP/b.st" "$TMP/out" || { cat "$TMP/out"; return 1; }
  "$TANDEM" weights-diff "$TMP/a.st" "$TMP/c.st" >"$TMP/out" 2>&1; [[ $? -eq 1 ]] || { cat "$TMP/out"; return 1; }
  grep -q "y: only in $TMP/c.st (i32 (1))" "$TMP/out" || { cat "$TMP/out"; return 1; }
}
check "weights-diff: names, dtypes and shapes compared" shapes_differ
# values: a NaN against a number is a difference wherever it stands, and an inf in both files
# does not hide the differences beside it (it is no scale for them)
st_values() { # PATH v1 v2 ...: one f32 tensor "x"
  python3 - "$@" <<'PYEOF2'
import json, struct, sys
v = [float(a) for a in sys.argv[2:]]
h = json.dumps({"x": {"dtype": "F32", "shape": [len(v)], "data_offsets": [0, 4 * len(v)]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<%df" % len(v), *v))
PYEOF2
}
nonfinite_values() {
  st_values "$TMP/v0.st" 0 1 2 3 && st_values "$TMP/vnan.st" nan 1 2 3 && st_values "$TMP/vinf0.st" inf 1 2 3 &&
    st_values "$TMP/vinf1.st" inf 1 2 4 || return 1
  local pair
  for pair in "v0 vnan" "vnan v0" "vinf0 vinf1"; do
    set -- $pair
    "$TANDEM" weights-diff "$TMP/$1.st" "$TMP/$2.st" --rtol 1e-3 >"$TMP/out" 2>&1
    [[ $? -eq 1 ]] && grep -q ": DIFFERENT$" "$TMP/out" || { echo "  $1 against $2:"; cat "$TMP/out"; return 1; }
  done
  "$TANDEM" weights-diff "$TMP/vnan.st" "$TMP/vnan.st" | grep -q ': same$' # equal bytes: a NaN equals itself
}
check "weights-diff: a NaN or an inf never makes two files the same" nonfinite_values

finish
