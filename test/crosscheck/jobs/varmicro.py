#!/usr/bin/env python3
"""varmicro: 2 to 6 micro-batches per optimizer step, picked by the data.

Each optimizer step packs a varying number of micro-batches (2-6, from the
lengths of the samples, as token-budget bucketing does): each uploads its
batch and launches forward and backward, no sync. The optimizer's kernels
follow, then wait_stream() records an event and waits for it: the step's
only sync. Every 25 steps evaluate() runs 10 batches, each waited for
through the same wait_stream(). Stall: read_index sleeps 15 ms before
every 29th step.
"""

import argparse
import ctypes
import random
import time

import simcu
import xtruth


class Job:
    def __init__(self, libdir):
        self.cu, self.ctx, mod, self._img = simcu.open_device(libdir)
        k = lambda us: simcu.kernel(self.cu, mod, us)
        self.fwd, self.bwd, self.opt, self.ev = k(500), k(900), k(350), k(600)
        self.stream = simcu.new_stream(self.cu)
        self.done = ctypes.c_void_p()
        simcu.ok(self.cu.cuEventCreate(ctypes.byref(self.done), 0), "cuEventCreate")
        pinned = ctypes.c_void_p()
        simcu.ok(self.cu.cuMemAllocHost_v2(ctypes.byref(pinned), ctypes.c_size_t(256 << 10)), "pinned")
        self.pinned = pinned
        self.batch = simcu.dalloc(self.cu, 256 << 10)

    def wait_stream(self):
        simcu.ok(self.cu.cuEventRecord(self.done, self.stream), "record")
        simcu.ok(self.cu.cuEventSynchronize(self.done), "event sync")

    def micro_batch(self):
        simcu.ok(self.cu.cuMemcpyHtoDAsync_v2(self.batch, self.pinned, 256 << 10, self.stream), "batch")
        simcu.launch(self.cu, self.fwd, self.stream)
        simcu.launch(self.cu, self.bwd, self.stream)

    def optimizer_step(self):
        for _ in range(2):
            simcu.launch(self.cu, self.opt, self.stream)
        self.wait_stream()

    def evaluate(self):
        for _ in range(10):
            simcu.ok(self.cu.cuMemcpyHtoDAsync_v2(self.batch, self.pinned, 256 << 10, self.stream), "eval batch")
            simcu.launch(self.cu, self.ev, self.stream)
            self.wait_stream()


def micro_batches(rng):
    """The data decides: samples' lengths packed into a token budget."""
    budget, n, used = 4096, 0, 0
    while n < 6:
        length = rng.randint(300, 2000)
        if used + length > budget and n >= 2:
            break
        used, n = used + length, n + 1
    return n


def read_index(truth):
    """Waits on a slow index service (the stall)."""
    with xtruth.timed_stall(truth, "sleep", "read_index"):
        time.sleep(0.015)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--truth")
    p.add_argument("--steps", type=int, default=700)
    a = p.parse_args()
    truth = xtruth.Truth(a.truth, "varmicro")
    j = Job(a.lib)
    rng = random.Random(20261206)
    for step in range(1, a.steps + 1):
        if step % 29 == 0:
            read_index(truth)
        t0 = time.time_ns()
        for _ in range(micro_batches(rng)):
            j.micro_batch()
        j.optimizer_step()
        truth.step(step, t0, time.time_ns())
        if step % 25 == 0:
            j.evaluate()
    truth.close()


if __name__ == "__main__":
    main()
