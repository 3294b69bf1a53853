#!/usr/bin/env bash
# Mixed precision's accuracy against fp32: the MLP's test accuracy after one epoch of
# Fashion-MNIST (over SEEDS seeds), and GPT mini's and llama-mini's validation loss on tiny
# Shakespeare after STEPS steps of B x T tokens, in --precision fp32, bf16 and fp16 (the same seed,
# data and schedule; one process, THREADS threads). Goals (issue 15): MLP within 0.3 points of fp32,
# the language models within 0.02 nats.
#
#   bench/mixed_accuracy.sh [SEEDS=3] [STEPS=500] [B=8] [T=128] [THREADS=2] [MODELS="mlp gpt llama"]
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${1:-3}
STEPS=${2:-500}
B=${3:-8}
T=${4:-128}
THREADS=${5:-2}
MODELS=${6:-"mlp gpt llama"}
make build >/dev/null
for m in $MODELS; do
  if [[ $m == mlp ]]; then
    printf "MLP, 1 epoch: test accuracy by seed\n%5s %9s %9s %9s\n" seed fp32 bf16 fp16
    for s in $(seq 1 "$SEEDS"); do
      row=""
      for p in fp32 bf16 fp16; do
        a=$(./build/tandem train --epochs 1 --seed "$s" --threads "$THREADS" --precision $p 2>/dev/null | sed -n 's/^test accuracy: \([0-9.]*\).*/\1/p')
        row="$row $a"
      done
      awk -v s="$s" -v r="$row" 'BEGIN { split(r, a, " "); printf "%5d %8.2f%% %8.2f%% %8.2f%%   (bf16 %+.2f, fp16 %+.2f points)\n", s, 100*a[1], 100*a[2], 100*a[3], 100*(a[2]-a[1]), 100*(a[3]-a[1]) }'
    done
    continue
  fi
  cfg=$([[ $m == gpt ]] && echo mini || echo llama-mini)
  printf "%s %s, %s steps of %s x %s tokens: validation loss (nats per byte)\n" "$m" "$cfg" "$STEPS" "$B" "$T"
  for p in fp32 bf16 fp16; do
    line=$(./build/tandem train --model "$m" --config "$cfg" --steps "$STEPS" --batch-size "$B" --seq-len "$T" --threads "$THREADS" \
      --val-every 0 --precision $p 2>/dev/null | grep '^val loss:')
    printf "  %-5s %s\n" "$p" "$line"
  done
done
