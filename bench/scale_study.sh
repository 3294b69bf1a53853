#!/usr/bin/env bash
# The scaling tables of docs/PERFORMANCE.md: `tandem scale` (weak scaling, one thread per rank so
# each rank's compute stays the same) for the MLP (synthetic Fashion-MNIST-shaped data) and GPT
# mini (tinyshakespeare), at 1, 2 and 4 ranks, over shared memory and over TCP with emulated
# 10 Gb/s and 1 Gb/s links (TANDEM_NET_EMULATE: 50 us latency). Each study's HTML report and
# metrics stay in OUT/<name>/.
# usage: bench/scale_study.sh path/to/tandem OUT [RANKS] [MLP_STEPS] [GPT_STEPS]
set -eu
T=$(readlink -f "${1:?usage: scale_study.sh path/to/tandem OUT [RANKS] [MLP_STEPS] [GPT_STEPS]}")
OUT=${2:?out dir}
RANKS=${3:-1,2,4}
MS=${4:-200}
GS=${5:-40}
mkdir -p "$OUT"
study() { # name, env..., -- train args
  local name=$1; shift
  local env=()
  while [[ $1 != -- ]]; do env+=("$1"); shift; done
  shift
  echo "== $name ${env[*]}"
  env "${env[@]}" nice -n 19 "$T" scale --ranks "$RANKS" --dir "$OUT/$name" -- tandem train --threads 1 "$@" | sed -n '/ranks global_batch/,$p'
}
MLP=(--data synthetic --batch-size 64 --steps "$MS")
GPT=(--model gpt --data tinyshakespeare --batch-size 4 --seq-len 64 --steps "$GS" --val-every 0)
study mlp-shm TANDEM_TRANSPORT=shm -- "${MLP[@]}"
study mlp-tcp-10g TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=50us,10gbps -- "${MLP[@]}"
study mlp-tcp-1g TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=50us,1gbps -- "${MLP[@]}"
study gpt-shm TANDEM_TRANSPORT=shm -- "${GPT[@]}"
study gpt-tcp-10g TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=50us,10gbps -- "${GPT[@]}"
study gpt-tcp-1g TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=50us,1gbps -- "${GPT[@]}"
