#!/usr/bin/env bash
# The simulator's validation (docs/PERFORMANCE.md, "Simulator: predicted against measured"):
#   collectives  every all-reduce algorithm (ring, rd, rhd, tree, direct), 1 KiB - 64 MiB, 2, 3, 4
#                and 8 ranks over tcp with TANDEM_NET_EMULATE=100us,1gbps: tandem bench measures
#                (the median of the iterations, the slowest rank's each: 41 up to 256 KiB, 5 beyond;
#                MEAN=1 summary: their mean; up to 256 KiB in PASSES (3) passes over every pair, minutes
#                apart, and each point the median of its passes: the host's scheduling regimes last
#                seconds and moved one pass's 8-rank points by 35-44%),
#                tandem simulate --collectives predicts from a calibration at the same world size just
#                before, one per pass, each point the median of their predictions (the calibrations
#                meet the regimes too: a message's CPU time at 8 ranks 24-41 us from one to the next)
#   training     data-parallel training of the MLP (200 steps) and GPT mini (40) at 1, 2 and 4
#                ranks, emulated 100us,1gbps and 100us,10gbps: the median step of tandem train's
#                metrics against tandem simulate's step, from a calibration at that world size
#                (tandem run -n N tandem simulate --calibrate: every rank's step measured at once,
#                the links); ROUNDS times (3), to show how much the same run varies
# B2B=1: the collectives predicted back to back (simulate --back-to-back), as tandem bench times them.
# RANKS="3" ALGOS="rd rhd" measure those pairs again, keeping the other rows of coll.tsv. INPLACE=1
# summary: the tables from the in-place measurements (tandem bench's second, of the same size).
# Errors are |predicted - measured| / measured; mean and max per group, as Calculon reports. Each
# row carries the 1-minute load average when it was measured (the machine is shared).
# T_BASE=path/to/an-earlier/tandem also predicts every point with that binary from the same
# calibration (its links the plain alpha-beta fit of the ring exchange, as calibrations before the
# CPU terms wrote them): the same measurements, two models.
# usage: bench/sim_validate.sh [collectives|training|all|summary|repredict]   (repository root, build/tandem built)
# repredict: $T's model on the measurements in $OUT, its predictions beside those it replaces
# Runs under nice; OUT (default /tmp/sim-validate) keeps every file.
set -u
T=${T:-$PWD/build/tandem}
T_BASE=${T_BASE:-}
OUT=${OUT:-/tmp/sim-validate}
WHAT=${1:-all}
mkdir -p "$OUT"
N() { nice -n 19 "$@"; }
load() { cut -d' ' -f1 /proc/loadavg; }
# the training runs (repredict gives the simulator the same options)
MLP=(--model mlp --data synthetic --batch-size 64 --steps 200 --threads 1)
GPT=(--model gpt --batch-size 2 --seq-len 64 --steps 40 --threads 1 --val-every 0 --val-batches 1)

base_cluster() { # base_cluster IN OUT: the links as a calibration without CPU terms fitted them
  /usr/bin/python3 - "$1" "$2" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
for l in ("intra", "inter"):
    c[l]["alpha"], c[l]["beta"] = c["measured"]["ring"]["alpha"], c["measured"]["ring"]["beta"]
    for f in ("cpu_alpha", "cpu_beta", "pairwise"): c[l].pop(f, None)
c.pop("cpu_cores", None)
json.dump(c, open(sys.argv[2], "w"), indent=1)
EOF
}

calibrate() { # calibrate N EMU OUTFILE [BASE]: the links at N ranks over tcp, emulated
  local n=$1 emu=$2 out=$3 base=${4:-}
  TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=$emu N timeout 300 "$T" run -n "$n" -- "$T" simulate --calibrate --no-compute \
    --calibrate-max ${CAL_MAX:-16M} ${base:+--cluster "$base"} -o "$out" 2>&1 | grep -E 'link:|cpu:' | sed 's/^\[rank 0\] //'
}

