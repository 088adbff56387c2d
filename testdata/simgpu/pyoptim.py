#!/usr/bin/env python3
"""pyoptim - a ctypes gradient-accumulation loop that marks its optimizer steps.

Drives the simulated GPU (the libcuda.so.1 in --lib): each iteration runs
4 micro-batches, each its batch copy (4 MiB, pinned, async), 20 launches
and its loss read (4 bytes to the host, stream sync), then the optimizer
(6 launches). Around them it enters record_function regions the way
PyTorch does, through the simulated libtorch (--torch, libsimtorch.so):
"## forward ##" for each micro-batch (a user region, not a step marker),
"Optimizer.step#SGD.step" once per optimizer step and
"Optimizer.zero_grad#SGD.zero_grad" after it. A step is one optimizer
step: the loss read recurs four times as often. --marker profiler enters
"ProfilerStep#N" at the end of each iteration instead of the optimizer's
regions, as torch.profiler's schedule does with prof.step() (a name short
enough for std::string's inline buffer).

--truth FILE writes JSON Lines: a meta record (pid, from_start), then one
step record per optimizer step (start_unix_nano, end_unix_nano), and the
count of optimizer steps the job ran (type "done").
"""
import argparse
import ctypes
import json
import os
import sys
import time

from pysteps import Loop

MICRO = 4


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", required=True, help="directory of the simulated libcuda.so.1")
    p.add_argument("--torch", required=True, help="path of the simulated libtorch (libsimtorch.so)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--marker", choices=("optimizer", "profiler"), default="optimizer", help="the step marker entered")
    p.add_argument("--capture", type=int, default=0, help="a CUDA-graph loop: the first N iterations step the optimizer (marked) with no read, the rest read their loss once and enter no marker")
    p.add_argument("--replay-copies", type=int, default=0, help="with --capture: the warm-up copies nothing; each replay copies its inputs with N blocking copies first, as a graph's static inputs are filled")
    p.add_argument("--truth", help="write the ground truth here (JSON Lines)")
    a = p.parse_args()
    if a.steps < 1:
        p.error("want --steps >= 1")
    a.sync_reads = False
    # The framework library is loaded after the process started and before
    # the model's setup, as `import torch` loads libtorch_cpu.so.
    torch = ctypes.CDLL(a.torch)
    loop = Loop(a)
    torch.sim_record_function.argtypes = [ctypes.c_char_p]
    torch.sim_record_function.restype = None
    loop.cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    truth = open(a.truth, "w") if a.truth else None

    def record(**kv):
        if truth:
            truth.write(json.dumps(kv) + "\n")
            truth.flush()

    record(type="meta", pid=os.getpid(), from_start=True, job="accum-optimizer", steps=a.steps)
    for step in range(a.steps):
        start = time.time_ns()
        if a.capture:
            if not a.replay_copies:
                loop.batch()
            elif step >= a.capture:
                for _ in range(a.replay_copies):
                    loop.cu.cuMemcpyHtoD_v2(loop.dptr.value, loop.host, 1 << 20)
            loop.launch(20)
            if step < a.capture:
                torch.sim_record_function(b"Optimizer.step#SGD.step")  # warm-up and capture
            else:
                loop.read()  # replay, then loss.item()
            record(type="step", step=step, start_unix_nano=start, end_unix_nano=time.time_ns())
            continue
        for _ in range(MICRO):
            torch.sim_record_function(b"## forward ##")
            loop.batch()
            loop.launch(20)
            loop.read()  # loss.item() of the micro-batch
        if a.marker == "optimizer":
            torch.sim_record_function(b"Optimizer.step#SGD.step")
        loop.launch(6, loop.funcs[3])  # the optimizer
        if a.marker == "optimizer":
            torch.sim_record_function(b"Optimizer.zero_grad#SGD.zero_grad")
        else:
            torch.sim_record_function(b"ProfilerStep#%d" % (step + 1))
        record(type="step", step=step, start_unix_nano=start, end_unix_nano=time.time_ns())
    record(type="done", steps=a.steps)
    if truth:
        truth.close()


if __name__ == "__main__":
    sys.exit(main())
