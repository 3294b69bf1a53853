#!/usr/bin/env bash
# tandem simulate against measurement: the links of an emulated network (TANDEM_NET_EMULATE
# 100us,1gbps over tcp) calibrated under tandem run -n 2, then the all-reduce of the ring and of
# recursive doubling at 2 and 4 ranks (64 KiB and 1 MiB) measured with tandem bench and predicted
# from the calibration at the same world size: at 2 ranks within a factor of 3 (the emulated link's
# sleeps dominate; a factor of 2 held for months, until a CI run beside test_tp_ranks and
# test_grid_ranks measured recursive doubling's 64 KiB at 2.5, 2.5 and 4.9x three times in a row), at 4 ranks within a factor of 4
# (they oversubscribe the 2 cores beside the CI's other tests: a 64 KiB exchange measured 2-3x its
# prediction there while the same points measure within 5% on a quiet machine). A pair outside
# its bound is measured up to twice more, a second apart, as a burst of other jobs can triple one measurement. This
# is a check that the model is not wrong by a large factor; its accuracy is bench/sim_validate.sh's
# to measure (docs/PERFORMANCE.md has the full table). The sanitizer
# build runs everything but the timing comparison (ASan's instrumentation slows the algorithms'
# copies and reductions 2-3x beyond what the calibration's exchanges see). The compute calibration on a tiny
# MLP; the refusals of bad input; a study (--vary) drawn as a page and SVG files.
# usage: test_sim.sh path/to/tandem
set -u
T=${1:?usage: test_sim.sh path/to/tandem}
T=$(cd "$(dirname "$T")" && pwd)/$(basename "$T")
. "$(dirname "$0")/../harness.sh"
EMU=100us,1gbps

calibrate() { # at each world size: ranks that share the 2 cores are measured sharing them
  for n in 2 4; do
    TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=$EMU timeout 120 "$T" run -n $n -- "$T" simulate --calibrate --no-compute \
      --calibrate-max 1M -o "$TMP/c$n.json" >"$TMP/calib.out" 2>&1 || { tail -5 "$TMP/calib.out"; return 1; }
    grep -q '"intra"' "$TMP/c$n.json" || return 1
  done
  # the sizes: 8 B by 4x to the largest, and the L2's own size where it is within them; the
  # ping-pong's four bursts, each a one-way time beyond the emulated latency; the handoff of a
  # waited-for collective, a finite time below the link's own cost of 1 MiB (8.4 ms at 1 Gb/s);
  # at 4 ranks (2 cores crowded) the share of the crowding that hides under the wire written to the
  # file (the fit keeps it within 0..1; a file without it reads as -1 here)
  /usr/bin/python3 - "$TMP/c2.json" "$(getconf LEVEL2_CACHE_SIZE 2>/dev/null || echo 0)" "$TMP/c4.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
s4 = json.load(open(sys.argv[3]))["intra"].get("stagger", -1)
print("  stagger at 4 ranks %.2f" % s4)
if not 0 <= s4 <= 1: sys.exit(1)
m = c["measured"]
sizes, l2 = [p[0] for p in m["points"]], int(sys.argv[2] or 0)
want = sorted(set([8 * 4 ** k for k in range(10) if 8 * 4 ** k <= 1048576] + ([l2] if 8 < l2 <= 1048576 else [])))
bursts, hand = m["pingpong_bursts"], c["intra"]["handoff"]
print("  sizes %s, ping-pong bursts %s us, handoff %.0f us" % (sizes, [round(b * 1e6) for b in bursts], hand * 1e6))
sys.exit(0 if sizes == want and len(bursts) == 4 and all(b > 100e-6 for b in bursts) and 0 <= hand < 5e-3 else 1)
EOF
}