predict_coll() { # predict_coll BINARY CLUSTER N OUT: one all-reduce alone; B2B=1: back to back, as tandem
  # bench times them (simulate --back-to-back: only the tree differs; on 2026-11-30's runs its 1-16
  # MiB at 8 ranks came right and its 1-64 KiB and 64 MiB went the other way, docs/PERFORMANCE.md)
  local b2b=()
  [[ ${B2B:-0} == 1 ]] && b2b=(--back-to-back)
  N "$1" simulate --collectives ${b2b[@]+"${b2b[@]}"} --cluster "$2" --ranks $3 --min-bytes 1K --max-bytes 64M --json >"$4"
}

collectives() {
  local emu=100us,1gbps
  local keep="$OUT/coll.tsv.keep"
  touch "$OUT/coll.tsv"
  # RANKS and ALGOS measure some pairs again (a burst of other work spoiled them): the other rows stay
  for n in ${RANKS:-2 3 4 8}; do for a in ${ALGOS:-ring rd rhd tree direct}; do
    awk -F'\t' -v a=$a -v n=$n '!($1 == a && $2 == n)' "$OUT/coll.tsv" >"$keep" && mv "$keep" "$OUT/coll.tsv"
  done; done
  for n in ${RANKS:-2 3 4 8}; do
    for a in ${ALGOS:-ring rd rhd tree direct}; do
      # calibrated just before: the machine's load drifts over the minutes a world size takes
      calibrate $n $emu "$OUT/coll-c$n-$a.json"
      predict_coll "$T" "$OUT/coll-c$n-$a.json" $n "$OUT/coll-p$n-$a.json"
      if [[ -n $T_BASE ]]; then
        base_cluster "$OUT/coll-c$n-$a.json" "$OUT/coll-b$n-$a.json"
        predict_coll "$T_BASE" "$OUT/coll-b$n-$a.json" $n "$OUT/coll-q$n-$a.json"
      else
        cp "$OUT/coll-p$n-$a.json" "$OUT/coll-q$n-$a.json"
      fi
      local l0; l0=$(load)
      # up to 256 KiB the median of 41 iterations after 20 (a few milliseconds each: a step's wake-ups and
      # sleeps vary 20-30% from one to the next), beyond it of 5
      rm -f "$OUT/coll-m$n-$a".small*.json "$OUT/coll-l$n-$a" "$OUT"/coll-[cp]"$n-$a".p*.json
      small $n $a 1 && TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=$emu N timeout 900 "$T" run -n $n -- "$T" bench allreduce -b 1M -e 64M -f 4 \
        -n 5 -w 2 -c 0 -a $a -J "$OUT/coll-m$n-$a.large.json" >/dev/null 2>&1 || { echo "bench $a at $n ranks failed"; continue; }
      echo "$l0 $(load)" >"$OUT/coll-l$n-$a"
      echo "done: $a at $n ranks (load $l0 .. $(load))"
    done
  done
  # the small sizes' further passes, each over every pair: the same point measured minutes apart
  for pass in $(seq 2 ${PASSES:-3}); do
    for n in ${RANKS:-2 3 4 8}; do for a in ${ALGOS:-ring rd rhd tree direct}; do
      [[ -f $OUT/coll-l$n-$a ]] || continue
      calibrate $n 100us,1gbps "$OUT/coll-c$n-$a.p$pass.json" >/dev/null
      # a calibration that failed leaves no prediction for this pass (the median is of the others)
      [[ -s $OUT/coll-c$n-$a.p$pass.json ]] && predict_coll "$T" "$OUT/coll-c$n-$a.p$pass.json" $n "$OUT/coll-p$n-$a.p$pass.json" ||
        rm -f "$OUT/coll-c$n-$a.p$pass.json" "$OUT/coll-p$n-$a.p$pass.json"
      small $n $a $pass || echo "bench $a at $n ranks failed (pass $pass)"
      read -r l0 l1 <"$OUT/coll-l$n-$a" && echo "$l0 $(/usr/bin/python3 -c "print(max($l1, $(load)))")" >"$OUT/coll-l$n-$a"
    done; done
    echo "done: pass $pass"
  done
  for n in ${RANKS:-2 3 4 8}; do for a in ${ALGOS:-ring rd rhd tree direct}; do
    [[ -f $OUT/coll-l$n-$a ]] && coll_rows $n $a
  done; done
  coll_summary
}

