#!/usr/bin/env python3
"""A launch-bound PyTorch job for measuring tracing's cost: every step launches --kernels tiny
kernels back to back (in-place ops on a small tensor) and ends with a sync. After --warmup steps it
times --steps steps and writes to --result:

  {"step_ns": mean wall time per step, "cpu_ns": the process's CPU time per step (every thread; a
   uprobe's trap is charged to the thread that hit it), "launch_ns": median time per launch call
   (the launch loop of a step over its kernels), "steps": N}

--profile runs the measured steps under the PyTorch profiler (CPU + CUDA activities), the
always-on reference.
"""
import argparse
import json
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--kernels", type=int, default=300)
    ap.add_argument("--result", required=True)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    x = torch.ones(256, device="cuda")

    def step():
        t0 = time.perf_counter_ns()
        for _ in range(a.kernels):
            x.mul_(1.0000001)
        t1 = time.perf_counter_ns()
        torch.cuda.synchronize()
        return t1 - t0

    for _ in range(a.warmup):
        step()
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


if __name__ == "__main__":
    main()
