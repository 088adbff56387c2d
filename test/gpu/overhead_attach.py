#!/usr/bin/env python3
"""Tracing's cost on one long-running launch-bound PyTorch job, measured in interleaved windows.

overhead_pairs.py pairs whole runs, and whole runs of the same job differ by ±25% on the GPU machine
(allocator, clocks, placement), far more than the 1% to resolve. Here one process (launchjob.py
--serve) steps the whole time and logs every step; gaptrace is attached to it (`gaptrace attach
--pid`) and detached again, and the PyTorch profiler switched on and off inside it, in windows:

    untraced W, mode A W, untraced W, mode B W, ...   (modes shuffled in every repetition)

Each traced window is paired with the untraced window right before it, so both see the same process,
allocator and clocks. Per pair: the median wall time per step as a ratio to the untraced window's,
the job's CPU time per step (every thread; uprobe traps are charged to the thread that hits them)
and the median time per kernel launch. Consecutive untraced windows form the untraced row (the
method's own noise). A window starts when gaptrace logs that it traces and, for auto, after its
first window of per-launch probes (--settle-auto): auto's later windows open once a minute for
500 ms by default, so the steady state is what a long job pays; the summary gives auto's share of
time at full in each attachment. Attach and detach themselves happen outside the windows.

The table (median, bootstrap 95% interval) is printed by bin/bench -merge, as make bench prints it.

--job loader runs cost.sh's job instead (trainer.py --serve: 2 pinned DataLoader workers, loader and
read stalls), whose steps are whole iterations (the wait for the loader and the stalls included), so
the ratio is what tracing costs a job with loader workers; its median skips the stalled iterations.

Usage: overhead_attach.py --gaptrace bin/gaptrace --out DIR [--job launch|loader] [--reps 20] [--window 2]
                          [--modes ...]
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

from pairtable import add_pair, print_table

HERE = os.path.dirname(os.path.abspath(__file__))


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    print(f"overhead-attach: timed out waiting for {what}", flush=True)
    return False


class Job:
    def __init__(self, a):
        self.log = os.path.join(a.out, "steps.log")
        self.ctl = os.path.join(a.out, "ctl")
        for f in (self.log, self.ctl, self.ctl + ".ack"):
            if os.path.exists(f):
                os.remove(f)
        if a.job == "loader":
            # cost.sh's job (trainer.py's loader-cost preset): 2 pinned DataLoader workers, loader and read stalls.
            cmd = [sys.executable, os.path.join(HERE, "trainer.py"), "--preset", "loader-cost",
                   "--loader-workers", str(a.loader_workers),
                   "--serve", self.log, "--ctl", self.ctl, "--data-dir", a.out]
        else:
            cmd = [sys.executable, os.path.join(HERE, "launchjob.py"), "--serve", self.log, "--ctl", self.ctl,
                   "--kernels", str(a.kernels), "--warmup", str(a.warmup), "--host-us", str(a.host_us)]
        self.p = subprocess.Popen(cmd, stdout=open(os.path.join(a.out, "job.log"), "w"), stderr=subprocess.STDOUT)

    def tell(self, word, timeout=120):
        with open(self.ctl + ".tmp", "w") as f:
            f.write(word)
        os.replace(self.ctl + ".tmp", self.ctl)

        def acked():
            try:
                with open(self.ctl + ".ack") as f:
                    return f.read() == word
            except FileNotFoundError:
                return False
        return wait_for(acked, timeout, f"the job to acknowledge {word!r}")

    def steps(self):
        out = []
        with open(self.log) as f:
            for line in f:
                p = line.split()
                if len(p) == 4:
                    end, wall, cpu, launch = map(int, p)
                    out.append((end - wall, end, wall, cpu, launch))
        return out


def attach(a, job, mode, name):
    """Starts gaptrace on the job and returns (process, log path) once it traces, else None.
    mode is a probe set, optionally followed by +VAR=VALUE settings of gaptrace's environment
    (lite+GOMAXPROCS=16) and by @alt: the --gaptrace-alt binary in place of --gaptrace's."""
    pre = os.path.join(a.out, name)
    log = pre + ".log"
    env = dict(os.environ)
    mode, settings, alt = parse_mode(mode)
    binary = a.gaptrace_alt if alt else a.gaptrace
    for kv in settings:
        k, _, v = kv.partition("=")
        env[k] = v
    if a.pprof and (mode == "auto" or name.startswith("sidecar-")):
        env["GAPTRACE_PPROF"] = pre
    g = subprocess.Popen([binary, "attach", "--pid", str(job.p.pid), "--probes", mode, "--live", "off",
                          "--summary-json", pre + "-summary.json", "--gaps-out", pre + "-gaps.jsonl",
                          "--spans-out", pre + "-spans.jsonl"], stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)

    def tracing():
        with open(log) as f:
            return "msg=tracing" in f.read()
    if not wait_for(lambda: g.poll() is not None or tracing(), 60, f"gaptrace {mode} to attach") or g.poll() is not None:
        print(f"overhead-attach: gaptrace {mode} did not attach (rc {g.poll()}), see {log}", flush=True)
        g.kill()
        return None
    g.traced_from = time.monotonic_ns()
    return g, pre


