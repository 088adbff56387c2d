#!/usr/bin/env python3
"""What --probes auto costs over lite in a long attachment, measured inside that attachment.

auto keeps lite's probes for good and adds the per-launch probes only in windows (the first until it
has measured five steps, then --auto-window every --auto-every, and when the steps change). Between
its windows auto runs exactly lite's probes, so in one long attachment the job's steps outside the
windows are lite's cost, in the same process at the same time, and the windows are full's. This
script runs launchjob.py --serve (one log line per step), attaches `gaptrace attach --probes auto
--log-level debug` for --seconds, reads when each window's probes were attached and detached from
gaptrace's log, and reports:

  - auto's share of the attachment at full (the windows, from the log and the summary)
  - the job's mean step time in the windows and outside them (after the first window), and
  - auto's cost over lite: the mean step time over the whole steady attachment (windows, their
    toggles and the lite stretches, everything a long job pays) against the lite stretches alone,
    with a bootstrap 95% interval over 5 s blocks (the job's drift stays inside a block).

With --untraced S it also logs S seconds untraced before and after, for the lite stretches' cost
against no tracing. Usage: auto_steady.py --gaptrace bin/gaptrace --out DIR [--seconds 240]
"""
import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TIME = re.compile(r'^time=(\S+) .*msg="auto: per-launch probes (attached|detached)"')


def rfc3339_ns(s):
    # 2026-12-01T19:01:02.123456789Z or with a +00:00 offset; gaptrace logs UTC
    s = s.rstrip("Z")
    s = re.sub(r"[+-]\d\d:\d\d$", "", s)
    base, _, frac = s.partition(".")
    t = time.mktime(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) - time.timezone
    return int(t) * 10**9 + int((frac + "000000000")[:9])


def steps(log):
    out = []
    with open(log) as f:
        for line in f:
            p = line.split()
            if len(p) == 4:
                end, wall, _, _ = map(int, p)
                out.append((end - wall, end, wall))
    return out


