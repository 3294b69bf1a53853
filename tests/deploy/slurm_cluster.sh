#!/usr/bin/env bash
# A real one-node Slurm cluster for test_slurm, on this machine, started and stopped by the test.
#   slurm_cluster.sh start DIR   installs slurmctld, slurmd, slurm-client and munge when missing,
#                                writes a slurm.conf under DIR and starts munged, slurmctld, slurmd;
#                                exit 77 (with the reason on stderr) where that cannot be done
#   slurm_cluster.sh stop DIR    stops what `start` started (by the pids in DIR), removes DIR
# The daemons use DIR for every file of theirs (config, spool, logs, pids, the munge socket), so
# the machine's own /etc/slurm and /etc/munge are left alone. Needs root (it starts daemons).
set -u
cmd=${1:?usage: slurm_cluster.sh start|stop DIR}
D=${2:?usage: slurm_cluster.sh start|stop DIR}
skip() { echo "slurm cluster: $*" >&2; exit 77; }

stop() {
  for p in slurmd slurmctld munged; do
    [[ -f "$D/$p.pid" ]] || continue
    pid=$(cat "$D/$p.pid")
    [[ "$pid" =~ ^[0-9]+$ ]] && kill "$pid" 2>/dev/null
  done
  for p in slurmd slurmctld munged; do # wait up to 5 s each, then force
    [[ -f "$D/$p.pid" ]] || continue
    pid=$(cat "$D/$p.pid")
    [[ "$pid" =~ ^[0-9]+$ ]] || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  done
  rm -rf "$D"
}
if [[ $cmd == stop ]]; then stop; exit 0; fi
[[ $cmd == start ]] || { echo "usage: slurm_cluster.sh start|stop DIR" >&2; exit 2; }

[[ $(id -u) -eq 0 ]] || skip "needs root to start slurmctld, slurmd and munged (running as $(id -un))"
need=()
for p in slurmctld slurmd slurm-client munge; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  command -v apt-get >/dev/null || skip "no apt-get to install ${need[*]}"
  echo "slurm cluster: installing ${need[*]} (once; about 30 s)" >&2
  # the packages' own services must not start: this script starts its daemons itself
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d.tandem && chmod +x /usr/sbin/policy-rc.d.tandem
  had_policy=0; [[ -e /usr/sbin/policy-rc.d ]] && had_policy=1
  ((had_policy)) || cp /usr/sbin/policy-rc.d.tandem /usr/sbin/policy-rc.d
  ok=1
  { DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
    { timeout 120 apt-get update -qq >/dev/null 2>&1 &&
      DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1; }; } || ok=0
  ((had_policy)) || rm -f /usr/sbin/policy-rc.d
  rm -f /usr/sbin/policy-rc.d.tandem
  ((ok)) || skip "cannot install ${need[*]} with apt-get (no network or no Debian mirror?)"
fi
for b in slurmctld slurmd munged mungekey srun sinfo; do
  command -v $b >/dev/null || [[ -x /usr/sbin/$b ]] || skip "$b is missing after installing"
done

mkdir -p "$D"/{spool,state,log,munge} || skip "cannot create $D"
host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
chown munge:munge "$D/munge" && chmod 700 "$D/munge" || skip "cannot give $D/munge to the munge user"
/usr/sbin/mungekey -c -k "$D/munge/munge.key" -f >/dev/null 2>&1 || skip "mungekey cannot create a key"
chown munge:munge "$D/munge/munge.key" && chmod 400 "$D/munge/munge.key"
sock="$D/munge/munge.socket"
# munged refuses group/world-writable parents of its socket and key: DIR itself must be tidy
chmod 755 "$D"
su -s /bin/sh munge -c "/usr/sbin/munged -S '$sock' --key-file='$D/munge/munge.key' --pid-file='$D/munge/munged.pid' \
  --log-file='$D/munge/munged.log' --seed-file='$D/munge/seed' --force" 2>"$D/log/munged.start" ||
  skip "munged does not start: $(tail -2 "$D/log/munged.start" "$D/munge/munged.log" 2>/dev/null | tr '\n' ' ')"
cp "$D/munge/munged.pid" "$D/munged.pid" 2>/dev/null

# Is something listening on TCP port $1 (decimal)? /proc/net/tcp{,6}: local address column, state 0A.
listening() {
  local hex; hex=$(printf ':%04X' "$1")
  # cat, not awk's file list: mawk gives up on a missing file (no tcp6 where IPv6 is off)
  cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }'
}
export SLURM_CONF="$D/slurm.conf"
# A port pair of our own, below the kernel's ephemeral ports (another test's connections take those:
# a base drawn among them once met "Address already in use" and slurmctld died after it had forked,
# CI run 2026-11-29). slurmctld reports a taken port only in its log, after daemonising: wait until
# it listens, and draw another pair when it died of that.
ctld_up=0
for attempt in 1 2 3 4 5; do
  base=$((20000 + RANDOM % 12000))
  listening "$base" || listening $((base + 1)) && continue
  cat >"$D/slurm.conf" <<CONF
ClusterName=tandemtest
SlurmctldHost=$host
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$base
SlurmdPort=$((base + 1))
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  rm -f "$D/slurmctld.pid" "$D/log/slurmctld.log"
  /usr/sbin/slurmctld -f "$D/slurm.conf" -i 2>"$D/log/slurmctld.start" ||
    skip "slurmctld does not start: $(tail -3 "$D/log/slurmctld.start" "$D/log/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
  for _ in $(seq 100); do # 10 s to listen
    # ours, listening (not another process that took the port while ours died)
    listening "$base" && [[ -f "$D/slurmctld.pid" ]] && kill -0 "$(cat "$D/slurmctld.pid")" 2>/dev/null && { ctld_up=1; break; }
    if [[ -f "$D/slurmctld.pid" ]] && ! kill -0 "$(cat "$D/slurmctld.pid")" 2>/dev/null; then break; fi
    sleep 0.1
  done
  ((ctld_up)) && break
  grep -q "Address already in use" "$D/log/slurmctld.log" 2>/dev/null ||
    skip "slurmctld did not come up: $(tail -3 "$D/log/slurmctld.start" "$D/log/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
  echo "slurm cluster: port $base was taken; another" >&2
done
((ctld_up)) || skip "no free port pair for slurmctld in 5 draws"
/usr/sbin/slurmd -f "$D/slurm.conf" 2>"$D/log/slurmd.start" ||
  skip "slurmd does not start: $(tail -3 "$D/log/slurmd.start" "$D/log/slurmd.log" 2>/dev/null | tr '\n' ' ')"
end=$((SECONDS + 15))
while ((SECONDS < end)); do # 15 s for the node to come up idle; sinfo alone would wait minutes on a dead controller
  if timeout 3 sinfo -h -o %T 2>/dev/null | grep -qx idle; then exit 0; fi
  sleep 0.1
done
skip "the node did not become idle in 15 s: sinfo says '$(timeout 3 sinfo -h -o '%N %T' 2>&1 | head -2 | tr '\n' ' ')'; $(tail -3 "$D/log/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
