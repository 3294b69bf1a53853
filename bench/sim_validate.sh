#!/usr/bin/env bash
# The simulator's validation (docs/PERFORMANCE.md, "Simulator: predicted against measured"):
#   collectives  every all-reduce algorithm (ring, rd, rhd, tree, direct), 1 KiB - 64 MiB, 2, 3, 4
#                and 8 ranks over tcp with TANDEM_NET_EMULATE=100us,1gbps: tandem bench measures,
#                tandem simulate --collectives predicts from a calibration at the same world size
#   training     data-parallel training of the MLP and GPT mini at 1, 2 and 4 ranks, emulated
#                100us,1gbps and 100us,10gbps: the median step of tandem train's metrics against
#                tandem simulate's step, from a calibration at that world size (tandem run -n N
#                tandem simulate --calibrate: every rank's step measured at once, the links)
# Errors are |predicted - measured| / measured; mean and max per group, as Calculon reports.
# usage: bench/sim_validate.sh [collectives|training|all]   (repository root, build/tandem built)
# Runs under nice; OUT (default /tmp/sim-validate) keeps every file.
set -u
T=${T:-$PWD/build/tandem}
OUT=${OUT:-/tmp/sim-validate}
WHAT=${1:-all}
mkdir -p "$OUT"
N() { nice -n 19 "$@"; }

calibrate() { # calibrate N EMU OUTFILE [BASE]: the links at N ranks over tcp, emulated
  local n=$1 emu=$2 out=$3 base=${4:-}
  TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=$emu N timeout 300 "$T" run -n "$n" -- "$T" simulate --calibrate --no-compute \
    --calibrate-max 4M ${base:+--cluster "$base"} -o "$out" 2>&1 | grep 'link:' | sed 's/^\[rank 0\] //'
}

collectives() {
  local emu=100us,1gbps
  : >"$OUT/coll.tsv"
  for n in 2 3 4 8; do
    for a in ring rd rhd tree direct; do
      # calibrated just before: the machine's load drifts over the minutes a world size takes
      calibrate $n $emu "$OUT/coll-c$n.json"
      N "$T" simulate --collectives --cluster "$OUT/coll-c$n.json" --ranks $n --min-bytes 1K --max-bytes 64M --json >"$OUT/coll-p$n.json"
      TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=$emu N timeout 900 "$T" run -n $n -- "$T" bench allreduce -b 1K -e 64M -f 4 \
        -n 3 -w 1 -c 0 -a $a -J "$OUT/coll-m$n-$a.json" >/dev/null 2>&1 || { echo "bench $a at $n ranks failed"; continue; }
      /usr/bin/python3 - "$OUT/coll-m$n-$a.json" "$OUT/coll-p$n.json" $a $n >>"$OUT/coll.tsv" <<'EOF'
import json, sys
pred = {}
for line in open(sys.argv[2]):
    r = json.loads(line)
    if r["algo"] == sys.argv[3]: pred[r["bytes"]] = r["allreduce_s"]
for r in json.load(open(sys.argv[1])):
    print("%s\t%s\t%d\t%.6e\t%.6e" % (sys.argv[3], sys.argv[4], r["size"], r["time_us"] * 1e-6, pred[r["size"]]))
EOF
      echo "done: $a at $n ranks"
    done
  done
  /usr/bin/python3 - "$OUT/coll.tsv" <<'EOF'
import sys, collections
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
groups = collections.OrderedDict()
for a, n, size, m, p in rows:
    e = abs(float(p) - float(m)) / float(m)
    for key in (a, "ranks %s" % n, "all"):
        groups.setdefault(key, []).append(e)
print("| group | points | mean error | max error |\n|---|---:|---:|---:|")
for k, v in groups.items():
    print("| %s | %d | %.1f%% | %.1f%% |" % (k, len(v), 100 * sum(v) / len(v), 100 * max(v)))
print("\n| algo | ranks | bytes | measured | predicted | error |\n|---|---:|---:|---:|---:|---:|")
for a, n, size, m, p in rows:
    m, p = float(m), float(p)
    print("| %s | %s | %s | %.3f ms | %.3f ms | %+.0f%% |" % (a, n, size, m * 1e3, p * 1e3, 100 * (p - m) / m))
EOF
}

