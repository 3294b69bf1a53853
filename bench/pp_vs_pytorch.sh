#!/usr/bin/env bash
# Pipeline parallelism on 2 ranks of this machine, tandem vs PyTorch 1.13 (CPU), in alternating
# runs: the same GPT step (one optimizer step over M micro-batches of B sequences) by
#   tandem:  one process (accumulating M), data parallel on 2 ranks (each accumulating M/2), tensor
#            parallel on 2 ranks (accumulating M), and a
#            2-stage pipeline with each schedule (gpipe, 1f1b, zb1p, interleaved with 2 chunks per rank)
#   PyTorch: one process (one batch of M x B), a hand-written 2-stage pipeline over gloo (gpipe,
#            1f1b; bench/pp_pytorch.py) and torch.distributed.pipeline.sync.Pipe (one process)
# and prints, as medians of REPS runs: the step time (the update included), each stage's measured
# bubble (the share of its step, the update excluded, it did not compute) beside the schedule's (its simulation with forward 1, backward 2: (P-1)/(M+P-1) for GPipe and 1F1B), and
# tandem's activations at the peak per stage (1F1B holds at most P micro-batches on the first
# stage, GPipe M).
#   bench/pp_vs_pytorch.sh [REPS=3] [CONFIG=mini] [B=4] [T=64] [M=8] [STEPS=5]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
CONFIG=${2:-mini}
B=${3:-4}
T=${4:-64}
M=${5:-8}
STEPS=${6:-5}
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1
if [[ $CONFIG == mini ]]; then ARCH=(--layers 4 --heads 4 --width 256 --vocab 256 --block 128); else ARCH=(--layers 12 --heads 12 --width 768 --vocab 50257 --block 1024); fi
TB=(bench gpt --config "$CONFIG" --batch-size "$B" --seq-len "$T" --steps "$STEPS" --warmup 2 --threads 1 --json)
tandem() { # name, then how
  local name=$1; shift
  "$@" 2>/dev/null | sed 's/^\[rank 0\] //' | grep '^{' >>"$TMP/t_$name" || echo "  tandem $name failed" >&2
}
torch() {
  local name=$1; shift
  /usr/bin/python3 "$@" 2>/dev/null | grep '^{' >>"$TMP/p_$name" || echo "  PyTorch $name failed" >&2
}
for r in $(seq 1 "$REPS"); do
  tandem one ./build/tandem "${TB[@]}" --accum "$M"
  torch one bench/gpt_pytorch.py "${ARCH[@]}" --batch $((B * M)) --seq "$T" --steps "$STEPS" --warmup 2
  tandem dp2 ./build/tandem run -n 2 -- tandem "${TB[@]}" --accum $((M / 2))
  tandem tp2 ./build/tandem run -n 2 -- tandem "${TB[@]}" --tp 2 --accum "$M"
  for s in gpipe 1f1b zb1p interleaved; do
    tandem "pp_$s" ./build/tandem run -n 2 -- tandem "${TB[@]}" --pp 2 --accum "$M" --schedule "$s"
    [[ $s == gpipe || $s == 1f1b ]] && torch "pp_$s" bench/pp_pytorch.py --mode "$s" "${ARCH[@]}" --batch "$B" --seq "$T" \
      --micro "$M" --stages 2 --steps "$STEPS" --warmup 2
  done
  torch pipe bench/pp_pytorch.py --mode pipe "${ARCH[@]}" --batch "$B" --seq "$T" --micro "$M" --stages 2 --steps "$STEPS" --warmup 2
  echo "rep $r/$REPS done" >&2
done
/usr/bin/python3 - "$TMP" "$M" <<'EOF'
import json, os, statistics, sys
d, M = sys.argv[1], int(sys.argv[2])
def rows(name):
    p = os.path.join(d, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
med = lambda v: statistics.median(v) if v else float("nan")
theory = {"gpipe": 1 / (M + 1), "1f1b": 1 / (M + 1), "zb1p": 1 / (3 * M + 1), "interleaved": 1 / (2 * M + 1)}
print(f"\nGPT step, {M} micro-batches, 2 ranks (1 thread each) or 1 process; medians of {len(rows('t_one'))} runs")
print(f"{'':28s} {'step ms':>9s} {'bubble 0':>9s} {'bubble 1':>9s} {'theory':>7s} {'act. MiB 0':>11s} {'act. MiB 1':>11s}")
one = med([r["ms"] for r in rows("t_one")])
for name, label in (("t_one", "tandem 1 process"), ("t_dp2", "tandem dp=2"), ("t_tp2", "tandem tp=2"), ("t_pp_gpipe", "tandem pp=2 gpipe"),
                    ("t_pp_1f1b", "tandem pp=2 1f1b"), ("t_pp_zb1p", "tandem pp=2 zb1p"),
                    ("t_pp_interleaved", "tandem pp=2 interleaved V=2")):
    rs = rows(name)
    if not rs:
        continue
    ms = med([r["ms"] for r in rs])
    line = f"{label:28s} {ms:9.1f}"
    if rs[0]["pp"] > 1:
        b = [med([r["ranks_detail"][k]["bubble"] for r in rs]) for k in range(2)]
        a = [med([r["ranks_detail"][k]["activations_mib"] for r in rs]) for k in range(2)]
        line += f" {b[0]:9.3f} {b[1]:9.3f} {theory[rs[0]['schedule']]:7.3f} {a[0]:11.1f} {a[1]:11.1f}"
    print(line)
for name, label in (("p_one", "PyTorch 1 process"), ("p_pp_gpipe", "PyTorch pp=2 gpipe (gloo)"),
                    ("p_pp_1f1b", "PyTorch pp=2 1f1b (gloo)"), ("p_pipe", "PyTorch Pipe (1 process)")):
    rs = rows(name)
    if not rs:
        continue
    line = f"{label:28s} {med([r['ms'] for r in rs]):9.1f}"
    if rs[0].get("stages"):
        b = [med([r["stages"][k]["bubble"] for r in rs]) for k in range(2)]
        line += f" {b[0]:9.3f} {b[1]:9.3f} {theory[rs[0]['mode']]:7.3f}"
    print(line)
EOF
