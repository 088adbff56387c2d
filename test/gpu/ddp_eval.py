#!/usr/bin/env python3
"""Score the two-rank DDP run: is the fast rank's waiting time attributed to `comm`, with the slow
peer in the evidence, and do both ranks' spans for a step share one trace?

Usage: ddp_eval.py --gaps0 g0.jsonl --truth1 t1.jsonl --spans0 s0.jsonl --spans1 s1.jsonl [--json out]
The slow rank's truth file holds its slow intervals; the fast rank should report `comm` over them.
"""
import argparse
import json
from collections import defaultdict


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def span_traces(path):
    """step number -> set of trace IDs of train.step / rank spans in a spans JSON-lines file."""
    out = defaultdict(set)
    for s in read_jsonl(path):
        name = s.get("name") or s.get("Name", "")
        if name != "train.step" and not name.startswith("rank"):
            continue
        attrs = s.get("attributes") or s.get("Attributes") or {}
        if isinstance(attrs, list):  # [{"Key":..,"Value":{"Value":..}}]
            attrs = {x.get("Key"): (x.get("Value") or {}).get("Value") for x in attrs}
        step = attrs.get("gpu.step.number")
        tid = s.get("trace_id") or s.get("TraceID") or (s.get("SpanContext") or {}).get("TraceID")
        if step is not None and tid:
            out[int(step)].add(tid)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gaps0", required=True)
    ap.add_argument("--truth1", required=True)
    ap.add_argument("--spans0")
    ap.add_argument("--spans1")
    ap.add_argument("--json")
    a = ap.parse_args()
    t1 = read_jsonl(a.truth1)
    off = next(r for r in t1 if r["type"] == "meta")["realtime_minus_monotonic_ns"]
    slow = [(r["start"] + off, r["end"] + off) for r in t1 if r["type"] == "stall"]
    gaps = read_jsonl(a.gaps0)
    lo, hi = slow[0][0], slow[-1][1]
    slow_ns = sum(e - s for s, e in slow)
    covered = defaultdict(int)
    with_peer = 0
    n_comm = 0
    for g in gaps:
        if g["end_unix_nano"] < lo or g["start_unix_nano"] > hi:
            continue
        for s, e in slow:
            o = max(0, min(e, g["end_unix_nano"]) - max(s, g["start_unix_nano"]))
            covered[g["cause"]] += o
        if g["cause"] == "comm":
            n_comm += 1
            col = (g.get("evidence") or {}).get("collective") or {}
            if col.get("waiting_on_ranks"):
                with_peer += 1
    tot = sum(covered.values())
    res = {"slow_ms": slow_ns / 1e6, "reported_ms": tot / 1e6,
           "coverage": tot / slow_ns if slow_ns else float("nan"),
           "comm_accuracy": covered["comm"] / tot if tot else float("nan"),
           "by_cause_ms": {k: v / 1e6 for k, v in covered.items()},
           "comm_gaps": n_comm, "comm_gaps_with_peer": with_peer}
    print(f"slow rank's late time {slow_ns / 1e6:.0f} ms; fast rank reported {tot / 1e6:.0f} ms over it "
          f"(coverage {res['coverage']:.3f}), comm accuracy {res['comm_accuracy']:.3f}; "
          f"{with_peer}/{n_comm} comm gaps name the peer")
    if a.spans0 and a.spans1:
        s0, s1 = span_traces(a.spans0), span_traces(a.spans1)
        common = sorted(set(s0) & set(s1))
        same = sum(1 for k in common if s0[k] & s1[k])
        res["steps_both_ranks"] = len(common)
        res["steps_same_trace"] = same
        print(f"spans: {len(common)} steps seen by both ranks, {same} of them in one shared trace")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