median_step() { # median step_time_ms of rank 0's steps from the 5th
  /usr/bin/python3 -c '
import json, sys, statistics
v = [json.loads(l)["step_time_ms"] for l in open(sys.argv[1]) if "step_time_ms" in l and json.loads(l)["step"] >= 4]
print(statistics.median(v) * 1e-3)' "$1"
}

training() {
  : >"$OUT/train.tsv"
  local MLP=(--model mlp --data synthetic --batch-size 64 --steps 40 --threads 1)
  local GPT=(--model gpt --batch-size 2 --seq-len 64 --steps 14 --threads 1 --val-every 0 --val-batches 1)
  for model in mlp gpt; do
    local -n args=${model^^}
    local cs=10
    [[ $model == gpt ]] && cs=6
    # one rank: the compute measured alone, then the run
    N "$T" simulate --calibrate "${args[@]}" --calibrate-steps $cs --calibrate-max 64K -o "$OUT/train-c-$model-1.json" | grep compute
    N "$T" train "${args[@]}" --metrics "$OUT/train-m-$model-1.jsonl" >/dev/null 2>&1
    local m p
    m=$(median_step "$OUT/train-m-$model-1.jsonl")
    p=$(N "$T" simulate "${args[@]}" --cluster "$OUT/train-c-$model-1.json" --ranks 1 --json | /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["step_s"])')
    printf '%s\t-\t1\t%s\t%s\n' $model "$m" "$p" >>"$OUT/train.tsv"
    echo "done: $model 1: measured $m s, predicted $p s"
    for emu in 100us,1gbps 100us,10gbps; do
      for n in 2 4; do
        # N ranks: every rank's step measured at once (as they share the cores), the links at N ranks
        local c="$OUT/train-c-$model-$emu-$n.json"
        TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=$emu N timeout 900 "$T" run -n $n -- "$T" simulate --calibrate "${args[@]}" \
          --calibrate-steps $cs --calibrate-max 4M -o "$c" 2>&1 | grep -E 'compute:|link:' | sed 's/^\[rank 0\] //'
        TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=$emu N timeout 900 "$T" run -n $n -- "$T" train "${args[@]}" \
          --metrics "$OUT/train-m-$model-$emu-$n.jsonl" >/dev/null 2>&1 || { echo "train $model $emu $n failed"; continue; }
        m=$(median_step "$OUT/train-m-$model-$emu-$n.jsonl")
        p=$(N "$T" simulate "${args[@]}" --cluster "$c" --ranks $n --json | /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["step_s"])')
        printf '%s\t%s\t%d\t%s\t%s\n' $model $emu $n "$m" "$p" >>"$OUT/train.tsv"
        echo "done: $model $emu $n: measured $m s, predicted $p s"
      done
    done
  done
  /usr/bin/python3 - "$OUT/train.tsv" <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print("| model | network | ranks | measured step | predicted step | error |\n|---|---|---:|---:|---:|---:|")
errs = {}
for model, emu, n, m, p in rows:
    m, p = float(m), float(p)
    e = (p - m) / m
    errs.setdefault(model, []).append(abs(e)); errs.setdefault("all", []).append(abs(e))
    print("| %s | %s | %s | %.1f ms | %.1f ms | %+.0f%% |" % (model, emu, n, m * 1e3, p * 1e3, 100 * e))
print("\n| group | points | mean error | max error |\n|---|---:|---:|---:|")
for k, v in errs.items():
    print("| %s | %d | %.1f%% | %.1f%% |" % (k, len(v), 100 * sum(v) / len(v), 100 * max(v)))
EOF
}

case $WHAT in
collectives) collectives ;;
training) training ;;
all) collectives; training ;;
*) echo "usage: bench/sim_validate.sh [collectives|training|all]" >&2; exit 2 ;;
esac
