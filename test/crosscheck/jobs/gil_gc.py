#!/usr/bin/env python3
"""gil_gc: a GIL-holding helper thread, a pure-Python stall and gc passes.

The loop is a plain function with nested helpers, on the per-thread
default stream (the _ptsz entry points with a NULL stream): seven kernels
and a 4-byte loss read (async copy, stream sync) per step. Stalls:
  - lock: every 10th step (offset 5) the "metrics" thread runs
    summarize_metrics, 40 ms of pure Python holding the GIL; the loop
    thread waits for the GIL after its next driver call. The stall is the
    holder's burst; its code is the holder's function.
  - cpu: every 10th step tokenize_batch computes 60 ms in pure Python on
    the loop's own thread.
  - cpu (gc): every 25th step compact_heap runs gc.collect() over a heap of
    about 300k tracked objects in reference cycles.
"""

import argparse
import ctypes
import gc
import threading
import time

import simcu
import xtruth


def burn(ms):
    end = time.perf_counter() + ms / 1000.0
    n = 0
    while time.perf_counter() < end:
        n += sum(range(50))
    return n


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--truth")
    p.add_argument("--steps", type=int, default=400)
    a = p.parse_args()
    truth = xtruth.Truth(a.truth, "gil_gc")
    cu, _ctx, mod, _img = simcu.open_device(a.lib)
    launch = cu.cuLaunchKernel_ptsz
    launch.argtypes = cu.cuLaunchKernel.argtypes
    read = cu.cuMemcpyDtoHAsync_v2_ptsz
    read.argtypes = cu.cuMemcpyDtoHAsync_v2.argtypes
    sync = cu.cuStreamSynchronize_ptsz
    sync.argtypes = [ctypes.c_void_p]
    fns = [simcu.kernel(cu, mod, us) for us in (1000, 800, 800, 800, 800, 600, 200)]
    loss_dev = simcu.dalloc(cu, 4)
    loss = ctypes.c_float()

    heap = []
    for i in range(100000):
        a_, b_ = {}, [i]
        a_["peer"] = b_
        b_.append(a_)
        heap.append(b_)
    gc.disable()

    go = threading.Event()

    def summarize_metrics():
        t0 = time.time_ns()
        d0 = xtruth.run_delay_ns()
        burn(40)
        truth.stall("lock", "summarize_metrics", t0, time.time_ns(), 0,
                    holder_run_delay_ns=xtruth.run_delay_ns() - d0)

    def metrics_thread():
        while True:
            go.wait()
            go.clear()
            if stop:
                return
            summarize_metrics()

    stop = False
    th = threading.Thread(target=metrics_thread, name="metrics", daemon=True)
    th.start()

    def tokenize_batch():
        with xtruth.timed_stall(truth, "cpu", "tokenize_batch"):
            burn(60)

    def compact_heap():
        with xtruth.timed_stall(truth, "cpu", "compact_heap|gc.collect|gc"):
            gc.collect()

    def train_step():
        for f in fns:
            if launch(f, 1, 1, 1, 1, 1, 1, 0, None, None, None):
                raise simcu.CudaError("launch")
        simcu.ok(read(ctypes.addressof(loss), loss_dev, 4, None), "loss read")
        simcu.ok(sync(None), "sync")

    for step in range(1, a.steps + 1):
        if step % 10 == 0:
            tokenize_batch()
        if step % 25 == 0:
            compact_heap()
        if step % 10 == 5:
            go.set()
        t0 = time.time_ns()
        train_step()
        truth.step(step, t0, time.time_ns())
    stop = True
    go.set()
    th.join()
    truth.close()


if __name__ == "__main__":
    main()