compare() { # compare N ALGO LO HI: tandem bench's all-reduce against the prediction, every ratio in [LO, HI]
  local n=$1 a=$2 lo=$3 hi=$4
  TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=$EMU timeout 120 "$T" run -n $n -- "$T" bench allreduce -b 64K -e 1M -f 16 \
    -n 5 -w 2 -c 0 -a $a -J "$TMP/m-$n-$a.json" >"$TMP/bench.out" 2>&1 || { tail -5 "$TMP/bench.out"; return 1; }
  "$T" simulate --collectives --cluster "$TMP/c$n.json" --ranks $n --min-bytes 64K --max-bytes 1M --json \
    >"$TMP/p-$n.json" || return 1
  /usr/bin/python3 - "$TMP/m-$n-$a.json" "$TMP/p-$n.json" $a $n $lo $hi <<'EOF'
import json, sys
meas = {r["size"]: r["time_us_median"] * 1e-6 for r in json.load(open(sys.argv[1]))} # as the validation measures
pred = {}
for line in open(sys.argv[2]):
    r = json.loads(line)
    if r["algo"] == sys.argv[3]: pred[r["bytes"]] = r["allreduce_s"]
bad = 0
for size, t in sorted(meas.items()):
    p = pred[size]
    ratio = t / p
    print("  %-4s %d ranks %8d B: measured %8.3f ms, predicted %8.3f ms, ratio %.2f" % (sys.argv[3], int(sys.argv[4]), size, t * 1e3, p * 1e3, ratio))
    bad |= not (float(sys.argv[5]) <= ratio <= float(sys.argv[6]))
sys.exit(1 if bad or not meas else 0)
EOF
}

predicted_vs_measured() { # a pair out of bounds is measured up to twice more: a burst of other jobs is not a wrong model
  [[ -s $TMP/c2.json && -s $TMP/c4.json ]] || return 1
  if ldd "$T" 2>/dev/null | grep -q libasan; then # instrumented copies and reductions cost 2-3x what the calibration saw
    echo "  skipped in the sanitizer build: the timings are the Release build's to check"
    return 0
  fi
  local ok=0 n a lo hi try
  for n in 2 4; do
    lo=0.33 hi=3
    [[ $n -eq 4 ]] && lo=0.25 hi=4 # 4 ranks share 2 cores with the CI's other tests: the scheduler's delays are noise here
    for a in ring rd; do
      for try in 1 2 3; do
        compare $n $a $lo $hi && break
        [[ $try -lt 3 ]] && { echo "  again:"; sleep 1; } || ok=1
      done
    done
  done
  return $ok
}

compute_calibration() { # a measured step gives a positive rate, written with the links of threads
  timeout 120 "$T" simulate --calibrate --data synthetic --batch-size 16 --threads 1 --calibrate-steps 4 --calibrate-max 64K \
    -o "$TMP/t.json" >"$TMP/t.out" 2>&1 || { tail -3 "$TMP/t.out"; return 1; }
  grep -q 'compute: mlp' "$TMP/t.out" && grep -q '"model": "mlp"' "$TMP/t.json" &&
    "$T" simulate --cluster "$TMP/t.json" --data synthetic --batch-size 16 --ranks 1,2 --json >"$TMP/s.json" &&
    [[ $(wc -l <"$TMP/s.json") -eq 2 ]]
}

