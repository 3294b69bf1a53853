#!/usr/bin/env bash
# tandem report, tandem scale and the live view, end to end: a 2-rank run with --metrics and
# tandem run --status-every (one status line per rank and the slowest rank; rank 0's progress line
# with the communication share); the metrics' run header and per-rank times (rank 0's own entry
# equals its step time); the report rendered in a real headless Chromium: its plots are SVG with
# drawn (non-empty) lines and bars, the axis labels are there, no console message at all (a page
# with a script error, as a control, shows one), a screenshot kept as BUILD/test-artifacts/report.png;
# a truncated line skipped and told on stderr and in the page; another run appended to the same
# metrics file, two runs in one directory, an empty and a missing directory: clear errors;
# tandem scale --ranks 1,2 (weak and --strong) prints the table whose speed-up and efficiency
# follow from its throughputs, sets the batches, and refuses what it cannot do.
# Chromium (Debian's) is installed here, only when this test runs and only when missing; without
# it (no root, no apt, no mirror) the browser checks are skipped with a message and the rest runs.
# usage: test_report.sh path/to/tandem [build dir for the screenshot]
set -u
T=$(readlink -f "${1:?usage: test_report.sh path/to/tandem [build dir]}")
ART=${2:-$(dirname "$T")}/test-artifacts
D=$(mktemp -d /tmp/tandem-report-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$D"; }
trap cleanup EXIT
trap 'exit 1' INT TERM
failed=0
check() { # name, command...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; failed=1; fi
}
TRAIN=(train --data synthetic --batch-size 16 --threads 1)

# ---- the browser: Debian's chromium, installed only now and only when missing -----------------
browser=""
find_browser() { for b in chromium chromium-browser google-chrome; do command -v $b >/dev/null && { browser=$(command -v $b); return 0; }; done; return 1; }
if ! find_browser; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "test_report: installing chromium for the browser checks (once)"
    { DEBIAN_FRONTEND=noninteractive timeout 400 apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 ||
      { timeout 120 apt-get update -qq >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive timeout 400 apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }; }
    find_browser || true
  fi
  [[ -n $browser ]] || echo "skip: the browser checks: chromium is not installed and cannot be installed here (needs root, apt-get and a Debian mirror)"
fi
chrome() { # chrome OUT_LOG args... : headless, a profile of its own, console messages on stderr
  local log=$1; shift
  timeout 90 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars --user-data-dir="$D/profile" \
    --enable-logging=stderr --v=0 "$@" 2>"$log"
}

# ---- a 2-rank run with the live view -------------------------------------------------------------
mkdir -p "$D/run"
timeout 300 "$T" run -n 2 --status-every 0.3 -- "$T" "${TRAIN[@]}" --steps 40 --metrics "$D/run/metrics.jsonl" >"$D/run.out" 2>&1 &
pids+=($!)
wait $! || { echo "FAIL the 2-rank run"; tail -20 "$D/run.out"; exit 1; }
live() {
  grep -q '^\[status [0-9]*s\] slowest: rank [01], last step [0-9.]* ms' "$D/run.out" &&
    grep -q '^  rank 0: step [0-9]*/40  loss [0-9.]*  [0-9]* samples/s  step [0-9.]* ms (forward .*comm [0-9]*%' "$D/run.out" &&
    grep -q '^  rank 1: step [0-9]*/40 ' "$D/run.out" &&
    grep -q '^\[rank 0\] epoch 1 step 40/40  loss [0-9.]*  acc [0-9.]*  [0-9]* samples/s  comm [0-9]*%  ETA ' "$D/run.out" ||
    { grep -v '^\[rank' "$D/run.out" | head -8; return 1; }
  ! ls /tmp | grep -q "tandem-status-" || [[ -n ${TMPDIR:-} ]] || { echo "  a status directory was left in /tmp"; return 1; }
}
check "live view: status lines per rank with the slowest rank, progress line with comm share" live
header_and_ranks() {
  python3 - "$D/run/metrics.jsonl" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
h = lines[0]["tandem_run"]
assert len(h["run_id"]) == 16 and len(h["config_hash"]) == 16 and h["attempt"] == 0 and h["resumed_from"] == -1, h
assert h["config"]["world_size"] == 2 and h["config"]["batch_size"] == 16 and h["plan"]["total"] > 0, h
steps = [l for l in lines if "step_time_ms" in l]
assert len(steps) == 40, len(steps)
for s in steps:
    assert len(s["rank_step_ms"]) == 2 and len(s["rank_comm_wait_ms"]) == 2, s
    assert abs(s["rank_step_ms"][0] - s["step_time_ms"]) < 1e-3 + 1e-6 * s["step_time_ms"], s   # rank 0's own slot
    assert abs(s["rank_forward_ms"][0] - s["time_forward_ms"]) < 1e-3 + 1e-6 * s["time_forward_ms"], s
    r0, r1 = s["rank_step_ms"]  # printed to 1 us: within that, either rank may be the slower one
    assert r1 > 0 and (abs(r0 - r1) <= 1e-3 or s["slowest_rank"] == (0 if r0 > r1 else 1)), s
EOF
}
check "metrics: run header, per-rank times gathered (rank 0's equal its own fields), slowest rank" header_and_ranks

# ---- the report -----------------------------------------------------------------------------------
cp "$D/run/metrics.jsonl" "$D/run/metrics.full"
head -c 100 <(sed -n 5p "$D/run/metrics.full") >"$D/cut"
{ sed -n 1,20p "$D/run/metrics.full"; cat "$D/cut"; echo; sed -n '21,$p' "$D/run/metrics.full"; } >"$D/run/metrics.jsonl"
rm "$D/run/metrics.full"
report() {
  "$T" report "$D/run" >"$D/report.out" 2>"$D/report.err" || { cat "$D/report.err"; return 1; }
  grep -q "metrics.jsonl:21: skipped: not a whole JSON record" "$D/report.err" &&
    grep -q "1 line skipped" "$D/run/report.html" && grep -q "metrics.jsonl:21: skipped" "$D/run/report.html" &&
    grep -q "tandem report: .*: 40 steps" "$D/report.out" || { cat "$D/report.out" "$D/report.err"; return 1; }
  ! grep -q "<script" "$D/run/report.html" && ! grep -qi "https\?://[a-z]" <(grep -v 'xmlns="http://www.w3.org/2000/svg"' "$D/run/report.html" | sed 's#xmlns="http://www.w3.org/2000/svg"##g')
}
check "tandem report: the truncated line is skipped and told (stderr and page); no script, nothing from the network" report

browser_checks() {
  mkdir -p "$ART"
  # the control: the same capture sees a script error
  printf '<html><body><script>undefined_function_for_the_control();</script></body></html>' >"$D/bad.html"
  chrome "$D/bad.log" --dump-dom "file://$D/bad.html" >/dev/null
  grep -q "CONSOLE.*Uncaught ReferenceError" "$D/bad.log" || { echo "  the console capture missed the control's error"; return 1; }
  # geometry, measured by the browser: a copy of the page with a script that writes what it finds
  sed 's#</body>#<script>\
var s=document.querySelectorAll("svg"),p=document.querySelectorAll("svg polyline"),b=document.querySelectorAll("svg rect.bar"),d=0,h=0;\
p.forEach(function(e){var r=e.getBBox();if(r.width>0)d++;});b.forEach(function(e){var r=e.getBBox();if(r.height>0)h++;});\
var l=[];document.querySelectorAll("svg text.axis-label").forEach(function(e){l.push(e.textContent)});\
var o=document.createElement("pre");o.id="check";o.textContent="svgs="+s.length+" lines="+p.length+" drawn="+d+" bars="+b.length+" tall="+h+" labels="+l.join("|");document.body.appendChild(o);\
</script></body>#' "$D/run/report.html" >"$D/check.html"
  chrome "$D/check.log" --dump-dom "file://$D/check.html" >"$D/check.dom" || { tail -5 "$D/check.log"; return 1; }
  # no console message at all (the page has no script; the checker's writes none)
  if grep -q ":CONSOLE" "$D/check.log"; then grep ":CONSOLE" "$D/check.log" | head -5; return 1; fi
  local got; got=$(grep -o '<pre id="check">[^<]*' "$D/check.dom" | sed 's/<pre id="check">//')
  echo "  browser: ${got:0:160}..."
  [[ $got =~ svgs=([0-9]+)\ lines=([0-9]+)\ drawn=([0-9]+)\ bars=([0-9]+)\ tall=([0-9]+) ]] || return 1
  local svgs=${BASH_REMATCH[1]} lines=${BASH_REMATCH[2]} drawn=${BASH_REMATCH[3]} bars=${BASH_REMATCH[4]} tall=${BASH_REMATCH[5]}
  ((svgs >= 10 && lines >= 8 && drawn == lines && bars >= 10 && tall >= 8)) || { echo "  too few plots, or empty ones"; return 1; }
  for label in "step" "loss" "training time (s)" "samples per second" "milliseconds per step" "MiB" "rank"; do
    grep -q "labels=.*|$label|\|labels=$label|" <<<"${got}|" || { echo "  no axis label '$label'"; return 1; }
  done
  chrome "$D/shot.log" --window-size=1360,3600 --screenshot="$ART/report.png" "file://$D/run/report.html" >/dev/null
  [[ -s $ART/report.png ]] || { echo "  no screenshot"; return 1; }
  echo "  screenshot: $ART/report.png"
}
if [[ -n $browser ]]; then check "headless Chromium: SVG plots drawn, axis labels, no console message (control caught), screenshot" browser_checks; fi

# ---- bad input ------------------------------------------------------------------------------------
bad_input() {
  mkdir -p "$D/empty"
  "$T" report "$D/empty" 2>"$D/e1"; [[ $? -eq 1 ]] && grep -q "holds no metrics file.*the directory is empty" "$D/e1" || { cat "$D/e1"; return 1; }
  "$T" report "$D/nowhere" 2>"$D/e2"; [[ $? -eq 1 ]] && grep -q "nowhere: No such file or directory; expected a run directory" "$D/e2" || { cat "$D/e2"; return 1; }
  "$T" report 2>"$D/e3"; [[ $? -eq 2 ]] && grep -q "no run directory given" "$D/e3" || { cat "$D/e3"; return 1; }
  "$T" report "$D/run" --bogus 2>/dev/null; [[ $? -eq 2 ]] || return 1
  # a second run appended to the same metrics file (tandem train appends)
  mkdir -p "$D/twice"
  "$T" "${TRAIN[@]}" --steps 3 --metrics "$D/twice/m.jsonl" >/dev/null 2>&1 && "$T" "${TRAIN[@]}" --steps 3 --seed 7 --metrics "$D/twice/m.jsonl" >/dev/null 2>&1 || return 1
  "$T" report "$D/twice" 2>"$D/e4"; [[ $? -eq 1 ]] && grep -q "metrics of different runs are mixed: run [0-9a-f]* .*m.jsonl:1.*m.jsonl:7.*tandem.seed 42 vs 7" "$D/e4" || { cat "$D/e4"; return 1; }
  # two runs' files in one directory
  mkdir -p "$D/two"
  "$T" "${TRAIN[@]}" --steps 2 --metrics "$D/two/a.jsonl" >/dev/null 2>&1 && "$T" "${TRAIN[@]}" --steps 2 --metrics "$D/two/b.jsonl" >/dev/null 2>&1 || return 1
  "$T" report "$D/two" 2>"$D/e5"; [[ $? -eq 1 ]] && grep -q "more than one run: .*a.jsonl .* and .*b.jsonl" "$D/e5" || { cat "$D/e5"; return 1; }
  [[ ! -e $D/two/report.html && ! -e $D/twice/report.html ]]
}
check "bad input: empty and missing directories, no argument, mixed runs in a file and in a directory" bad_input

# ---- tandem scale -----------------------------------------------------------------------------------
scale() {
  timeout 300 "$T" scale --ranks 1,2 --dir "$D/weak" -- tandem "${TRAIN[@]}" --steps 8 >"$D/weak.out" 2>&1 || { cat "$D/weak.out"; return 1; }
  python3 - "$D/weak.out" <<'EOF' || return 1
import re, sys
rows = [l.split() for l in open(sys.argv[1]) if re.match(r"^\s+[12]\s+\d+\s+[0-9.]+\s", l)]
assert [r[0] for r in rows] == ["1", "2"] and [r[1] for r in rows] == ["16", "32"], rows   # weak: batch per rank kept
s1, s2 = float(rows[0][2]), float(rows[1][2])
assert abs(float(rows[1][3]) - s2 / s1) <= 0.006 and abs(float(rows[1][4].rstrip("%")) - 100 * s2 / s1 / 2) <= 0.06, rows
assert float(rows[0][6].rstrip("%")) == 0.0 and float(rows[1][6].rstrip("%")) > 0, rows       # one rank waits for nobody
EOF
  grep -q '"batch_size":16,' "$D/weak/ranks-2/metrics.jsonl" && [[ -s $D/weak/report.html ]] || return 1
  timeout 300 "$T" scale --ranks 1,2 --strong --dir "$D/strong" -o "$D/strong.html" -- tandem "${TRAIN[@]}" --steps 4 >"$D/strong.out" 2>&1 || { cat "$D/strong.out"; return 1; }
  grep -q '"batch_size":8,"accum":1,"global_batch":16,' "$D/strong/ranks-2/metrics.jsonl" && [[ -s $D/strong.html ]] || return 1
  "$T" scale --ranks 1,2 --dir "$D/weak" -- tandem "${TRAIN[@]}" --steps 8 2>"$D/s1"; [[ $? -eq 2 ]] && grep -q "ranks-1/metrics.jsonl exists" "$D/s1" || { cat "$D/s1"; return 1; }
  "$T" scale --ranks 1,3 --strong --dir "$D/s3" -- tandem "${TRAIN[@]}" 2>"$D/s2"; [[ $? -eq 2 ]] && grep -q "global batch 16 .*which 3 ranks do not divide" "$D/s2" || { cat "$D/s2"; return 1; }
  "$T" scale --ranks 2,1 -- tandem train 2>"$D/s3e"; [[ $? -eq 2 ]] && grep -q "expected increasing world sizes" "$D/s3e" || return 1
  "$T" scale --ranks 1 -- tandem train --metrics x 2>"$D/s4"; [[ $? -eq 2 ]] && grep -q "gives --metrics" "$D/s4" || return 1
  "$T" scale --ranks 1 -- tandem train --emulate-ranks 2 2>"$D/s4e"; [[ $? -eq 2 ]] && grep -q "gives --emulate-ranks" "$D/s4e" || return 1
  "$T" scale --ranks 1 -o "$D" -- tandem train 2>"$D/s4o"; [[ $? -eq 2 ]] && grep -q -- "-o: $D is a directory" "$D/s4o" || return 1
  "$T" scale --ranks 1 -- tandem bench 2>"$D/s5"; [[ $? -eq 2 ]] && grep -q "expected tandem train" "$D/s5" || return 1
  if [[ -n $browser ]]; then
    chrome "$D/scale.log" --dump-dom "file://$D/weak/report.html" >"$D/scale.dom" && ! grep -q ":CONSOLE" "$D/scale.log" &&
      [[ $(grep -o "<svg" "$D/scale.dom" | wc -l) -eq 4 ]] && grep -q ">percent of linear<" "$D/scale.dom" || { echo "  the scale report in the browser"; return 1; }
  fi
}
check "tandem scale: weak and strong tables (speed-up and efficiency from the throughputs), batches set, refusals" scale

exit $failed
