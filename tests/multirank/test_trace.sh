#!/usr/bin/env bash
# Timelines across real processes (tandem train --trace DIR, tandem trace merge): every collective
# has a span on every rank with the same sequence number (data parallel over shared memory with
# its buckets; ZeRO-3 over TCP on 3 ranks with its parameter gathers; a 2-stage pipeline); the
# clock offsets of ranks on this machine are zero within their stated uncertainty; the merged file
# is valid JSON with one process row per rank; a trace directory that cannot be written fails
# before any step; --emulate-ranks N equals N real ranks bit for bit, each rank its own row.
# usage: test_trace.sh path/to/tandem   (run from the repository root: the GPT reads data/)
set -u
T=${1:?usage: test_trace.sh path/to/tandem}
. "$(dirname "$0")/../harness.sh"
CHECK_PY="$(dirname "$0")/trace_check.py"

job() { # job RANKS TRANSPORT OUT ARGS...: tandem ARGS on RANKS processes, bounded
  local n=$1 tr=$2 out=$3; shift 3
  TANDEM_TRANSPORT=$tr TANDEM_TIMEOUT=60 timeout 120 "$T" run -n "$n" -- tandem "$@" >"$out" 2>&1 ||
    { echo "  tandem $* failed:"; tail -4 "$out" | sed 's/^/    /'; return 1; }
}
traced() { # traced NAME RANKS TRANSPORT SPANS -- ARGS...: the run, its merge, the checks
  local name=$1 n=$2 tr=$3 spans=$4; shift 5
  job "$n" "$tr" "$TMP/$name.out" "$@" --trace "$TMP/$name" || return 1
  "$T" trace merge "$TMP/$name" "$TMP/$name.json" >"$TMP/$name.merge" 2>&1 || { cat "$TMP/$name.merge"; return 1; }
  grep -q "merged $n ranks" "$TMP/$name.merge" && /usr/bin/python3 "$CHECK_PY" "$TMP/$name" "$TMP/$name.json" "$n" $spans
}

MLP=(train --data synthetic --steps 4 --threads 1 --batch-size 16 --bucket-mb 0.05 --seed 3)
GPT=(train --model gpt --layers 2 --heads 2 --width 32 --block 16 --seq-len 16 --steps 3 --threads 1 --val-batches 1
     --val-every 0 --batch-size 2 --seed 5)
check "dp over shm: every collective on every rank, buckets, clocks, merge" \
  traced dp 2 shm "step data forward backward optimizer evaluation bucket_all-reduce wait_for_buckets checkpoint" -- \
  "${MLP[@]}" --checkpoint-dir "$TMP/ck2" --checkpoint-every 2
check "dp over tcp, 3 ranks: bucket all-reduces launched and completed" \
  traced dp3 3 tcp "all-reduce wait_for_buckets" -- "${MLP[@]}" --steps 2
check "zero-3 over tcp, 3 ranks: parameter gathers" \
  traced zero 3 tcp "all-gather reduce-scatter checkpoint wait_for_parameters forward_block backward_block" -- "${GPT[@]}" --zero 3 --checkpoint-dir "$TMP/ckz"
check "pipeline, 2 stages: its actions" traced pp 2 shm "forward backward optimizer wait_for_exchange" -- "${GPT[@]}" --pp 2 --microbatches 2