def parse_mode(mode):
    """A mode's probe set, its VAR=VALUE settings and whether it runs the alternative build:
    ("auto", ["GOMAXPROCS=4"], True) of auto+GOMAXPROCS=4@alt."""
    alt = mode.endswith("@alt")
    if alt:
        mode = mode[:-len("@alt")]
    probes, *settings = mode.split("+")
    return probes, settings, alt


def probes_of(mode):
    """The probe set of a mode: auto of auto+GOMAXPROCS=4@alt."""
    return parse_mode(mode)[0]


def detach(g, pre):
    g.traced_to = time.monotonic_ns()
    g.send_signal(signal.SIGINT)
    try:
        g.wait(30)
    except subprocess.TimeoutExpired:
        g.kill()
        g.wait()
        print(f"overhead-attach: gaptrace did not stop within 30 s, killed ({pre}.log)", flush=True)
    r = {}
    try:
        with open(pre + "-summary.json") as f:
            s = json.load(f)
        if s.get("wall_ns"):
            r["full_share"] = s.get("probes_full_ns", 0) / s["wall_ns"]
        r["sidecar"] = s.get("sidecar")
        r["steps"] = s.get("steps")
    except (OSError, ValueError):
        pass
    r["traced"] = (g.traced_from, g.traced_to)
    return r


def proc_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def sidecar_cost(a, job, mode, i):
    """gaptrace's own CPU (share of one core) and RSS over the i-th long attachment, after its start."""
    at = attach(a, job, mode, f"sidecar-{i}-{mode.replace('+', '-').replace('=', '').replace('@', '-')}")
    if at is None:
        return None
    g, pre = at
    time.sleep(5)
    c0, t0 = proc_cpu_s(g.pid), time.monotonic_ns()
    rss = []
    while (time.monotonic_ns() - t0) / 1e9 < a.sidecar_seconds:
        time.sleep(1)
        rss.append(proc_rss_mib(g.pid))
    c1, t1 = proc_cpu_s(g.pid), time.monotonic_ns()
    extra = detach(g, pre)
    steps = sum(1 for s in job.steps() if s[0] >= t0 and s[1] <= t1) / ((t1 - t0) / 1e9)
    return {"mode": mode, "cpu_share": (c1 - c0) / ((t1 - t0) / 1e9), "rss_mib_max": max(rss), "rss_mib_end": rss[-1],
            "steps_per_s": steps, "launches_per_s": steps * a.kernels if a.job == "launch" else None,
            "seconds": (t1 - t0) / 1e9, "full_share": extra.get("full_share"),
            "peak_rss_mib": (extra.get("sidecar") or {}).get("max_rss_bytes", 0) / 2**20}


