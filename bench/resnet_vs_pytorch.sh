#!/usr/bin/env bash
# tandem vs PyTorch 1.13: the training step of resnet20 (width 16) and of the small CNN on 1x28x28
# images, batch 128, at 1 and 2 threads. Both sides run in turn, REPS times; medians and their
# ratio, and the share of the machine's FMA peak (cores used x the FMA rate bench/sgemm_peak
# measures: 16 floats x 2 units x 2 flop a cycle where AVX-512 runs at full width, half that where
# it is split or absent) and of the measured single-core sgemm rate that the step reaches, counting
# the step's flop as PyTorch's hooks count them (bench/resnet_pytorch.py: forward, input and
# weight gradients of every conv and linear layer). Those are the direct convolution's flop: where
# tandem runs Winograd (resnet20's 3x3 stride-1 layers and the CNN's second 5x5, TANDEM_WINOGRAD=off to compare), the share
# is an effective one, the machine executing fewer.
#
#   bench/resnet_vs_pytorch.sh [REPS=3] [STEPS=8]
#
# PyTorch runs twice: as it comes, and with glibc's malloc told to keep freed memory
# (MALLOC_MMAP_THRESHOLD_=32 MiB, MALLOC_TRIM_THRESHOLD_=4 GiB). As it comes, its activations are
# fresh mmaps or trimmed heap each step and fault in again, 4 KiB at a time (12-22 us a fault on
# this VM): its resnet20 step then moves between 180 and 900 samples/s from run to run. The ratio
# is taken against the tuned run, the stronger and steadier of the two; tandem's arena keeps its
# memory and is run as it comes.
#
# OpenBLAS chooses its kernels from the processor, as PyTorch's oneDNN does: an OPENBLAS_CORETYPE
# in the environment (this project's machines set Haswell, which halves sgemm on their AVX-512
# cores) is removed for the run; BLAS_CORETYPE=Haswell bench/resnet_vs_pytorch.sh asks for one.
#
# tandem trains on a generated IDX set of Fashion-MNIST's shape (1280 training images, 10 test
# images, so the closing evaluation costs nothing); samples/s from its per-step metrics after 2
# warm-up steps. PyTorch runs the same step on one fixed batch.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
STEPS=${2:-8}
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PY=/usr/bin/python3
if [[ -n ${BLAS_CORETYPE:-} ]]; then export OPENBLAS_CORETYPE=$BLAS_CORETYPE; else unset OPENBLAS_CORETYPE; fi
$PY - "$TMP" <<'PYEOF'
import random, struct, sys
random.seed(1)
def idx(path, dims, data):
    with open(path, "wb") as f:
        f.write(struct.pack(">HBB", 0, 8, len(dims)) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data))
for pre, n in (("train", 1280), ("t10k", 10)):
    idx(f"{sys.argv[1]}/{pre}-images-idx3-ubyte", (n, 28, 28), (random.randrange(256) for _ in range(n * 784)))
    idx(f"{sys.argv[1]}/{pre}-labels-idx1-ubyte", (n,), (i % 10 for i in range(n)))
PYEOF
WARM=2
tandem_sps() { # model threads
  rm -f "$TMP/m.jsonl" # --metrics appends: each run's rows alone
  ./build/tandem train --model "$1" --data-dir "$TMP" --steps $((STEPS + WARM)) --batch-size 128 --threads "$2" \
    --optimizer sgd --momentum 0.9 --lr 0.05 --prefetch off --metrics "$TMP/m.jsonl" >/dev/null 2>&1
  $PY - "$TMP/m.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step_time_ms"' in l][2:]
print(len(rows) * 128 / (sum(r["step_time_ms"] for r in rows) / 1e3))
PYEOF
}
torch_sps() { # model threads [env...]
  env "${@:3}" $PY bench/resnet_pytorch.py --model "$1" --batch 128 --threads "$2" --steps "$STEPS" --warmup $WARM >"$TMP/p.json"
  $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples_per_sec"])' "$TMP/p.json"
}
FLOP_resnet=$($PY bench/resnet_pytorch.py --model resnet --steps 1 --warmup 0 --batch 2 | $PY -c 'import json,sys; print(json.load(sys.stdin)["flop_per_sample"])')
FLOP_cnn=$($PY bench/resnet_pytorch.py --model cnn --steps 1 --warmup 0 --batch 2 | $PY -c 'import json,sys; print(json.load(sys.stdin)["flop_per_sample"])')
for r in $(seq 1 "$REPS"); do
  for m in resnet cnn; do
    for t in 1 2; do
      tandem_sps $m $t >>"$TMP/t.$m.$t"
      torch_sps $m $t MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296 >>"$TMP/p.$m.$t"
      torch_sps $m $t >>"$TMP/q.$m.$t"
    done
  done
  echo "rep $r/$REPS done" >&2
done
PEAK=$(./build/bench/sgemm_peak)
SGEMM=$($PY -c 'import json,sys; print(json.loads(sys.argv[1])["sgemm_gflops"])' "$PEAK")
# the clock the core runs at, measured (a VM's /proc/cpuinfo gives its base clock: 2.1 GHz here, under
# which the measured sgemm would be 1.6x the peak); /proc/cpuinfo only where it cannot be measured
GHZ=$($PY -c 'import json,sys; print(json.loads(sys.argv[1])["clock_ghz"])' "$PEAK")
[[ $GHZ == 0 || $GHZ == 0.0 ]] && GHZ=$(awk -F: '/cpu MHz/ { print $2 / 1000; exit }' /proc/cpuinfo)
FMA=$($PY -c 'import json,sys; print(json.loads(sys.argv[1])["fma_gflops"])' "$PEAK")
[[ $FMA == 0 || $FMA == 0.0 ]] && FMA=$($PY -c "print($GHZ * 32)") # not measured: two 8-float FMA units
CORE=$($PY -c 'import json,sys; print(json.loads(sys.argv[1])["blas_core"])' "$PEAK")
median() { sort -g "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf "\nTraining step, batch 128, medians of %s runs of %s steps (samples/s); load average: %s\n" "$REPS" "$STEPS" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf "%7s %7s %10s %10s %7s %12s %12s %14s\n" model threads tandem pytorch ratio "% FMA peak" "% sgemm" "pytorch plain"
for m in resnet cnn; do
  for t in 1 2; do
    f=FLOP_$m
    awk -v m=$m -v th=$t -v a="$(median "$TMP/t.$m.$t")" -v b="$(median "$TMP/p.$m.$t")" -v f="${!f}" -v p="$FMA" -v s="$SGEMM" -v q="$(median "$TMP/q.$m.$t")" 'BEGIN {
      printf "%7s %7d %10.0f %10.0f %6.2fx %11.1f%% %11.1f%% %14.0f\n", m, th, a, b, a / b, 100 * a * f / (th * p * 1e9), 100 * a * f / (th * s * 1e9), q }'
  done
done
echo "(flop per sample: resnet20 $FLOP_resnet, cnn $FLOP_cnn; FMA peak: $FMA GFLOP/s per core at $GHZ GHz, measured; sgemm: $SGEMM GFLOP/s on one core with OpenBLAS's $CORE kernels; pytorch: malloc keeps freed memory; pytorch plain: as it comes; ratio = tandem / pytorch)"
