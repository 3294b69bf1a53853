#!/bin/bash
# Device all-reduce: NCCL vs host staging on 1 rank (alternating, medians), then staging with 2 and 4
# ranks sharing the GPU (tandem run). Needs a build with NCCL (cmake/nccl.cmake) and a GPU.
# Usage: bench/nccl_allreduce.sh [BUILD_DIR] [MAX_BYTES]   (default build, 268435456)
set -eu
B=${1:-build} MAX=${2:-268435456}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "== 1 rank: NCCL vs staged"
"$B/bench/nccl_allreduce" "$MAX"
for n in 2 4; do
  echo "== $n ranks on one GPU: staged (device -> host -> shm all-reduce -> device)"
  timeout 300 "$B/tandem" run -n "$n" -- "$B/bench/nccl_allreduce" "$MAX" | sed -n 's/^\[rank 0\] //p'
done
