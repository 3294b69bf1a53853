#!/usr/bin/env bash
# Checkpoints and restarts: a run stopped after step s and resumed ends bit-identical to an
# uninterrupted one (1 process, and 2 ranks restarted by tandem run --max-restarts); a corrupt
# newest checkpoint is refused and the previous good one used; a changed world size is refused.
# usage: test_ckpt.sh path/to/tandem
set -u
T=${1:?usage: test_ckpt.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"
A=(train --steps 12 --threads 1 --seed 5 --batch-size 32)

one_process() {
  "$T" "${A[@]}" --save-weights "$TMP/full1.st" >/dev/null 2>&1 || return 1
  TANDEM_FAULT=0:7 "$T" "${A[@]}" --checkpoint-dir "$TMP/c1" --checkpoint-every 5 >/dev/null 2>&1
  [[ $? -eq 3 ]] || { echo "  the fault did not fire"; return 1; }
  "$T" "${A[@]}" --checkpoint-dir "$TMP/c1" --resume --save-weights "$TMP/res1.st" >"$TMP/out" 2>&1 &&
    grep -q "resumed from step 5" "$TMP/out" && cmp -s "$TMP/full1.st" "$TMP/res1.st"
}
check "stopped after step 7, resumed from step 5: bit-identical to an uninterrupted run" one_process

restarts() {
  "$T" run -n 2 -- tandem "${A[@]}" --save-weights "$TMP/full2.st" >/dev/null 2>&1 || return 1
  TANDEM_FAULT=1:8 "$T" run -n 2 --max-restarts 2 -- tandem "${A[@]}" --checkpoint-dir "$TMP/c2" --checkpoint-every 3 \
    --resume --save-weights "$TMP/res2.st" >"$TMP/out" 2>&1 || { tail -5 "$TMP/out"; return 1; }
  grep -q "restarting all 2 ranks (restart 1 of 2)" "$TMP/out" && grep -q "resumed from step 6" "$TMP/out" &&
    cmp -s "$TMP/full2.st" "$TMP/res2.st"
}
check "tandem run --max-restarts: rank 1 dies, the group restarts and resumes, bit-identical" restarts

corrupt() {
  rm -rf "$TMP/c3"
  "$T" "${A[@]}" --checkpoint-dir "$TMP/c3" --checkpoint-every 4 --steps 8 >/dev/null 2>&1 || return 1
  local newest; newest=$(ls "$TMP/c3"/ckpt-*.safetensors | sort | tail -1)
  printf '\x55' | dd of="$newest" bs=1 seek=$(( $(stat -c %s "$newest") - 100 )) conv=notrunc 2>/dev/null
  "$T" "${A[@]}" --checkpoint-dir "$TMP/c3" --resume --save-weights "$TMP/res3.st" >"$TMP/out" 2>&1 || { cat "$TMP/out"; return 1; }
  grep -q "checksum mismatch" "$TMP/out" && grep -q "resumed from step 4" "$TMP/out" && cmp -s "$TMP/full1.st" "$TMP/res3.st"
}
check "a corrupt newest checkpoint: refused with its reason, the previous one used, same result" corrupt

world_size() {
  "$T" "${A[@]}" --checkpoint-dir "$TMP/c2" --resume >"$TMP/out" 2>&1
  [[ $? -eq 1 ]] && grep -q "written by 2 ranks; this run has 1" "$TMP/out"
}
check "resuming with another number of ranks is refused" world_size
check "--resume needs --checkpoint-dir" bash -c "\"$T\" train --resume 2>&1 | grep -q 'needs --checkpoint-dir'"
finish