refused() { # refused CODE TEXT ARGS...: exit status CODE and TEXT in the message
  local code=$1 text=$2; shift 2
  "$T" simulate "$@" >"$TMP/r.out" 2>&1
  local rc=$?
  [[ $rc -eq $code ]] && grep -q -- "$text" "$TMP/r.out" || { echo "  simulate $*: exit $rc:"; tail -2 "$TMP/r.out"; return 1; }
}
bad_input() {
  printf '{"ranks_per_node": 8, "cores_per_node": 0, "threads": 1, "shm": 0, "intra": {"alpha": 1e-6, "beta": 1e-10, "gamma": 0}, "compute": {"flops": 1e9, "optimizer": 1e9, "overhead": 0}}' >"$TMP/bad.json"
  refused 2 "'0' is not a rank count" --ranks 0,2 &&
    refused 2 "expected positive rank counts" --ranks 2, &&
    refused 2 'the object "inter" is missing' --cluster "$TMP/bad.json" &&
    refused 2 "No such file" --cluster "$TMP/none.json" &&
    refused 2 "$TMP: not a regular file but a directory" --cluster "$TMP" &&
    refused 1 "resnet model: its compute per layer is not described" --model resnet --ranks 2 &&
    refused 1 "the mlp model has no heads to split" --tp 2 --ranks 2 &&
    refused 1 "the process grid does not make the world" --model gpt --tp 2 --ranks 3 &&
    refused 2 "inter-bw 0" --inter-bw 0 --ranks 2 &&
    refused 2 "give it with --calibrate" -o "$TMP/x.json" &&
    refused 2 "give it with --collectives" --back-to-back --ranks 2 &&
    refused 2 "expected OPTION=V1,V2" --vary allreduce --ranks 2 &&
    refused 2 "--vary allreduce: the value tri failed" --vary allreduce=ring,tri --ranks 2 &&
    { ! grep -q "^allreduce ring" "$TMP/r.out" || { echo "  ring predicted before tri was refused"; false; }; } &&
    refused 2 "not with --collectives" --collectives --html "$TMP/x.html" &&
    refused 2 "--html: $TMP/none/x.html: cannot create" --ranks 2 --html "$TMP/none/x.html" &&
    refused 2 "-o: $TMP is a directory" --calibrate -o "$TMP" &&
    refused 2 "--svg: $TMP/none/s-step.svg: cannot create" --ranks 2 --svg "$TMP/none/s"
}

study_page() { # --vary, --html, --svg: a plot per quantity, a polyline per configuration, the axes labelled
  "$T" simulate --model gpt --config mini --batch-size 2 --seq-len 64 --ranks 1,8,64 --vary allreduce=ring,hier,rd \
    --html "$TMP/study.html" --svg "$TMP/study" >"$TMP/study.out" 2>&1 || { tail -3 "$TMP/study.out"; return 1; }
  /usr/bin/python3 - "$TMP/study.html" "$TMP/study-step.svg" "$TMP/study-efficiency.svg" "$TMP/study.out" <<'EOF'
import re, sys
page, step, eff, out = (open(p).read() for p in sys.argv[1:5])
bad = []
def want(cond, what):
    if not cond: bad.append(what)
want(page.startswith("<!DOCTYPE html>") and "<script" not in page, "a page without script")
want(page.count("<svg") == 3 and page.count("<polyline") == 9, "3 plots of 3 lines: %d, %d" % (page.count("<svg"), page.count("<polyline")))
for label in ("ranks", "milliseconds per step", "percent"):
    want(">%s</text>" % label in page, "axis label " + label)
for name in ("allreduce ring", "allreduce hier", "allreduce rd"):
    want('data-name="%s"' % name in page and "<h2>%s</h2>" % name in page, "series and table " + name)
want(len(re.findall(r"<tr><td>(1|8|64)</td>", page)) == 9, "9 table rows")
for svg, label in ((step, "milliseconds per step"), (eff, "percent")):
    want(svg.startswith("<?xml") and "<figure" not in svg and svg.count("<svg xmlns=") == 1, "a standalone svg")
    want(svg.count("<polyline") == 3 and ">%s</text>" % label in svg and ">ranks</text>" in svg, "its lines and axes")
# the printed tables: one per configuration; at 1 rank all three alike, at 64 ranks (8 nodes) hier differs from ring
steps = {}
cur = None
for line in out.splitlines():
    m = re.match(r"(allreduce \w+): cluster", line)
    if m: cur = m.group(1); continue
    f = line.split()
    if cur and f and f[0].isdigit(): steps[(cur, int(f[0]))] = float(f[2])
want(len(steps) == 9 and steps[("allreduce ring", 1)] == steps[("allreduce hier", 1)], "1 rank: the same step")
want(steps.get(("allreduce ring", 64)) != steps.get(("allreduce hier", 64)), "64 ranks: hier is not the ring")
if bad: print("  " + "; ".join(bad)); sys.exit(1)
EOF
}

check calibrate calibrate
check predicted_vs_measured predicted_vs_measured
check compute_calibration compute_calibration
check bad_input bad_input
check study_page study_page
finish
