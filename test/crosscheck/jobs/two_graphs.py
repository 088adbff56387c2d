#!/usr/bin/env python3
"""two_graphs: eager warm-up, then a train graph and an eval graph.

The first 15 steps run eagerly (upload, five kernels, the loss read), as
torch.cuda.graphs' warm-up does; then two graphs are captured and
instantiated. From there each step uploads its batch, replays the train
graph (forward, backward and optimizer in one exec) and reads the loss as
a scalar (async copy, stream sync) through read_scalar. Every 10 steps the
eval graph is replayed on the same stream and its accuracy read through
the same read_scalar. Stall: decode_batch computes 30 ms in pure Python
before every 21st step.
"""

import argparse
import ctypes
import os
import time

import simcu
import xtruth

WARMUP = 15


def decode_batch(ms):
    deadline = time.perf_counter() + ms / 1000.0
    acc = 1
    while time.perf_counter() < deadline:
        acc = (acc * 17 + 3) % 65521
    return acc


class Runner:
    def __init__(self, libdir):
        self.cu, self.ctx, mod, self._img = simcu.open_device(libdir)
        self.kernels = [simcu.kernel(self.cu, mod, us) for us in (800, 600, 1200, 1200, 400)]
        self.stream = simcu.new_stream(self.cu)
        pinned = ctypes.c_void_p()
        simcu.ok(self.cu.cuMemAllocHost_v2(ctypes.byref(pinned), ctypes.c_size_t(128 << 10)), "pinned")
        self.pinned = pinned
        self.batch = simcu.dalloc(self.cu, 128 << 10)
        self.scalar = simcu.dalloc(self.cu, 4)
        self.host = ctypes.c_float()
        self.train_exec = self.eval_exec = None

    def capture(self):
        execs = []
        for _ in range(2):
            graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
            simcu.ok(self.cu.cuGraphCreate(ctypes.byref(graph), 0), "cuGraphCreate")
            simcu.ok(self.cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)),
                     "instantiate")
            execs.append(exe)
        self.train_exec, self.eval_exec = execs

    def upload(self):
        simcu.ok(self.cu.cuMemcpyHtoDAsync_v2(self.batch, self.pinned, 128 << 10, self.stream), "upload")

    def read_scalar(self):
        simcu.ok(self.cu.cuMemcpyDtoHAsync_v2(ctypes.addressof(self.host), self.scalar, 4, self.stream), "read")
        simcu.ok(self.cu.cuStreamSynchronize(self.stream), "read sync")
        return self.host.value

    def eager_step(self):
        self.upload()
        for f in self.kernels:
            simcu.launch(self.cu, f, self.stream)
        return self.read_scalar()

    def graph_step(self):
        self.upload()
        simcu.ok(self.cu.cuGraphLaunch(self.train_exec, self.stream), "train replay")
        return self.read_scalar()

    def evaluate(self):
        simcu.ok(self.cu.cuGraphLaunch(self.eval_exec, self.stream), "eval replay")
        return self.read_scalar()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--truth")
    p.add_argument("--steps", type=int, default=1000)
    a = p.parse_args()
    os.environ.setdefault("SIMGPU_GRAPH_US", "5000")
    truth = xtruth.Truth(a.truth, "two_graphs")
    r = Runner(a.lib)
    for step in range(1, a.steps + 1):
        if step % 21 == 0:
            with xtruth.timed_stall(truth, "cpu", "decode_batch"):
                decode_batch(30)
        if step == WARMUP + 1:
            r.capture()
        t0 = time.time_ns()
        if step <= WARMUP:
            r.eager_step()
        else:
            r.graph_step()
        truth.step(step, t0, time.time_ns())
        if step > WARMUP and step % 10 == 0:
            r.evaluate()
    truth.close()


if __name__ == "__main__":
    main()
