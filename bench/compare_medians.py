#!/usr/bin/python3
"""Medians of REPS benchmark runs on both sides, compared per size. Each run file holds lines
"size time_us busbw". Used by comm_vs_mpi.sh and tcp_vs_gloo.sh.

    compare_medians.py DIR REPS NAME_A NAME_B TITLE
reads DIR/NAME_A.1..REPS and DIR/NAME_B.1..REPS; the ratio is time B / time A, which at equal
sizes is busbw A / busbw B (computed from times, which the printed busbw rounds).
"""
import statistics as st
import sys

tmp, reps, a, b, title = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]


def load(name):
    rows = {}
    for r in range(1, reps + 1):
        for line in open(f"{tmp}/{name}.{r}"):
            f = line.split()
            if len(f) == 3:
                rows.setdefault(int(f[0]), []).append((float(f[1]), float(f[2])))
    return {k: (st.median(t for t, _ in v), st.median(x for _, x in v)) for k, v in rows.items()}


ta, tb = load(a), load(b)
print(f"\n{title}, medians of {reps} runs")
print(f"{'size (B)':>12} {a + ' us':>11} {b + ' us':>10} {a + ' busbw':>13} {b + ' busbw':>11} {'ratio':>7}")
for k in sorted(set(ta) & set(tb)):
    ratio = tb[k][0] / ta[k][0]
    print(f"{k:>12} {ta[k][0]:>11.2f} {tb[k][0]:>10.2f} {ta[k][1]:>13.2f} {tb[k][1]:>11.2f} {ratio:>6.2f}x")
print(f"(ratio: time {b} / time {a} = busbw {a} / busbw {b}. GB = 1e9 bytes)")