def boot(blocks, stat, n=2000, seed=1):
    rng = random.Random(seed)
    vals = []
    for _ in range(n):
        vals.append(stat([blocks[rng.randrange(len(blocks))] for _ in blocks]))
    vals.sort()
    return vals[int(0.025 * n)], vals[int(0.975 * n) - 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gaptrace", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=240)
    ap.add_argument("--untraced", type=float, default=20)
    ap.add_argument("--kernels", type=int, default=300)
    ap.add_argument("--host-us", type=int, default=0)
    ap.add_argument("--block", type=float, default=5.0, help="seconds per bootstrap block")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log = os.path.join(a.out, "steps.log")
    if os.path.exists(log):
        os.remove(log)
    job = subprocess.Popen([sys.executable, os.path.join(HERE, "launchjob.py"), "--serve", log, "--kernels", str(a.kernels),
                            "--warmup", "300", "--host-us", str(a.host_us)],
                           stdout=open(os.path.join(a.out, "job.log"), "w"), stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 300
        while not (os.path.exists(log) and os.path.getsize(log) > 0):
            if job.poll() is not None or time.monotonic() > end:
                sys.exit(f"auto-steady: the job did not start stepping (see {a.out}/job.log)")
            time.sleep(0.1)
        u0 = time.monotonic_ns()
        time.sleep(a.untraced)
        u1 = time.monotonic_ns()
        glog = os.path.join(a.out, "gaptrace.log")
        g = subprocess.Popen([a.gaptrace, "attach", "--pid", str(job.pid), "--probes", "auto", "--live", "off",
                              "--log-level", "debug", "--summary-json", os.path.join(a.out, "summary.json"),
                              "--gaps-out", os.path.join(a.out, "gaps.jsonl"), "--spans-out", os.path.join(a.out, "spans.jsonl")],
                             stdout=open(glog, "w"), stderr=subprocess.STDOUT)
        while "msg=tracing" not in open(glog).read():
            if g.poll() is not None:
                sys.exit(f"auto-steady: gaptrace exited (rc {g.returncode}), see {glog}")
            time.sleep(0.05)
        t0 = time.monotonic_ns()
        time.sleep(a.seconds)
        t1 = time.monotonic_ns()
        g.send_signal(signal.SIGINT)
        g.wait(60)
        time.sleep(2)
        v0 = time.monotonic_ns()
        time.sleep(a.untraced)
        v1 = time.monotonic_ns()
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait()
    # Window edges: the log's wall-clock times, moved to CLOCK_MONOTONIC with one offset taken now.
    off = time.time_ns() - time.monotonic_ns()
    edges = []
    for line in open(glog):
        m = TIME.match(line)
        if m:
            edges.append((rfc3339_ns(m.group(1)) - off, m.group(2)))
    windows, opened = [], None
    for t, what in edges:
        if what == "attached":
            opened = t
        elif opened is not None:
            windows.append((opened, t))
            opened = None
    if opened is not None:
        windows.append((opened, t1))
    st = steps(log)

    def inside(s):
        return any(w0 <= s[1] and s[0] <= w1 for w0, w1 in windows)
    # The steady attachment: from the end of the first window (auto's warm-up) to the detach.
    steady_from = windows[0][1] if windows else t0
    steady = [s for s in st if s[0] >= steady_from and s[1] <= t1]
    in_w = [s for s in steady if inside(s)]
    out_w = [s for s in steady if not inside(s)]
    untraced = [s for s in st if (u0 <= s[0] and s[1] <= u1) or (v0 <= s[0] and s[1] <= v1)]
    res = {"seconds": a.seconds, "windows": len(windows),
           "windows_ms": [round((w1 - w0) / 1e6, 1) for w0, w1 in windows],
           "steps_attached": sum(1 for s in st if t0 <= s[1] <= t1)}
    try:
        summ = json.load(open(os.path.join(a.out, "summary.json")))
        res["gaptrace_steps"] = summ.get("steps")
        res["full_share_summary"] = summ.get("probes_full_ns", 0) / summ["wall_ns"] if summ.get("wall_ns") else None
    except (OSError, ValueError):
        pass
    span = max(1, t1 - steady_from)
    res["full_share_steady"] = sum(min(w1, t1) - max(w0, steady_from) for w0, w1 in windows if w1 > steady_from) / span
    if not steady or not out_w:
        print(json.dumps(res, indent=1))
        sys.exit("auto-steady: too few steps outside the windows")
    mean = lambda xs: sum(x[2] for x in xs) / len(xs)
    res["step_us"] = {"untraced": mean(untraced) / 1e3 if untraced else None, "lite_stretches": mean(out_w) / 1e3,
                      "windows": mean(in_w) / 1e3 if in_w else None, "steady_all": mean(steady) / 1e3}
    res["step_us_median"] = {"untraced": statistics.median(s[2] for s in untraced) / 1e3 if untraced else None,
                             "lite_stretches": statistics.median(s[2] for s in out_w) / 1e3,
                             "windows": statistics.median(s[2] for s in in_w) / 1e3 if in_w else None}
    # Blocks of --block seconds over the steady part: each block's (sum of all steps' time, count,
    # sum of its lite-stretch steps' time, their count); the ratio of means resampled by block.
    blocks = {}
    for s in steady:
        b = blocks.setdefault((s[0] - steady_from) // int(a.block * 1e9), [0, 0, 0, 0])
        b[0] += s[2]
        b[1] += 1
        if not inside(s):
            b[2] += s[2]
            b[3] += 1
    bl = [b for b in blocks.values() if b[3]]

    def ratio(bs):
        return (sum(b[0] for b in bs) / sum(b[1] for b in bs)) / (sum(b[2] for b in bs) / sum(b[3] for b in bs))
    r = ratio(bl)
    lo, hi = boot(bl, ratio)
    res["auto_over_lite"] = {"ratio": r, "ci95": [lo, hi], "blocks": len(bl)}
    if untraced:
        res["lite_over_untraced_mean"] = mean(out_w) / mean(untraced)
    if in_w:
        res["window_over_lite_mean"] = mean(in_w) / mean(out_w)
    with open(os.path.join(a.out, "auto-steady.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"auto, one {a.seconds:.0f} s attachment to launchjob.py --serve ({a.kernels} kernels a step, host-us {a.host_us}):")
    print(f"  windows {len(windows)} ({', '.join(map(str, res['windows_ms']))} ms); at full {100 * res['full_share_steady']:.2f}% of "
          f"the steady attachment, {100 * (res.get('full_share_summary') or 0):.2f}% of all of it (summary)")
    print(f"  mean step: lite stretches {res['step_us']['lite_stretches']:.1f} µs, windows "
          f"{res['step_us']['windows'] or 0:.1f} µs, untraced before/after {res['step_us']['untraced'] or 0:.1f} µs")
    print(f"  auto over lite (everything the steady attachment paid / its lite stretches): {r:.4f} [{lo:.4f}, {hi:.4f}] "
          f"over {len(bl)} blocks of {a.block:g} s")
    print(f"  steps: gaptrace {res.get('gaptrace_steps')}, the job's while attached {res['steps_attached']}")


if __name__ == "__main__":
    main()
