#!/usr/bin/env bash
# Data parallelism with the hierarchical all-reduce: 4 ranks over TCP as 2 "nodes" of 2
# (TANDEM_NODE_ID = RANK / 2) and as 3 + 1 train the MLP as one process with the 4-times batch
# does (parameters within 1e-5 relative, as test_ddp's layouts: the node-by-node sums round
# differently from one process's), the same seed twice is bit-identical, and
# TANDEM_ALGO=allreduce=direct puts the gradients back on rank order: bit for bit the 4 ranks on one node.
# usage: test_hier.sh path/to/tandem
set -u
T=${1:?usage: test_hier.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"
A=(train --steps 12 --threads 1 --optimizer sgd --lr 0.05 --momentum 0.9 --dropout 0.3 --seed 7 --eval-batch-size 100)
"$T" "${A[@]}" --batch-size 96 --save-weights "$TMP/one.st" >/dev/null 2>&1 || { echo "FAIL the one-process reference did not run"; exit 1; }

# nodes NAME RULE [ENV...]: 4 ranks x 24 over tcp, rank r on node $((RULE)); weights to $TMP/NAME.st, log to $TMP/NAME.out
nodes() {
  local name=$1 rule=$2; shift 2
  env "$@" TANDEM_TRANSPORT=tcp TANDEM_LOG=info timeout 120 "$T" run -n 4 -- \
    sh -c 'TANDEM_NODE_ID=node$(('"$rule"')) exec "$0" "$@"' "$T" "${A[@]}" --batch-size 24 \
    --save-weights "$TMP/$name.st" >"$TMP/$name.out" 2>&1 || { echo "  $name:"; tail -3 "$TMP/$name.out"; return 1; }
}
same() { "$T" weights-diff "$1" "$2" --rtol "$3" --quiet >/dev/null || { "$T" weights-diff "$1" "$2" --rtol "$3" | tail -2; return 1; }; }

two_by_two() {
  nodes h22 'RANK / 2' && grep -q "dp: gradients averaged by the hierarchical all-reduce" "$TMP/h22.out" &&
    grep -q "hierarchical all-reduce: rank 3 is 1 of 2 on node 1 of 2 (2 lanes)" "$TMP/h22.out" && same "$TMP/one.st" "$TMP/h22.st" 1e-5
}
check "2 nodes of 2 (hierarchical all-reduce) x 24 == 1 process x 96 (parameters within 1e-5)" two_by_two
again() { nodes h22b 'RANK / 2' && cmp -s "$TMP/h22.st" "$TMP/h22b.st"; }
check "the same seed twice on 2 nodes of 2: bit-identical weights" again
uneven() {
  nodes h31 'RANK / 3' && grep -q "hierarchical all-reduce: rank 3 is 0 of 1 on node 1 of 2 (1 lanes)" "$TMP/h31.out" &&
    same "$TMP/one.st" "$TMP/h31.st" 1e-5
}
check "uneven nodes (3 + 1) x 24 == 1 process x 96" uneven
rank_order() {
  nodes d22 'RANK / 2' TANDEM_ALGO=allreduce=direct && ! grep -q "dp: gradients averaged by the hierarchical" "$TMP/d22.out" &&
    nodes one4 '0' && ! grep -q "hierarchical all-reduce: rank" "$TMP/one4.out" && cmp -s "$TMP/d22.st" "$TMP/one4.st"
}
check "TANDEM_ALGO=allreduce=direct on 2 nodes of 2: rank order, bit for bit the 4 ranks on one node" rank_order
relayed_world_rank() { # rank 3 (node 1, local rank 1) fails of its own: every other rank names rank 3 as the
  # origin, whether it learned it in its node's shared memory (local numbers) or from another node
  TANDEM_FAULT=3:2:error TANDEM_TRANSPORT=tcp timeout 120 "$T" run --keep-going -n 4 -- \
    sh -c 'TANDEM_NODE_ID=node$((RANK / 2)) exec "$0" "$@"' "$T" "${A[@]}" --batch-size 24 --steps 4 >"$TMP/rel.out" 2>&1
  [[ $(grep -c "relayed from rank 3)" "$TMP/rel.out") == 3 ]] && grep -q "rank 3 failed first: exit code 1" "$TMP/rel.out" ||
    { grep "tandem train: [a-zA-Z/ ]*(\|failed first" "$TMP/rel.out"; return 1; }
}
check "a failure relayed through a node's shared memory names the world rank where it began" relayed_world_rank
finish