small() { # small N ALGO PASS: one pass of the sizes up to 256 KiB
  TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=100us,1gbps N timeout 900 "$T" run -n $1 -- "$T" bench allreduce -b 1K -e 256K -f 4 \
    -n 41 -w 20 -c 0 -a $2 -J "$OUT/coll-m$1-$2.small.p$3.json" >/dev/null 2>&1
}

coll_rows() { # coll_rows N ALGO: its rows of coll.tsv, each small size the median of its passes (their least and most beside it)
  /usr/bin/python3 - "$OUT" $1 $2 >>"$OUT/coll.tsv" <<'EOF'
import glob, json, statistics, sys
out, n, a = sys.argv[1:4]
def preds(path):
    got = {}
    for line in open(path):
        r = json.loads(line)
        if r["algo"] == a: got[r["bytes"]] = r["allreduce_s"]
    return got
# the median of the passes' predictions (each from its own calibration), the first's as the base
ps = [preds(f) for f in ["%s/coll-p%s-%s.json" % (out, n, a)] + sorted(glob.glob("%s/coll-p%s-%s.p*.json" % (out, n, a)))]
pred, base = {s: statistics.median(p[s] for p in ps) for s in ps[0]}, preds("%s/coll-q%s-%s.json" % (out, n, a))
load = max(map(float, open("%s/coll-l%s-%s" % (out, n, a)).read().split()))
passes = [json.load(open(f)) for f in sorted(glob.glob("%s/coll-m%s-%s.small.p*.json" % (out, n, a)))]
merged = []
for i, r in enumerate(passes[0]):
    got = sorted(p[i]["time_us_median"] for p in passes)
    m = dict(r, time_us_median=statistics.median(got), time_us=statistics.median(p[i]["time_us"] for p in passes), least=got[0], most=got[-1])
    for k in ("time_us_inplace", "time_us_inplace_median"): m[k] = statistics.median(p[i][k] for p in passes)
    merged.append(m)
merged += [dict(r, least=r["time_us_median"], most=r["time_us_median"]) for r in json.load(open("%s/coll-m%s-%s.large.json" % (out, n, a)))]
json.dump(merged, open("%s/coll-m%s-%s.json" % (out, n, a), "w"), indent=1)
for r in merged:
    # the median of the iterations (a burst of other work moves a mean of 5 by 2-4x), the mean beside
    # it, then the least and most of the passes' medians
    print("%s\t%s\t%d\t%.6e\t%.6e\t%.6e\t%.2f\t%.6e\t%.6e\t%.6e" % (a, n, r["size"], r["time_us_median"] * 1e-6, pred[r["size"]],
          base[r["size"]], load, r["time_us"] * 1e-6, r["least"] * 1e-6, r["most"] * 1e-6))
EOF
}

