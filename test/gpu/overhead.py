#!/usr/bin/env python3
"""Overhead of gaptrace on one training job, configurations interleaved.

For each repetition, in a rotated order: the trainer untraced, under `gaptrace run --probes lite`,
`--probes auto`, `--probes full`, `--probes null` (the same uprobes and tracepoints as full, attached to programs that
return at once: the raw cost of the probes themselves), and with the PyTorch profiler always on.
Reports steps/s median and spread per configuration, the ratio to untraced, and gaptrace's own CPU
time and peak RSS (from its --summary-json).

Usage: overhead.py --gaptrace bin/gaptrace --out DIR [--reps 3] [--steps 300] [--configs ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cfg, rep, a):
    res = os.path.join(a.out, f"ovh-{cfg}-{rep}.json")
    summ = os.path.join(a.out, f"ovh-{cfg}-{rep}-summary.json")
    trainer = [sys.executable, os.path.join(HERE, "trainer.py"), "--steps", str(a.steps), "--warmup",
               str(a.warmup), "--result", res]
    if cfg == "profiler":
        trainer += ["--profile", os.path.join(a.out, f"ovh-prof-{rep}.json"), "--profile-activities", "cpu,cuda"]
    if cfg in ("untraced", "profiler"):
        cmd = trainer
    else:
        cmd = [a.gaptrace, "run", "--probes", cfg, "--live", "off", "--summary-json", summ,
               "--gaps-out", os.path.join(a.out, f"ovh-{cfg}-{rep}-gaps.jsonl"),
               "--spans-out", os.path.join(a.out, f"ovh-{cfg}-{rep}-spans.jsonl"), "--"] + trainer
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(os.path.join(a.out, "overhead.log"), "a") as log:
        log.write(f"=== {cfg} rep {rep} rc={p.returncode} {time.time() - t0:.1f}s\n{p.stdout[-4000:]}\n")
    if p.returncode != 0:
        print(f"overhead: {cfg} rep {rep} failed (rc {p.returncode}), see overhead.log", flush=True)
        return None, None
    with open(res) as f:
        sps = json.load(f)["steps_per_s"]
    side = None
    if os.path.exists(summ):
        with open(summ) as f:
            side = json.load(f)
    print(f"overhead: {cfg:<9} rep {rep}: {sps:.2f} steps/s", flush=True)
    return sps, side


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gaptrace", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--configs", default="untraced,lite,auto,full,null,profiler")
    ap.add_argument("--raw", help="rewrite every run's result here as it comes (survives a cut-short run)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cfgs = a.configs.split(",")
    sps = {c: [] for c in cfgs}
    side = {c: [] for c in cfgs}
    for rep in range(a.reps):
        order = cfgs[rep % len(cfgs):] + cfgs[:rep % len(cfgs)]
        for c in order:
            v, s = run(c, rep, a)
            if v is not None:
                sps[c].append(v)
            if s:
                side[c].append(s)
            if a.raw:
                with open(a.raw, "w") as f:
                    json.dump({"steps_per_s": sps, "sidecar": {k: [x.get("sidecar") for x in v] for k, v in side.items()}}, f)
    base = statistics.median(sps["untraced"]) if sps.get("untraced") else None
    out = {}
    print(f"\n{'config':<10} {'n':>2} {'median':>8} {'min':>8} {'max':>8} {'vs untraced':>12} {'cpu s':>7} {'rss MB':>7}")
    for c in cfgs:
        xs = sps[c]
        if not xs:
            print(f"{c:<10} no successful run")
            continue
        med = statistics.median(xs)
        rel = (med / base - 1) * 100 if base else float("nan")
        cpu = [s.get("sidecar", {}).get("cpu_ns", 0) / 1e9 for s in side[c]]
        rss = [s.get("sidecar", {}).get("max_rss_bytes", 0) / 2**20 for s in side[c]]
        cpu_m = statistics.median(cpu) if cpu else float("nan")
        rss_m = statistics.median(rss) if rss else float("nan")
        print(f"{c:<10} {len(xs):>2} {med:>8.2f} {min(xs):>8.2f} {max(xs):>8.2f} {rel:>+11.2f}% {cpu_m:>7.2f} {rss_m:>7.1f}")
        out[c] = {"steps_per_s": xs, "median": med, "vs_untraced_pct": rel, "sidecar_cpu_s": cpu,
                  "sidecar_rss_mb": rss}
    with open(os.path.join(a.out, "overhead.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
