#!/usr/bin/env python3
"""Score gaptrace's output against two ground truths from the same run.

  1. the trainer's own truth file (injected stalls with their cause, CLOCK_MONOTONIC ns), and
  2. a PyTorch profiler (Kineto/CUPTI) trace: the true GPU busy intervals (kernels, copies, memsets).

Reports, for gaps >= --min-gap-ms (default 1 ms):
  detection recall    true idle time (Kineto gaps >= 1 ms) covered by gaptrace gaps
  precision           gaptrace gap time that the GPU really spent idle
  attribution         per injected cause: idle time inside the stall that gaptrace attributed to
                      the right cause, over the idle time inside the stall that it reported at all
  boundary error      |start| and |end| differences of each true gap and its best-overlapping gap
  window agreement    (with --windows) each NVML/GPM window's idle fraction against Kineto's

Usage: evaluate.py --gaps gaps.jsonl --truth truth.jsonl --kineto trace.json [--windows w.jsonl]
                   [--json out.json] [--busy-out busy.json] [--missed N]

--busy-out writes the GPU busy intervals the profiler trace holds as a small JSON file that --kineto
also accepts: a recorded run ('gaptrace run --record') replayed offline ('gaptrace replay --gaps-out')
is then scored without the profiler trace. --missed N lists the N true gaps >= --min-gap-ms that
gaptrace's gaps cover least, with the injected stall they fall in.
Only the Python standard library is used.
"""
import argparse
import bisect
import json
import statistics
import sys

# The cause gaptrace should report for each injected stall.
EXPECTED = {"io.read": "io.read", "loader.wait": "loader.wait", "net": "net", "io.write": "io.write",
            "cpu": "cpu", "launch": "cpu", "comm": "comm", "sleep": "sleep",
            "checkpoint": "io.write", "lock": "lock", "pageable": "cuda.memcpy"}


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def merge(iv):
    iv = sorted(iv)
    out = []
    for s, e in iv:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


class Intervals:
    """A sorted, merged set of [start, end) intervals with fast overlap queries."""

    def __init__(self, iv):
        self.iv = merge(iv)
        self.starts = [s for s, _ in self.iv]

    def overlap(self, a, b):
        if b <= a:
            return 0
        i = max(0, bisect.bisect_right(self.starts, a) - 1)
        tot = 0
        while i < len(self.iv) and self.iv[i][0] < b:
            s, e = self.iv[i]
            tot += max(0, min(b, e) - max(a, s))
            i += 1
        return tot

    def total(self):
        return sum(e - s for s, e in self.iv)


def kineto_busy(path, compute_only=False):
    """GPU busy intervals: kernels, copies and memsets; kernels alone with compute_only (the
    definition NVML's utilization uses: a copy engine moving a pageable buffer leaves compute idle)."""
    with open(path) as f:
        tr = json.load(f)
    if "busy" in tr:  # written by --busy-out
        return Intervals(tr["busy"])
    base = int(tr.get("baseTimeNanoseconds", 0))
    busy = []
    cats = ("kernel",) if compute_only else ("kernel", "gpu_memcpy", "gpu_memset")
    for ev in tr.get("traceEvents", []):
        if ev.get("ph") != "X" or ev.get("cat") not in cats:
            continue
        s = base + int(float(ev["ts"]) * 1000)
        busy.append([s, s + int(float(ev.get("dur", 0)) * 1000)])
    if not busy:
        sys.exit(f"evaluate: no GPU events in {path}: was the profiler recording CUDA activity?")
    return Intervals(busy)


