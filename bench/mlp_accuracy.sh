#!/usr/bin/env bash
# Test accuracy of the same MLP set-up (784-512-256-10, ReLU, dropout 0.3, Adam lr 1e-3, batch 64)
# after EPOCHS epochs, tandem vs PyTorch, over SEEDS seeds, with the mean and the difference.
#
#   bench/mlp_accuracy.sh [SEEDS=3] [EPOCHS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${1:-3}
EPOCHS=${2:-1}
make build >/dev/null
PY=/usr/bin/python3
printf "%5s %10s %10s\n" seed tandem pytorch
sum_t=0 sum_p=0
for s in $(seq 1 "$SEEDS"); do
  t=$(./build/tandem train --epochs "$EPOCHS" --seed "$s" --threads 1 2>/dev/null | sed -n 's/^test accuracy: \([0-9.]*\).*/\1/p')
  p=$($PY bench/mlp_pytorch.py --epochs "$EPOCHS" --seed "$s" --threads 1 | $PY -c 'import json,sys; print(json.load(sys.stdin)["test_accuracy"])')
  awk -v s="$s" -v t="$t" -v p="$p" 'BEGIN { printf "%5d %9.2f%% %9.2f%%\n", s, 100 * t, 100 * p }'
  sum_t=$(awk -v a="$sum_t" -v b="$t" 'BEGIN { print a + b }')
  sum_p=$(awk -v a="$sum_p" -v b="$p" 'BEGIN { print a + b }')
done
awk -v t="$sum_t" -v p="$sum_p" -v n="$SEEDS" -v e="$EPOCHS" 'BEGIN {
  printf " mean %9.2f%% %9.2f%%   (tandem - PyTorch: %+.2f points after %d epoch%s)\n", 100*t/n, 100*p/n, 100*(t-p)/n, e, (e > 1 ? "s" : "") }'
