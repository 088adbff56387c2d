#!/usr/bin/env python3
"""A launch-bound PyTorch job for measuring tracing's cost: every step launches --kernels tiny
kernels back to back (in-place ops on a small tensor) and ends with a sync. After --warmup steps it
times --steps steps and writes to --result:

  {"step_ns": mean wall time per step, "cpu_ns": the process's CPU time per step (every thread; a
   uprobe's trap is charged to the thread that hit it), "launch_ns": median time per launch call
   (the launch loop of a step over its kernels), "steps": N}

--host-us N adds N µs of pure-Python work to every step after its launches (no syscall, no CUDA
call): a job that launches at a lower rate, for measuring the sidecar's cost per launch rate.

--profile runs the measured steps under the PyTorch profiler (CPU + CUDA activities), the
always-on reference.

--serve LOG runs until killed (or --ctl says stop) and appends one line per step to LOG:
  "end_ns wall_ns cpu_ns launch_ns" (end: CLOCK_MONOTONIC, the clock time.monotonic_ns() reads in
any process; cpu: the process's CPU time of the step, every thread; launch: the launch loop's time).
--ctl FILE is read every 25 steps: "profile" runs the PyTorch profiler from then on, "none" stops
it, "stop" ends the job; each change is acknowledged by writing the same word to FILE.ack once in
effect (the profiler's start and its post-processing at stop happen before the ack).
overhead_attach.py drives it.
"""
import argparse
import json
import os
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--kernels", type=int, default=300)
    ap.add_argument("--host-us", type=int, default=0)
    ap.add_argument("--result")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--serve", metavar="LOG")
    ap.add_argument("--ctl", metavar="FILE")
    a = ap.parse_args()
    if not a.serve and not a.result:
        ap.error("--result or --serve is required")
    x = torch.ones(256, device="cuda")

    def step():
        t0 = time.perf_counter_ns()
        for _ in range(a.kernels):
            x.mul_(1.0000001)
        t1 = time.perf_counter_ns()
        if a.host_us:
            until = t1 + a.host_us * 1000
            while time.perf_counter_ns() < until:
                pass
        torch.cuda.synchronize()
        return t1 - t0

    for _ in range(a.warmup):
        step()
    if a.serve:
        serve(a, step)
        return
    prof = None
    if a.profile:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
        prof.__enter__()
    per_launch = []
    c0, w0 = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(a.steps):
        per_launch.append(step() / a.kernels)
    w1, c1 = time.perf_counter_ns(), time.process_time_ns()
    if prof is not None:
        prof.__exit__(None, None, None)
    with open(a.result, "w") as f:
        json.dump({"step_ns": (w1 - w0) / a.steps, "cpu_ns": (c1 - c0) / a.steps,
                   "launch_ns": statistics.median(per_launch), "steps": a.steps}, f)


def profiler():
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])


def serve(a, step):
    prof, state, seen = None, "none", None
    with open(a.serve, "a", buffering=1 << 16) as log:
        n = 0
        while True:
            if a.ctl and n % 25 == 0:
                try:
                    st = os.stat(a.ctl).st_mtime_ns
                except FileNotFoundError:
                    st = None
                if st is not None and st != seen:
                    seen = st
                    with open(a.ctl) as f:
                        want = f.read().strip()
                    if want != state:
                        if prof is not None:
                            prof.__exit__(None, None, None)
                            prof = None
                        if want == "profile":
                            prof = profiler()
                            prof.__enter__()
                        state = want
                        log.flush()
                        with open(a.ctl + ".ack.tmp", "w") as f:
                            f.write(want)
                        os.replace(a.ctl + ".ack.tmp", a.ctl + ".ack")
                        if want == "stop":
                            return
            c0 = time.process_time_ns()
            w0 = time.monotonic_ns()
            launch = step()
            w1 = time.monotonic_ns()
            c1 = time.process_time_ns()
            log.write(f"{w1} {w1 - w0} {c1 - c0} {launch}\n")
            n += 1
            if n % 250 == 0:
                log.flush()


if __name__ == "__main__":
    main()
