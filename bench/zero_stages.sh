#!/usr/bin/env bash
# ZeRO stages 1-3 against stage 0 (data parallelism) on 2 ranks, one thread each: step time and
# CPU time per step for the MLP (tandem train, Fashion-MNIST, batch 64 per rank) and GPT mini
# (tandem bench gpt, B=4 T=64 per rank); the memory held; and the bytes each rank sends per step
# (tdm_comm_bytes_sent) against the theory, 2Ψ(N-1)/N f32 elements at stages 0-2 and 3Ψ(N-1)/N at
# stage 3, on 2 and more ranks.
#
#   bench/zero_stages.sh [REPS=5] [MLP_STEPS=400] [GPT_STEPS=15] [VOLUME_RANKS="2 3 4"] [EXTRA=""]
#
# Every repetition runs all stages of both models, in an order that rotates from one repetition to
# the next, each run when no other process uses the CPU, and again if one did meanwhile
# (bench/quiet.sh). Step time: the median of a run's steps (MLP: steps 20 and later of --metrics'
# step_time_ms; GPT: bench gpt's median). CPU time per step and rank, every thread: GPT, rank 0's
# from bench gpt; MLP, the difference between the CPU time of a run of MLP_STEPS steps and one of
# MLP_STEPS/4 (start-up and the final evaluation cancel), over both ranks. The table shows medians
# over repetitions and, per stage, the median of the per-repetition ratios to the stage-0 run of
# the same repetition. EXTRA is passed to every GPT run (e.g. "--bucket-mb 2").
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
MLP_STEPS=${2:-400}
GPT_STEPS=${3:-15}
VOLUME_RANKS=${4-"2 3 4"}
EXTRA=${5:-}
PY=/usr/bin/python3
make build >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
QUIET_DIR=$TMP
. bench/quiet.sh
export T=./build/tandem TMP PY MLP_STEPS EXTRA

mlp() { # stage -> one JSON line: median step and comm wait of steps 20.., CPU ms per step and rank
  local short=$((MLP_STEPS / 4)) c1 c2
  rm -f "$TMP/m$1.jsonl" # metrics files are appended to
  /usr/bin/time -f "%U %S" -o "$TMP/c1" $T run -n 2 -- tandem train --zero "$1" --steps "$short" --threads 1 >/dev/null 2>&1
  /usr/bin/time -f "%U %S" -o "$TMP/c2" $T run -n 2 -- tandem train --zero "$1" --steps "$MLP_STEPS" --threads 1 \
    --metrics "$TMP/m$1.jsonl" >/dev/null 2>&1
  c1=$(cat "$TMP/c1") c2=$(cat "$TMP/c2")
  $PY -c '
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if "step_time_ms" in l][20:]
c1, c2 = (sum(map(float, c.split())) for c in sys.argv[2:4])
print(json.dumps({"ms": statistics.median(x["step_time_ms"] for x in r),
                  "comm_wait_ms": statistics.median(x["time_comm_wait_ms"] for x in r),
                  "cpu_ms": (c2 - c1) * 1e3 / (int(sys.argv[4]) - int(sys.argv[5])) / 2}))' \
    "$TMP/m$1.jsonl" "$c1" "$c2" "$MLP_STEPS" "$short"
}
gpt() { # ranks stage steps warmup -> bench gpt's JSON
  # shellcheck disable=SC2086
  $T run -n "$1" -- tandem bench gpt --zero "$2" --steps "$3" --warmup "$4" --json $EXTRA | sed 's/^\[rank 0\] //'
}
export -f mlp gpt

for r in $(seq 1 "$REPS"); do
  for k in 0 1 2 3; do
    s=$(((k + r) % 4))
    quiet "$TMP/mlp_$s" bash -c "mlp $s"
    quiet "$TMP/gpt_$s" bash -c "gpt 2 $s $GPT_STEPS 3"
  done
  echo "rep $r/$REPS done ($QUIET_REJECTED runs disturbed and repeated so far)" >&2
