#!/usr/bin/env python3
"""Measured pipeline bubble from a `troupe train --timeline` trace.

For each iteration (delimited on every rank by its "optimizer" span), the pipeline phase runs from
the first forward to the last backward/weight span of any rank; a stage's busy time is the sum of
its forward, backward and weight spans in that phase. With p stages:

    bubble = 1 - sum(busy of the p stages) / (p * phase length)

which is the fraction of stage-time left idle, the quantity (p-1)/(m+p-1) predicts for 1F1B and
GPipe. Iterations in --skip (default: the first 2, warm-up) are left out; the median of the rest is
printed with the min and max. Only ranks with tp = 0 and dp = 0 are used (one pipeline).

usage: pipeline_bubble.py TRACE [--skip N] [--json]
"""
import json
import statistics
import sys


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    path, skip, as_json = args[0], 2, "--json" in args
    if "--skip" in args:
        skip = int(args[args.index("--skip") + 1])
    events = json.load(open(path))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    # "rank R (tp T, pp P, dp D)"
    def coord(tid, key):
        text = names[tid]
        return int(text.split(key + " ")[1].split(",")[0].rstrip(")"))
    stages = {coord(t, "pp"): t for t in names if coord(t, "tp") == 0 and coord(t, "dp") == 0}
    p = len(stages)
    per_rank = {}
    for tid in stages.values():
        spans = sorted((e for e in events if e["ph"] == "X" and e["tid"] == tid), key=lambda e: e["ts"])
        iters, current = [], []
        for e in spans:
            if e["cat"] == "optimizer":
                iters.append(current)
                current = []
            elif e["cat"] in ("forward", "backward", "weight"):
                current.append(e)
        per_rank[tid] = iters
    n = min(len(v) for v in per_rank.values())
    bubbles = []
    for i in range(skip, n):
        start = min(it[i][0]["ts"] for it in per_rank.values())
        end = max(e["ts"] + e["dur"] for it in per_rank.values() for e in it[i])
        busy = sum(e["dur"] for it in per_rank.values() for e in it[i])
        bubbles.append(1 - busy / (p * (end - start)))
    if not bubbles:
        print(f"{path}: fewer than {skip + 1} iterations traced", file=sys.stderr)
        return 1
    # Mean cost of one action of each kind over the measured iterations and all stages (f, b, w for
    # the theory), and the stage imbalance: the busiest stage's time over the mean stage's.
    costs = {}
    for kind in ("forward", "backward", "weight"):
        d = [e["dur"] for it in per_rank.values() for i in range(skip, n) for e in it[i] if e["cat"] == kind]
        costs[kind[0]] = statistics.mean(d) if d else 0.0
    stage_busy = [sum(e["dur"] for i in range(skip, n) for e in it[i]) for it in per_rank.values()]
    result = {"stages": p, "iterations": len(bubbles), "median": statistics.median(bubbles),
              "min": min(bubbles), "max": max(bubbles), "f": costs["f"], "b": costs["b"], "w": costs["w"],
              "imbalance": max(stage_busy) / statistics.mean(stage_busy)}
    print(json.dumps(result) if as_json else
          f"{path}: p={p}, {len(bubbles)} iterations: bubble median {result['median']:.4f} "
          f"(min {result['min']:.4f}, max {result['max']:.4f}); mean F {result['f']:.0f} us, "
          f"B {result['b']:.0f} us, W {result['w']:.0f} us; stage imbalance {result['imbalance']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
