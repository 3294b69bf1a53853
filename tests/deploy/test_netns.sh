#!/usr/bin/env bash
# Two "hosts" on this machine: two network namespaces joined by a veth pair, each with its own
# address, and no way between them but that link (each has only its own loopback). Rank 0 runs
# in one, rank 1 in the other:
#  1. torchrun-style variables (MASTER_ADDR = host A's address): the TCP transport, the store and
#     TANDEM_SOCKET_IFNAME work across hosts, and the weights equal `tandem run -n 2` over tcp on
#     one host bit for bit;
#  2. srun-style variables only (a 2-node step "tdmh[1-2]", names resolved by each namespace's
#     /etc/hosts): rank 0's address from the node list's first host, the port from the job id;
#  3. TANDEM_SOCKET_IFNAME naming no interface: a clear error.
# usage: test_netns.sh path/to/tandem   (exit 77 = skipped: namespaces cannot be created here)
set -u
T=$(readlink -f "${1:?usage: test_netns.sh path/to/tandem}")
[[ $(id -u) -eq 0 ]] || { echo "skip: network namespaces need root (running as $(id -un))"; exit 77; }
command -v ip >/dev/null || { echo "skip: no ip command (iproute2)"; exit 77; }
id=$$
NA=tdm-a-$id NB=tdm-b-$id VA=tda$id VB=tdb$id
VA=${VA:0:15} VB=${VB:0:15}
net=$((100 + RANDOM % 150)).$((RANDOM % 250))
AA=10.$net.1 AB=10.$net.2
TMP=$(mktemp -d /tmp/tandem-netns-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  ip netns del "$NA" 2>/dev/null; ip netns del "$NB" 2>/dev/null # takes the veth pair with it
  rm -rf "/etc/netns/$NA" "/etc/netns/$NB" "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
if ! { ip netns add "$NA" && ip netns add "$NB"; } 2>"$TMP/why"; then
  echo "skip: cannot create network namespaces: $(cat "$TMP/why")"; exit 77
fi
if ! { ip link add "$VA" netns "$NA" type veth peer name "$VB" netns "$NB" &&
       ip -n "$NA" addr add "$AA/24" dev "$VA" && ip -n "$NB" addr add "$AB/24" dev "$VB" &&
       ip -n "$NA" link set "$VA" up && ip -n "$NB" link set "$VB" up &&
       ip -n "$NA" link set lo up && ip -n "$NB" link set lo up; } 2>"$TMP/why"; then
  echo "skip: cannot join the namespaces with a veth pair: $(cat "$TMP/why")"; exit 77
fi
# host names, as a cluster's DNS would give them (ip netns exec mounts /etc/netns/NAME/hosts)
for n in "$NA" "$NB"; do mkdir -p "/etc/netns/$n" && printf '127.0.0.1 localhost\n%s tdmh1\n%s tdmh2\n' "$AA" "$AB" >"/etc/netns/$n/hosts"; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TANDEM_NUM_THREADS TANDEM_TRANSPORT TANDEM_STORE_DIR
cd "$TMP" || exit 1
A=(train --steps 30 --seed 9 --threads 1)
failed=0

# two_hosts NAME ENV_A ENV_B: rank 0 in A, rank 1 in B, each with its own variables
two_hosts() {
  local name=$1
  pids=()
  ip netns exec "$NA" env $2 TANDEM_LOG=info TANDEM_TIMEOUT=30 timeout 120 "$T" "${A[@]}" --save-weights "$name.st" \
    >"$name.0" 2>&1 & pids+=($!)
  ip netns exec "$NB" env $3 TANDEM_LOG=info TANDEM_TIMEOUT=30 timeout 120 "$T" "${A[@]}" --save-weights "$name.st" >"$name.1" 2>&1 & pids+=($!)
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  pids=()
  return $rc
}

port=$((20000 + RANDOM % 10000))
E="WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_ADDR=$AA MASTER_PORT=$port"
if two_hosts env "RANK=0 $E TANDEM_SOCKET_IFNAME=$VA" "RANK=1 $E TANDEM_SOCKET_IFNAME=$VB" &&
   grep -q "tcp: rank 0 listens on $AA ($VA)" env.0 && grep -q "tcp: rank 1 listens on $AB ($VB)" env.1 &&
   grep -q ", 2 ranks, transport tcp" env.0; then
  TANDEM_TRANSPORT=tcp timeout 120 "$T" run -n 2 -- tandem "${A[@]}" --save-weights one.st >one.out 2>&1
  if cmp -s env.st one.st; then
    echo "ok   two hosts over a veth pair (MASTER_ADDR=$AA, TANDEM_SOCKET_IFNAME): tcp and the store across hosts, weights == one host's bit for bit"
  else
    echo "FAIL two hosts: the weights differ from tandem run -n 2 over tcp"; tail -n 5 one.out; failed=1
  fi
else
  echo "FAIL two hosts over a veth pair"; tail -n 8 env.0 env.1; failed=1
fi

S="SLURM_JOB_ID=$((RANDOM * 7)) SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 SLURM_NTASKS=2 SLURM_STEP_NODELIST=tdmh[1-2] SLURM_STEP_TASKS_PER_NODE=1(x2) SLURM_LOCALID=0"
if two_hosts slurm "$S SLURM_PROCID=0 SLURM_NODEID=0 SLURMD_NODENAME=tdmh1" "$S SLURM_PROCID=1 SLURM_NODEID=1 SLURMD_NODENAME=tdmh2" &&
   grep -q "tcp: rank 1 listens on $AB ($VB)" slurm.1 && grep -q ", 2 ranks, transport tcp" slurm.0 && cmp -s slurm.st env.st; then
  echo "ok   two hosts as a 2-node srun step (tdmh[1-2], nothing else set): rank 0 found at the first host, weights as above"
else
  echo "FAIL two hosts as a 2-node srun step"; tail -n 8 slurm.0 slurm.1; failed=1
fi

ip netns exec "$NA" env RANK=0 $E TANDEM_SOCKET_IFNAME=eth9 TANDEM_TIMEOUT=10 timeout 60 "$T" "${A[@]}" >bad.out 2>&1
if [[ $? -ne 0 ]] && grep -q "TANDEM_SOCKET_IFNAME=eth9: no such interface with an IPv4 address that is up" bad.out; then
  echo "ok   TANDEM_SOCKET_IFNAME naming no interface: a clear error"
else
  echo "FAIL TANDEM_SOCKET_IFNAME=eth9"; tail -n 5 bad.out; failed=1
fi
exit $failed