bad_dir() { # a file where the directory should be: refused at the start, before any step
  : >"$TMP/a-file"
  TANDEM_TRANSPORT=shm timeout 60 "$T" run -n 2 -- tandem "${MLP[@]}" --trace "$TMP/a-file/traces" >"$TMP/bad.out" 2>&1
  local rc=$?
  [[ $rc -ne 0 ]] && grep -q -- "--trace $TMP/a-file/traces: cannot create the directory" "$TMP/bad.out" &&
    ! grep -q "step 1/" "$TMP/bad.out" || { echo "  exit $rc:"; tail -3 "$TMP/bad.out" | sed 's/^/    /'; return 1; }
}
check "an unwritable trace directory fails before any step" bad_dir
merge_errors() {
  mkdir -p "$TMP/half" && cp "$TMP/dp3/trace.rank0.json" "$TMP/dp3/trace.rank2.json" "$TMP/half/" 2>/dev/null
  "$T" trace merge "$TMP/half" "$TMP/half.json" >"$TMP/half.out" 2>&1
  [[ $? -eq 1 ]] && grep -q "lacks the trace of rank 1 (of 3 ranks)" "$TMP/half.out" &&
    ! "$T" trace merge "$TMP/half" >/dev/null 2>&1 || { cat "$TMP/half.out"; return 1; }
}
check "trace merge refuses a rank missing, and a missing argument" merge_errors
merge_onto_input() { # an output that is one of the inputs is refused, the input kept; --help after merge
  mkdir -p "$TMP/own" && cp "$TMP/dp3/"trace.rank*.json "$TMP/own/" && cp "$TMP/own/trace.rank0.json" "$TMP/own.rank0" || return 1
  "$T" trace merge "$TMP/own" "$TMP/own/trace.rank0.json" >"$TMP/own.out" 2>&1
  [[ $? -eq 1 ]] && grep -q "the output $TMP/own/trace.rank0.json is one of the inputs" "$TMP/own.out" &&
    cmp -s "$TMP/own.rank0" "$TMP/own/trace.rank0.json" || { echo "  refused? kept?"; cat "$TMP/own.out"; return 1; }
  "$T" trace merge --help | grep -q "usage: tandem trace merge" || return 1
  mkdir -p "$TMP/big" && echo '{}' >"$TMP/big/trace.rank99999999999.json"
  "$T" trace merge "$TMP/big" "$TMP/big.json" 2>&1 | grep -q "rank 99999999999 is out of range"
}
check "trace merge refuses to write over one of its inputs (kept as it was); trace merge --help" merge_onto_input
killed() { # a run killed after its second checkpoint: its traces were never closed, and merge all the same
  # its own session (the launcher and both ranks in one process group, killed at once as a node's
  # crash would), and a timeout should the kill miss it
  TANDEM_TRANSPORT=tcp setsid timeout 300 "$T" run -n 2 -- tandem "${MLP[@]}" --steps 1000000 --checkpoint-dir "$TMP/ckk" \
    --checkpoint-every 3 --trace "$TMP/killed" >"$TMP/killed.out" 2>&1 &
  local pid=$! i
  disown # its SIGKILL is the test, not news
  for i in $(seq 600); do # up to 60 s for the second checkpoint (the first one's flush, after step 3, on both ranks)
    [[ $(ls "$TMP/ckk" 2>/dev/null | grep -c '^ckpt-[0-9]*\.safetensors$') -ge 2 ]] && break
    sleep 0.1
  done
  kill -9 -- -"$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null
  pkill -9 -f -- "--trace $TMP/killed" # any left (setsid forks when already a group leader)
  for i in $(seq 50); do pgrep -f -- "--trace $TMP/killed" >/dev/null || break; sleep 0.1; done
  "$T" trace merge "$TMP/killed" "$TMP/killed.json" >"$TMP/killed.merge" 2>&1 || { cat "$TMP/killed.merge"; return 1; }
  grep -q "of the traces w[a-z]* not closed" "$TMP/killed.merge" || { cat "$TMP/killed.merge"; return 1; }
  /usr/bin/python3 - "$TMP/killed.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
steps = {r: sum(1 for e in m["traceEvents"] if e.get("pid") == r and e.get("name") == "step" and e["ph"] == "X") for r in (0, 1)}
uc = m["otherData"]["unclosed"]
# both killed mid-run (a rank that heard the other go first may close its own: one at least)
ok = all(n >= 3 for n in steps.values()) and len(uc) >= 1 and all(u["last_us"] > 0 for u in uc)
sys.exit(0 if ok else print("steps per rank %s, unclosed %s" % (steps, uc)) or 1)
EOF
}
check "a run killed mid-way: its unclosed traces merge up to the last flush, listed as unclosed" killed
# --emulate-ranks N: N ranks as threads of one process equal N real ranks bit for bit (the data
# parallel sums run in rank order on every transport), and each is its own row in the trace
emulated() { # emulated NAME RANKS ARGS...: the emulated run (traced) against tandem run over tcp
  local name=$1 n=$2; shift 2
  TANDEM_TIMEOUT=60 timeout 120 "$T" "$@" --emulate-ranks "$n" --trace "$TMP/$name" --save-weights "$TMP/$name.emu" \
    >"$TMP/$name.out" 2>&1 || { echo "  the emulated run failed:"; tail -3 "$TMP/$name.out" | sed 's/^/    /'; return 1; }
  job "$n" tcp "$TMP/$name.real.out" "$@" --save-weights "$TMP/$name.real" || return 1
  cmp -s "$TMP/$name.emu" "$TMP/$name.real" || { echo "  $n emulated ranks differ from $n real ones"; return 1; }
  "$T" trace merge "$TMP/$name" "$TMP/$name.json" >/dev/null && /usr/bin/python3 "$CHECK_PY" "$TMP/$name" "$TMP/$name.json" "$n" step
}
check "--emulate-ranks 2 (MLP, dropout) equals 2 real ranks; a row per rank" emulated emu2 2 "${MLP[@]}" --dropout 0.3
check "--emulate-ranks 3 with ZeRO-3 (GPT) equals 3 real ranks" emulated emu3 3 "${GPT[@]}" --zero 3
straggler() { # a straggler changes the timing, never the result
  timeout 120 "$T" "${MLP[@]}" --dropout 0.3 --emulate-ranks 2 --emulate-slow 1:2 --save-weights "$TMP/slow.emu" >"$TMP/slow.out" 2>&1 &&
    cmp -s "$TMP/emu2.emu" "$TMP/slow.emu" || { echo "  the straggler's run differs or failed:"; tail -2 "$TMP/slow.out"; return 1; }
}
check "--emulate-slow 1:2 gives the same weights" straggler
emulate_refused() {
  "$T" "${MLP[@]}" --emulate-ranks 2 --threads 2 >"$TMP/e1" 2>&1; local a=$?
  WORLD_SIZE=2 "$T" "${MLP[@]}" --emulate-ranks 2 >"$TMP/e2" 2>&1; local b=$?
  "$T" "${MLP[@]}" --emulate-ranks 2 --emulate-slow 2:2 >"$TMP/e3" 2>&1; local c=$?
  [[ $a -eq 2 && $b -eq 2 && $c -eq 2 ]] && grep -q "give --threads 1 (given 2)" "$TMP/e1" && grep -q "not under a launcher" "$TMP/e2" &&
    grep -q "emulate-slow '2:2'; expected RANK:FACTOR with a rank 0..1" "$TMP/e3" || { cat "$TMP/e1" "$TMP/e2" "$TMP/e3"; return 1; }
}
check "--emulate-ranks with --threads 2, under a launcher, or a straggler that is no rank, is refused" emulate_refused
finish
