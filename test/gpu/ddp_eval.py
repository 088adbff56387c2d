#!/usr/bin/env python3
"""Score the two-rank DDP run: is the fast rank's waiting time attributed to `comm`, with the slow
peer in the evidence, and do both ranks' spans for a step share one trace?

Usage: ddp_eval.py --gaps0 g0.jsonl --truth1 t1.jsonl --spans0 s0.jsonl --spans1 s1.jsonl [--json out]
       ddp_eval.py --gaps0 gaps.jsonl --truth0 t0.jsonl --truth1 t1.jsonl --spans-both spans.jsonl [--json out]
The slow rank's truth file holds its slow intervals; the fast rank should report `comm` over them.
The second form scores one gaptrace that traced both ranks: --truth0 names the fast rank's pid,
whose gaps are scored, and --spans-both counts each rank's steps in the one spans file. A comm gap
judged on both ranks' timelines names the late rank (late_rank, late_pid, late_by_ns).
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


def meta_pid(path):
    return next(r for r in read_jsonl(path) if r["type"] == "meta")["pid"]


def steps_by_pid(path):
    """pid -> number of train.step spans in a spans JSON-lines file."""
    out = defaultdict(int)
    for s in read_jsonl(path):
        if (s.get("name") or s.get("Name", "")) != "train.step":
            continue
        attrs = s.get("attributes") or {}
        if isinstance(attrs, dict) and "process.pid" in attrs:
            out[int(attrs["process.pid"])] += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gaps0", required=True)
    ap.add_argument("--truth1", required=True)
    ap.add_argument("--spans0")
    ap.add_argument("--spans1")
    ap.add_argument("--truth0", help="the fast rank's truth: only its pid's gaps are scored")
    ap.add_argument("--spans-both", help="one spans file holding both ranks' steps")
    ap.add_argument("--json")
    a = ap.parse_args()
    t1 = read_jsonl(a.truth1)
    off = next(r for r in t1 if r["type"] == "meta")["realtime_minus_monotonic_ns"]
    slow = [(r["start"] + off, r["end"] + off) for r in t1 if r["type"] == "stall"]
    gaps = read_jsonl(a.gaps0)
    pid0 = meta_pid(a.truth0) if a.truth0 else None
    if pid0 is not None:
        gaps = [g for g in gaps if g["pid"] == pid0]
    lo, hi = slow[0][0], slow[-1][1]
    slow_ns = sum(e - s for s, e in slow)
    covered = defaultdict(int)
    with_peer = 0
    n_comm = 0
    late_ranks = defaultdict(int)
    late_by = []
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
            if col.get("late_rank") is not None:
                late_ranks[col["late_rank"]] += 1
                late_by.append(col.get("late_by_ns", 0) / 1e6)
    tot = sum(covered.values())
    res = {"slow_ms": slow_ns / 1e6, "reported_ms": tot / 1e6,
           "coverage": tot / slow_ns if slow_ns else float("nan"),
           "comm_accuracy": covered["comm"] / tot if tot else float("nan"),
           "by_cause_ms": {k: v / 1e6 for k, v in covered.items()},
           "comm_gaps": n_comm, "comm_gaps_with_peer": with_peer,
           "comm_gaps_naming_late_rank": dict(late_ranks)}
    if late_by:
        late_by.sort()
        res["late_by_ms_p50"] = late_by[len(late_by) // 2]
    print(f"slow rank's late time {slow_ns / 1e6:.0f} ms; fast rank reported {tot / 1e6:.0f} ms over it "
          f"(coverage {res['coverage']:.3f}), comm accuracy {res['comm_accuracy']:.3f}; "
          f"{with_peer}/{n_comm} comm gaps name the peer")
    if late_ranks:
        print(f"comm gaps judged on both ranks' timelines, by late rank: {dict(late_ranks)}; "
              f"late by {res['late_by_ms_p50']:.1f} ms (median)")
    if a.spans_both:
        by = steps_by_pid(a.spans_both)
        pid1 = meta_pid(a.truth1)
        res["steps_rank0"], res["steps_rank1"] = by.get(pid0, 0), by.get(pid1, 0)
        print(f"steps counted: rank 0 (pid {pid0}) {res['steps_rank0']}, rank 1 (pid {pid1}) {res['steps_rank1']}")
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