def idle_gaps(busy, lo, hi):
    gaps, prev = [], lo
    for s, e in busy.iv:
        if s > prev:
            gaps.append([prev, min(s, hi)])
        prev = max(prev, e)
    if hi > prev:
        gaps.append([prev, hi])
    return [g for g in gaps if g[1] > g[0]]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gaps", required=True)
    ap.add_argument("--truth", required=True)
    ap.add_argument("--kineto", required=True)
    ap.add_argument("--compute-only", action="store_true", help="count copies and memsets as idle: only kernels keep the GPU busy")
    ap.add_argument("--windows")
    ap.add_argument("--spans", help="gaptrace --spans-out file: compare per-step idle")
    ap.add_argument("--min-gap-ms", type=float, default=1.0)
    ap.add_argument("--json")
    ap.add_argument("--busy-out", help="write the profiler's GPU busy intervals here (a file --kineto accepts)")
    ap.add_argument("--missed", type=int, default=0, help="list the N least covered true gaps")
    a = ap.parse_args()
    ming = int(a.min_gap_ms * 1e6)

    truth = read_jsonl(a.truth)
    meta = next(r for r in truth if r["type"] == "meta")
    off = int(meta["realtime_minus_monotonic_ns"])
    steps = [r for r in truth if r["type"] == "step"]
    stalls = [r for r in truth if r["type"] == "stall"]
    busy = kineto_busy(a.kineto, a.compute_only)
    if a.busy_out:
        with open(a.busy_out, "w") as f:
            json.dump({"compute_only": a.compute_only, "busy": busy.iv}, f, separators=(",", ":"))
    lo = min(busy.iv[0][0], steps[0]["start"] + off)
    hi = max(busy.iv[-1][1], steps[-1]["end"] + off)
    true_idle = Intervals(idle_gaps(busy, lo, hi))
    true_big = [g for g in true_idle.iv if g[1] - g[0] >= ming]

    gaps = [g for g in read_jsonl(a.gaps) if g["end_unix_nano"] > lo and g["start_unix_nano"] < hi]
    idle = [g for g in gaps if g.get("kind", "idle") == "idle" and g["duration_ns"] >= ming]
    found = Intervals([[g["start_unix_nano"], g["end_unix_nano"]] for g in idle])

    big_total = sum(e - s for s, e in true_big)
    recall = sum(found.overlap(s, e) for s, e in true_big) / big_total if big_total else float("nan")
    prec = (sum(true_idle.overlap(s, e) for s, e in found.iv) / found.total()) if found.total() else float("nan")

    if a.missed:
        rows = []
        for s, e in true_big:
            miss = (e - s) - found.overlap(s, e)
            if miss > 0:
                inside = [st["cause"] for st in stalls if st["start"] + off < e and st["end"] + off > s]
                step = next((r["step"] for r in steps if r["start"] + off <= s < r["end"] + off + 2_000_000), None)
                rows.append((miss, s, e, step, inside))
        rows.sort(reverse=True)
        print(f"missed: {sum(r[0] for r in rows) / 1e6:.1f} ms of true gaps >= {a.min_gap_ms} ms in {len(rows)} gaps; largest:")
        for miss, s, e, step, inside in rows[:a.missed]:
            print(f"  {(e - s) / 1e6:7.2f} ms gap at +{(s - lo) / 1e6:9.2f} ms (step {step}, stalls {inside or '-'}): "
                  f"{miss / 1e6:.2f} ms not covered")

    # Boundary error: each true gap >= min against its best-overlapping reported gap.
    starts, ends = [], []
    for s, e in true_big:
        best, bo = None, 0
        for g in idle:
            o = max(0, min(e, g["end_unix_nano"]) - max(s, g["start_unix_nano"]))
            if o > bo:
                best, bo = g, o
        if best:
            starts.append(abs(best["start_unix_nano"] - s) / 1e6)
            ends.append(abs(best["end_unix_nano"] - e) / 1e6)

    # Attribution per injected cause. A gap can hold several stalls back to back (two stalls
    # injected before one step): its breakdown says how much of it each cause took, so the time
    # credited to the right cause within one stall is at most that cause's share of the gap.
    per = {}
    for st in stalls:
        if st["cause"] == "launch":
            continue  # micro-gaps: accounted per step, scored below
        s, e = st["start"] + off, st["end"] + off
        want = EXPECTED.get(st["cause"], st["cause"])
        d = per.setdefault(st["cause"], {"stalls": 0, "idle_ns": 0, "reported_ns": 0, "correct_ns": 0, "got": {}})
        d["stalls"] += 1
        d["idle_ns"] += true_idle.overlap(s, e)
        for g in gaps:
            a0, a1 = max(s, g["start_unix_nano"]), min(e, g["end_unix_nano"])
            if a1 <= a0:
                continue
            o = true_idle.overlap(a0, a1) if g.get("kind", "idle") == "idle" else a1 - a0
            if o <= 0:
                continue
            bd = g.get("breakdown") or {g["cause"]: g["duration_ns"]}
            d["reported_ns"] += o
            right = min(o, bd.get(want, 0))
            d["correct_ns"] += right
            d["got"][want] = d["got"].get(want, 0) + right
            # the rest of the overlap goes to the gap's other causes, largest first
            rest = o - right
            for c, ns in sorted(bd.items(), key=lambda kv: -kv[1]):
                if c == want or rest <= 0:
                    continue
                take = min(rest, ns)
                d["got"][c] = d["got"].get(c, 0) + take
                rest -= take

    # Per-step idle (bounded gaps + micro-gaps) against the profiler's idle inside each step:
    # what a launch-bound phase loses in sub-millisecond gaps must show up here.
    step_cmp = None
    if a.spans:
        rows = []
        for sp in read_jsonl(a.spans):
            if sp.get("name") != "train.step":
                continue
            at = sp.get("attributes", {})
            s, e = int(sp["start_unix_nano"]), int(sp["end_unix_nano"])
            if s < lo or e > hi:
                continue
            rows.append((true_idle.overlap(s, e) / 1e6, float(at.get("gpu.step.idle_ms", 0)),
                         float(at.get("gpu.step.micro_idle_ms", 0))))
        if rows:
            ti, gi, mi = (sum(r[i] for r in rows) for i in range(3))
            step_cmp = {"steps": len(rows), "true_idle_ms": ti, "gaptrace_idle_ms": gi, "gaptrace_micro_ms": mi,
                        "rel_err": (gi - ti) / ti if ti else float("nan")}

    res = {"true_idle_ms": true_idle.total() / 1e6, "true_idle_ge_min_ms": big_total / 1e6,
           "true_gaps_ge_min": len(true_big), "reported_gaps": len(idle), "recall": recall, "precision": prec,
           "boundary_start_ms_p50": pct(starts, 50), "boundary_start_ms_p90": pct(starts, 90),
           "boundary_end_ms_p50": pct(ends, 50), "boundary_end_ms_p90": pct(ends, 90), "causes": {}}
    print(f"range {(hi - lo) / 1e9:.2f}s  true idle {true_idle.total() / 1e6:.1f} ms "
          f"({big_total / 1e6:.1f} ms in {len(true_big)} gaps >= {a.min_gap_ms:g} ms); gaptrace: {len(idle)} gaps")
    print(f"detection recall {recall:.3f}  precision {prec:.3f}")
    print(f"boundary error ms: start p50 {res['boundary_start_ms_p50']:.2f} p90 {res['boundary_start_ms_p90']:.2f}"
          f"  end p50 {res['boundary_end_ms_p50']:.2f} p90 {res['boundary_end_ms_p90']:.2f}")
    print(f"{'cause':<12} {'stalls':>6} {'idle ms':>9} {'reported':>9} {'accuracy':>9}  what gaptrace said")
    for c, d in sorted(per.items()):
        acc = d["correct_ns"] / d["reported_ns"] if d["reported_ns"] else float("nan")
        cov = d["reported_ns"] / d["idle_ns"] if d["idle_ns"] else float("nan")
        got = ", ".join(f"{k} {v / 1e6:.0f}ms" for k, v in sorted(d["got"].items(), key=lambda kv: -kv[1])[:3])
        print(f"{c:<12} {d['stalls']:>6} {d['idle_ns'] / 1e6:>9.1f} {cov:>9.3f} {acc:>9.3f}  {got}")
        res["causes"][c] = {"stalls": d["stalls"], "idle_ms": d["idle_ns"] / 1e6, "coverage": cov, "accuracy": acc,
                            "got_ms": {k: v / 1e6 for k, v in d["got"].items()}}

    # What gaptrace said about the copies and host operations behind the pageable and checkpoint
    # stalls: the gap that covers most of each stall, and its copy or episode evidence.
    def covering(st):
        s, e = st["start"] + off, st["end"] + off
        best, bo = None, 0
        for g in gaps:
            o = min(e, g["end_unix_nano"]) - max(s, g["start_unix_nano"])
            if o > bo:
                best, bo = g, o
        return best

    pg = [st for st in stalls if st["cause"] == "pageable"]
    if pg:
        copies = [((covering(st) or {}).get("evidence") or {}).get("copy") for st in pg]
        found = [c for c in copies if c]
        ev = {"stalls": len(pg), "with_copy_evidence": len(found),
              "pageable": sum(1 for c in found if c.get("pageable")),
              "directions": sorted({c.get("direction", "") for c in found}),
              "gb_per_s_p50": statistics.median([c["gb_per_s"] for c in found]) if found else float("nan"),
              "bytes_p50": statistics.median([c["bytes"] for c in found]) if found else 0,
              "fix": found[0].get("fix", "") if found else "",
              "bytes_right": sum(1 for st, c in zip(pg, copies) if c and st.get("bytes") in (None, c.get("bytes")))}
        res["pageable_evidence"] = ev
        print(f"pageable: {ev['with_copy_evidence']} of {ev['stalls']} stalls with copy evidence, "
              f"{ev['pageable']} pageable, {'/'.join(ev['directions']) or '-'}, "
              f"median {ev['bytes_p50'] / 2**20:.0f} MiB at {ev['gb_per_s_p50']:.2f} GB/s, bytes as the truth's in "
              f"{ev['bytes_right']}; fix: {ev['fix'] or '-'}")
    ck = [st for st in stalls if st["cause"] == "checkpoint"]
    if ck:
        eps = [((covering(st) or {}).get("evidence") or {}).get("episode") for st in ck]
        found = [x for x in eps if x]
        ev = {"stalls": len(ck), "with_episode": len(found),
              "kinds": sorted({x.get("kind", "") for x in found}),
              "copies_p50": statistics.median([x["copies"] for x in found]) if found else 0,
              "writes_p50": statistics.median([x["writes"] for x in found]) if found else 0,
              "serialize_ms_p50": statistics.median([x["serialize_ns"] / 1e6 for x in found]) if found else 0,
              "fsync_ms_p50": statistics.median([x["fsync_ns"] / 1e6 for x in found]) if found else 0}
        res["checkpoint_evidence"] = ev
        print(f"checkpoint: {ev['with_episode']} of {ev['stalls']} stalls in one episode gap ({'/'.join(ev['kinds']) or '-'}), "
              f"median {ev['copies_p50']:g} copies, {ev['writes_p50']:g} writes, "
              f"serialization {ev['serialize_ms_p50']:.1f} ms, fsync {ev['fsync_ms_p50']:.1f} ms")

    if step_cmp:
        res["steps"] = step_cmp
        print(f"per-step idle over {step_cmp['steps']} steps: profiler {step_cmp['true_idle_ms']:.1f} ms, "
              f"gaptrace {step_cmp['gaptrace_idle_ms']:.1f} ms (of which micro {step_cmp['gaptrace_micro_ms']:.1f} ms), "
              f"error {step_cmp['rel_err'] * 100:+.1f}%")
    if a.windows:
        errs = []
        for w in read_jsonl(a.windows):
            s, e = int(w["start_unix_nano"]), int(w["end_unix_nano"])
            if s < lo or e > hi or e <= s:
                continue
            ki = true_idle.overlap(s, e) / (e - s)
            errs.append((w.get("source", "?"), abs(ki - float(w["idle_fraction"])), e - s))
        for src in sorted({x[0] for x in errs}):
            xs = [x[1] for x in errs if x[0] == src]
            per_ms = statistics.median([x[2] for x in errs if x[0] == src]) / 1e6
            res[f"window_{src}"] = {"n": len(xs), "abs_err_p50": pct(xs, 50), "abs_err_p90": pct(xs, 90),
                                    "period_ms_p50": per_ms}
            print(f"window {src}: {len(xs)} windows, period p50 {per_ms:.0f} ms, |idle fraction error| "
                  f"p50 {pct(xs, 50):.3f} p90 {pct(xs, 90):.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