coll_summary() { # the tables of docs/PERFORMANCE.md from $OUT/coll.tsv (INPLACE=1: the in-place measurements instead; MEAN=1: means)
  /usr/bin/python3 - "$OUT/coll.tsv" "${T_BASE:+base}" "${INPLACE:-0}" "${MEAN:-0}" <<'EOF'
import sys, collections, json, os
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
has_base = len(sys.argv) > 2 and sys.argv[2] == "base"
mean = sys.argv[4] == "1"
if sys.argv[3] == "1": # tandem bench measures in place second, after the same warm-up
    d = os.path.dirname(sys.argv[1])
    got = {}
    key = "time_us_inplace" if mean else "time_us_inplace_median"
    for r in rows:
        if (r[0], r[1]) not in got:
            got[(r[0], r[1])] = {x["size"]: x.get(key, x["time_us_inplace"]) * 1e-6 for x in json.load(open("%s/coll-m%s-%s.json" % (d, r[1], r[0])))}
        r[3] = "%.6e" % got[(r[0], r[1])][int(r[2])]
    print("measured: in place")
elif mean: # rows measured before the median was kept have their mean in column 4 only
    for r in rows:
        if len(r) > 7: r[3] = r[7]
    print("measured: the mean of the iterations")
passes = [(float(r[9]) - float(r[8])) / float(r[3]) for r in rows if len(r) > 9 and int(r[2]) <= 262144 and float(r[3]) > 0]
if passes: # how far apart the same point measured in different passes was
    print("the small sizes' passes: (most - least) / median over %d points: mean %.1f%%, max %.1f%%" % (len(passes), 100 * sum(passes) / len(passes), 100 * max(passes)))
rows = [r[:7] for r in rows]
loads = [float(r[6]) for r in rows]
print("load average (1 minute) during the measurements: %.1f - %.1f" % (min(loads), max(loads)))
def table(title, keep):
    groups = collections.OrderedDict()
    for a, n, size, m, p, b, l in rows:
        if not keep(int(size)): continue
        m, p, b = float(m), float(p), float(b)
        for key in ("all", a, "ranks %s" % n):
            groups.setdefault(key, []).append((abs(p - m) / m, abs(b - m) / m))
    print("\n| %s | points | mean error | max error |%s\n|---|---:|---:|---:|%s" % (title, " earlier model: mean | max |" if has_base else "",
          "---:|---:|" if has_base else ""))
    for k, v in groups.items():
        e = [x[0] for x in v]; eb = [x[1] for x in v]
        print("| %s | %d | %.1f%% | %.1f%% |%s" % (k, len(v), 100 * sum(e) / len(e), 100 * max(e),
              " %.1f%% | %.1f%% |" % (100 * sum(eb) / len(eb), 100 * max(eb)) if has_base else ""))
table("group", lambda s: True)
table("256 KiB - 64 MiB only", lambda s: s >= 262144)
sizes = [1024, 65536, 1048576, 16777216, 67108864]
print("\nEach cell: measured / predicted (error)\n\n| algo | ranks | load | " + " | ".join("%g KiB" % (s / 1024) if s < 1048576 else "%g MiB" % (s / 1048576) for s in sizes) + " |")
print("|---|---:|---:|" + "---:|" * len(sizes))
cells = collections.OrderedDict()
for a, n, size, m, p, b, l in rows:
    cells.setdefault((a, n), {"load": l})[int(size)] = (float(m), float(p))
def ms(x): return "%.3g" % (x * 1e3)
for (a, n), c in cells.items():
    print("| %s | %s | %s | " % (a, n, c["load"]) + " | ".join("%s / %s ms (%+.0f%%)" % (ms(c[s][0]), ms(c[s][1]), 100 * (c[s][1] - c[s][0]) / c[s][0])
          if s in c else "-" for s in sizes) + " |")
EOF
}

median_step() { # median step_time_ms of rank 0's steps from the 5th
  /usr/bin/python3 -c '
import json, sys, statistics
v = [json.loads(l)["step_time_ms"] for l in open(sys.argv[1]) if "step_time_ms" in l and json.loads(l)["step"] >= 4]
print(statistics.median(v) * 1e-3)' "$1"
}

predict_step() { # predict_step BINARY CLUSTER N ARGS...: the simulator's step in seconds
  local b=$1 c=$2 n=$3; shift 3
  N "$b" simulate "$@" --cluster "$c" --ranks $n --json | /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["step_s"])'
}

train_point() { # train_point MODEL EMU N CLUSTER METRICS LOAD0 ARGS...: one row of train.tsv (ROUND: which round)
  local model=$1 emu=$2 n=$3 c=$4 mfile=$5 l0=$6; shift 6
  local m p b
  m=$(median_step "$mfile")
  p=$(predict_step "$T" "$c" $n "$@")
  b=$p
  if [[ -n $T_BASE ]]; then
    base_cluster "$c" "${c%.json}-base.json"
    b=$(predict_step "$T_BASE" "${c%.json}-base.json" $n "$@")
  fi
  local l1; l1=$(load)
  printf '%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n' $model $emu $n "$m" "$p" "$b" "$(/usr/bin/python3 -c "print(max($l0, $l1))")" $ROUND >>"$OUT/train.tsv"
  echo "done: $model $emu $n: measured $m s, predicted $p s (load $l0 .. $l1)"
}

