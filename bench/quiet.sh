# Sourced by the ZeRO benchmarks: runs a measurement when no one else uses the CPU, and again when
# someone did meanwhile. The development machine's 2 cores are shared with other jobs (builds,
# fuzzers, tests) whose bursts double a step's time; medians alone do not remove that.
#
#   quiet OUT CMD...   waits until the machine has been idle for a second (at most QUIET_WAIT
#                      seconds), runs CMD, and appends its stdout to OUT if the CPU time that other
#                      processes used meanwhile stayed under QUIET_OTHERS (a share of one core);
#                      else runs it again, QUIET_TRIES times at most, and keeps the least disturbed.
#                      Appends that run's share to OUT.others; counts the runs thrown away in
#                      $QUIET_REJECTED. When other jobs keep both cores busy for long, step times
#                      stay disturbed: the CPU time per step is the figure to compare then.
# Other processes' CPU time = busy time of all cores (/proc/stat) - CMD's user + system time
# (GNU time, which includes the ranks that tandem run and mp.spawn wait for).
QUIET_WAIT=${QUIET_WAIT:-30}
QUIET_OTHERS=${QUIET_OTHERS:-0.08}
QUIET_TRIES=${QUIET_TRIES:-3}
QUIET_REJECTED=0
_busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; } # jiffies, all cores
_hz=$(getconf CLK_TCK)

_wait_idle() {
  local t0=$SECONDS a b
  while ((SECONDS - t0 < QUIET_WAIT)); do
    a=$(_busy)
    sleep 1
    b=$(_busy)
    if awk -v d=$((b - a)) -v hz="$_hz" 'BEGIN { exit !(d / hz < 0.1) }'; then return 0; fi
  done
}

quiet() {
  local out=$1 try best_share=99 share a b t0 t1 cpu
  shift
  local res=$QUIET_DIR/res rt=$QUIET_DIR/rt
  for try in $(seq 1 "$QUIET_TRIES"); do
    _wait_idle
    a=$(_busy)
    t0=$(date +%s.%N)
    /usr/bin/time -f "%U %S" -o "$rt" "$@" >"$res.new"
    t1=$(date +%s.%N)
    b=$(_busy)
    cpu=$(awk '{print $1 + $2}' "$rt")
    share=$(awk -v d=$((b - a)) -v hz="$_hz" -v cpu="$cpu" -v t="$(echo "$t1 - $t0" | bc)" \
      'BEGIN { o = d / hz - cpu; if (o < 0) o = 0; printf "%.3f", o / t }')
    if awk -v s="$share" -v b="$best_share" 'BEGIN { exit !(s < b) }'; then
      best_share=$share
      mv "$res.new" "$res"
    fi
    if awk -v s="$share" -v m="$QUIET_OTHERS" 'BEGIN { exit !(s <= m) }'; then break; fi
    QUIET_REJECTED=$((QUIET_REJECTED + 1))
    echo "  (others used $share of a core during the run: again)" >&2
  done
  cat "$res" >>"$out"
  echo "$best_share" >>"$out.others"
}
