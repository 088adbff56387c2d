#!/usr/bin/env python3
"""Tracing's cost on a launch-bound PyTorch job (launchjob.py), as `make bench` measures it on simtrain.

Modes: untraced, gaptrace --probes null / lite / auto / full, and the PyTorch profiler always on
(reference). Every traced (or profiled) run is paired with an untraced run right before it, the
modes shuffled per repetition. Per pair: the wall time per step as a ratio to the untraced run, the
job's own CPU time per step and the time per kernel launch. The table (median, bootstrap 95%
interval) is printed by bin/bench -merge from the pairs this script saves, so it is the same table as
make bench's; build bin/bench with `go build -o bin/bench ./test/bench` (pure Go) and ship it with
bin/gaptrace. Without it, medians only.

Usage: overhead_pairs.py --gaptrace bin/gaptrace --out DIR [--reps 20] [--steps 2000] [--modes ...]
"""
import argparse
import json
import os
import random
import subprocess
import sys

from pairtable import add_pair, print_table

HERE = os.path.dirname(os.path.abspath(__file__))


def run(mode, name, a):
    res = os.path.join(a.out, name + ".json")
    job = [sys.executable, os.path.join(HERE, "launchjob.py"), "--steps", str(a.steps), "--warmup",
           str(a.warmup), "--kernels", str(a.kernels), "--result", res]
    if mode == "profiler":
        job.append("--profile")
    cmd = job
    if mode not in ("untraced", "profiler"):
        cmd = [a.gaptrace, "run", "--probes", mode, "--live", "off",
               "--summary-json", os.path.join(a.out, name + "-summary.json"),
               "--gaps-out", os.path.join(a.out, name + "-gaps.jsonl"),
               "--spans-out", os.path.join(a.out, name + "-spans.jsonl"), "--"] + job
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(os.path.join(a.out, "overhead-pairs.log"), "a") as log:
        log.write(f"=== {name} rc={p.returncode}\n{p.stdout[-4000:]}\n")
    if p.returncode != 0:
        print(f"overhead-pairs: {name} failed (rc {p.returncode}), see overhead-pairs.log", flush=True)
        return None
    with open(res) as f:
        r = json.load(f)
    summ = os.path.join(a.out, name + "-summary.json")
    if os.path.exists(summ):
        with open(summ) as f:
            s = json.load(f)
        if s.get("wall_ns"):
            r["full_share"] = s.get("probes_full_ns", 0) / s["wall_ns"]
        r["sidecar"] = s.get("sidecar")
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gaptrace", required=True)
    ap.add_argument("--bench", default=os.path.join(HERE, "..", "..", "bin", "bench"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--kernels", type=int, default=300)
    ap.add_argument("--modes", default="untraced,null,lite,auto,full,profiler")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    modes = a.modes.split(",")
    # The bench's -save format, so that bin/bench -merge prints the table.
    saved = {"Ratio": {m: [] for m in modes}, "CPU": {m: [] for m in modes}, "Launch": {m: [] for m in modes},
             "FullShare": []}
    sidecar = {m: [] for m in modes}
    rng = random.Random(a.seed)
    path = os.path.join(a.out, "pairs.json")
    for rep in range(a.reps):
        order = modes[:]
        rng.shuffle(order)
        for m in order:
            base = run("untraced", f"{rep:03d}-{m}-base", a)
            r = run(m, f"{rep:03d}-{m}", a)
            if base is None or r is None:
                continue
            add_pair(saved, m, r, base)
            if m == "auto" and "full_share" in r:
                saved["FullShare"].append(r["full_share"])
            if r.get("sidecar"):
                sidecar[m].append(r["sidecar"])
            print(f"overhead-pairs: rep {rep} {m:<8} step {r['step_ns'] / 1e3:.1f} µs (untraced {base['step_ns'] / 1e3:.1f}), "
                  f"cpu {r['cpu_ns'] / 1e3:.1f} µs/step, {r['launch_ns'] / 1e3:.3f} µs/launch", flush=True)
            with open(path, "w") as f:
                json.dump(saved, f)
    print(f"\nlaunch-bound PyTorch job: {a.kernels} in-place kernels a step, {a.steps} steps measured after {a.warmup}")
    print_table(a.bench, path, saved, modes, sidecar, "run")

if __name__ == "__main__":
    main()