training() { # ROUNDS (default 3): the whole set again, so that the table shows how much the same run varies
  : >"$OUT/train.tsv"
  for ROUND in $(seq ${ROUNDS:-3}); do
    echo "round $ROUND"
    training_round
  done
  train_summary
}

training_round() {
  # as many steps timed for the compute rate as the runs take: a step of a few milliseconds on a
  # shared machine varies 2-5x from one step to the next, and only medians of many agree
  for model in mlp gpt; do
    local -n args=${model^^}
    local cs=200
    [[ $model == gpt ]] && cs=40
    # one rank: the compute measured alone, then the run
    local l0; l0=$(load)
    N "$T" simulate --calibrate "${args[@]}" --calibrate-steps $cs --calibrate-max 64K -o "$OUT/train-c-$model-1-r$ROUND.json" | grep compute
    N "$T" train "${args[@]}" --metrics "$OUT/train-m-$model-1.jsonl" >/dev/null 2>&1
    train_point $model - 1 "$OUT/train-c-$model-1-r$ROUND.json" "$OUT/train-m-$model-1.jsonl" "$l0" "${args[@]}"
    for emu in 100us,1gbps 100us,10gbps; do
      for n in 2 4; do
        # N ranks: every rank's step measured at once (as they share the cores), the links at N ranks
        local c="$OUT/train-c-$model-$emu-$n-r$ROUND.json" # every round's kept: repredict reads them
        l0=$(load)
        TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=$emu N timeout 900 "$T" run -n $n -- "$T" simulate --calibrate "${args[@]}" \
          --calibrate-steps $cs --calibrate-max 4M -o "$c" 2>&1 | grep -E 'compute:|link:|cpu:' | sed 's/^\[rank 0\] //'
        TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=$emu N timeout 900 "$T" run -n $n -- "$T" train "${args[@]}" \
          --metrics "$OUT/train-m-$model-$emu-$n.jsonl" >/dev/null 2>&1 || { echo "train $model $emu $n failed"; continue; }
        train_point $model $emu $n "$c" "$OUT/train-m-$model-$emu-$n.jsonl" "$l0" "${args[@]}"
      done
    done
  done
}

train_summary() { # the tables of docs/PERFORMANCE.md from $OUT/train.tsv
  /usr/bin/python3 - "$OUT/train.tsv" "${T_BASE:+base}" <<'EOF'
import sys
import collections, statistics
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
has_base = len(sys.argv) > 2 and sys.argv[2] == "base"
loads = [float(r[6]) for r in rows]
print("load average (1 minute) during the measurements: %.1f - %.1f\n" % (min(loads), max(loads)))
print("| round | model | network | ranks | load | measured step | predicted step | error |%s\n|---:|---|---|---:|---:|---:|---:|---:|%s" %
      (" earlier model |" if has_base else "", "---:|" if has_base else ""))
errs = {}
runs = collections.OrderedDict()
for model, emu, n, m, p, b, l, rnd in rows:
    m, p, b = float(m), float(p), float(b)
    e, eb = (p - m) / m, (b - m) / m
    for k in (model, "all"): errs.setdefault(k, []).append((abs(e), abs(eb)))
    runs.setdefault((model, emu, n), []).append(m)
    print("| %s | %s | %s | %s | %s | %.1f ms | %.1f ms | %+.0f%% |%s" % (rnd, model, emu, n, l, m * 1e3, p * 1e3, 100 * e,
          " %.1f ms (%+.0f%%) |" % (b * 1e3, 100 * eb) if has_base else ""))
if max(len(v) for v in runs.values()) > 1: # the noise floor: the same run, measured again
    print("\n| model | network | ranks | measured steps (each round) | spread (max - min) / median |\n|---|---|---:|---|---:|")
    spreads = []
    for (model, emu, n), v in runs.items():
        sp = (max(v) - min(v)) / statistics.median(v); spreads.append(sp)
        print("| %s | %s | %s | %s | %.0f%% |" % (model, emu, n, ", ".join("%.1f ms" % (x * 1e3) for x in v), 100 * sp))
    print("| all | | | | mean %.0f%%, max %.0f%% |" % (100 * sum(spreads) / len(spreads), 100 * max(spreads)))
print("\n| group | points | mean error | max error |%s\n|---|---:|---:|---:|%s" % (" earlier model: mean | max |" if has_base else "",
      "---:|---:|" if has_base else ""))
for k, v in errs.items():
    e = [x[0] for x in v]; eb = [x[1] for x in v]
    print("| %s | %d | %.1f%% | %.1f%% |%s" % (k, len(v), 100 * sum(e) / len(e), 100 * max(e),
          " %.1f%% | %.1f%% |" % (100 * sum(eb) / len(eb), 100 * max(eb)) if has_base else ""))
EOF
}

