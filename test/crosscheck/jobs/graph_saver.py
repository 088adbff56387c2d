#!/usr/bin/env python3
"""graph_saver: one CUDA graph replayed per step, the loss read as a scalar.

Each iteration replays one instantiated graph exec (forward, backward and
optimizer captured together, as torch.cuda.graphs does) on a side stream,
then reads the 4-byte loss with an async device-to-host copy and a stream
sync (loss.item()). A background saver thread snapshots the weights every
20 steps: a dozen device-to-host copies into pageable host buffers on its
own stream, each waited for. Right after each snapshot is queued, the main thread
spends 60 ms building features in pure Python (a cpu stall in
pack_features) while the saver copies.
"""

import argparse
import ctypes
import os
import queue
import threading
import time

import simcu
import xtruth


def pack_features(ms):
    deadline = time.perf_counter() + ms / 1000.0
    acc = 0
    while time.perf_counter() < deadline:
        acc = (acc * 31 + 7) % 1000003
    return acc


class Saver(threading.Thread):
    def __init__(self, cu, ctx, weights):
        super().__init__(name="ckpt-saver", daemon=True)
        self.cu, self.ctx, self.weights = cu, ctx, weights
        self.jobs = queue.Queue()
        self.host = [ctypes.create_string_buffer(n) for _, n in weights]

    def run(self):
        self.cu.cuCtxSetCurrent(self.ctx)
        stream = simcu.new_stream(self.cu)
        while True:
            step = self.jobs.get()
            if step is None:
                return
            for (ptr, n), buf in zip(self.weights, self.host):
                simcu.ok(self.cu.cuMemcpyDtoHAsync_v2(ctypes.addressof(buf), ptr, n, stream), "saver copy")
                simcu.ok(self.cu.cuStreamSynchronize(stream), "saver sync")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--truth")
    p.add_argument("--steps", type=int, default=500)
    a = p.parse_args()
    os.environ.setdefault("SIMGPU_GRAPH_US", "6000")
    truth = xtruth.Truth(a.truth, "graph_saver")
    cu, ctx, mod, _img = simcu.open_device(a.lib)
    graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
    simcu.ok(cu.cuGraphCreate(ctypes.byref(graph), 0), "cuGraphCreate")
    simcu.ok(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)), "instantiate")
    stream = simcu.new_stream(cu)
    loss_dev = simcu.dalloc(cu, 4)
    loss_host = ctypes.c_float()
    saver = Saver(cu, ctx, [(simcu.dalloc(cu, 4 << 20), 4 << 20) for _ in range(12)])
    saver.start()
    for step in range(1, a.steps + 1):
        if step % 20 == 1 and step > 1:
            with xtruth.timed_stall(truth, "cpu", "pack_features"):
                pack_features(60)
        t0 = time.time_ns()
        simcu.ok(cu.cuGraphLaunch(exe, stream), "cuGraphLaunch")
        simcu.ok(cu.cuMemcpyDtoHAsync_v2(ctypes.addressof(loss_host), loss_dev, 4, stream), "loss copy")
        simcu.ok(cu.cuStreamSynchronize(stream), "loss sync")
        truth.step(step, t0, time.time_ns())
        if step % 20 == 0:
            saver.jobs.put(step)
    saver.jobs.put(None)
    saver.join()
    truth.close()


if __name__ == "__main__":
    main()
