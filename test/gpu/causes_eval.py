#!/usr/bin/env python3
"""causes_eval - score gaptrace's gaps against a job's own record of its
stalls (truth JSON Lines with "stall" records: kind, start, end, function).

Per stall kind: the share of the stall's time that gaps gave the expected
cause (each gap's breakdown spread evenly over it, clipped to the stall),
the share of stalls whose overlapping gaps name the stall's function (in the
blocking stack, evidence.stack, or among the CPU-sampled code, its callers
and the lock holders' code), and over the
whole run the share of idle labelled other. A stall record's run_delay_ns
(the thread's run-queue wait during it, which the machine's load adds) is
set aside: cpu.contention up to that much is counted in neither share.

usage: causes_eval.py TRUTH GAPS MODE [--tsv OUT] [--expect kind=cause ...]
Prints rows and appends them to OUT: kind mode stalls cause_share code_named other_share
"""
import argparse
import json
import sys

EXPECT = {
    "cpu": "cpu", "gc": "cpu", "pipe": "io.write", "subprocess": "subprocess", "mmap": "io.read",
    "ckpt_python": "cpu", "loader": "loader.wait", "gil": "lock", "read": "io.read", "sleep": "sleep",
    "pageable": "cuda.memcpy", "socket": "net",
}


def load(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def names(g):
    """The functions a gap names: its blocking stack, the sampled code and
    each code entry's caller, its lock holders' code."""
    fns = set()
    ev = g.get("evidence", {})
    for fr in ev.get("stack") or []:
        fns.add(fr.get("function", ""))
    code = list(g.get("code") or [])
    for h in ev.get("lock_holders") or []:
        code += h.get("code") or []
    for c in code:
        fns.add(c.get("function", ""))
        caller = c.get("caller")
        if isinstance(caller, dict):
            fns.add(caller.get("function", ""))
    return fns


def matches(fn, want):
    # "Causes.burn_python" vs "burn_python": qualname or plain name
    return any(f == want or f.endswith("." + want) or want.endswith("." + f) for f in fn if f)


def score(truth, gaps, mode, expect):
    stalls = [r for r in truth if r.get("type") == "stall"]
    rows = []
    for kind in sorted({s["kind"] for s in stalls}):
        want = expect.get(kind, EXPECT.get(kind))
        total = right = 0.0
        named = n = 0
        for s in (x for x in stalls if x["kind"] == kind):
            a, b = s["start"], s["end"]
            n += 1
            seen = set()
            contention = 0.0
            for g in gaps:
                if g.get("kind") == "hang" or "end_unix_nano" not in g:
                    continue  # a hang record, not a gap
                ga, gb = g["start_unix_nano"], g["end_unix_nano"]
                ov = min(b, gb) - max(a, ga)
                if ov <= 0 or gb <= ga:
                    continue
                frac = ov / (gb - ga)
                bd = g.get("breakdown") or {g["cause"]: g["duration_ns"]}
                for c, ns in bd.items():
                    if c == "cpu.contention":
                        contention += ns * frac
                        continue
                    total += ns * frac
                    if c == want or (want == "loader.wait" and c.startswith("loader.wait")):
                        right += ns * frac
                seen |= names(g)
            # the machine's load, as the job measured it, is nobody's cause
            total += max(0.0, contention - s.get("run_delay_ns", 0))
            if want == "cpu.contention":
                right += max(0.0, contention - s.get("run_delay_ns", 0))
            if matches(seen, s.get("function", "")):
                named += 1
        rows.append((kind, mode, n, right / total if total else 0.0, named / n if n else 0.0))
    idle = sum(g["duration_ns"] for g in gaps)
    other = sum((g.get("breakdown") or {}).get("other", 0) for g in gaps)
    return rows, (other / idle if idle else 0.0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("truth")
    p.add_argument("gaps")
    p.add_argument("mode")
    p.add_argument("--tsv")
    p.add_argument("--expect", action="append", default=[])
    a = p.parse_args()
    expect = dict(e.split("=", 1) for e in a.expect)
    rows, other = score(load(a.truth), load(a.gaps), a.mode, expect)
    lines = ["%s\t%s\t%d\t%.3f\t%.3f\t%.3f" % (k, m, n, c, named, other) for k, m, n, c, named in rows]
    print("\n".join(lines))
    if a.tsv:
        with open(a.tsv, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