repredict() { # every prediction again with $T from the same calibration files; the old ones become the base column
  /usr/bin/python3 - "$OUT" "$T" "${MLP[*]}" "${GPT[*]}" <<'EOF'
import glob, json, os, statistics, subprocess, sys
out, T = sys.argv[1], sys.argv[2]
MLP, GPT = sys.argv[3].split(), sys.argv[4].split()
def sim(args): return subprocess.run([T, "simulate"] + args, capture_output=True, text=True, check=True).stdout
b2b = ["--back-to-back"] if os.environ.get("B2B") == "1" else [] # as predict_coll
preds, rows = {}, []
for l in open(out + "/coll.tsv"):
    a, n, size, m, p, b, load, *mean = l.rstrip("\n").split("\t")
    if (a, n) not in preds: # each pass's calibration (validations before passes had one), the median
        ps = []
        for c in ["%s/coll-c%s-%s.json" % (out, n, a)] + sorted(glob.glob("%s/coll-c%s-%s.p*.json" % (out, n, a))):
            js = sim(["--collectives"] + b2b + ["--cluster", c, "--ranks", n, "--min-bytes", "1K", "--max-bytes", "64M", "--json"])
            ps.append({r["bytes"]: r["allreduce_s"] for r in map(json.loads, js.splitlines()) if r["algo"] == a})
        preds[(a, n)] = {s: statistics.median(p[s] for p in ps) for s in ps[0]}
    rows.append("\t".join([a, n, size, m, "%.6e" % preds[(a, n)][int(size)], p, load] + mean))
open(out + "/coll.tsv", "w").write("\n".join(rows) + "\n")
rows = []
for l in open(out + "/train.tsv"):
    model, emu, n, m, p, b, load, rnd = l.rstrip("\n").split("\t")
    c = "%s/train-c-%s-%s-r%s.json" % (out, model, "1" if emu == "-" else emu + "-" + n, rnd)
    if not os.path.exists(c): sys.exit("repredict: %s is missing (measured before calibrations were kept per round)" % c)
    q = json.loads(sim((MLP if model == "mlp" else GPT) + ["--cluster", c, "--ranks", n, "--json"]))["step_s"]
    rows.append("\t".join((model, emu, n, m, "%.6e" % q, p, load, rnd)))
open(out + "/train.tsv", "w").write("\n".join(rows) + "\n")
EOF
  T_BASE=earlier # the tables' base column: the predictions these replace
}

case $WHAT in
collectives) collectives ;;
training) training ;;
all) collectives; training ;;
summary) coll_summary; train_summary ;; # the tables again from $OUT's files
repredict) repredict && coll_summary && train_summary ;; # $T's model on $OUT's measurements, beside the predictions it replaces
*) echo "usage: bench/sim_validate.sh [collectives|training|all|summary|repredict]" >&2; exit 2 ;;
esac
