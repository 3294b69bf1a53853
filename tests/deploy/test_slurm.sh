#!/usr/bin/env bash
# A real one-node Slurm cluster (slurm_cluster.sh: slurmctld, slurmd, munge, started here and
# stopped on exit): `srun -n 2 tandem train` with nothing set by hand trains the MLP as a 2-rank
# job over shared memory with the node's cores divided between the ranks, and its weights equal
# bit for bit those of `tandem run -n 2` with the same arguments; a node list that does not parse
# and tasks that disagree on the node list fail with errors naming them; the shipped batch script
# (deploy/slurm/train.sbatch) runs.
# usage: test_slurm.sh path/to/tandem   (exit 77 = skipped: the cluster cannot be started here)
set -u
T=$(readlink -f "${1:?usage: test_slurm.sh path/to/tandem}")
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(mktemp -d /tmp/tandem-slurm-XXXXXX)
chmod 755 "$D"
TMP=$(mktemp -d /tmp/tandem-slurm-out-XXXXXX)
cleanup() { "$HERE/slurm_cluster.sh" stop "$D/cluster"; rm -rf "$D" "$TMP"; }
trap cleanup EXIT
trap 'exit 1' INT TERM
"$HERE/slurm_cluster.sh" start "$D/cluster"
rc=$?
if [[ $rc -eq 77 ]]; then echo "skip: no Slurm cluster here (the reason is above)"; exit 77; fi
[[ $rc -eq 0 ]] || { echo "FAIL: slurm_cluster.sh start exited $rc"; exit 1; }
export SLURM_CONF="$D/cluster/slurm.conf"
# nothing by hand: none of the variables a user would otherwise set
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TANDEM_NUM_THREADS TANDEM_TRANSPORT TANDEM_STORE_DIR
cd "$TMP" || exit 1
failed=0
check() { # name, command...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; failed=1; fi
}
A=(train --steps 120 --seed 3 --batch-size 64)
cores=$(nproc)
per=$((cores / 2 > 0 ? cores / 2 : 1))

srun_train() {
  timeout 180 srun -n 2 "$T" "${A[@]}" --save-weights "$TMP/srun.st" >"$TMP/srun.out" 2>&1 || { tail -20 "$TMP/srun.out"; return 1; }
  local head; head=$(grep "^tandem train:" "$TMP/srun.out")
  grep -q "batch 64 x 2 data ranks" <<<"$head" && grep -q ", 2 ranks, transport shm" <<<"$head" &&
    grep -q " $per thread" <<<"$head" || { echo "  header: $head (expected 2 ranks, shm, $per thread(s) per rank)"; return 1; }
  local acc; acc=$(sed -n 's/^test accuracy: \([0-9.]*\).*/\1/p' "$TMP/srun.out")
  echo "  srun -n 2: $head"
  echo "  test accuracy $acc after 120 steps"
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }' || { echo "  accuracy $acc < 0.75"; return 1; }
}
check "srun -n 2 tandem train: 2 ranks over shm, $per thread(s) each, accuracy >= 0.75" srun_train

same_as_tandem_run() {
  timeout 180 "$T" run -n 2 -- tandem "${A[@]}" --save-weights "$TMP/run.st" >"$TMP/run.out" 2>&1 || { tail -20 "$TMP/run.out"; return 1; }
  cmp -s "$TMP/srun.st" "$TMP/run.st" || { echo "  the weights of srun and tandem run differ"; return 1; }
}
check "srun -n 2 == tandem run -n 2, weights bit for bit" same_as_tandem_run

batch_script() { # the shipped deploy/slurm/train.sbatch, shrunk to this one node by sbatch's options
  local repo; repo=$(cd "$HERE/../.." && pwd)
  timeout 180 sbatch --wait --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --mem=500M -o "$TMP/batch.out" \
    --export=ALL,TANDEM="$T",TANDEM_ARGS="--steps 20" "$repo/deploy/slurm/train.sbatch" >/dev/null || { cat "$TMP/batch.out"; return 1; }
  grep -q ", 2 ranks, transport shm" "$TMP/batch.out" && grep -q "^test accuracy: " "$TMP/batch.out" && ls "$TMP"/mlp-*.st >/dev/null ||
    { cat "$TMP/batch.out"; return 1; }
}
check "sbatch deploy/slurm/train.sbatch (one node, 2 tasks): trains over shm and saves its weights" batch_script

bad_nodelist() { # a list that does not parse: every task says so, naming it
  timeout 60 srun -n 2 bash -c 'SLURM_STEP_NODELIST="$SLURMD_NODENAME[01-" exec "$0" train --steps 1' "$T" >"$TMP/bad.out" 2>&1 && return 1
  [[ $(grep -c "SLURM_STEP_NODELIST: Slurm node list '.*\[01-': a '\[' that is never closed" "$TMP/bad.out") -eq 2 ]] ||
    { cat "$TMP/bad.out"; return 1; }
}
check "a node list that does not parse: both tasks name it and fail" bad_nodelist

disagree() { # task 1 sees one node more than task 0: it stops at rendezvous naming both views
  timeout 60 srun -n 2 bash -c 'if [ "$SLURM_PROCID" = 1 ]; then export SLURM_STEP_NODELIST="$SLURM_STEP_NODELIST,ghost" \
    SLURM_STEP_TASKS_PER_NODE="1(x2)" SLURM_LOCALID=0; fi; TANDEM_TIMEOUT=5 exec "$0" train --steps 1' "$T" >"$TMP/dis.out" 2>&1 &&
    return 1
  grep -q "rank 1 sees Slurm job [0-9]* step [0-9]*, 2 tasks, SLURM_STEP_NODELIST=.*,ghost, but rank 0 sees Slurm job" "$TMP/dis.out" ||
    { cat "$TMP/dis.out"; return 1; }
}
check "tasks that disagree on the node list: a clear error naming both" disagree
exit $failed