def window(a):
    t0 = time.monotonic_ns()
    time.sleep(a.window)
    return t0, time.monotonic_ns()


def figures(steps, t0, t1, kernels):
    inside = [s for s in steps if s[0] >= t0 and s[1] <= t1]
    if len(inside) < 20:
        return None
    return {"step_ns": statistics.median(s[2] for s in inside),
            "cpu_ns": sum(s[3] for s in inside) / len(inside),
            "launch_ns": statistics.median(s[4] for s in inside) / kernels,
            "steps": len(inside)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gaptrace", required=True)
    ap.add_argument("--gaptrace-alt", help="the binary of modes ending in @alt (auto@alt): two builds timed interleaved")
    ap.add_argument("--bench", default=os.path.join(HERE, "..", "..", "bin", "bench"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--window", type=float, default=2.0, help="seconds per window")
    ap.add_argument("--settle", type=float, default=0.5, help="seconds after attach (or profiler start) before a window")
    ap.add_argument("--settle-auto", type=float, default=2.0, help="seconds after attach before auto's window (its first full window)")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--kernels", type=int, default=300)
    ap.add_argument("--host-us", type=int, default=0, help="µs of Python work a step after its launches (a lower launch rate)")
    ap.add_argument("--job", choices=("launch", "loader"), default="launch",
                    help="launch: launchjob.py; loader: trainer.py fed by DataLoader workers (cost.sh's job; no profiler mode)")
    ap.add_argument("--loader-workers", type=int, default=2, help="--job loader: its DataLoader worker processes")
    ap.add_argument("--modes", default="null,lite,auto,full,profiler")
    ap.add_argument("--budget", type=float, default=0, help="stop starting repetitions after this many seconds (0: none)")
    ap.add_argument("--pprof", action="store_true", help="GAPTRACE_PPROF for auto's attachments and every sidecar attachment (heap and CPU profiles)")
    ap.add_argument("--sidecar", default="auto,lite", help="modes whose own cost is measured in a long attachment each, in this order, at the end "
                    "(MODE+VAR=VALUE sets gaptrace's environment; a mode may repeat)")
    ap.add_argument("--sidecar-seconds", type=float, default=30)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.job == "loader" and "profiler" in a.modes.split(","):
        ap.error("--job loader has no profiler mode")
    if "@alt" in a.modes + a.sidecar and not a.gaptrace_alt:
        ap.error("a mode ending in @alt needs --gaptrace-alt")
    os.makedirs(a.out, exist_ok=True)
    modes = a.modes.split(",")
    rng = random.Random(a.seed)
    job = Job(a)
    start = time.monotonic()
    if not wait_for(lambda: os.path.exists(job.log) and os.path.getsize(job.log) > 0 or job.p.poll() is not None, 300,
                    "the job's first steps") or job.p.poll() is not None:
        sys.exit(f"overhead-attach: the job did not start stepping (see {a.out}/job.log)")
    time.sleep(1)
    plan = []  # (mode, rep, untraced window, traced window, extra)
    try:
        for rep in range(a.reps):
            if a.budget and time.monotonic() - start > a.budget:
                print(f"overhead-attach: budget reached after {rep} repetitions", flush=True)
                break
            order = modes[:]
            rng.shuffle(order)
            for m in order:
                base = window(a)
                extra = {}
                if m == "profiler":
                    if not job.tell("profile"):
                        continue
                    time.sleep(a.settle)
                    w = window(a)
                    job.tell("none")
                else:
                    at = attach(a, job, m, f"{rep:03d}-{m}")
                    if at is None:
                        continue
                    time.sleep(a.settle_auto if probes_of(m) == "auto" else a.settle)
                    w = window(a)
                    extra = detach(*at)
                    time.sleep(a.settle)
                plan.append((m, rep, base, w, extra))
                print(f"overhead-attach: rep {rep} {m} done", flush=True)
            if job.p.poll() is not None:
                print("overhead-attach: the job exited", flush=True)
                break
        costs = []
        for i, m in enumerate(m for m in a.sidecar.split(",") if m):
            if job.p.poll() is None:
                c = sidecar_cost(a, job, m, i)
                if c:
                    costs.append(c)
                    rate = (f"{c['launches_per_s'] / 1e3:.0f}k launches/s" if c["launches_per_s"] is not None
                            else f"{c['steps_per_s']:.1f} steps/s")
                    print(f"overhead-attach: gaptrace {m} on its own: {100 * c['cpu_share']:.1f}% of a core over "
                          f"{c['seconds']:.0f} s at {rate}, RSS {c['rss_mib_end']:.0f} MiB "
                          f"(max {c['rss_mib_max']:.0f}, peak {c['peak_rss_mib']:.0f})", flush=True)
        with open(os.path.join(a.out, "sidecar.json"), "w") as f:
            json.dump(costs, f)
    finally:
        if job.p.poll() is None:
            job.tell("stop", timeout=30)
            try:
                job.p.wait(30)
            except subprocess.TimeoutExpired:
                job.p.kill()
    steps = job.steps()
    saved = {"Ratio": {m: [] for m in ["untraced"] + modes}, "CPU": {m: [] for m in ["untraced"] + modes},
             "Launch": {m: [] for m in ["untraced"] + modes}, "FullShare": []}
    sidecar = {m: [] for m in modes}
    prev = None
    rows = []
    for m, rep, base, w, extra in plan:
        fb, fw = figures(steps, *base, a.kernels), figures(steps, *w, a.kernels)
        if fb is None or fw is None:
            print(f"overhead-attach: rep {rep} {m}: too few steps in a window", flush=True)
            continue
        if prev is not None:
            add_pair(saved, "untraced", fb, prev)
        prev = fb
        add_pair(saved, m, fw, fb)
        if probes_of(m) == "auto" and "full_share" in extra:
            saved["FullShare"].append(extra["full_share"])
        if extra.get("sidecar"):
            sidecar[m].append(extra["sidecar"])
        if "traced" in extra:
            # What gaptrace counted against what the job logged while it traced (the job's steps that
            # ended between gaptrace saying it traces and its stop; a step at each edge may differ).
            lo, hi = extra.pop("traced")
            extra["job_steps"] = sum(1 for s in steps if lo <= s[1] <= hi)
        rows.append({"mode": m, "rep": rep, "base": fb, "traced": fw, **extra})
    if a.job != "launch":
        # bench -merge keys a job other than launch as JOB/mode.
        for k in ("Ratio", "CPU", "Launch"):
            saved[k] = {f"{a.job}/{m}": v for m, v in saved[k].items()}
    with open(os.path.join(a.out, "pairs.json"), "w") as f:
        json.dump(saved, f)
    with open(os.path.join(a.out, "windows.json"), "w") as f:
        json.dump(rows, f)
    n = min((len(v) for k, v in saved["Ratio"].items() if v), default=0)
    what = (f"launch-bound PyTorch job: {a.kernels} in-place kernels a step" if a.job == "launch" else
            f"PyTorch job fed by {a.loader_workers} DataLoader workers (trainer.py, loader and read stalls; launch column not measured)")
    print(f"\n{what}; one process, {a.window:g} s windows, {n}+ pairs per mode, {len(steps)} steps logged")
    print_table(a.bench, os.path.join(a.out, "pairs.json"), saved, ["untraced"] + modes, sidecar, "attachment", a.job)
    for m in modes:
        counted = [(r["steps"], r["job_steps"]) for r in rows if r["mode"] == m and r.get("job_steps") and r.get("steps") is not None]
        if counted:
            print(f"steps under {m}: gaptrace counted {sum(c for c, _ in counted)} of the job's {sum(j for _, j in counted)} "
                  f"while attached ({len(counted)} attachments; per attachment {min(c / j for c, j in counted):.3f}–"
                  f"{max(c / j for c, j in counted):.3f})")


if __name__ == "__main__":
    main()
