#!/usr/bin/env python3
"""Checks a --trace directory and its merge (test_trace.sh): every rank's file is valid JSON with
its own process row; every collective has a span on every rank with the same (communicator,
sequence number, name, bytes, algorithm); the clock offsets of ranks on one machine (one clock)
are zero within their stated uncertainty; the merged file holds one process row per rank.
usage: trace_check.py DIR MERGED.json RANKS [SPAN_NAME ...]   (names that must appear on every rank)"""
import collections, json, sys

d, merged, P = sys.argv[1], sys.argv[2], int(sys.argv[3])
need = [n.replace("_", " ") for n in sys.argv[4:]]  # spaces written as _
bad = []
sigs = []
for r in range(P):
    doc = json.load(open(f"{d}/trace.rank{r}.json"))
    evs, other = doc["traceEvents"], doc["otherData"]
    if other["rank"] != r or other["world"] != P:
        bad.append(f"rank {r}: otherData says rank {other['rank']} of {other['world']}")
    if any(e["pid"] != r for e in evs):
        bad.append(f"rank {r}: events of another pid")
    if other["dropped"] != 0:
        bad.append(f"rank {r}: {other['dropped']} spans dropped")
    for k in ("clock_start", "clock_end"):
        c = other.get(k)
        if c is None:
            bad.append(f"rank {r}: no {k}")
        elif abs(c["offset_us"]) > c["uncertainty_us"] or (r == 0 and c["offset_us"] != 0):
            bad.append(f"rank {r}: {k} offset {c['offset_us']} us beyond its uncertainty {c['uncertainty_us']} us (one clock: 0)")
    coll = collections.Counter((e["args"].get("comm"), e["args"]["seq"], e["name"], e["args"]["bytes"], e["args"]["algo"])
                               for e in evs if e["ph"] == "X" and e["cat"] == "comm")
    if not coll:
        bad.append(f"rank {r}: no collective spans")
    if any(n > 1 for n in coll.values()):
        bad.append(f"rank {r}: a (comm, seq) appears twice: {[k for k, n in coll.items() if n > 1][:3]}")
    sigs.append(coll)
    names = {e["name"] for e in evs if e["ph"] in "Xb"}
    for n in need:
        if n not in names:
            bad.append(f"rank {r}: no span named '{n}' (has {sorted(names)})")
    rows = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    if "training" not in rows:
        bad.append(f"rank {r}: no training row ({rows})")
for r in range(1, P):
    if sigs[r] != sigs[0]:
        only0, onlyr = sigs[0] - sigs[r], sigs[r] - sigs[0]
        bad.append(f"rank {r}'s collectives differ from rank 0's: only on 0 {list(only0)[:3]}, only on {r} {list(onlyr)[:3]}")
m = json.load(open(merged))
rows = collections.Counter(e["pid"] for e in m["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name")
if sorted(rows) != list(range(P)) or any(n != 1 for n in rows.values()):
    bad.append(f"merged: process rows {dict(rows)}; expected one per rank 0..{P - 1}")
if len(m["otherData"]["tandem_clock"]) != P:
    bad.append("merged: otherData.tandem_clock lacks ranks")
if min(e["ts"] for e in m["traceEvents"] if "ts" in e) != 0:
    bad.append("merged: the earliest event is not at 0")
for b in bad:
    print("  " + b)
print(f"  {P} ranks, {sum(sigs[0].values())} collectives each" if not bad else "")
sys.exit(1 if bad else 0)