done
for n in $VOLUME_RANKS; do
  for s in 0 1 2 3; do gpt "$n" "$s" 2 1 >>"$TMP/vol_${n}_$s"; done
done

$PY - "$TMP" "$REPS" "$VOLUME_RANKS" "$QUIET_REJECTED" <<'PYEOF'
import json, os, statistics as st, sys
d, reps, vranks, rejected = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
rows = lambda f: [json.loads(l) for l in open(os.path.join(d, f))]
others = lambda f: [float(l) for l in open(os.path.join(d, f + ".others"))]
med = lambda rs, k: st.median(x[k] for x in rs)
for model, title in (("mlp", "MLP 784-512-256-10, batch 64 per rank"), ("gpt", "GPT mini, B=4 T=64 per rank")):
    print(f"\n{title}, 2 ranks, 1 thread each: medians over {reps} repetitions")
    base = rows(f"{model}_0")
    extra = model == "gpt"
    print("%-6s %9s %11s %13s %9s %11s %13s %10s %7s" % ("stage", "step ms", "vs stage 0", "(range)", "CPU ms",
          "vs stage 0", "(range)", "comm wait", "others") +
          (" %8s %8s %8s %9s %9s" % ("fwd", "bwd", "opt", "RSS MiB", "held MiB") if extra else ""))
    for s in range(4):
        rs = rows(f"{model}_{s}")
        wr = sorted(x["ms"] / b["ms"] for x, b in zip(rs, base))
        cr = sorted(x["cpu_ms"] / b["cpu_ms"] for x, b in zip(rs, base))
        line = "%-6d %9.2f %+10.1f%% %5.0f..%+4.0f%% %9.2f %+10.1f%% %5.0f..%+4.0f%% %10.2f %6.0f%%" % (
            s, med(rs, "ms"), 100 * (st.median(wr) - 1), 100 * (wr[0] - 1), 100 * (wr[-1] - 1), med(rs, "cpu_ms"),
            100 * (st.median(cr) - 1), 100 * (cr[0] - 1), 100 * (cr[-1] - 1), med(rs, "comm_wait_ms"),
            100 * st.median(others(f"{model}_{s}")))
        if extra:
            line += " %8.2f %8.2f %8.2f %9.1f %9.1f" % (med(rs, "fwd_ms"), med(rs, "bwd_ms"), med(rs, "opt_ms"),
                                                       max(x["peak_rss_mib"] for x in rs), max(x["held_mib"] for x in rs))
        print(line)
    if extra:
        cats = ["parameters", "gradients", "optimizer", "activations", "communication", "workspace"]
        print("held at the peak on rank 0, MiB: " + ", ".join(cats))
        for s in range(4):
            r0 = rows(f"gpt_{s}")[0]
            print("  stage %d: %s" % (s, "  ".join("%.1f" % r0[c + "_mib"] for c in cats)))
print("\n(vs stage 0: the median of the per-repetition ratios to stage 0, and their range. CPU: per step and rank, every")
print(" thread, which the host's other jobs do not stretch as they stretch step times. comm wait: what backward did not")
print(" hide. others: the median share of a core that other processes used during the runs; %s runs were repeated" % rejected)
print(" because others used more than %s)" % os.environ.get("QUIET_OTHERS", "0.08"))
if vranks:
    print("\nGPT mini: bytes sent per step and rank (rank 0) over 4 x Ψ(N-1)/N; theory 2 at stages 0-2, 3 at stage 3")
    print("%-6s" % "ranks" + "".join("%22s" % f"stage {s}" for s in range(4)))
    for n in vranks:
        line = "%-6s" % n
        for s in range(4):
            r = rows(f"vol_{n}_{s}")[0]
            line += "%13.2f MiB %5.3f" % (r["sent_bytes_per_step"] / 1048576, r["sent_psi"])
        print(line)
    print("(Ψ = %d parameters)" % rows(f"vol_{vranks[0]}_0")[0]["params"])
PYEOF
